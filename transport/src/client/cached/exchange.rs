//! One cached lock's exchange with the server: an acquisition, a give-back or a downgrade sent
//! through the client ([`drive_op`]'s loop), each reply handed to the lock's record, the value
//! block a local writer set written with the end of its turn, an op the server did not answer
//! left owed for the next look, and the entry counted again after it ([`State::settle`]).
//! Every acquisition, give-back and downgrade a [`super::CachedLocks`] sends goes through
//! [`State::drive`].

use std::time::Duration;

use dlock_core::manager::cache::{Release, Reply, ServerOp};
use dlock_core::{LockId, Mode, Status};

use super::drive::drive_op;
use super::state::State;
use crate::client::Connection;
use crate::client::error::{Error, Op};

impl<C: Connection> State<C> {
    /// A local user of `id` in `mode` is done: kept cached, or given back if a revoke waits
    /// for it.
    pub(super) fn release(&mut self, id: LockId, mode: Mode) {
        let Some(e) = self.entries.get_mut(&id) else {
            return;
        };
        if let Release::Send(op) = e.cache.release(mode) {
            drop(self.drive(id, op, Duration::ZERO));
        }
    }

    /// Sends `op` for `id` and hands the reply to the record, again while the record says it is
    /// owed ([`drive_op`]: up to [`SENDS_MAX`](super::SENDS_MAX) times; then at the next look). The
    /// record's answer, and the error of a refused acquisition or of the send that left an op owed.
    pub(super) fn drive(
        &mut self,
        id: LockId,
        op: ServerOp,
        wait: Duration,
    ) -> (Reply, Option<Error>) {
        let done = self.exchange(id, op, wait);
        self.settle(id);
        done
    }

    /// [`State::drive`]'s exchange, before the entry is counted again.
    fn exchange(&mut self, id: LockId, op: ServerOp, wait: Duration) -> (Reply, Option<Error>) {
        // Whether the last send was a grant the server made plain: it goes with the reply;
        // and which operation it was, to name in an error.
        let (mut err, mut plain, mut last) = (None, false, op);
        let Ok(done) = drive_op(
            self,
            op,
            |st, op| {
                let (status, p, e) = st.send(id, op, wait);
                (err, plain, last) = (e, p, op);
                let token = st.entries.get(&id).expect("a handle's entry").token.0;
                Ok::<_, std::convert::Infallible>((status, token))
            },
            |st| &mut st.entries.get_mut(&id).expect("a handle's entry").cache,
        );
        match done.reply {
            Reply::Lost => {
                tracing::warn!(lock = ?id, "dlock: a cached lock's readers lost its grant");
            }
            // Made plain by the server (a contended lock): the last guard's drop unlocks it.
            Reply::Granted if plain => {
                let e = self.entries.get_mut(&id).expect("checked");
                e.cache.granted_plain();
            }
            Reply::Send(owed) => {
                let e = self.entries.get_mut(&id).expect("checked");
                (e.owed, e.failed) = (Some(owed), done.status);
                self.watch(id);
                let named = match last {
                    ServerOp::Downgrade => Op::Downgrade,
                    ServerOp::Acquire(_) | ServerOp::GiveBack(_) => Op::Unlock,
                };
                let err = err.unwrap_or_else(|| named.err(done.status));
                return (Reply::Send(owed), Some(err));
            }
            _ => {}
        }
        (done.reply, err)
    }

    /// One message for `id`: the status the server answered, whether it granted the lock plain
    /// (`Grant::plain`), and the error when it is not a success.
    fn send(&mut self, id: LockId, op: ServerOp, wait: Duration) -> (Status, bool, Option<Error>) {
        let e = *self.entries.get(&id).expect("a handle's entry");
        let done = match op {
            ServerOp::Acquire(mode) => {
                let lease_ms = duration_ms(self.client.lease());
                let got = if wait.is_zero() {
                    self.client.trylock(id, mode, lease_ms)
                } else {
                    self.client.lock(id, mode, lease_ms, wait)
                };
                got.map(|g| {
                    let e = self.entries.get_mut(&id).expect("checked");
                    (e.token, e.value, e.staged) = (g.token, g.value, None);
                    (Status::Success, g.plain)
                })
            }
            ServerOp::GiveBack(_) | ServerOp::Downgrade => {
                // A local writer's block goes with the end of the exclusive turn (the
                // mutation puts back a downgrade that leaves it behind).
                let dropped =
                    op == ServerOp::Downgrade && dlock_core::mutated!(DowngradeDropsBlock);
                if e.cache.held() == Some(Mode::Exclusive)
                    && !dropped
                    && let Some(block) = e.staged
                    && let Err(err) = self.client.stage_value(id, &block.0)
                {
                    tracing::warn!(error = %err, "dlock: a cached lock's block was not staged");
                }
                let done = match op {
                    ServerOp::Downgrade => self.client.downgrade(id),
                    _ => self.client.unlock(id),
                };
                if done.is_ok() {
                    self.entries.get_mut(&id).expect("checked").staged = None;
                }
                done.map(|_| (Status::Success, false))
            }
        };
        match done {
            Ok((s, plain)) => (s, plain, None),
            Err(err) => (err.status(), false, Some(err)),
        }
    }
}

/// `d` in the protocol's milliseconds, at least 1.
pub(super) fn duration_ms(d: Duration) -> u32 {
    dlock_core::time::duration_to_ms(d).max(1)
}
