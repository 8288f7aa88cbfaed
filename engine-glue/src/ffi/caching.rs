//! A C client's cached locks (`cached.rs` has the calls and the rules they follow): one
//! `dlock_core::manager::CachedLock` per cache-enabled lock, driven with the client's own
//! calls, the revoke notices the engine has not taken, and its callback.

use std::collections::HashMap;
use std::convert::Infallible;
use std::ffi::{c_int, c_void};

use dlock_core::manager::CachedLock;
use dlock_core::manager::cache::on_overflow;
use dlock_core::manager::cache::{Acquire, OnRevoke, Release, Reply, ServerOp};
use dlock_core::proto::{Event, LockFlags};
use dlock_core::table::EVENT_RING_LEN;
use dlock_core::{LockId, LockKind, Mode, Status};
use dlock_transport::client::cached::{Notices, drive_op, send_op, warn_overdue};
use dlock_transport::client::{Client, Grant};

use super::types::{DLOCK_REVOKE_ALL, LOCK_EXCLUSIVE, LOCK_SHARED, dlock_revoke};

/// One cache-enabled lock: the core's record of its cached grant
/// ([`dlock_core::manager::CachedLock`], whose tables decide every case: what covers a
/// request, when a revoke is stale, downgrade or give-back, what an unanswered give-back
/// does), and what the C calls add to it. The record's local users are the worker's uses:
/// a `trylock`/`lock` that reaches the server or the parked grant starts one, the `unlock`
/// that ends it releases it; re-entries within a use are counted by the client's own record.
#[derive(Clone, Copy, Debug)]
pub(super) struct Cached {
    pub(super) rec: CachedLock,
    /// A give-back or downgrade that did not reach the server (the record keeps it in flight):
    /// sent again at the client's next call, never dropped, so the server does not go on
    /// holding a grant the engine was told it gave back.
    pub(super) owed: Option<ServerOp>,
    /// The status its last attempt failed with: what a call that must wait for it reports.
    pub(super) failed: Status,
    /// `lock_cache_release` asked while the grant was in use: the `unlock` that ends the use
    /// gives it back.
    pub(super) let_go: bool,
    /// Its users outlived a revoke by the lease: warned once.
    warned: bool,
    /// In `Caching::watch` (a flag, not a search of the list: an overflow watches every lock).
    watched: bool,
    /// Counted in `Caching::engaged`: the record holds a grant (or gives one back) on the
    /// server, or a give-back is owed. Set by `Caching::settle` after every exchange with the
    /// server, the only place where a record comes to hold something or stops holding it.
    engaged: bool,
}

impl Cached {
    pub(super) const fn new() -> Cached {
        Cached {
            rec: CachedLock::new(LockKind::Rw),
            owed: None,
            failed: Status::Success,
            let_go: false,
            warned: false,
            watched: false,
            engaged: false,
        }
    }

    /// Whether the server may send a revoke this lock must hear (`Cached::engaged`).
    fn engages(&self) -> bool {
        self.rec.held().is_some() || self.rec.giving_back() || self.owed.is_some()
    }

    /// Parked: held on the server with no use.
    pub(super) fn parked(&self) -> bool {
        self.rec.held().is_some() && self.rec.users() == (0, false)
    }
}

/// The revoke callback and its `user_data` (kept as an address: the library never reads it).
#[derive(Clone, Copy, Debug)]
pub(super) struct Callback {
    pub(super) f: unsafe extern "C" fn(c_int, *const dlock_revoke, *mut c_void),
    pub(super) user_data: usize,
}

/// A client's cached locks, the notices the engine has not taken, and its callback.
#[derive(Debug)]
pub(super) struct Caching {
    pub(super) locks: HashMap<LockId, Cached>,
    /// The locks each look must visit: a give-back owed, or a revoke waiting for the use to
    /// end (warned about once overdue). The other locks are not looked at.
    watch: Vec<LockId>,
    pub(super) notices: Notices<dlock_revoke>,
    pub(super) callback: Option<Callback>,
    /// Events read off the connection before they are acted on (kept for its capacity).
    events: Vec<Event>,
    /// The locks an overflow revokes, or the give-backs a look sends again (kept for its
    /// capacity, so that a look allocates nothing once it has seen as many).
    scratch: Vec<(LockId, Option<ServerOp>)>,
    /// The client's `renumberings` when `locks` was last known to name the client's ids.
    renumberings: u64,
    /// The locks that are `Cached::engaged`: while there are none and nothing is watched, a
    /// look at the events may wait as long as the client's trust bound holds (`pump`).
    engaged: usize,
    /// Looks at the events so far (`event_looks`, for tests).
    pub(super) looks: u64,
}

