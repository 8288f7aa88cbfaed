//! The client's side of one cached grant: local users share the grant the server holds for
//! the client, and a revoke makes the client give it back once they are done.
//!
//! This is how a GFS2 node uses its glocks: a glock stays in the node's cache in the mode the
//! DLM granted, local holders come and go without a message, and a callback from the DLM (a
//! blocking AST) queues a demote that runs when the last local holder conflicting with the
//! wanted mode is gone, converting down to that mode or unlocking. The record does no I/O,
//! reads no clock and allocates nothing, like [`crate::client::LocalLock`], which still builds
//! the commands: a [`ServerOp`] says what to ask, the client module sends it through the lock's
//! `LocalLock` (with the `CACHEABLE` flag on acquisitions) and hands the reply back here.
//!
//! # Decisions
//!
//! "Covers" means the mode held admits `m` (exclusive admits both); local users are
//! compatible as grants are ([`super::conflicts`]).
//!
//! | in flight | revoke  | held            | local users                      | `acquire(m)`                    |
//! |-----------|---------|-----------------|----------------------------------|---------------------------------|
//! | —         | —       | —               | —                                | atomic and `m` shared: `Einval`  |
//! | yes       | any     | any             | any                              | `Wait`                          |
//! | no        | pending | any             | any                              | `Wait` (no new users once asked) |
//! | no        | none    | any             | lost users (below)               | `Wait`                          |
//! | no        | none    | nothing         | none                             | `Send(Acquire(m))`              |
//! | no        | none    | covers `m`      | compatible with `m`              | `Local` (no message)            |
//! | no        | none    | covers `m`      | conflicting                      | `Wait`                          |
//! | no        | none    | shared, `m` EX  | readers                          | `Wait`                          |
//! | no        | none    | shared, `m` EX  | none                             | `Send(GiveBack(shared))`, then ask again |
//!
//! | revoke wanting               | `release(m)` leaves               | then                          |
//! |------------------------------|-----------------------------------|-------------------------------|
//! | (no user in `m`)             | —                                 | `AlreadyUnlocked`             |
//! | none                         | anything                          | `Keep` (cached, no message)   |
//! | exclusive (or atomic lock)   | users                             | `Keep`                        |
//! | exclusive (or atomic lock)   | no users                          | `Send(GiveBack(held))`        |
//! | shared, held exclusive       | a writer                          | `Keep`                        |
//! | shared, held exclusive       | readers or nobody                 | `Send(Downgrade)`             |
//!
//! | revoke for `wanted`, `fence`         | then                                                    |
//! |--------------------------------------|---------------------------------------------------------|
//! | nothing held or asked for            | `Ignore` (the bad-input rule: a revoke for a lock not held) |
//! | `fence` below the grant's token      | `Ignore`: it was sent for an earlier grant, since given back |
//! | held shared, wanted shared           | `Ignore`: no conflict                                   |
//! | a give-back in flight, or a downgrade and shared wanted | `Ignore`: its answer is on its way   |
//! | otherwise                            | recorded (exclusive outranks shared); `Send` what is owed now, or `Deferred`: the engine's users must finish (and flush), and the last `release` sends it |
//!
//! | the holder's own call                 | when                                   | then                     |
//! |---------------------------------------|----------------------------------------|--------------------------|
//! | `give_back()` (a policy, or the engine) | held, no local user, nothing in flight | `Some(GiveBack(held))`   |
//! | `downgrade()` (the engine)            | held exclusive, nothing in flight      | `Some(Downgrade)`: a writer reads on |
//! | either                                | otherwise                              | `None`                   |
//!
//! | `reader_to_writer()` (a reader of the grant now writes) | when                     | then                     |
//! |---------------------------------------|----------------------------------------|--------------------------|
//! | held exclusive, one reader, no downgrade in flight | (a pending exclusive revoke is answered when the writer is done) | `Local`: the reader is the writer |
//! | held exclusive, other readers too     |                                        | `Wait`                   |
//! | otherwise (no reader, a writer already, held shared, a downgrade in flight or done, users lost) | | `Refuse(Einval)` |
//!
//! A reader under an exclusive grant (taken locally, since exclusive covers shared) that goes
//! on to write must say so: counted as a reader, a revoke wanting shared would downgrade the
//! grant under its writes. Once the grant is going (or gone) shared there is nothing to write
//! under, and the conversion is refused as an uncached RW lock refuses `trylock(¬m)`.
//!
//! A revoke can overtake the reply that grants the lock: over shared memory the event ring and
//! the mailbox are two paths, and the client may read the ring first; on a stream the server
//! sends a client's events ahead of its replies (the trust bound needs that order,
//! [`super::trust`]), so a revoke of a parked request's grant made in the same turn comes first. So a revoke that arrives
//! while an acquisition is in flight is recorded with its `fence` and kept if the grant's token
//! is not above it (the revoke was sent for this grant), dropped otherwise. The same `fence`
//! rule drops a revoke that was sent for a grant this client has given back since.
//!
//! An event-ring overflow ([`on_overflow`]) treats every cached lock as revoked for exclusive:
//! idle ones are given back at once, busy ones when their users are done. Simply asking the
//! server which of them are wanted would cost a round trip per lock and race with new revokes.
//!
//! # Replies
//!
//! | in flight            | reply                  | record after                            | [`Reply`]     |
//! |----------------------|------------------------|-----------------------------------------|---------------|
//! | `Acquire(m)`         | `Success`              | held `m`, token, one user in `m`; an early revoke kept if meant for it | `Granted` |
//! | `Acquire(m)`         | anything else          | nothing held, an early revoke dropped   | `Refused(s)`  |
//! | `GiveBack`           | `Success`, `Fail` or `AlreadyUnlocked` | nothing held, revoke cleared | `AskAgain` for a conversion, else `Settled` |
//! | `Downgrade`          | `Success`              | held shared; a shared revoke answered   | `Send(op)` if a stronger revoke is owed, else `Settled` |
//! | `Downgrade`          | `Fail`                 | nothing held                            | `Lost` if readers remain, else `Settled` |
//! | `Downgrade`          | `Einval` or `AlreadyUnlocked` (the client's own record holds nothing exclusive: its failover recovery forgot the grant) | nothing held | `Lost` if readers remain, else `Settled` |
//! | `GiveBack`, `Downgrade` | anything else (the server is recovering, the reply was lost) | unchanged | `Send(op)` again |
//!
//! `Fail` to a give-back or downgrade means the server no longer held the grant for this client:
//! a revoke it ignored past the timeout, or its lease. A downgrade is the one give-back sent
//! while users remain (readers, which a shared grant would have covered), so its `Fail` is the
//! one that strands users: [`Reply::Lost`] tells the engine their work was not protected, and
//! no new user is let in until they are gone.

