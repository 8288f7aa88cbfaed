//! The one loop that carries a cached lock's [`ServerOp`] to the server: send it through the
//! client, hand the reply to the lock's [`CachedLock`], and again while the record says more
//! is owed. [`super::CachedLocks`], the C ABI's cached locks and the row-group cache all drive
//! their records with it, so they send alike: the same bound on sends in one go, the same
//! reading of each reply.

use dlock_core::Status;
use dlock_core::manager::CachedLock;
use dlock_core::manager::cache::{Reply, ServerOp};

/// How often an op is sent in one go — a give-back after the downgrade a stronger revoke
/// followed, or one the server did not answer — before it is left owed for the next look.
pub const SENDS_MAX: u32 = 3;

/// What [`drive_op`] left.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Driven {
    /// The record's last answer; [`Reply::Send`] after [`SENDS_MAX`] sends: that op is still
    /// owed (the record keeps it in flight), for the caller to send at its next look.
    pub reply: Reply,
    /// The status the server (or the client's own record) answered last.
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
/// up to [`SENDS_MAX`] times. `send(cx, op)` sends one and returns the status answered and the
/// fencing token of the lock's grant after it, or ends the loop with its error (a fatal
/// status, say); `rec(cx)` is the lock's record. `cx` is what both need (the client and the
/// records), as in [`super::wait_sliced`].
pub fn drive_op<X: ?Sized, E>(
    cx: &mut X,
    mut op: ServerOp,
    mut send: impl FnMut(&mut X, ServerOp) -> Result<(Status, u64), E>,
    mut rec: impl FnMut(&mut X) -> &mut CachedLock,
) -> Result<Driven, E> {
    let mut status = Status::Success;
    for _ in 0..SENDS_MAX {
        let token;
        (status, token) = send(cx, op)?;
        match rec(cx).on_reply(status, token) {
            Reply::Send(next) => op = next,
            reply => return Ok(Driven { reply, status }),
        }
    }
    Ok(Driven {
        reply: Reply::Send(op),
        status,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use dlock_core::manager::cache::{Acquire, OnRevoke};
    use dlock_core::{LockKind, Mode};

    /// An exclusive grant with one reader, revoked for exclusive after shared: downgrade now.
    fn reading() -> (CachedLock, ServerOp) {
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

    #[test]
    fn a_send_that_fails_ends_the_loop_with_its_error() {
        let (mut l, op) = reading();
        assert_eq!(drive_op(&mut l, op, |_, _| Err("gone"), |l| l), Err("gone"));
    }
}
