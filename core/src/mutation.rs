//! Mutation points: bugs the simulators once found, which a test can put back at run time to
//! prove that a recorded seed still finds its bug (and that the simulators find it at all).
//!
//! A point is a condition written at the place the fix lives, `if dlock_core::mutated!(Name)
//! { … }` or `… && !dlock_core::mutated!(Name)`, that is true only while a test has switched
//! that mutation on for its thread. The module exists only with the `sim-mutations` feature,
//! which only `dlock-tests` enables: without it [`mutated!`](crate::mutated) is the literal
//! `false`, nothing of this module is compiled, and the point costs nothing.
//!
//! Cargo unifies features across a build, so `cargo test --workspace` compiles every crate
//! against a `dlock-core` that has the feature. That is why the switch is per thread and off
//! unless a test turns it on: the test harness runs tests side by side on several threads, and
//! a test proving that a seed fails with its bug back must not make the tests beside it fail.
//! An inactive point is one thread-local load on a cold path (a recovering server's merge, a
//! client's re-registration). A thread-local needs `std`, which this feature brings in; it
//! holds a `Cell<u32>` initialised as a constant, so it allocates nothing.
//!
//! | mutation           | where                                | puts back                                                                                  |
//! |--------------------|--------------------------------------|--------------------------------------------------------------------------------------------|
//! | `MergeClaimOwner`  | `server/recovery.rs`, `merge_claim`  | a later exclusive RW claim displaces one already accepted (the owner check is dropped)      |
//! | `ClientLeaseLapse` | `dlock-transport`, `Client::reinit` (`client/control.rs`) | a client silent past its lease re-claims, on a replacement, grants the old server freed     |
//! | `FairClaimServing` | `server/recovery.rs`, `merge_fair`   | fair readers re-claimed newest first leave `ns` past the oldest one's ticket (the lock wedges) |
//! | `FairClaimExpired` | `server/recovery.rs`, `merge_claim`  | a fair grant that ran out is restored, and an extend revives it under an older token than its successor's |
//! | `LapseWakesWaiters` | `server/revokes.rs`, `judge_holders` | a cached grant lapsed inside a request's lock command retries the lock's waiters there: a waiter being retried is retried again inside its own retry and answered twice |
//! | `TrustNoBound`     | `manager/trust.rs`, `take_overflow`  | a stream client trusts its cached grants however long no data request was answered (the stale report is never made) |
//! | `CacheUsesRevoked` | `manager/cache.rs`, `acquire`        | a revoke read and not yet answered does not stop new local users of the grant |
//! | `DowngradeStaysExclusive` | `client/mod.rs`, `LocalLock::apply` | a record whose downgrade succeeded still says it holds the lock exclusively |
//! | `StreamKeepsParked` | `server/route.rs`, `Route::leave_stream` | a closed stream's parked request keeps its route and is not cancelled (`stream_closed` alone: a data connection lost while the control connection lives) |
//! | `OverflowDropped`  | `dlock-transport`, `Client::poll_events` (`client/events.rs`) | an overflow the connection reports (events lost) is not passed on: the client goes on using grants whose revokes it lost |
//! | `DeadWriterKeepsValue` | `server/clients.rs`, `release_grant` | an exclusive holder gone without an unlock (death, deinit) leaves the lock's value block valid (the Linux DLM rule of `manager/value.rs` dropped) |
//! | `ReconnectKeepsTrust` | `dlock-transport`, `Client::reinit` (`client/control.rs`) | a client that opened its connections again goes on trusting the cached grants it held (`manager/trust.rs`, rule 2 dropped): it hands them out locally although revokes on the old connection may be lost |
//! | `DowngradeDropsBlock` | `dlock-transport`, `CachedLocks`' `State::send` (`client/cached/exchange.rs`) | a cached lock's downgrade is sent without the value block its writer set: the server keeps the block from before, while the writer's readers read the new one |
//!
//! The model clients of `dlock-tests` mirror the transport client's registration protocol, so
//! their copy of a client rule reads the same switch.

extern crate std;

use core::cell::Cell;
use core::fmt;

/// A named mutation point (see the module doc for where each one is).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Mutation {
    /// `merge_claim`, RW exclusive: the claim is merged even when another client's claim was
    /// accepted first.
    MergeClaimOwner = 0,
    /// `Client::reinit`: a client whose lease lapsed still re-claims its grants from a
    /// replacement server.
    ClientLeaseLapse = 1,
    /// `merge_fair`, shared: the serving counter stays where the first claim put it.
    FairClaimServing = 2,
    /// `merge_claim`, fair: a grant with no time left is restored.
    FairClaimExpired = 3,
    /// `judge_holders`: the waiters of a lock whose grant lapsed are retried at once
    /// (`wake_slot_waiters`), in the middle of the command that lapsed it.
    LapseWakesWaiters = 4,
    /// `take_overflow`: the bound on trusting cached grants never passes.
    TrustNoBound = 5,
    /// `CachedLock::acquire`: a pending revoke lets new local users in.
    CacheUsesRevoked = 6,
    /// `LocalLock::apply`, a downgrade's success: the record stays exclusive.
    DowngradeStaysExclusive = 7,
    /// `Client::poll_events`: an overflow read off the connection is dropped.
    OverflowDropped = 8,
    /// `Route::leave_stream`: the route over a closed stream is kept, its request not cancelled.
    StreamKeepsParked = 9,
    /// `release_grant`: an exclusive grant given up for its gone holder keeps the block valid.
    DeadWriterKeepsValue = 10,
    /// `Client::reinit`: the trust in cached grants survives the broken connection.
    ReconnectKeepsTrust = 11,
    /// `CachedLocks`' `State::send`: a downgrade writes no block.
    DowngradeDropsBlock = 12,
}

