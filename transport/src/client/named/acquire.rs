//! Taking, extending and giving back one lock's grants: the steps every typed handle and
//! guard is made of, each written once for a blocking caller and once for a future, with the
//! decisions between them shared.
//!
//! A request goes like this (the module doc of `named` has the why of each step):
//!
//! 1. take a turn on the client and settle it (`turn.rs`);
//! 2. if a guard of this handle holds the lock in a mode that excludes the one asked: a `try_`
//!    is `WouldBlock`; a wait gives the client back and waits for that guard (or its deadline);
//! 3. if the client's record holds a grant no guard stands for (an unlock that never reached
//!    the server), give it back first: a guard always stands for a grant made for it;
//! 4. ask the server: a trylock, or a lock that waits on the server (atomic and RW: at most one
//!    20 ms slice, then back to 1 with the client given back between; fair: the whole wait);
//! 5. a grant becomes a guard before anything else can happen (so a future dropped after it
//!    drops a guard, which unlocks).

use std::future::poll_fn;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use dlock_core::manager::value::ValueBlock;
use dlock_core::time::{MS_MAX, duration_to_ms};
use dlock_core::{LockKind, Mode, Status};

use super::guard::Held;
use super::kinds::Named;
use super::turn::Turn;
use super::turn::wait_in;
use super::{Connection, Error, Locks, Op, lease_ms, timer};
use crate::client::{AsyncOp, ErrorKind, Grant};

/// The longest server-side wait of one request for an atomic or RW lock; the handle's other
/// callers get the client between two such requests.
const WAIT_SLICE: Duration = Duration::from_millis(20);

/// The shortest server-side wait: a waiting request whose time is up still gives the server a
/// millisecond (zero would make it a trylock), as [`crate::client::Client::lock`] does.
const WAIT_MIN: Duration = Duration::from_millis(1);

/// What a request for a grant asks of the server.
#[derive(Clone, Copy, Debug)]
pub(super) struct Ask {
    pub(super) mode: Mode,
    /// The lease the request carries. An RW grant has no lease on the server, so RW requests
    /// carry the longest the wire can say: the client's record then never believes the grant
    /// over before the client's own lease is.
    lease_ms: u32,
    /// `None`: ask once (a `try_`); `Some`: wait up to this long on the server.
    wait: Option<Duration>,
}

impl Ask {
    /// One attempt for a grant of `lease` (`None`: an RW grant, which has none).
    pub(super) fn once(mode: Mode, lease: Option<Duration>) -> Result<Ask, Error> {
        Ask::new(mode, lease, None)
    }

    /// A request that waits up to `wait` on the server.
    pub(super) fn waiting(
        mode: Mode,
        lease: Option<Duration>,
        wait: Duration,
    ) -> Result<Ask, Error> {
        Ask::new(mode, lease, Some(wait))
    }

    fn new(mode: Mode, lease: Option<Duration>, wait: Option<Duration>) -> Result<Ask, Error> {
        let op = if wait.is_some() {
            Op::Lock
        } else {
            Op::TryLock
        };
        let lease_ms = match lease {
            Some(lease) => lease_ms(op, lease)?,
            None => u32::MAX,
        };
        Ok(Ask {
            mode,
            lease_ms,
            wait,
        })
    }

    fn op(&self) -> Op {
        if self.wait.is_some() {
            Op::Lock
        } else {
            Op::TryLock
        }
    }
}

impl<C: Connection> Named<C> {
    /// Takes a grant, blocking the thread (see the module doc).
    pub(super) fn acquire(self: &Arc<Self>, ask: Ask) -> Result<Held<C>, Error> {
        let locks = &self.locks;
        let mut turn = locks.turn();
        let deadline = ask.wait.map(|w| turn.client().now() + w.min(MS_MAX));
        loop {
            turn.settle();
            let now = turn.client().now();
            if turn.conflicts(self.id, ask.mode) {
                let left = conflict_wait(ask, deadline, now)?;
                drop(turn);
                if !locks.wait_release(self.id, ask.mode, left) {
                    return Err(ask.op().err(Status::Etimeout));
                }
                turn = locks.turn();
                continue;
            }
            if turn.stale(self.id) {
                forgotten(turn.client().unlock(self.id))?;
            }
            let answer = match self.server_wait(deadline, now) {
                None => turn.client().trylock(self.id, ask.mode, ask.lease_ms),
                Some(w) => turn.client().lock(self.id, ask.mode, ask.lease_ms, w),
            };
            if let Some(held) = self.after(&mut turn, ask, answer, deadline)? {
                return Ok(held);
            }
            // A slice ran out with time left: let the handle's other callers in first.
            drop(turn);
            std::thread::yield_now();
            turn = locks.turn();
        }
    }