use super::conflicts;
use crate::ids::{LockKind, Mode};
use crate::status::Status;

/// What the cache asks the server for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServerOp {
    /// Take the lock in this mode (a trylock flagged `CACHEABLE`).
    Acquire(Mode),
    /// Give back the grant held in this mode (an unlock).
    GiveBack(Mode),
    /// Exclusive to shared (RW and fair locks).
    Downgrade,
}

/// What a local acquisition does ([`CachedLock::acquire`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub enum Acquire {
    /// Granted here: the user holds the lock.
    Local,
    /// Send this; hand the reply to [`CachedLock::on_reply`].
    Send(ServerOp),
    /// Try again after a local release, a reply or a give-back.
    Wait,
    /// Refused.
    Refuse(Status),
}

/// What a local release does ([`CachedLock::release`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub enum Release {
    /// Still cached: no message.
    Keep,
    /// The release answered a revoke: send this.
    Send(ServerOp),
    /// No local user held the lock in that mode.
    Refuse(Status),
}

/// What a revoke (or an overflow) does ([`CachedLock::on_revoke`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub enum OnRevoke {
    /// Nothing to do.
    Ignore,
    /// Nobody is in the way: send this now.
    Send(ServerOp),
    /// Local users are in the way: tell the engine to finish them; the last release sends.
    Deferred,
}

/// What a reply means ([`CachedLock::on_reply`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub enum Reply {
    /// The acquisition was granted: the user that asked holds the lock.
    Granted,
    /// The acquisition was refused with this status.
    Refused(Status),
    /// A conversion's give-back is done: the user that asked asks again.
    AskAgain,
    /// Nothing more to send.
    Settled,
    /// Send this (a stronger revoke is owed, or the last attempt did not reach the server).
    Send(ServerOp),
    /// The server no longer held the grant while local users did: their work was unprotected.
    Lost,
}

/// What is in flight to the server for this lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Flight {
    Acquire(Mode),
    /// `convert`: sent by an acquisition wanting exclusive while shared was held.
    GiveBack {
        mode: Mode,
        convert: bool,
    },
    Downgrade,
}

