//! What one client holds on one lock: a [`GrantState`], four bits in the holds grid.
//!
//! The grid had two bits per (client, lock) — none, exclusive, shared, ticketed — all four
//! values used, so the server could not tell a ticket's mode. A lock manager needs more: whether a
//! grant is *cached* (its holder gives it back when asked, so it may be revoked), whether it
//! is *retained* on its holder's death, and whether a revoke is *outstanding* on it (at most
//! one per holder and lock). Four bits hold all of it:
//!
//! | code | state                    | grant | ticket | cached | retain | revoke sent |
//! |-----:|--------------------------|-------|--------|:------:|:------:|:-----------:|
//! |    0 | `None`                   | —     | —      |        |        |             |
//! |    1 | `Exclusive`              | EX    |        |        |        |             |
//! |    2 | `Shared`                 | SH    |        |        |        |             |
//! |    3 | `ExclusiveCached`        | EX    |        | ✓      |        |             |
//! |    4 | `SharedCached`           | SH    |        | ✓      |        |             |
//! |    5 | `ExclusiveRetain`        | EX    |        |        | ✓      |             |
//! |    6 | `SharedRetain`           | SH    |        |        | ✓      |             |
//! |    7 | `ExclusiveCachedRetain`  | EX    |        | ✓      | ✓      |             |
//! |    8 | `SharedCachedRetain`     | SH    |        | ✓      | ✓      |             |
//! |    9 | `ExclusiveRevoking`      | EX    |        | ✓      |        | ✓           |
//! |   10 | `SharedRevoking`         | SH    |        | ✓      |        | ✓           |
//! |   11 | `ExclusiveRetainRevoking`| EX    |        | ✓      | ✓      | ✓           |
//! |   12 | `SharedRetainRevoking`   | SH    |        | ✓      | ✓      | ✓           |
//! |   13 | `TicketExclusive`        | —     | EX     |        |        |             |
//! |   14 | `TicketShared`           | —     | SH     |        |        |             |
//! |   15 | corrupt                  |       |        |        |        |             |
//!
//! Grants are `1 + 2 × variant + shared`, the variants in the order plain, cached, retain,
//! cached + retain, revoking, retain + revoking, so a grant's mode is its code's parity and the
//! plain grants keep today's codes (1 exclusive, 2 shared). Zero stays "nothing", which is what
//! a zeroed region and [`crate::table::BitGrid::next_in_row`] rely on.
//!
//! # Why the revoke mark is in the grid
//!
//! The integration spec counts eleven states (none, two tickets, and each mode × plain,
//! cached, retained, cached + retained) and keeps "a revoke is outstanding" elsewhere. It fits
//! in the five values left over: a revoke is only ever outstanding on a cached grant, so it
//! adds four states, and the one load that tells the server what a holder holds also tells it
//! whether that holder was already asked. A separate one-bit grid would cost 6.4 MB at the
//! default capacities and a second load per holder; one value (15) is still left over.
//!
//! # Transitions (who moves a state where)
//!
//! | from                       | event                                   | to                         |
//! |----------------------------|-----------------------------------------|----------------------------|
//! | `None`                     | granted, request flags `CACHEABLE`/`RETAIN` | [`GrantState::granted`] |
//! | `None`                     | fair request queued                      | [`GrantState::ticketed`]   |
//! | a ticket                   | granted                                  | [`GrantState::granted`]    |
//! | cached                     | revoke sent                              | [`GrantState::with_revoke_sent`] |
//! | exclusive (any variant)    | downgrade                                | [`GrantState::downgraded`] |
//! | any grant or ticket        | unlock, lapse, preemption, deinit        | `None`                     |
//! | any                        | holder dies                              | [`crate::manager::retain::at_departure`] |
//!
//! A corrupt value ([`GrantState::from_bits`] → [`CorruptGrant`]) can only come from a bug or
//! from memory scribbled outside the server's control; the server's `check_invariants` reports
//! it and the data path treats the entry as holding nothing it can act on, never panicking.

use crate::ids::Mode;
use crate::proto::Held;