    /// [`Named::acquire`] as a future: the same steps, waiting by returning `Pending`.
    pub(super) async fn acquire_async(self: &Arc<Self>, ask: Ask) -> Result<Held<C>, Error> {
        let locks = &self.locks;
        let mut turn = poll_fn(|cx| locks.poll_turn(cx)).await;
        let deadline = ask.wait.map(|w| turn.client().now() + w.min(MS_MAX));
        loop {
            poll_fn(|cx| turn.poll_settle(cx)).await;
            let now = turn.client().now();
            if turn.conflicts(self.id, ask.mode) {
                let left = conflict_wait(ask, deadline, now)?;
                drop(turn);
                let until = Instant::now() + left;
                let mut timed = false;
                let released =
                    poll_fn(|cx| locks.poll_release(self.id, ask.mode, until, &mut timed, cx));
                if !released.await {
                    return Err(ask.op().err(Status::Etimeout));
                }
                turn = poll_fn(|cx| locks.poll_turn(cx)).await;
                continue;
            }
            if turn.stale(self.id) {
                turn.expect(self.id, false);
                let unlocked = turn.client().lock_async(self.id, AsyncOp::Unlock).await;
                turn.answered();
                forgotten(unlocked)?;
            }
            let op = match self.server_wait(deadline, now) {
                None => AsyncOp::Lock(ask.mode, ask.lease_ms),
                Some(w) => AsyncOp::LockWait(ask.mode, ask.lease_ms, w),
            };
            turn.expect(self.id, true);
            let answer = turn.client().lock_async(self.id, op).await;
            turn.answered();
            // A grant is a guard from here: dropping this future later drops it, which unlocks.
            let next = self.after(&mut turn, ask, answer, deadline);
            poll_fn(|cx| turn.poll_flush(cx)).await;
            if let Some(held) = next? {
                return Ok(held);
            }
            drop(turn);
            yield_once().await;
            turn = poll_fn(|cx| locks.poll_turn(cx)).await;
        }
    }

    /// How long the server may hold this request: `None` for a `try_`; the whole wait left for
    /// a fair lock (its ticket must not be given back between slices); at most one slice
    /// otherwise.
    fn server_wait(&self, deadline: Option<Instant>, now: Instant) -> Option<Duration> {
        let left = deadline?.saturating_duration_since(now).max(WAIT_MIN);
        Some(match self.kind {
            LockKind::Fair => left,
            _ => left.min(WAIT_SLICE),
        })
    }

    /// What the server's `answer` means: a guard, `None` to ask again (a slice ran out with
    /// time left), or the error (a fair ticket it leaves stays the registration's: see "Fair
    /// locks and tickets" in the module doc).
    fn after(
        self: &Arc<Self>,
        turn: &mut Turn<C>,
        ask: Ask,
        answer: Result<Grant, Error>,
        deadline: Option<Instant>,
    ) -> Result<Option<Held<C>>, Error> {
        match answer {
            Ok(grant) => {
                turn.hold(self.id, ask.mode);
                let (token, value) = (grant.token, grant.value);
                Ok(Some(Held::new(Arc::clone(self), ask.mode, token, value)))
            }
            Err(e) => {
                // A slice that ran out, busy or behind a dead client's retained grant
                // (answered `LockRetained` at the slice's end): ask again while time is left.
                let sliced = self.kind != LockKind::Fair
                    && matches!(e.status(), Status::Etimeout | Status::LockRetained);
                let now = turn.client().now();
                match deadline {
                    Some(d) if sliced && now < d => Ok(None),
                    _ => Err(e),
                }
            }
        }
    }

