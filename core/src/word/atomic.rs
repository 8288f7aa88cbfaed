//! The atomic lock: exclusive, with an expiry.
//!
//! Algorithm: the reference's `lock_memory.cpp` (§2.1 of `shared/reference/dlock-reference.md`),
//! with the expiry on the server's monotonic millisecond tick instead of wall-clock seconds.
//!
//! # Layout (16 bytes)
//!
//! | bits     | field       | meaning                                         |
//! |----------|-------------|-------------------------------------------------|
//! | 0..32    | `owner`     | client id of the holder, 0 when never taken     |
//! | 32..64   | reserved    | zero                                            |
//! | 64..128  | `expiry_ms` | tick after which the grant no longer holds      |
//!
//! The lock is *free* when `owner == 0` or `now_ms > expiry_ms`.
//!
//! # Transitions
//!
//! | state                   | operation        | new state                          | status  |
//! |-------------------------|------------------|------------------------------------|---------|
//! | free (or expired)       | trylock(c, t)    | `{c, now + t}`                      | Success |
//! | held by anyone, live    | trylock(c, t)    | unchanged                          | Fail    |
//! | owner == c              | unlock(c)        | `{0, 0}`                            | Success |
//! | owner != c              | unlock(c)        | unchanged                          | Fail    |
//! | owner == c              | extend(c, t)     | `{c, max(expiry, now + t)}`         | Success |
//! | owner != c              | extend(c, t)     | unchanged                          | Fail    |
//!
//! Taking an expired lock from another client *is* the preemption: the grant reports
//! `preempted`. As in the reference, unlock and extend check ownership but not expiry, so an
//! owner can still extend an expired lock nobody has taken (the lease is resurrected), and
//! `extend(c, 0)` only validates ownership. Trylock does not special-case "already mine": a
//! client re-entering its own lock sends an extend.

use bitfield_struct::bitfield;

use super::{Effect, Outcome, deadline};
use crate::ids::{ClientId, Mode};
use crate::status::Status;

/// The atomic lock word.
#[bitfield(u128)]
#[derive(PartialEq, Eq)]
pub struct AtomicWord {
    /// Holder's client id; 0 = never taken (or released).
    pub owner: u32,
    #[bits(32)]
    __: u32,
    /// Absolute tick (ms) after which the grant lapses.
    pub expiry_ms: u64,
}

static_assertions::assert_eq_size!(AtomicWord, u128);

impl AtomicWord {
    /// Whether a live grant is held at `now_ms`.
    #[inline]
    pub const fn is_held(self, now_ms: u64) -> bool {
        self.owner() != 0 && now_ms <= self.expiry_ms()
    }
}

/// Take the lock for `me` until `now + expire_ms` if it is free or expired.
#[inline]
pub fn try_lock(w: AtomicWord, me: ClientId, expire_ms: u32, now_ms: u64) -> Outcome<AtomicWord> {
    if w.is_held(now_ms) {
        return Outcome::refused(w, Status::Fail);
    }
    let preempted = w.owner() != 0;
    let state = AtomicWord::new()
        .with_owner(me.get())
        .with_expiry_ms(deadline(now_ms, expire_ms));
    Outcome::ok(
        state,
        Effect::Granted {
            mode: Mode::Exclusive,
            preempted,
        },
    )
}

/// Release the lock; only the owner may (expired or not).
#[inline]
pub fn unlock(w: AtomicWord, me: ClientId) -> Outcome<AtomicWord> {
    if w.owner() != me.get() {
        return Outcome::refused(w, Status::Fail);
    }
    Outcome::ok(AtomicWord::new(), Effect::Released(Mode::Exclusive))
}

