//! Fencing tokens in a cluster: `epoch:32 | counter:32`, one counter per partition.
//!
//! A standalone server's token is `epoch:16 | counter:48` with one counter for the server
//! ([`crate::FencingToken`]); an operator picks the epoch. In a cluster a lock can move
//! between servers, so its tokens must grow across owners: the high half is the partition's
//! epoch from the map — raised by the coordinator at every ownership change, through an etcd
//! compare-and-swap, so never lowered — and the low half counts the grants its owner made in it
//! at that epoch. Every lock lives in exactly one partition, so tokens grow per lock:
//!
//! | event                                  | next token of any lock in `p`                       |
//! |----------------------------------------|-----------------------------------------------------|
//! | a grant in `p` at epoch `e`            | `e:(c + 1)`, larger than every `e:c` before         |
//! | `p` moves (failover, drain, rebalance) | `(e + 1):1`, larger than every `e:*`                |
//! | `p`'s counter reaches [`RENEW_AT`]     | the owner asks for a renewal: `(e + 1):1` when the coordinator grants it |
//! | `p`'s counter reaches [`COUNTER_MAX`]  | no grant ([`PartitionTokens::issue`] refuses) until the renewal arrives |
//! | `p`'s epoch is [`EPOCH_MAX`]           | the coordinator cannot raise it: `p` stays where it is |
//!
//! Nothing ever wraps. The limits, at a sustained ten million grants a second **in one
//! partition** (more than one server serves in total):
//!
//! - 2^32 − 1 = 4,294,967,295 grants per epoch: seven minutes. A renewal is asked for at half
//!   of that, three and a half minutes before the counter runs out; a map write takes
//!   milliseconds.
//! - 2^32 − 1 epochs per partition: one change or renewal every 215 s for 29,000 years; or one
//!   ownership change every second, without pause, for 136 years.
//!
//! A new owner starts its counter at 1 at its epoch; re-claimed grants keep the tokens the old
//! owner issued (at lower epochs, [`is_plausible_claim`]), so a new grant's token is larger
//! than each of them.

/// Bits of the counter below the epoch.
pub const COUNTER_BITS: u32 = 32;
/// The largest counter value a grant can carry.
pub const COUNTER_MAX: u32 = u32::MAX;
/// The largest epoch: the coordinator raises no partition past it.
pub const EPOCH_MAX: u32 = u32::MAX;
/// The counter at which an owner asks the coordinator to renew the partition's epoch.
pub const RENEW_AT: u32 = 1 << 31;

/// The token of grant `counter` at `epoch`.
#[inline]
#[must_use]
pub const fn token(epoch: u32, counter: u32) -> u64 {
    (epoch as u64) << COUNTER_BITS | counter as u64
}

/// The epoch a cluster token was issued at.
#[inline]
#[must_use]
pub const fn token_epoch(token: u64) -> u32 {
    (token >> COUNTER_BITS) as u32
}

/// Whether a re-claim's token can be one the partition's earlier owners issued: its epoch is
/// below the partition's current one and at least 1. A token at or above the current epoch is
/// forged (or from a server that must not have granted), and is refused.
#[inline]
#[must_use]
pub const fn is_plausible_claim(token: u64, partition_epoch: u32) -> bool {
    let e = token_epoch(token);
    e >= 1 && e < partition_epoch
}

/// One partition's token counter on its owner.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct PartitionTokens {
    epoch: u32,
    /// The last counter issued at `epoch` (0: none yet).
    last: u32,
}

/// Why [`PartitionTokens::issue`] gave no token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenError {
    /// The partition is not owned here (epoch 0).
    NotOwned,
    /// Every counter of this epoch was issued; a renewal (a new epoch) must come first.
    Exhausted,
}

impl PartitionTokens {
    /// Nothing owned: issues nothing.
    pub const NONE: PartitionTokens = PartitionTokens { epoch: 0, last: 0 };

    /// The counter of an owner at `epoch`. An owner that kept the partition across a renewal
    /// moves to the new epoch with [`PartitionTokens::advance`].
    #[inline]
    #[must_use]
    pub const fn at(epoch: u32) -> Self {
        PartitionTokens { epoch, last: 0 }
    }