/// The client's record of one cached lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CachedLock {
    kind: LockKind,
    /// What the server holds for this client.
    held: Option<Mode>,
    /// The fencing token of the grant held (0: none).
    token: u64,
    /// Local users holding it shared.
    readers: u32,
    /// A local user holds it exclusively.
    writer: bool,
    /// Users the server no longer covers (a downgrade refused): no new user until they go.
    lost: bool,
    /// A revoke received and not yet answered: the mode the other client wants.
    revoke: Option<Mode>,
    /// When the revoke arrived (the caller's clock).
    revoked_at_ms: u64,
    /// The lock's fencing token when the revoke was sent.
    revoke_fence: u64,
    flight: Option<Flight>,
}

impl CachedLock {
    /// A lock of `kind` the client holds nothing on yet.
    #[inline]
    pub const fn new(kind: LockKind) -> CachedLock {
        CachedLock {
            kind,
            held: None,
            token: 0,
            readers: 0,
            writer: false,
            lost: false,
            revoke: None,
            revoked_at_ms: 0,
            revoke_fence: 0,
            flight: None,
        }
    }

    /// The mode the server holds for this client.
    #[inline]
    pub const fn held(&self) -> Option<Mode> {
        self.held
    }

    /// The grant's fencing token (0: none).
    #[inline]
    pub const fn token(&self) -> u64 {
        self.token
    }

    /// Local users: shared count and whether one holds it exclusively.
    #[inline]
    pub const fn users(&self) -> (u32, bool) {
        (self.readers, self.writer)
    }

    /// The mode a pending revoke wants.
    #[inline]
    pub const fn revoke(&self) -> Option<Mode> {
        self.revoke
    }

    /// Whether a pending revoke has waited `timeout_ms` or more for the local users: past it
    /// the server releases the grant, so the client warns (the users outlived the revoke).
    #[inline]
    pub const fn revoke_overdue(&self, now_ms: u64, timeout_ms: u32) -> bool {
        self.revoke.is_some() && now_ms >= self.revoked_at_ms.saturating_add(timeout_ms as u64)
    }

    /// The grant [`Self::on_reply`] just recorded (`Granted`) was made plain by the server
    /// (protocol 8's [`CommandResult::plain`](crate::proto::CommandResult::plain): the lock is
    /// contended, `manager::contention`). The record treats it as a grant revoked for exclusive
    /// at once — no new local user, and the last `release` sends the give-back, which is the
    /// plain unlock — as the revoke notice an older server sends instead would; but a plain
    /// grant never lapses, so its users are never overdue ([`Self::revoke_overdue`]). Nothing
    /// held: nothing to do.
    #[inline]
    pub fn granted_plain(&mut self) {
        if self.held.is_none() {
            return;
        }
        (self.revoke, self.revoke_fence) = (Some(Mode::Exclusive), self.token);
        self.revoked_at_ms = u64::MAX;
    }

    /// A local user wants the lock in `mode` (module doc: the first table).
    #[inline]
    pub fn acquire(&mut self, mode: Mode) -> Acquire {
        if self.kind == LockKind::Atomic && mode == Mode::Shared {
            return Acquire::Refuse(Status::Einval);
        }
        let revoked = self.revoke.is_some() && !crate::mutated!(CacheUsesRevoked);
        if self.flight.is_some() || revoked || self.lost {
            return Acquire::Wait;
        }
        match self.held {
            None => self
                .send(Flight::Acquire(mode))
                .map_or(Acquire::Wait, Acquire::Send),
            Some(held) if held == Mode::Exclusive || mode == Mode::Shared => {
                if self.writer || (mode == Mode::Exclusive && self.readers > 0) {
                    return Acquire::Wait;
                }
                self.add_user(mode);
                Acquire::Local
            }
            // Shared held, exclusive wanted: give the shared grant back, then ask for more.
            Some(_) if self.readers > 0 => Acquire::Wait,
            Some(shared) => {
                let flight = Flight::GiveBack {
                    mode: shared,
                    convert: true,
                };
                self.send(flight).map_or(Acquire::Wait, Acquire::Send)
            }
        }
    }

    /// A local user in `mode` is done (module doc: the second table).
    #[inline]
    pub fn release(&mut self, mode: Mode) -> Release {
        match mode {
            Mode::Exclusive if self.writer => self.writer = false,
            Mode::Shared if self.readers > 0 => self.readers -= 1,
            _ => return Release::Refuse(Status::AlreadyUnlocked),
        }
        if self.readers == 0 && !self.writer {
            self.lost = false;
        }
        self.owed().map_or(Release::Keep, Release::Send)
    }

    /// The holder gives an idle grant back of its own accord, no revoke asked for it: a policy
    /// ([`super::Demotion`], [`super::Payback`]) let the lock go at the end of its use, or the
    /// engine asked. `Some(GiveBack(held))`, marked in flight, when something is held with no
    /// local user and nothing in flight; `None` otherwise (a busy grant is the users' to end).
    #[inline]
    pub fn give_back(&mut self) -> Option<ServerOp> {
        let held = self.held?;
        if self.readers > 0 || self.writer {
            return None;
        }
        self.send(Flight::GiveBack {
            mode: held,
            convert: false,
        })
    }

