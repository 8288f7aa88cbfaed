//! The reader-writer lock: one exclusive holder or many shared holders, no expiry.
//!
//! Algorithm: the reference's `lock_memory.cpp` (§2.2 of `shared/reference/dlock-reference.md`),
//! with one fix. The reference keeps no identity for readers, so any client can decrement the
//! shared count; here the server tracks which clients hold a shared grant and passes that in, so
//! a shared unlock from a client that holds none fails, and a client gets at most one shared
//! grant per lock (its re-entrancy is counted on the client, as in the reference).
//!
//! # Layout (16 bytes)
//!
//! | bits    | field      | meaning                                                      |
//! |---------|------------|--------------------------------------------------------------|
//! | 0..32   | `owner`    | exclusive holder's client id; 0 = free or shared              |
//! | 32..64  | `readers`  | number of shared grants                                      |
//! | 64..128 | `since_ms` | tick of the first acquisition of the current hold (0 = free)  |
//!
//! `owner != 0` implies `readers == 0`.
//!
//! # Transitions
//!
//! | state                | operation                     | new state                     | status        |
//! |----------------------|-------------------------------|-------------------------------|---------------|
//! | free                 | try_exclusive(c)              | `{c, 0, now}`                  | Success       |
//! | exclusive or shared  | try_exclusive(c)              | unchanged                     | Fail          |
//! | owner == c           | unlock_exclusive(c)           | free                          | Success       |
//! | owner != c           | unlock_exclusive(c)           | unchanged                     | Fail          |
//! | free or shared       | try_shared(c), c not a reader | readers + 1 (since = now if 0) | Success       |
//! | shared, c a reader   | try_shared(c)                 | unchanged                     | AlreadyLocked |
//! | exclusive            | try_shared(c)                 | unchanged                     | Fail          |
//! | shared, c a reader   | unlock_shared(c)              | readers − 1 (free at 0)        | Success       |
//! | anything else        | unlock_shared(c)              | unchanged                     | Fail          |
//! | any                  | extend                        | unchanged                     | Einval        |
//! | owner == c           | downgrade(c)                  | `{0, 1, since}`                | Success       |
//! | owner != c           | downgrade(c)                  | unchanged                     | Fail          |
//!
//! Writers are not prioritised (as in the reference): a stream of readers can starve a writer;
//! the fair lock is the kind that orders them.

use bitfield_struct::bitfield;

use super::{Effect, Outcome};
use crate::ids::{ClientId, Mode};
use crate::status::Status;

/// The reader-writer lock word.
#[bitfield(u128)]
#[derive(PartialEq, Eq)]
pub struct RwWord {
    /// Exclusive holder; 0 when free or shared.
    pub owner: u32,
    /// Number of shared grants.
    pub readers: u32,
    /// Tick of the first acquisition of the current hold; 0 when free.
    pub since_ms: u64,
}

static_assertions::assert_eq_size!(RwWord, u128);

impl RwWord {
    /// Whether nobody holds the lock in any mode.
    #[inline]
    pub const fn is_free(self) -> bool {
        self.owner() == 0 && self.readers() == 0
    }
}

/// Take the lock exclusively if nobody holds it in any mode.
#[inline]
pub fn try_exclusive(w: RwWord, me: ClientId, now_ms: u64) -> Outcome<RwWord> {
    if !w.is_free() {
        return Outcome::refused(w, Status::Fail);
    }
    let state = RwWord::new().with_owner(me.get()).with_since_ms(now_ms);
    Outcome::ok(
        state,
        Effect::Granted {
            mode: Mode::Exclusive,
            preempted: false,
        },
    )
}

/// Release an exclusive grant; only its holder may.
#[inline]
pub fn unlock_exclusive(w: RwWord, me: ClientId) -> Outcome<RwWord> {
    if w.owner() != me.get() {
        return Outcome::refused(w, Status::Fail);
    }
    Outcome::ok(RwWord::new(), Effect::Released(Mode::Exclusive))
}