/// Push the expiry to at least `now + expire_ms`; only the owner may. `expire_ms == 0` only
/// validates ownership.
#[inline]
pub fn extend(w: AtomicWord, me: ClientId, expire_ms: u32, now_ms: u64) -> Outcome<AtomicWord> {
    if w.owner() != me.get() {
        return Outcome::refused(w, Status::Fail);
    }
    if expire_ms == 0 {
        return Outcome::ok(w, Effect::Extended);
    }
    let expiry = w.expiry_ms().max(deadline(now_ms, expire_ms));
    Outcome::ok(w.with_expiry_ms(expiry), Effect::Extended)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn c(id: u32) -> ClientId {
        ClientId::new(id).unwrap()
    }

    fn word(owner: u32, expiry_ms: u64) -> AtomicWord {
        AtomicWord::new()
            .with_owner(owner)
            .with_expiry_ms(expiry_ms)
    }

    /// The reference model: the lock as "who holds it until when", written independently of the
    /// bit layout.
    #[derive(Clone, Copy, Debug, PartialEq)]
    struct Model {
        owner: u32,
        expiry: u64,
    }

    #[derive(Clone, Copy, Debug)]
    enum Op {
        Try(u32, u32),
        Unlock(u32),
        Extend(u32, u32),
    }

    fn model_apply(m: Model, op: Op, now: u64) -> (Model, Status) {
        let live = m.owner != 0 && now <= m.expiry;
        match op {
            Op::Try(_, _) if live => (m, Status::Fail),
            Op::Try(who, t) => (
                Model {
                    owner: who,
                    expiry: now + t as u64,
                },
                Status::Success,
            ),
            Op::Unlock(who) if who == m.owner => (
                Model {
                    owner: 0,
                    expiry: 0,
                },
                Status::Success,
            ),
            Op::Extend(who, 0) if who == m.owner => (m, Status::Success),
            Op::Extend(who, t) if who == m.owner => (
                Model {
                    owner: who,
                    expiry: m.expiry.max(now + t as u64),
                },
                Status::Success,
            ),
            Op::Unlock(_) | Op::Extend(_, _) => (m, Status::Fail),
        }
    }

    fn apply(w: AtomicWord, op: Op, now: u64) -> Outcome<AtomicWord> {
        match op {
            Op::Try(who, t) => try_lock(w, c(who), t, now),
            Op::Unlock(who) => unlock(w, c(who)),
            Op::Extend(who, t) => extend(w, c(who), t, now),
        }
    }

    #[test]
    fn every_state_and_operation_matches_the_model() {
        let now = 1_000;
        // States: free, held by 1 (live), held by 1 (expired), held by 2 (live).
        let states = [(0, 0), (1, 5_000), (1, 999), (2, 1_000)];
        let ops = [
            Op::Try(1, 100),
            Op::Try(2, 100),
            Op::Unlock(1),
            Op::Unlock(2),
            Op::Extend(1, 0),
            Op::Extend(1, 100),
            Op::Extend(1, 10_000),
            Op::Extend(2, 100),
        ];
        for (owner, expiry) in states {
            for op in ops {
                let (m, status) = model_apply(Model { owner, expiry }, op, now);
                let out = apply(word(owner, expiry), op, now);
                assert_eq!(out.status, status, "state ({owner}, {expiry}) op {op:?}");
                assert_eq!(
                    (out.state.owner(), out.state.expiry_ms()),
                    (m.owner, m.expiry),
                    "state ({owner}, {expiry}) op {op:?}"
                );
            }
        }
    }

    #[test]
    fn expired_lock_is_taken_by_another_client_as_a_preemption() {
        let out = try_lock(word(1, 10), c(2), 50, 11);
        assert_eq!(out.status, Status::Success);
        assert_eq!(
            out.effect,
            Effect::Granted {
                mode: Mode::Exclusive,
                preempted: true
            }
        );
        assert_eq!(out.state.owner(), 2);
        assert_eq!(out.state.expiry_ms(), 61);
    }

    #[test]
    fn lock_is_still_held_at_its_expiry_tick() {
        assert_eq!(try_lock(word(1, 10), c(2), 50, 10).status, Status::Fail);
    }

    #[test]
    fn failed_trylock_returns_the_current_word() {
        let w = word(7, 100);
        let out = try_lock(w, c(2), 50, 1);
        assert_eq!(out.state, w);
        assert_eq!(out.effect, Effect::None);
    }

    #[test]
    fn extend_never_shortens_and_zero_only_validates() {
        let w = word(1, 500);
        assert_eq!(extend(w, c(1), 10, 100).state.expiry_ms(), 500);
        assert_eq!(extend(w, c(1), 0, 100).state, w);
        assert_eq!(extend(w, c(1), 1_000, 100).state.expiry_ms(), 1_100);
    }

    #[test]
    fn huge_expiry_saturates_instead_of_wrapping() {
        let out = try_lock(AtomicWord::new(), c(1), u32::MAX, u64::MAX - 5);
        assert_eq!(out.state.expiry_ms(), u64::MAX);
    }

    fn op_strategy() -> impl Strategy<Value = Op> {
        let who = 1u32..4;
        prop_oneof![
            (who.clone(), 1u32..50).prop_map(|(w, t)| Op::Try(w, t)),
            who.clone().prop_map(Op::Unlock),
            (who, 0u32..50).prop_map(|(w, t)| Op::Extend(w, t)),
        ]
    }

    proptest! {
        /// Random sequences from three clients: the word tracks the model, and at no tick do two
        /// clients believe they hold a live grant.
        #[test]
        fn random_sequences_keep_mutual_exclusion(
            steps in proptest::collection::vec((op_strategy(), 0u64..20), 1..200)
        ) {
            let mut w = AtomicWord::new();
            let mut m = Model { owner: 0, expiry: 0 };
            let mut now = 0u64;
            // holder[i]: the tick until which client i was granted, by the replies it got.
            let mut granted_until = [None::<u64>; 4];
            for (op, dt) in steps {
                now += dt;
                let out = apply(w, op, now);
                let (m2, status) = model_apply(m, op, now);
                prop_assert_eq!(out.status, status);
                prop_assert_eq!((out.state.owner(), out.state.expiry_ms()), (m2.owner, m2.expiry));
                w = out.state;
                m = m2;
                match (op, out.effect) {
                    (Op::Try(who, _), Effect::Granted { .. }) | (Op::Extend(who, _), Effect::Extended) => {
                        granted_until[who as usize] = Some(w.expiry_ms());
                    }
                    (Op::Unlock(who), Effect::Released(_)) => granted_until[who as usize] = None,
                    _ => {}
                }
                // Clients that, by the replies they got, believe they hold a live grant now.
                let believers = granted_until.iter().filter(|g| matches!(g, Some(t) if now <= *t)).count();
                prop_assert!(believers <= 1);
                // Whoever the word names as a live holder was told so.
                if w.is_held(now) {
                    prop_assert!(granted_until[w.owner() as usize].is_some());
                }
            }
        }
    }
}