impl Mutation {
    /// Every mutation point.
    pub const ALL: [Mutation; 13] = [
        Mutation::MergeClaimOwner,
        Mutation::ClientLeaseLapse,
        Mutation::FairClaimServing,
        Mutation::FairClaimExpired,
        Mutation::LapseWakesWaiters,
        Mutation::TrustNoBound,
        Mutation::CacheUsesRevoked,
        Mutation::DowngradeStaysExclusive,
        Mutation::OverflowDropped,
        Mutation::StreamKeepsParked,
        Mutation::DeadWriterKeepsValue,
        Mutation::ReconnectKeepsTrust,
        Mutation::DowngradeDropsBlock,
    ];

    /// The mutation's name, as [`Mutation::from_name`] reads it.
    pub const fn name(self) -> &'static str {
        match self {
            Mutation::MergeClaimOwner => "MergeClaimOwner",
            Mutation::ClientLeaseLapse => "ClientLeaseLapse",
            Mutation::FairClaimServing => "FairClaimServing",
            Mutation::FairClaimExpired => "FairClaimExpired",
            Mutation::LapseWakesWaiters => "LapseWakesWaiters",
            Mutation::TrustNoBound => "TrustNoBound",
            Mutation::CacheUsesRevoked => "CacheUsesRevoked",
            Mutation::DowngradeStaysExclusive => "DowngradeStaysExclusive",
            Mutation::OverflowDropped => "OverflowDropped",
            Mutation::StreamKeepsParked => "StreamKeepsParked",
            Mutation::DeadWriterKeepsValue => "DeadWriterKeepsValue",
            Mutation::ReconnectKeepsTrust => "ReconnectKeepsTrust",
            Mutation::DowngradeDropsBlock => "DowngradeDropsBlock",
        }
    }

    /// The mutation named `name` (as [`Mutation::name`] writes it).
    pub fn from_name(name: &str) -> Option<Mutation> {
        Mutation::ALL.into_iter().find(|m| m.name() == name)
    }

    const fn bit(self) -> u32 {
        1 << self as u8
    }
}

impl fmt::Display for Mutation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

std::thread_local! {
    /// The mutations switched on for this thread, one bit each.
    static ACTIVE: Cell<u32> = const { Cell::new(0) };
}

/// Whether mutation `m` is switched on for this thread.
#[inline]
pub fn active(m: Mutation) -> bool {
    ACTIVE.with(|a| a.get() & m.bit() != 0)
}

/// Runs `f` with mutation `m` switched on for this thread (and every other one off), and
/// switches them all off again afterwards, also if `f` panics.
pub fn with<R>(m: Mutation, f: impl FnOnce() -> R) -> R {
    /// Switches everything off when dropped.
    struct Off;
    impl Drop for Off {
        fn drop(&mut self) {
            ACTIVE.with(|a| a.set(0));
        }
    }
    ACTIVE.with(|a| a.set(m.bit()));
    let _off = Off;
    f()
}

/// Whether the mutation point `$name` ([`Mutation`]) is switched on for this thread; the
/// literal `false` in a build without the `sim-mutations` feature.
#[macro_export]
macro_rules! mutated {
    ($name:ident) => {
        $crate::mutation::active($crate::mutation::Mutation::$name)
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mutation_is_on_only_inside_with_and_only_on_its_thread() {
        assert!(!mutated!(MergeClaimOwner));
        with(Mutation::MergeClaimOwner, || {
            assert!(mutated!(MergeClaimOwner));
            assert!(!mutated!(ClientLeaseLapse));
            let other = std::thread::spawn(|| mutated!(MergeClaimOwner));
            assert!(!other.join().unwrap(), "another thread sees it off");
        });
        assert!(!mutated!(MergeClaimOwner));
        let caught = std::panic::catch_unwind(|| {
            with(Mutation::ClientLeaseLapse, || panic!("a failing run"));
        });
        assert!(caught.is_err());
        assert!(!mutated!(ClientLeaseLapse), "off again after a panic");
    }

    #[test]
    fn names_read_back() {
        for m in Mutation::ALL {
            assert_eq!(Mutation::from_name(m.name()), Some(m));
        }
        assert_eq!(Mutation::from_name("merge_claim_owner"), None);
    }
}