/// Take a shared grant if no writer holds the lock. `is_reader` says whether the caller already
/// holds a shared grant on this lock (the server's per-client record).
#[inline]
pub fn try_shared(w: RwWord, is_reader: bool, now_ms: u64) -> Outcome<RwWord> {
    if w.owner() != 0 {
        return Outcome::refused(w, Status::Fail);
    }
    if is_reader {
        return Outcome::refused(w, Status::AlreadyLocked);
    }
    // Readers are bounded by the client table (one grant per client), far below u32::MAX; a
    // saturated count would be a broken invariant, so refuse rather than wrap.
    let Some(readers) = w.readers().checked_add(1) else {
        return Outcome::refused(w, Status::ServerNoResource);
    };
    let since = if w.readers() == 0 {
        now_ms
    } else {
        w.since_ms()
    };
    let state = w.with_readers(readers).with_since_ms(since);
    Outcome::ok(
        state,
        Effect::Granted {
            mode: Mode::Shared,
            preempted: false,
        },
    )
}

/// Give up a shared grant. Fails unless the caller holds one (`is_reader`).
#[inline]
pub fn unlock_shared(w: RwWord, is_reader: bool) -> Outcome<RwWord> {
    if !is_reader || w.owner() != 0 || w.readers() == 0 {
        return Outcome::refused(w, Status::Fail);
    }
    let readers = w.readers() - 1;
    let since = if readers == 0 { 0 } else { w.since_ms() };
    Outcome::ok(
        w.with_readers(readers).with_since_ms(since),
        Effect::Released(Mode::Shared),
    )
}

/// Turn an exclusive grant into a shared one in place (a revoked cached holder that still
/// reads, `LockOp::Downgrade`): the holder becomes the only reader, so readers waiting may
/// join it and a writer keeps waiting. The hold's start is kept: it is the same hold.
#[inline]
pub fn downgrade(w: RwWord, me: ClientId) -> Outcome<RwWord> {
    if w.owner() != me.get() {
        return Outcome::refused(w, Status::Fail);
    }
    Outcome::ok(w.with_owner(0).with_readers(1), Effect::Downgraded)
}

