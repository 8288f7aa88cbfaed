//! The one loop that carries a cached lock's [`ServerOp`] to the server: send it through the
//! client, hand the reply to the lock's [`CachedLock`], and again while the record says more
//! is owed. [`super::CachedLocks`], the C ABI's cached locks and the row-group cache all drive
//! their records with it, so they send alike: the same bound on sends in one go, the same
//! reading of each reply.

use dlock_core::Status;
use dlock_core::manager::CachedLock;
use dlock_core::manager::cache::{Reply, ServerOp};

/// Sends `op` of lock `id`'s record the way the reference-shaped calls carry it — a
/// downgrade, else an unlock (a give-back, or an acquisition's undo) — and returns the status
/// answered and the fencing token of the lock's grant after it, as [`drive_op`]'s `send`
/// does. The C ABI's cached locks and the row-group cache send their records' ops with it.
pub fn send_op<C: crate::client::Connection>(
    client: &mut crate::client::Client<C>,
    id: dlock_core::LockId,
    op: ServerOp,
) -> (Status, u64) {
    let sent = match op {
        ServerOp::Downgrade => client.downgrade(id),
        ServerOp::GiveBack(_) | ServerOp::Acquire(_) => client.unlock(id),
    };
    let status = sent.map_or_else(|e| e.status(), |_| Status::Success);
    (status, client.local_lock(id).map_or(0, |l| l.token.0))
}

/// How often an op is sent in one go — a give-back after the downgrade a stronger revoke
/// followed, or one the server did not answer — before it is left owed for the next look.
pub const SENDS_MAX: u32 = 3;

/// What [`drive_op`] left.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Driven {
    /// The record's last answer; [`Reply::Send`] after [`SENDS_MAX`] failed sends: that op is
    /// still owed (the record keeps it in flight), for the caller to send at its next look.
    pub reply: Reply,
    /// The status the server (or the client's own record) answered last; when an op is left
    /// owed, the failure that left it so — never `Success`, which callers would pass on as
    /// "done" for an op that was not.
    pub status: Status,
}

impl Driven {
    /// The op still owed, if the sends ran out.
    pub const fn owed(&self) -> Option<ServerOp> {
        match self.reply {
            Reply::Send(op) => Some(op),
            _ => None,
        }
    }
}

/// Sends `op` (one the record put in flight) and what the record asks for after each reply,
/// until [`SENDS_MAX`] sends have failed. `send(cx, op)` sends one and returns the status
/// answered and the fencing token of the lock's grant after it, or ends the loop with its
/// error (a fatal status, say); `rec(cx)` is the lock's record. `cx` is what both need (the
/// client and the records), as in [`super::wait_sliced`].
///
/// Only failed sends count toward the bound: an answered op that leads to the next one (the
/// give-back after a downgrade a stronger revoke followed) is progress, and leaving that next
/// op owed under the answered op's `Success` let a caller report a give-back as done that was
/// never sent. Each answered op moves the record on, so the answered sends are few as well;
/// [`SENDS_TOTAL_MAX`] bounds them anyway.
pub fn drive_op<X: ?Sized, E>(
    cx: &mut X,
    mut op: ServerOp,
    mut send: impl FnMut(&mut X, ServerOp) -> Result<(Status, u64), E>,
    mut rec: impl FnMut(&mut X) -> &mut CachedLock,
) -> Result<Driven, E> {
    let (mut failed, mut failures) = (None, 0);
    for _ in 0..SENDS_TOTAL_MAX {
        let (status, token) = send(cx, op)?;
        if status != Status::Success {
            (failed, failures) = (Some(status), failures + 1);
        }
        match rec(cx).on_reply(status, token) {
            Reply::Send(next) => op = next,
            reply => return Ok(Driven { reply, status }),
        }
        if failures == SENDS_MAX {
            break;
        }
    }
    Ok(Driven {
        reply: Reply::Send(op),
        // Answered every time yet never settled: a record the replies do not move on.
        status: failed.unwrap_or(Status::BadResponse),
    })
}