/// What one client holds on one lock (module doc: the table of codes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum GrantState {
    /// Nothing (or only a reference).
    None = 0,
    /// An exclusive grant released by its holder's unlock.
    Exclusive = 1,
    /// A shared grant released by its holder's unlock.
    Shared = 2,
    /// An exclusive grant its holder keeps until asked to give it back.
    ExclusiveCached = 3,
    /// A shared grant its holder keeps until asked.
    SharedCached = 4,
    /// An exclusive grant kept as retained if its holder dies.
    ExclusiveRetain = 5,
    /// A shared grant kept as retained if its holder dies.
    SharedRetain = 6,
    /// Cached, and retained on death.
    ExclusiveCachedRetain = 7,
    /// Cached, and retained on death.
    SharedCachedRetain = 8,
    /// Cached, and a revoke is outstanding.
    ExclusiveRevoking = 9,
    /// Cached, and a revoke is outstanding.
    SharedRevoking = 10,
    /// Cached, retained on death, and a revoke is outstanding.
    ExclusiveRetainRevoking = 11,
    /// Cached, retained on death, and a revoke is outstanding.
    SharedRetainRevoking = 12,
    /// A fair-lock ticket for an exclusive grant, waiting.
    TicketExclusive = 13,
    /// A fair-lock ticket for a shared grant, waiting.
    TicketShared = 14,
}

/// A holds-grid entry that is none of the fifteen states: the bits read (module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CorruptGrant(pub u8);

impl core::fmt::Display for CorruptGrant {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "corrupt grant state {:#x}", self.0)
    }
}

impl core::error::Error for CorruptGrant {}

impl GrantState {
    /// Bits per entry in the holds grid.
    pub const BITS: u32 = 4;

    /// Every state, in code order (for exhaustive tests and tables).
    pub const ALL: [GrantState; 15] = [
        GrantState::None,
        GrantState::Exclusive,
        GrantState::Shared,
        GrantState::ExclusiveCached,
        GrantState::SharedCached,
        GrantState::ExclusiveRetain,
        GrantState::SharedRetain,
        GrantState::ExclusiveCachedRetain,
        GrantState::SharedCachedRetain,
        GrantState::ExclusiveRevoking,
        GrantState::SharedRevoking,
        GrantState::ExclusiveRetainRevoking,
        GrantState::SharedRetainRevoking,
        GrantState::TicketExclusive,
        GrantState::TicketShared,
    ];

    /// The state with grid code `bits`; [`CorruptGrant`] for 15 and anything above four bits.
    #[inline]
    pub const fn from_bits(bits: u8) -> Result<GrantState, CorruptGrant> {
        match Self::with_code(bits) {
            Some(state) => Ok(state),
            None => Err(CorruptGrant(bits)),
        }
    }

    /// The state whose code is `code`, if any. A match rather than an index into
    /// [`Self::ALL`]: the codes are the discriminants, so the compiler makes it the identity,
    /// where the table cost the data path a second dependent load on every command (the holds
    /// word, then the table), on the chain that runs through the holds grid from one command
    /// of a batch to the next.
    #[inline]
    const fn with_code(code: u8) -> Option<GrantState> {
        Some(match code {
            0 => GrantState::None,
            1 => GrantState::Exclusive,
            2 => GrantState::Shared,
            3 => GrantState::ExclusiveCached,
            4 => GrantState::SharedCached,
            5 => GrantState::ExclusiveRetain,
            6 => GrantState::SharedRetain,
            7 => GrantState::ExclusiveCachedRetain,
            8 => GrantState::SharedCachedRetain,
            9 => GrantState::ExclusiveRevoking,
            10 => GrantState::SharedRevoking,
            11 => GrantState::ExclusiveRetainRevoking,
            12 => GrantState::SharedRetainRevoking,
            13 => GrantState::TicketExclusive,
            14 => GrantState::TicketShared,
            _ => return None,
        })
    }

    /// The grid code.
    #[inline]
    pub const fn bits(self) -> u8 {
        self as u8
    }

    /// A fresh grant in `mode`: cached if the request asked for it and the server allows it
    /// (see [`crate::manager::Answer::Grant`]), retained on death if the request asked.
    #[inline]
    pub const fn granted(mode: Mode, cached: bool, retain: bool) -> GrantState {
        let variant = cached as u8 + 2 * retain as u8;
        match Self::with_code(1 + 2 * variant + matches!(mode, Mode::Shared) as u8) {
            Some(state) => state,
            // Codes 1..=8: every one is a state.
            None => GrantState::None,
        }
    }

    /// A fair-lock ticket waiting for `mode`.
    #[inline]
    pub const fn ticketed(mode: Mode) -> GrantState {
        match mode {
            Mode::Exclusive => GrantState::TicketExclusive,
            Mode::Shared => GrantState::TicketShared,
        }
    }

    /// The mode of the grant held, if this is a grant.
    #[inline]
    pub const fn grant_mode(self) -> Option<Mode> {
        match self as u8 {
            1..=12 if self as u8 % 2 == 1 => Some(Mode::Exclusive),
            1..=12 => Some(Mode::Shared),
            _ => None,
        }
    }