    /// The epoch this counter issues at.
    #[inline]
    pub const fn epoch(&self) -> u32 {
        self.epoch
    }

    /// Moves to `epoch` if it is newer (a renewal or a new ownership); an older or equal one is
    /// ignored, so tokens never go back. Returns whether it moved.
    #[inline]
    #[must_use]
    pub fn advance(&mut self, epoch: u32) -> bool {
        let newer = epoch > self.epoch;
        if newer {
            *self = PartitionTokens::at(epoch);
        }
        newer
    }

    /// The next token, larger than every token issued before in this partition.
    #[inline]
    pub fn issue(&mut self) -> Result<u64, TokenError> {
        if self.epoch == 0 {
            return Err(TokenError::NotOwned);
        }
        if self.last == COUNTER_MAX {
            return Err(TokenError::Exhausted);
        }
        self.last += 1;
        Ok(token(self.epoch, self.last))
    }

    /// Whether the owner should ask for a renewal: half the epoch's counters are used.
    #[inline]
    #[must_use]
    pub const fn wants_renewal(&self) -> bool {
        self.epoch != 0 && self.last >= RENEW_AT && self.epoch < EPOCH_MAX
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_token_is_the_epoch_above_the_counter() {
        assert_eq!(token(3, 7), 0x0000_0003_0000_0007);
        assert_eq!(token_epoch(token(EPOCH_MAX, COUNTER_MAX)), EPOCH_MAX);
    }

    #[test]
    fn a_counter_refuses_rather_than_wraps() {
        let mut t = PartitionTokens {
            epoch: 4,
            last: COUNTER_MAX - 1,
        };
        assert_eq!(t.issue(), Ok(token(4, COUNTER_MAX)));
        assert_eq!(t.issue(), Err(TokenError::Exhausted));
        assert!(t.wants_renewal());
        assert!(t.advance(5));
        assert_eq!(t.issue(), Ok(token(5, 1)));
        assert_eq!(
            PartitionTokens::NONE.clone().issue(),
            Err(TokenError::NotOwned)
        );
    }

    #[test]
    fn renewal_is_asked_for_at_half_the_counter() {
        let mut t = PartitionTokens::at(1);
        assert!(!t.wants_renewal());
        t.last = RENEW_AT - 1;
        assert!(!t.wants_renewal());
        t.last = RENEW_AT;
        assert!(t.wants_renewal());
        let last_epoch = PartitionTokens {
            epoch: EPOCH_MAX,
            last: RENEW_AT,
        };
        assert!(!last_epoch.wants_renewal(), "no epoch left to renew to");
    }

    #[test]
    fn claims_must_come_from_an_earlier_epoch() {
        assert!(is_plausible_claim(token(4, 99), 5));
        assert!(!is_plausible_claim(token(5, 1), 5), "this epoch's own");
        assert!(
            !is_plausible_claim(token(9, 1), 5),
            "forged: from the future"
        );
        assert!(
            !is_plausible_claim(token(0, 1), 5),
            "no owner issues at epoch 0"
        );
    }

    proptest! {
        /// Tokens of one partition grow across grants, renewals and moves to any owner: every
        /// owner is handed a larger epoch than the one before, as the map guarantees.
        #[test]
        fn tokens_grow_per_partition_across_owners(steps in proptest::collection::vec((0u32..5, 1u32..3), 1..200)) {
            let mut owner = PartitionTokens::at(1);
            let mut last = 0u64;
            for (grants, raise) in steps {
                for _ in 0..grants {
                    let t = owner.issue().unwrap();
                    prop_assert!(t > last);
                    last = t;
                }
                // A move (a fresh counter at a larger epoch) or a renewal (the same counter
                // advanced): either way the next token is larger.
                let epoch = owner.epoch() + raise;
                if raise == 1 {
                    prop_assert!(owner.advance(epoch));
                } else {
                    owner = PartitionTokens::at(epoch);
                }
                prop_assert!(!owner.advance(epoch - 1), "an older epoch is ignored");
            }
        }
    }
}