/// RW locks have no expiry, so there is nothing to extend (the reference answers EINVAL too).
#[inline]
pub fn extend(w: RwWord) -> Outcome<RwWord> {
    Outcome::refused(w, Status::Einval)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn c(id: u32) -> ClientId {
        ClientId::new(id).unwrap()
    }

    /// The model: who holds it exclusively and which clients read, as a set.
    #[derive(Clone, Copy, Debug, Default, PartialEq)]
    struct Model {
        writer: u32,
        readers: u8, // bit i = client i reads
    }

    #[derive(Clone, Copy, Debug)]
    enum Op {
        TryEx(u32),
        UnlockEx(u32),
        TrySh(u32),
        UnlockSh(u32),
        Extend,
        Downgrade(u32),
    }

    fn model_apply(m: Model, op: Op) -> (Model, Status) {
        let bit = |c: u32| 1u8 << c;
        match op {
            Op::TryEx(c) if m.writer == 0 && m.readers == 0 => (
                Model {
                    writer: c,
                    readers: 0,
                },
                Status::Success,
            ),
            Op::TryEx(_) => (m, Status::Fail),
            Op::UnlockEx(c) if m.writer == c => (Model::default(), Status::Success),
            Op::UnlockEx(_) => (m, Status::Fail),
            Op::TrySh(_) if m.writer != 0 => (m, Status::Fail),
            Op::TrySh(c) if m.readers & bit(c) != 0 => (m, Status::AlreadyLocked),
            Op::TrySh(c) => (
                Model {
                    readers: m.readers | bit(c),
                    ..m
                },
                Status::Success,
            ),
            Op::UnlockSh(c) if m.readers & bit(c) != 0 => (
                Model {
                    readers: m.readers & !bit(c),
                    ..m
                },
                Status::Success,
            ),
            Op::UnlockSh(_) => (m, Status::Fail),
            Op::Extend => (m, Status::Einval),
            Op::Downgrade(c) if m.writer == c => (
                Model {
                    writer: 0,
                    readers: bit(c),
                },
                Status::Success,
            ),
            Op::Downgrade(_) => (m, Status::Fail),
        }
    }

    /// Applies `op` to the word, feeding it the per-client reader record the server would keep.
    fn apply(w: RwWord, readers: &mut u8, op: Op, now: u64) -> Outcome<RwWord> {
        let is_reader = |c: u32| *readers & (1 << c) != 0;
        let out = match op {
            Op::TryEx(c) => try_exclusive(w, super::ClientId::new(c).unwrap(), now),
            Op::UnlockEx(who) => unlock_exclusive(w, c(who)),
            Op::TrySh(who) => try_shared(w, is_reader(who), now),
            Op::UnlockSh(who) => unlock_shared(w, is_reader(who)),
            Op::Extend => extend(w),
            Op::Downgrade(who) => downgrade(w, c(who)),
        };
        match (op, out.effect) {
            (Op::TrySh(who), Effect::Granted { .. }) => *readers |= 1 << who,
            (Op::Downgrade(who), Effect::Downgraded) => *readers |= 1 << who,
            (Op::UnlockSh(who), Effect::Released(_)) => *readers &= !(1 << who),
            _ => {}
        }
        out
    }

    fn model_word(m: Model, since: u64) -> RwWord {
        RwWord::new()
            .with_owner(m.writer)
            .with_readers(m.readers.count_ones())
            .with_since_ms(if m.writer != 0 || m.readers != 0 {
                since
            } else {
                0
            })
    }

    #[test]
    fn every_state_and_operation_matches_the_model() {
        let since = 7;
        let states = [
            Model::default(),
            Model {
                writer: 1,
                readers: 0,
            },
            Model {
                writer: 2,
                readers: 0,
            },
            Model {
                writer: 0,
                readers: 0b0010,
            },
            Model {
                writer: 0,
                readers: 0b0110,
            },
        ];
        let ops = [
            Op::TryEx(1),
            Op::UnlockEx(1),
            Op::TrySh(1),
            Op::TrySh(3),
            Op::UnlockSh(1),
            Op::UnlockSh(3),
            Op::Extend,
            Op::Downgrade(1),
            Op::Downgrade(2),
        ];
        for m in states {
            for op in ops {
                let mut readers = m.readers;
                let out = apply(model_word(m, since), &mut readers, op, since);
                let (m2, status) = model_apply(m, op);
                assert_eq!(out.status, status, "state {m:?} op {op:?}");
                assert_eq!(out.state, model_word(m2, since), "state {m:?} op {op:?}");
                assert_eq!(readers, m2.readers, "state {m:?} op {op:?}");
            }
        }
    }

    #[test]
    fn shared_unlock_from_non_holder_fails() {
        let w = try_shared(RwWord::new(), false, 1).state;
        let out = unlock_shared(w, false);
        assert_eq!(out.status, Status::Fail);
        assert_eq!(out.state.readers(), 1);
    }

    /// The word itself must count the reader the caller's record says it is: a record that
    /// disagrees with the word (a broken invariant, which `check_invariants` names) is refused,
    /// never counted below zero or taken out of a writer's grant.
    #[test]
    fn a_shared_unlock_the_word_does_not_count_is_refused() {
        let writer = try_exclusive(RwWord::new(), c(1), 5).state;
        for w in [RwWord::new(), writer] {
            let out = unlock_shared(w, true);
            assert_eq!((out.status, out.state), (Status::Fail, w), "{w:?}");
        }
    }

    #[test]
    fn since_is_the_first_acquisition_and_clears_when_free() {
        let w = try_shared(RwWord::new(), false, 10).state;
        let w = try_shared(w, false, 20).state;
        assert_eq!(w.since_ms(), 10);
        let w = unlock_shared(w, true).state;
        assert_eq!(w.since_ms(), 10);
        let w = unlock_shared(w, true).state;
        assert_eq!(w, RwWord::new());
    }

    fn op_strategy() -> impl Strategy<Value = Op> {
        let who = 1u32..5;
        prop_oneof![
            who.clone().prop_map(Op::TryEx),
            who.clone().prop_map(Op::UnlockEx),
            who.clone().prop_map(Op::TrySh),
            who.clone().prop_map(Op::UnlockSh),
            who.prop_map(Op::Downgrade),
            Just(Op::Extend),
        ]
    }

    proptest! {
        /// Random sequences from four clients: the word tracks the model, a writer never
        /// coexists with a reader, and the reader count equals the clients holding shared grants.
        #[test]
        fn random_sequences_keep_writers_and_readers_apart(ops in proptest::collection::vec(op_strategy(), 1..300)) {
            let mut w = RwWord::new();
            let mut m = Model::default();
            let mut readers = 0u8;
            for (now, op) in ops.into_iter().enumerate() {
                let out = apply(w, &mut readers, op, now as u64 + 1);
                let (m2, status) = model_apply(m, op);
                prop_assert_eq!(out.status, status);
                w = out.state;
                m = m2;
                prop_assert_eq!(w.owner(), m.writer);
                prop_assert_eq!(w.readers(), m.readers.count_ones());
                prop_assert_eq!(readers, m.readers);
                prop_assert!(w.owner() == 0 || w.readers() == 0);
            }
        }
    }
}