impl Caching {
    /// Sized at `client_init`, so that reading revokes allocates nothing afterwards.
    pub(super) fn new() -> Caching {
        Caching {
            locks: HashMap::new(),
            watch: Vec::with_capacity(EVENT_RING_LEN),
            notices: Notices::new(revoke_all()),
            callback: None,
            events: Vec::with_capacity(EVENT_RING_LEN + 1),
            scratch: Vec::with_capacity(EVENT_RING_LEN),
            renumberings: 0,
            engaged: 0,
            looks: 0,
        }
    }

    /// After a failover's re-claim filed the client's records under a replacement's ids
    /// (`Client::renumberings`): the cache's ids name other locks now, or none, and giving back
    /// a parked grant by one would unlock another lock of the client. So the cache forgets
    /// every lock, and tells the engine every lock was revoked; the engine takes its ids again
    /// with `get_lock` by name (as every id after `update_all_locks`) and enables caching on
    /// them again. Nothing parked is lost: a failover re-claims no cached grant
    /// (`dlock_core::manager::trust`, rule 3). One comparison when nothing changed.
    ///
    /// The client's records stop asking for cacheable grants (and for waits cut short by a
    /// revoke) too: the recovery keeps what they ask, but the cache no longer knows them, so a
    /// grant taken before caching is enabled again would be cacheable on the server with no
    /// entry here to hear its revoke, and the server would give it to another at the revoke
    /// timeout while its use goes on. Only `lock_cache_enable` asks for cacheable grants in
    /// the C ABI, so the records asking are those the cache had enabled.
    pub(super) fn follow_renumbering(&mut self, client: &mut Client) {
        let now = client.renumberings();
        if now == self.renumberings {
            return;
        }
        self.renumberings = now;
        // Allocates, once per failover that renumbered.
        let plain: Vec<LockId> = client
            .locks()
            .filter(|(_, l)| {
                l.ask.contains(LockFlags::CACHEABLE) || l.ask.contains(LockFlags::WAKE_ON_REVOKE)
            })
            .map(|(&id, _)| id)
            .collect();
        for id in plain {
            // Each id was just listed among the client's records: neither call can fail.
            let _ = client.set_cacheable(id, false);
            let _ = client.set_wake_on_revoke(id, false);
        }
        if !self.locks.is_empty() {
            self.locks.clear();
            self.watch.clear();
            self.engaged = 0;
            // The notices the engine has not taken name ids from before.
            self.notices.renumbered();
        }
    }

    /// Whether any lock of the client caches (then `lock` waits in slices).
    pub(super) fn any(&self) -> bool {
        !self.locks.is_empty()
    }

    /// Whether `id`'s grants are cached (batches and asynchronous calls refuse it).
    pub(super) fn caches(&self, id: LockId) -> bool {
        self.locks.contains_key(&id)
    }

    /// Gives `id`'s parked grant back, if it has one (`release_lock`), after what an earlier
    /// call left owed. One that does not reach the server stays owed, and the failure is the
    /// answer (the reference's release is refused while the grant is held).
    pub(super) fn unpark(&mut self, client: &mut Client, id: LockId) -> Result<(), Status> {
        self.pump(client);
        let Some(c) = self.locks.get_mut(&id) else {
            return Ok(());
        };
        if c.owed.is_some() {
            return Err(c.failed);
        }
        match c.rec.give_back() {
            Some(op) => self.drive(client, id, op),
            None => Ok(()),
        }
    }

    /// Forgets `id` (its reference was released).
    pub(super) fn forget(&mut self, id: LockId) {
        if self.locks.remove(&id).is_some_and(|c| c.engaged) {
            self.engaged -= 1;
        }
        self.watch.retain(|&w| w != id);
    }

    /// Counts `id` in `Caching::engaged` if it engages now, after an exchange with the server.
    fn settle(&mut self, id: LockId) {
        let Some(c) = self.locks.get_mut(&id) else {
            return;
        };
        let now = c.engages();
        if now != c.engaged {
            c.engaged = now;
            if now {
                self.engaged += 1;
            } else {
                self.engaged -= 1;
            }
        }
    }