    /// The mode of the ticket held, if this is a fair-lock ticket.
    #[inline]
    pub const fn ticket_mode(self) -> Option<Mode> {
        match self {
            GrantState::TicketExclusive => Some(Mode::Exclusive),
            GrantState::TicketShared => Some(Mode::Shared),
            _ => None,
        }
    }

    /// Whether nothing is held.
    #[inline]
    pub const fn is_none(self) -> bool {
        matches!(self, GrantState::None)
    }

    /// The grant variant, 0..=5 (plain, cached, retain, cached + retain, revoking, retain +
    /// revoking); `None` for a ticket or nothing.
    #[inline]
    const fn variant(self) -> Option<u8> {
        match self as u8 {
            code @ 1..=12 => Some((code - 1) / 2),
            _ => None,
        }
    }

    /// Whether the grant is cached: its holder gives it back when asked, so it may be revoked
    /// (also while a revoke is outstanding).
    #[inline]
    pub const fn is_cached(self) -> bool {
        matches!(self.variant(), Some(1 | 3 | 4 | 5))
    }

    /// Whether the grant stays held as retained if its holder dies.
    #[inline]
    pub const fn retains(self) -> bool {
        matches!(self.variant(), Some(2 | 3 | 5))
    }

    /// Whether a revoke of this grant has been sent and not yet answered.
    #[inline]
    pub const fn revoke_outstanding(self) -> bool {
        matches!(self.variant(), Some(4 | 5))
    }

    /// The same grant once a revoke has been sent for it; anything that is not a cached grant
    /// is returned unchanged (only cached grants are revoked).
    #[inline]
    pub const fn with_revoke_sent(self) -> GrantState {
        match self.variant() {
            Some(1) => Self::ALL[self as usize + 6],
            Some(3) => Self::ALL[self as usize + 4],
            _ => self,
        }
    }

    /// The grant after its holder downgrades it to shared: still cached and retained as it
    /// was, and the revoke (which a downgrade answers) no longer outstanding. Shared grants,
    /// tickets and nothing are returned unchanged.
    #[inline]
    pub const fn downgraded(self) -> GrantState {
        match (self.grant_mode(), self.variant()) {
            (Some(Mode::Exclusive), Some(v)) => {
                let cached = matches!(v, 1 | 3 | 4 | 5);
                let retain = matches!(v, 2 | 3 | 5);
                GrantState::granted(Mode::Shared, cached, retain)
            }
            _ => self,
        }
    }

    /// The same grant, plain: neither cached nor retained, no revoke outstanding (what a
    /// retained grant becomes once its holder is dead, and what an old-style `Held` claim
    /// restores). Tickets and nothing are returned unchanged.
    #[inline]
    pub const fn plain(self) -> GrantState {
        match self.grant_mode() {
            Some(mode) => GrantState::granted(mode, false, false),
            None => self,
        }
    }

    /// What a client re-claims for this state after a failover.
    #[inline]
    pub const fn held(self) -> Held {
        match (self.grant_mode(), self.ticket_mode()) {
            (Some(Mode::Exclusive), _) => Held::Exclusive,
            (Some(Mode::Shared), _) => Held::Shared,
            (None, Some(mode)) => Held::Ticketed(mode),
            (None, None) => Held::Reference,
        }
    }