/// The most sends of one op chain in one go, answered or not (see [`drive_op`]).
pub const SENDS_TOTAL_MAX: u32 = 3 * SENDS_MAX;

#[cfg(test)]
mod tests {
    use super::*;
    use dlock_core::manager::cache::{Acquire, OnRevoke};
    use dlock_core::{LockKind, Mode};

    /// An idle cached exclusive grant under token 7.
    fn idle_exclusive() -> CachedLock {
        let mut l = CachedLock::new(LockKind::Rw);
        assert_eq!(
            l.acquire(Mode::Exclusive),
            Acquire::Send(ServerOp::Acquire(Mode::Exclusive))
        );
        assert_eq!(l.on_reply(Status::Success, 7), Reply::Granted);
        assert!(matches!(
            l.release(Mode::Exclusive),
            dlock_core::manager::cache::Release::Keep
        ));
        l
    }

    /// An idle exclusive grant revoked for exclusive: it goes back now.
    fn reading() -> (CachedLock, ServerOp) {
        let mut l = idle_exclusive();
        let OnRevoke::Send(op) = l.on_revoke(Mode::Exclusive, 7, 0) else {
            panic!("an idle grant goes back at once");
        };
        (l, op)
    }

    #[test]
    fn an_answered_op_is_sent_once_and_an_unanswered_one_is_left_owed_after_the_bound() {
        let (mut l, op) = reading();
        let mut sent = Vec::new();
        let done = drive_op(
            &mut l,
            op,
            |_, op| {
                sent.push(op);
                Ok::<_, ()>((Status::Success, 7))
            },
            |l| l,
        );
        assert_eq!(
            done,
            Ok(Driven {
                reply: Reply::Settled,
                status: Status::Success
            })
        );
        assert_eq!(sent, [ServerOp::GiveBack(Mode::Exclusive)]);

        let (mut l, op) = reading();
        let mut sends = 0;
        let done = drive_op(
            &mut l,
            op,
            |_, _| {
                sends += 1;
                Ok::<_, ()>((Status::BadResponse, 0))
            },
            |l| l,
        )
        .unwrap();
        assert_eq!(sends, SENDS_MAX);
        assert_eq!(done.owed(), Some(ServerOp::GiveBack(Mode::Exclusive)));
        assert_eq!(done.status, Status::BadResponse);
        assert!(l.giving_back(), "still in flight: owed");
    }

    /// A downgrade that went unanswered twice, then answered with an exclusive revoke
    /// pending: the give-back it leads to is sent in the same go, not left owed under the
    /// downgrade's `Success` (which the C ABI then reported as a trylock granted).
    #[test]
    fn an_answered_send_after_failed_ones_does_not_leave_the_next_op_owed_as_a_success() {
        let mut l = idle_exclusive();
        let OnRevoke::Send(op) = l.on_revoke(Mode::Shared, 7, 0) else {
            panic!("an idle exclusive grant wanted shared is downgraded at once");
        };
        assert_eq!(op, ServerOp::Downgrade);
        let _ = l.on_revoke(Mode::Exclusive, 7, 0);
        let mut answers = [Status::BadResponse, Status::BadResponse].into_iter();
        let mut sent = Vec::new();
        let done = drive_op(
            &mut l,
            op,
            |_, op| {
                sent.push(op);
                Ok::<_, ()>((answers.next().unwrap_or(Status::Success), 7))
            },
            |l| l,
        )
        .unwrap();
        assert_eq!(done.reply, Reply::Settled, "{sent:?}");
        assert_eq!(done.status, Status::Success);
        assert_eq!(sent.last(), Some(&ServerOp::GiveBack(Mode::Shared)));
        assert!(!l.giving_back());
    }

    #[test]
    fn a_send_that_fails_ends_the_loop_with_its_error() {
        let (mut l, op) = reading();
        assert_eq!(drive_op(&mut l, op, |_, _| Err("gone"), |l| l), Err("gone"));
    }
}