    /// Enables caching of `id`'s grants (`lock_cache_enable`), with room made now for what
    /// a look at its revokes lists, so that the look allocates nothing.
    pub(super) fn enable(&mut self, id: LockId) {
        self.locks.entry(id).or_insert(Cached::new());
        let n = self.locks.len();
        self.watch.reserve(n.saturating_sub(self.watch.len()));
        self.scratch.reserve(n.saturating_sub(self.scratch.len()));
    }

    /// Visits `id` at every look from now on.
    fn watch(&mut self, id: LockId) {
        if let Some(c) = self.locks.get_mut(&id)
            && !c.watched
        {
            c.watched = true;
            self.watch.push(id);
        }
    }

    /// Reads the revokes the server sent and acts on them (module doc), then sends again what
    /// is owed.
    ///
    /// While no lock holds anything on the server or owes a give-back, and nothing is watched,
    /// the look is left for later when `Client::events_may_wait` allows it (the row-group
    /// cache's rule, and `CachedLocks`'): no revoke is for anything held, any unread one is for
    /// a grant given back since (which the look would ignore), and no lost connection owes its
    /// report, so nothing parked is used while the look waits. Over TCP a call on a lock not
    /// parked then pays no `recv` on top of its request; the first grant held makes every call
    /// look again.
    pub(super) fn pump(&mut self, client: &mut Client) {
        self.follow_renumbering(client);
        if self.locks.is_empty()
            || self.engaged == 0 && self.watch.is_empty() && client.events_may_wait()
        {
            return;
        }
        self.looks += 1;
        let mut events = std::mem::take(&mut self.events);
        if let Err(e) = client.poll_events(|e| events.push(e)) {
            tracing::debug!(error = %e, "dlock: reading a C client's revokes");
        }
        if events.is_empty() && self.watch.is_empty() {
            // Nothing came and nothing waits: every C call passes here, so no clock is read.
            self.events = events;
            return;
        }
        let now = client.now_ms();
        for e in events.drain(..) {
            match e {
                Event::Revoke {
                    lock,
                    wanted,
                    fence,
                } => {
                    let acted = self.revoke(client, lock, wanted, fence, now);
                    if acted {
                        self.notices.push(dlock_revoke {
                            lock_id: lock.raw() as c_int,
                            wanted_op: op_of(wanted),
                        });
                    }
                }
                Event::Overflow => {
                    // Each lock's act, then carried out (a give-back now, or a watch).
                    let mut acts = std::mem::take(&mut self.scratch);
                    let locks = self.locks.iter_mut().map(|(&id, c)| (id, &mut c.rec));
                    on_overflow(locks, now, |id, act| {
                        let op = match act {
                            OnRevoke::Send(op) => Some(op),
                            OnRevoke::Deferred | OnRevoke::Ignore => None,
                        };
                        acts.push((id, op));
                    });
                    for &(id, op) in &acts {
                        match op {
                            // A failure stays owed (`drive`).
                            Some(op) => drop(self.drive(client, id, op)),
                            None => self.watch(id),
                        }
                    }
                    acts.clear();
                    self.scratch = acts;
                    self.notices.push(revoke_all());
                }
            }
        }
        self.events = events;
        self.visit_watched(client, now);
    }

    /// Sends again what is owed, and warns of revokes the use outlived (as `CachedLocks`).
    fn visit_watched(&mut self, client: &mut Client, now: u64) {
        let lease_ms = dlock_core::time::duration_to_ms(client.lease()).max(1);
        let mut watch = std::mem::take(&mut self.watch);
        let mut owed = std::mem::take(&mut self.scratch);
        watch.retain(|id| {
            let Some(c) = self.locks.get_mut(id) else {
                return false;
            };
            warn_overdue(*id, &c.rec, &mut c.warned, now, lease_ms);
            if let Some(op) = c.owed.take() {
                owed.push((*id, Some(op)));
            }
            c.watched = c.rec.revoke().is_some();
            c.watched
        });
        self.watch = watch;
        for &(id, op) in &owed {
            if let Some(op) = op {
                // A failure stays owed (`drive`), for the next look.
                let _ = self.drive(client, id, op);
            }
        }
        owed.clear();
        self.scratch = owed;
    }