    /// Gives one guard's grant back, writing `write` as the lock's value block (an exclusive
    /// guard's `set_value`), and waits for the answer.
    pub(super) fn unlock(&self, write: Option<ValueBlock>) -> Result<(), Error> {
        let mut turn = self.locks.turn();
        turn.settle();
        turn.unhold(self.id);
        turn.stage(self.id, write);
        turn.client().unlock(self.id).map(drop)
    }

    /// [`Named::unlock`] as a future. `held` is disarmed only once the unlock is this future's
    /// to send: dropped before that, the guard's own drop sends it.
    pub(super) async fn unlock_async(&self, held: &mut Held<C>) -> Result<(), Error> {
        let locks = &self.locks;
        let mut turn = poll_fn(|cx| locks.poll_turn(cx)).await;
        poll_fn(|cx| turn.poll_settle(cx)).await;
        held.disarm();
        turn.unhold(self.id);
        turn.stage(self.id, held.write());
        turn.expect(self.id, false);
        let answer = turn.client().lock_async(self.id, AsyncOp::Unlock).await;
        turn.answered();
        poll_fn(|cx| turn.poll_flush(cx)).await;
        answer.map(drop)
    }

    /// Extends one guard's grant, held in `mode`, to at least `lease` from now (zero only
    /// checks that it is still held).
    pub(super) fn extend(&self, mode: Mode, lease: Duration) -> Result<(), Error> {
        let mut turn = self.locks.turn();
        turn.settle();
        turn.client()
            .lock_extend(self.id, mode, duration_to_ms(lease))
            .map(drop)
    }
}

/// The answer to giving back a stale grant (see [`Turn::stale`]): done, also when the server
/// says it is not held any more (its lease ran out meanwhile: the record has forgotten it
/// now), or the error that stopped it.
pub(super) fn forgotten<T>(unlocked: Result<T, Error>) -> Result<(), Error> {
    match unlocked {
        Err(e) if e.kind() != ErrorKind::NotHeld => Err(e),
        _ => Ok(()),
    }
}

/// How long a request may wait for a guard of its own handle: `WouldBlock` for a `try_`,
/// `TimedOut` when no time is left.
fn conflict_wait(ask: Ask, deadline: Option<Instant>, now: Instant) -> Result<Duration, Error> {
    let Some(deadline) = deadline else {
        return Err(ask.op().err(Status::Fail));
    };
    match deadline.checked_duration_since(now) {
        Some(left) if !left.is_zero() => Ok(left),
        _ => Err(ask.op().err(Status::Etimeout)),
    }
}

/// Returns `Pending` once (having asked to be polled again): lets other tasks of the executor
/// take the client before this one asks again.
async fn yield_once() {
    let mut yielded = false;
    poll_fn(|cx| {
        if yielded {
            return Poll::Ready(());
        }
        yielded = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    })
    .await;
}

impl<C: Connection> Locks<C> {
    /// Waits up to `left` for this handle's guards to stop excluding `mode` on `id`; false when
    /// the time ran out first. (A local wait, measured on the real clock.)
    fn wait_release(&self, id: dlock_core::LockId, mode: Mode, left: Duration) -> bool {
        let until = Instant::now() + left;
        let mut st = self.state();
        while st.conflicts(id, mode) {
            let Some(left) = until.checked_duration_since(Instant::now()) else {
                return false;
            };
            st = self
                .shared
                .changed
                .wait_timeout(st, left)
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
        }
        true
    }

    /// [`Locks::wait_release`] for a future: ready with true once no guard excludes `mode` on
    /// `id`, with false at `until`; the timer wakes the task then (`timed`: asked already).
    fn poll_release(
        &self,
        id: dlock_core::LockId,
        mode: Mode,
        until: Instant,
        timed: &mut bool,
        cx: &mut Context<'_>,
    ) -> Poll<bool> {
        let mut st = self.state();
        if !st.conflicts(id, mode) {
            return Poll::Ready(true);
        }
        if Instant::now() >= until {
            return Poll::Ready(false);
        }
        wait_in(&mut st.wakers, cx.waker());
        drop(st);
        if !*timed {
            *timed = true;
            timer::wake_at(until, cx.waker());
        }
        Poll::Pending
    }
}