    /// The engine turns the exclusive grant into a shared one in place, its writer (if any)
    /// reading on: `Some(Downgrade)`, marked in flight, when exclusive is held and nothing is
    /// in flight; `None` otherwise (`Einval` to the engine). The reply goes to
    /// [`CachedLock::on_reply`], as a downgrade a revoke asked for.
    #[inline]
    pub fn downgrade(&mut self) -> Option<ServerOp> {
        if self.held != Some(Mode::Exclusive) || self.flight.is_some() {
            return None;
        }
        if self.writer {
            (self.writer, self.readers) = (false, 1);
        }
        self.send(Flight::Downgrade)
    }

    /// The one local reader of an exclusive grant becomes its writer (module doc: the
    /// `reader_to_writer` table). No message: the server already holds the grant exclusive.
    #[inline]
    pub fn reader_to_writer(&mut self) -> Acquire {
        let downgrading = matches!(self.flight, Some(Flight::Downgrade));
        if self.held != Some(Mode::Exclusive)
            || self.readers == 0
            || self.writer
            || self.lost
            || downgrading
        {
            return Acquire::Refuse(Status::Einval);
        }
        if self.readers > 1 {
            return Acquire::Wait;
        }
        (self.readers, self.writer) = (0, true);
        Acquire::Local
    }

    /// Whether a give-back or downgrade is in flight: sent, and not answered yet (one whose
    /// reply did not come is sent again, [`Reply::Send`]).
    #[inline]
    pub const fn giving_back(&self) -> bool {
        matches!(
            self.flight,
            Some(Flight::GiveBack { .. } | Flight::Downgrade)
        )
    }

    /// The server revokes the grant, wanting `wanted` for another client; `fence` is the lock's
    /// fencing token when the revoke was sent (module doc: the third table).
    #[inline]
    pub fn on_revoke(&mut self, wanted: Mode, fence: u64, now_ms: u64) -> OnRevoke {
        let wanted = match self.kind {
            LockKind::Atomic => Mode::Exclusive,
            LockKind::Rw | LockKind::Fair => wanted,
        };
        let held = match (self.held, self.flight) {
            (Some(held), _) => held,
            // It overtook the reply granting the lock (module doc).
            (None, Some(Flight::Acquire(asked))) => asked,
            (None, _) => return OnRevoke::Ignore,
        };
        let answered = match self.flight {
            Some(Flight::GiveBack { .. }) => true,
            Some(Flight::Downgrade) => wanted == Mode::Shared,
            Some(Flight::Acquire(_)) | None => false,
        };
        if fence < self.token || !conflicts(held, wanted) || answered {
            return OnRevoke::Ignore;
        }
        if self.revoke.is_none() {
            self.revoked_at_ms = now_ms;
        }
        self.revoke = match self.revoke {
            Some(Mode::Exclusive) => Some(Mode::Exclusive),
            _ => Some(wanted),
        };
        self.revoke_fence = self.revoke_fence.max(fence);
        self.owed().map_or(OnRevoke::Deferred, OnRevoke::Send)
    }

    /// The server's reply to what is in flight, with the fencing token it carried (module doc:
    /// the replies table). A reply with nothing in flight changes nothing.
    #[inline]
    pub fn on_reply(&mut self, status: Status, token: u64) -> Reply {
        let Some(flight) = self.flight.take() else {
            return Reply::Settled;
        };
        let ok = status.is_success();
        match flight {
            Flight::Acquire(mode) if ok => {
                (self.held, self.token) = (Some(mode), token);
                self.add_user(mode);
                // An early revoke sent before this grant was for one given back since.
                if self.revoke_fence < token {
                    self.clear_revoke();
                }
                Reply::Granted
            }
            Flight::Acquire(_) => {
                self.clear_revoke();
                Reply::Refused(status)
            }
            // `AlreadyUnlocked`: the client's own record holds nothing any more (its failover
            // recovery forgot the grant rather than re-claim it, `manager::trust`), so there
            // is nothing to give back either.
            Flight::GiveBack { convert, .. }
                if ok || matches!(status, Status::Fail | Status::AlreadyUnlocked) =>
            {
                (self.held, self.token) = (None, 0);
                self.clear_revoke();
                if convert {
                    Reply::AskAgain
                } else {
                    Reply::Settled
                }
            }
            Flight::Downgrade if ok => {
                self.held = Some(Mode::Shared);
                if self.revoke == Some(Mode::Shared) {
                    self.clear_revoke();
                }
                self.owed().map_or(Reply::Settled, Reply::Send)
            }
            // `Einval`, `AlreadyUnlocked`: the client's own record no longer holds the lock
            // exclusive (its failover recovery forgot the grant, `manager::trust`), so it
            // refuses the downgrade without asking; sent again, it would be refused forever.
            Flight::Downgrade
                if matches!(
                    status,
                    Status::Fail | Status::Einval | Status::AlreadyUnlocked
                ) =>
            {
                (self.held, self.token) = (None, 0);
                self.clear_revoke();
                self.lost = self.readers > 0;
                if self.lost {
                    Reply::Lost
                } else {
                    Reply::Settled
                }
            }
            // Not answered (a recovering server, a lost reply): it is still owed.
            Flight::GiveBack { .. } | Flight::Downgrade => {
                self.flight = Some(flight);
                Reply::Send(op_of(flight))
            }
        }
    }