    /// Acts on a revoke of `id` wanting `wanted`, sent when the lock's token was `fence`
    /// (`manager::cache::on_overflow` handles an overflow). Whether it concerned a grant held (the record
    /// ignores a revoke of a lock not held, a stale one, and one its answer is on its way for).
    fn revoke(
        &mut self,
        client: &mut Client,
        id: LockId,
        wanted: Mode,
        fence: u64,
        now: u64,
    ) -> bool {
        let Some(c) = self.locks.get_mut(&id) else {
            return false;
        };
        match c.rec.on_revoke(wanted, fence, now) {
            OnRevoke::Ignore => return false,
            OnRevoke::Deferred => self.watch(id),
            // A failure stays owed (`drive`).
            OnRevoke::Send(op) => {
                let _ = self.drive(client, id, op);
            }
        }
        true
    }

    /// Sends `op` (a give-back or downgrade the record put in flight) for `id` and hands the
    /// reply to the record, again while it asks ([`drive_op`]). One the server did not answer
    /// stays owed (`Err` with its status), sent again at the next look.
    pub(super) fn drive(
        &mut self,
        client: &mut Client,
        id: LockId,
        op: ServerOp,
    ) -> Result<(), Status> {
        let done = self.exchange(client, id, op);
        self.settle(id);
        done
    }

    /// `Caching::drive`'s exchange, before the lock is counted again.
    fn exchange(&mut self, client: &mut Client, id: LockId, op: ServerOp) -> Result<(), Status> {
        let Some(c) = self.locks.get_mut(&id) else {
            return Ok(());
        };
        let mut cx = (client, c);
        let Ok(done) = drive_op(
            &mut cx,
            op,
            |(client, _), op| Ok::<_, Infallible>(send_op(client, id, op)),
            |(_, c)| &mut c.rec,
        );
        let (_, c) = cx;
        match done.reply {
            Reply::Send(next) => {
                tracing::warn!(lock = ?id, status = %done.status, "dlock: a cached lock's give-back is owed");
                (c.owed, c.failed) = (Some(next), done.status);
                self.watch(id);
                Err(done.status)
            }
            Reply::Lost => {
                tracing::warn!(lock = ?id, "dlock: a cached lock's readers lost its grant");
                Err(done.status)
            }
            _ => Ok(()),
        }
    }

    /// `trylock`/`lock` of `id` in `mode`: answered here (from the parked grant, or asked of the
    /// server through `ask`, which may read revokes meanwhile) when `id` caches and is not in
    /// use; `None` when the client answers as without caching (not cached, or a re-entry
    /// within a use, which the client's record counts).
    pub(super) fn acquire(
        &mut self,
        client: &mut Client,
        id: LockId,
        mode: Mode,
        mut ask: impl FnMut(&mut Client, &mut Caching) -> Result<Grant, Status>,
    ) -> Option<Result<Grant, Status>> {
        self.pump(client);
        loop {
            let c = self.locks.get_mut(&id)?;
            match c.rec.users() {
                (0, false) => {}
                // A use reading under the parked exclusive grant goes on to write: the record
                // must count a writer, or a revoke wanting shared would downgrade the grant
                // under its writes. The client's record (exclusive) counts the re-entry.
                (_, false) if mode == Mode::Exclusive => {
                    return match c.rec.reader_to_writer() {
                        Acquire::Local => None,
                        Acquire::Refuse(s) => Some(Err(s)),
                        Acquire::Wait | Acquire::Send(_) => Some(Err(Status::Einval)),
                    };
                }
                _ => return None,
            }
            match c.rec.acquire(mode) {
                Acquire::Local => return Some(held_grant(client, id).ok_or(Status::LockNotGet)),
                Acquire::Send(ServerOp::Acquire(_)) => {
                    let got = ask(client, self);
                    let (status, token, plain) = match got {
                        // Granted only if the client's record now holds it in `mode`: a
                        // trylock with no lease (`expire_time` 0) is the reference's "read the
                        // cache", answered `Success` by the record with nothing sent, and the
                        // record must not take it for a grant the server gave.
                        Ok(g) if holds(client, id, mode) => (g.status, g.token.0, g.plain),
                        Ok(_) => (Status::LockNotGet, 0, false),
                        Err(s) => (s, 0, false),
                    };
                    let c = self.locks.get_mut(&id)?;
                    if let Reply::Granted = c.rec.on_reply(status, token) {
                        c.let_go = false;
                        // Made plain by the server (a contended lock): its unlock is the
                        // give-back, as after a revoke.
                        if plain {
                            c.rec.granted_plain();
                        }
                    }
                    self.settle(id);
                    return Some(got);
                }
                // No upgrade in place: the parked shared grant goes back, then the request is
                // a new one.
                Acquire::Send(op) => {
                    if let Err(s) = self.drive(client, id, op) {
                        return Some(Err(s));
                    }
                }
                // A give-back that has not reached the server yet (the look above sent it
                // again): the connection's failure is the answer.
                Acquire::Wait => return Some(Err(c.failed)),
                Acquire::Refuse(s) => return Some(Err(s)),
            }
        }
    }