    /// The state a re-claim of `held` restores, before the claim's flags say whether it was
    /// cached or retained: a plain grant, a ticket, or nothing.
    #[inline]
    pub const fn from_held(held: Held) -> GrantState {
        match held {
            Held::Reference => GrantState::None,
            Held::Exclusive => GrantState::Exclusive,
            Held::Shared => GrantState::Shared,
            Held::Ticketed(mode) => GrantState::ticketed(mode),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use GrantState::*;
    use Mode::{Exclusive as EX, Shared as SH};

    /// One row of the module doc's table: state, grant, ticket, cached, retain, revoking.
    type Row = (GrantState, Option<Mode>, Option<Mode>, bool, bool, bool);

    /// The module doc's table, row by row.
    #[rustfmt::skip]
    const TABLE: [Row; 15] = [
        (None,                    Option::None, Option::None, false, false, false),
        (Exclusive,               Some(EX), Option::None, false, false, false),
        (Shared,                  Some(SH), Option::None, false, false, false),
        (ExclusiveCached,         Some(EX), Option::None, true,  false, false),
        (SharedCached,            Some(SH), Option::None, true,  false, false),
        (ExclusiveRetain,         Some(EX), Option::None, false, true,  false),
        (SharedRetain,            Some(SH), Option::None, false, true,  false),
        (ExclusiveCachedRetain,   Some(EX), Option::None, true,  true,  false),
        (SharedCachedRetain,      Some(SH), Option::None, true,  true,  false),
        (ExclusiveRevoking,       Some(EX), Option::None, true,  false, true),
        (SharedRevoking,          Some(SH), Option::None, true,  false, true),
        (ExclusiveRetainRevoking, Some(EX), Option::None, true,  true,  true),
        (SharedRetainRevoking,    Some(SH), Option::None, true,  true,  true),
        (TicketExclusive,         Option::None, Some(EX), false, false, false),
        (TicketShared,            Option::None, Some(SH), false, false, false),
    ];

    #[test]
    fn every_state_reads_as_the_table_says() {
        for (code, (state, grant, ticket, cached, retain, revoking)) in
            TABLE.into_iter().enumerate()
        {
            assert_eq!(state.bits() as usize, code, "{state:?}");
            assert_eq!(GrantState::ALL[code], state);
            let got = (
                state.grant_mode(),
                state.ticket_mode(),
                state.is_cached(),
                state.retains(),
                state.revoke_outstanding(),
            );
            assert_eq!(got, (grant, ticket, cached, retain, revoking), "{state:?}");
            assert_eq!(state.is_none(), code == 0);
        }
    }

    #[test]
    fn every_state_round_trips_through_its_bits() {
        for state in GrantState::ALL {
            assert_eq!(GrantState::from_bits(state.bits()), Ok(state));
            assert!(state.bits() < 1 << GrantState::BITS);
        }
    }

    #[test]
    fn no_other_value_decodes_and_none_panics() {
        // Every byte: the fifteen codes decode, everything else (15, and what no four-bit
        // field can hold) is a defined corrupt answer.
        for bits in 0..=u8::MAX {
            match GrantState::from_bits(bits) {
                Ok(state) => assert_eq!(state.bits(), bits),
                Err(e) => {
                    assert!(bits >= 15, "{bits} is a state");
                    assert_eq!(e, CorruptGrant(bits));
                }
            }
        }
        assert_eq!(GrantState::from_bits(15), Err(CorruptGrant(15)));
    }

    #[test]
    fn a_grant_is_built_from_its_mode_and_flags() {
        for (state, grant, _, cached, retain, revoking) in TABLE {
            let (Some(mode), false) = (grant, revoking) else {
                continue;
            };
            assert_eq!(GrantState::granted(mode, cached, retain), state);
        }
        assert_eq!(GrantState::ticketed(EX), TicketExclusive);
        assert_eq!(GrantState::ticketed(SH), TicketShared);
    }

    #[test]
    fn only_cached_grants_are_marked_revoking_and_the_rest_is_kept() {
        for state in GrantState::ALL {
            let sent = state.with_revoke_sent();
            if state.is_cached() {
                assert!(sent.revoke_outstanding(), "{state:?}");
                assert_eq!(sent.grant_mode(), state.grant_mode());
                assert_eq!(sent.retains(), state.retains());
                assert!(sent.is_cached());
            } else {
                assert_eq!(sent, state, "only a cached grant is revoked");
            }
            assert_eq!(sent.with_revoke_sent(), sent, "one revoke at a time");
        }
    }

    #[test]
    fn a_downgrade_keeps_the_flags_and_answers_the_revoke() {
        for state in GrantState::ALL {
            let down = state.downgraded();
            match state.grant_mode() {
                Some(EX) => {
                    assert_eq!(down.grant_mode(), Some(SH), "{state:?}");
                    assert_eq!(down.is_cached(), state.is_cached());
                    assert_eq!(down.retains(), state.retains());
                    assert!(!down.revoke_outstanding());
                }
                _ => assert_eq!(down, state, "{state:?}"),
            }
        }
    }

    #[test]
    fn conversions_keep_what_the_old_views_can_say() {
        for state in GrantState::ALL {
            let plain = state.plain();
            assert_eq!(plain.grant_mode(), state.grant_mode());
            assert_eq!(plain.ticket_mode(), state.ticket_mode());
            assert!(!plain.is_cached() && !plain.retains());
            // A claim restores the plain state, which claims again the same way.
            assert_eq!(GrantState::from_held(state.held()), plain, "{state:?}");
        }
        // The plain grants keep the two-bit grid's codes (1 exclusive, 2 shared).
        assert_eq!((Exclusive.bits(), Shared.bits()), (1, 2));
    }
}