    /// What this record owes the server now, if nothing is in flight: a give-back or a
    /// downgrade that a revoke asked for and the local users allow. Marks it in flight.
    #[inline]
    fn owed(&mut self) -> Option<ServerOp> {
        let (Some(held), Some(wanted)) = (self.held, self.revoke) else {
            return None;
        };
        let flight = match (held, wanted) {
            (Mode::Exclusive, Mode::Shared) if !self.writer => Flight::Downgrade,
            (_, Mode::Exclusive) if !self.writer && self.readers == 0 => Flight::GiveBack {
                mode: held,
                convert: false,
            },
            _ => return None,
        };
        self.send(flight)
    }

    /// Puts `flight` in flight unless something already is.
    #[inline]
    fn send(&mut self, flight: Flight) -> Option<ServerOp> {
        if self.flight.is_some() {
            return None;
        }
        self.flight = Some(flight);
        Some(op_of(flight))
    }

    #[inline]
    fn clear_revoke(&mut self) {
        (self.revoke, self.revoked_at_ms, self.revoke_fence) = (None, 0, 0);
    }

    #[inline]
    fn add_user(&mut self, mode: Mode) {
        match mode {
            Mode::Exclusive => self.writer = true,
            Mode::Shared => self.readers = self.readers.saturating_add(1),
        }
    }

    /// The record's invariants, for tests and the simulators: users are covered by the grant
    /// held (or known lost), a writer is alone, and a revoke is recorded only for a grant held
    /// (or asked for) that it conflicts with.
    pub fn check_invariants(&self) -> Result<(), &'static str> {
        if self.writer && self.readers > 0 {
            return Err("a writer beside readers");
        }
        let covered = match self.held {
            Some(Mode::Exclusive) => true,
            Some(Mode::Shared) => !self.writer,
            None => !self.writer && self.readers == 0,
        };
        if !covered && !self.lost {
            return Err("local users the grant held does not cover");
        }
        if let (Some(held), Some(wanted)) = (self.held, self.revoke)
            && !conflicts(held, wanted)
        {
            return Err("a revoke recorded that the grant held already answers");
        }
        let asking = matches!(self.flight, Some(Flight::Acquire(_)));
        if self.revoke.is_some() && self.held.is_none() && !asking {
            return Err("a revoke recorded with nothing held or asked for");
        }
        if self.kind == LockKind::Atomic && self.held == Some(Mode::Shared) {
            return Err("an atomic lock held shared");
        }
        Ok(())
    }
}

/// The wire-facing op of a flight.
#[inline]
const fn op_of(flight: Flight) -> ServerOp {
    match flight {
        Flight::Acquire(mode) => ServerOp::Acquire(mode),
        Flight::GiveBack { mode, .. } => ServerOp::GiveBack(mode),
        Flight::Downgrade => ServerOp::Downgrade,
    }
}

/// The client's event ring overflowed, so revokes may have been lost: every cached lock is
/// treated as revoked for exclusive. `act(key, what)` is told what each of `locks` (a key and
/// its record) does about it, unless it ignores it: `Send` a give-back owed now, or `Deferred`
/// until its users are done.
pub fn on_overflow<'a, K>(
    locks: impl IntoIterator<Item = (K, &'a mut CachedLock)>,
    now_ms: u64,
    mut act: impl FnMut(K, OnRevoke),
) {
    for (key, lock) in locks {
        match lock.on_revoke(Mode::Exclusive, u64::MAX, now_ms) {
            OnRevoke::Ignore => {}
            what => act(key, what),
        }
    }
}

#[cfg(test)]
#[path = "cache_tests.rs"]
mod tests;