    /// `unlock` of `id`: `Some` when answered here (the use ends: the grant parked, or given
    /// back when asked for; or nothing in use); `None` when the unlock goes to the client as
    /// without caching (a re-entry counted down, or nothing cached).
    pub(super) fn release(
        &mut self,
        client: &mut Client,
        id: LockId,
    ) -> Option<Result<Grant, Status>> {
        self.pump(client);
        let c = self.locks.get_mut(&id)?;
        let (readers, writer) = c.rec.users();
        if !writer && readers == 0 {
            return c.rec.held().map(|_| Err(Status::AlreadyUnlocked));
        }
        let l = client.local_lock(id)?;
        if l.refs > 1 {
            return None;
        }
        // The client's record holds nothing (refs 0): its failover recovery forgot the grant
        // (a revoked grant is never re-claimed, `manager::trust`). The use ends all the same,
        // and what the record believes held goes back (the client's record answers it, with
        // nothing sent) instead of staying parked for uses the server would not cover.
        let forgotten = l.state.held_mode().is_none();
        let mode = if writer {
            Mode::Exclusive
        } else {
            Mode::Shared
        };
        let op = match c.rec.release(mode) {
            Release::Keep if c.let_go || forgotten => c.rec.give_back(),
            Release::Keep => None,
            Release::Send(op) => Some(op),
            Release::Refuse(s) => return Some(Err(s)),
        };
        match op {
            Some(op) => {
                c.let_go = false;
                let done = self.drive(client, id, op);
                Some(match done {
                    // As without caching: the unlock of a grant the client no longer held.
                    Ok(()) if forgotten => Err(Status::AlreadyUnlocked),
                    Ok(()) => Ok(recorded(client, id)),
                    Err(s) => Err(s),
                })
            }
            None if c.rec.held().is_some() => held_grant(client, id).map(Ok),
            // The server no longer held it (a refused downgrade): the client answers.
            None => None,
        }
    }

    /// `lock_downgrade` of `id`: `Some` when the record holds it exclusive (the grant goes
    /// shared, a use reads on); `None` when the client answers as without caching.
    pub(super) fn downgrade(
        &mut self,
        client: &mut Client,
        id: LockId,
    ) -> Option<Result<(), Status>> {
        self.pump(client);
        let c = self.locks.get_mut(&id)?;
        if c.rec.held() != Some(Mode::Exclusive) {
            return None;
        }
        match c.rec.downgrade() {
            Some(op) => Some(self.drive(client, id, op)),
            None => Some(Err(c.failed)),
        }
    }
}

/// The revoke notice of every lock.
const fn revoke_all() -> dlock_revoke {
    dlock_revoke {
        lock_id: DLOCK_REVOKE_ALL,
        wanted_op: LOCK_EXCLUSIVE,
    }
}

/// The C op that asks for `m`.
const fn op_of(m: Mode) -> c_int {
    match m {
        Mode::Exclusive => LOCK_EXCLUSIVE,
        Mode::Shared => LOCK_SHARED,
    }
}

/// Whether the client's record of `id` holds it in `mode` (granted by the server).
fn holds(client: &Client, id: LockId, mode: Mode) -> bool {
    client
        .local_lock(id)
        .is_some_and(|l| l.state.held_mode() == Some(mode))
}

/// The grant the record of `id` holds, as the lock calls report it.
fn held_grant(client: &Client, id: LockId) -> Option<Grant> {
    let l = client.local_lock(id)?;
    Some(Grant {
        status: Status::Success,
        token: l.token,
        word: l.word,
        value: l.value,
        plain: l.plain,
    })
}

/// A successful unlock of `id`, with the word the record keeps.
fn recorded(client: &Client, id: LockId) -> Grant {
    let l = client.local_lock(id);
    Grant {
        status: Status::Success,
        token: l.map_or(dlock_core::FencingToken(0), |l| l.token),
        word: l.map_or(0, |l| l.word),
        value: None,
        plain: false,
    }
}
