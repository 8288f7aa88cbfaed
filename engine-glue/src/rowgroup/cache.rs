//! Cached row-group grants ([`RowGroupConfig::cached`](super::RowGroupConfig)): a worker keeps
//! the keys its transactions took after they end, takes them again with no message, and gives
//! them back when the server revokes them for another worker.
//!
//! An engine's transactions mostly touch the row groups of "their" range again and again (the
//! affinity a partitioned workload has); asking the server for each of them on every
//! transaction, and giving each back at its end, is two messages per key that another worker
//! almost never wanted meanwhile. With caching on, every key is asked for as cacheable
//! (`Client::set_cacheable`), a transaction's end keeps its grants in the worker's cache, and
//! the next transaction's keys that the cache covers are taken locally:
//!
//! | key in the cache | asked     | the next [`Txn::acquire`](super::Txn::acquire)        |
//! |------------------|-----------|--------------------------------------------------------|
//! | exclusive        | either    | taken locally, in key order (no message)              |
//! | shared           | shared    | taken locally                                         |
//! | shared           | exclusive | the shared grant is given back (an unlock), then asked for as any key |
//! | absent           | either    | asked for as any key                                  |
//!
//! Revokes are read ([`RowGroupLocks::poll_revokes`]) at the start of every `acquire`, at every
//! transaction's end, in `keep_leases` and between the slices of a wait, and acted on by the
//! worker itself. Every name is asked for with `WAKE_ON_REVOKE`
//! ([`Client::set_wake_on_revoke`](dlock_transport::client::Client::set_wake_on_revoke)): a
//! revoke that comes while the worker is parked on the server waiting for another key ends
//! that wait at once, so the worker answers it within a round trip rather than at the end of
//! its slice, and a worker waiting for a key this one caches is not kept waiting for it:
//!
//! | the revoked key              | wanted    | then                                             |
//! |------------------------------|-----------|--------------------------------------------------|
//! | not cached and not held      | any       | ignored (a stale revoke, or for a grant since given back; one that came before the reply granting its key is acted on, since revokes are read only between calls, once the grant is recorded) |
//! | cached (no transaction)      | shared, held exclusive | downgraded now                      |
//! | cached (no transaction)      | otherwise | given back now                                   |
//! | held by the open transaction, read under an exclusive grant | shared | downgraded now; it reads on |
//! | held by the open transaction, read under an exclusive grant, then asked for exclusive | shared | downgraded when the transaction ends: it writes (`CachedLock::reader_to_writer`) |
//! | held by the open transaction | exclusive, or shared while it writes | given back (or downgraded) when the transaction ends |
//! | (an event-ring overflow)     | —         | every cached key given back, every held key at the end |
//!
//! Each key's grant is a `dlock_core::manager::CachedLock`, the record `CachedLocks` and the
//! C ABI keep too, so these rules are decided in one place (its module doc has the tables:
//! the stale-fence rule, downgrade or give-back, an overflow). The row-group cache adds the
//! policy on top — which keys to keep at all, [`dlock_core::manager::Demotion`] and
//! [`dlock_core::manager::Payback`] below — and the batching: the give-backs of a transaction's
//! end go in one message. A give-back or downgrade the server answers with a status that is
//! neither a result nor fatal (its reply lost, say) stays owed, the key in the cache, and is
//! sent again at the next look; a fatal one ends the client, as any ([`super::is_fatal`]). A
//! downgrade refused while the transaction reads (the server let the grant go at the revoke
//! timeout) loses the key, reported as a dead client's keys are (`on_lost`, [`Txn::lost`](super::Txn::lost)),
//! and a key holding nothing is never cached. A
//! transaction that outlives a revoke by the lease is warned about, as `CachedLocks` warns.
//!
//! A key whose cached grant is revoked before the worker took it again from its cache twice
//! is *demoted* ([`dlock_core::manager::Demotion`]): its next 4 uses end in an unlock, as without
//! caching, and 16, then 64 after each further such revoke in a row. A key several workers
//! take in turn then costs about what it costs uncached — a plain unlock in one batch with the
//! others, and no wait for its holder to notice a revoke — while a worker's own keys, revoked
//! now and then by a stray access after the worker reused them a few times, stay in its cache.
//!
//! A worker most of whose cached grants were revoked before it took them again twice stops
//! caching fresh grants ([`dlock_core::manager::Payback`]): with no affinity — every key taken
//! by whichever worker comes next — each key would otherwise cost a wasted revoke, and the
//! requester a wait for this worker to notice it, before its own demotion, and again each time
//! that ran out. Then 63 fresh grants in 64 end in an unlock, as without caching; the 64th is
//! cached as a probe, and grants taken from the cache stay cached, so caching resumes
//! once grants pay again.
//!
//! A key the server granted plain though it was asked for cached (protocol 8: the lock is
//! contended, `dlock_core::manager::contention`, and the grant's result says so) is never
//! cached: its transaction's end unlocks it in the same batch as the keys it does not keep,
//! exactly as without caching, and no revoke notice is read for it.
//!
//! Whether a grant is cached follows what the server was asked for it, never the filter's
//! answer after ([`RowGroupLocks::set_cache_filter`]): the filter is asked at each acquisition,
//! and a key's name asks for cacheable grants, or stops, before the request goes out (not
//! while a grant of it is cached). A key asked for plain is unlocked at its transaction's end
//! even if the filter keeps it by then; a cached grant the filter no longer keeps has its
//! revokes read until its transaction's end gives it back.
//!
//! The engine's loop calls `keep_leases` between transactions anyway, so an idle worker answers
//! its revokes within a quarter lease; one that does not answer loses the grant at the server's
//! revoke timeout (the lease by default), which the server then counts (`revokes_lapsed`).

use dlock_core::manager::cache::{Acquire, OnRevoke, Release, Reply, ServerOp, on_overflow};
use dlock_core::manager::{CachedLock, Demotion};
use dlock_core::proto::Event;
use dlock_core::{FencingToken, LockId, LockKind, Mode, Status};

use dlock_transport::client::Connection;
use dlock_transport::client::cached::{drive_op, send_op, warn_overdue};

use super::{Held, RowGroup, RowGroupLocks, is_fatal};

/// A grant kept after its transaction ended.
#[derive(Clone, Copy, Debug)]
pub(super) struct Cached {
    pub(super) id: LockId,
    /// The core's record of the grant (no local user while it is here).
    pub(super) rec: CachedLock,
    /// How many times it was taken again from the cache since the server granted it
    /// (`manager::Demotion`).
    pub(super) reuses: u32,
    /// A give-back or downgrade the server did not answer: sent again at the next look.
    pub(super) owed: Option<Owed>,
}

/// An op the server did not answer, and the status its last send failed with (what a call
/// that must wait for it answers).
pub(super) type Owed = (ServerOp, Status);

/// The record of a grant the server just gave in `mode` with `token`, one local user (the
/// transaction) holding it.
pub(super) fn granted(mode: Mode, token: u64) -> CachedLock {
    let mut rec = CachedLock::new(LockKind::Rw);
    let asked = rec.acquire(mode);
    debug_assert_eq!(asked, Acquire::Send(ServerOp::Acquire(mode)));
    let got = rec.on_reply(Status::Success, token);
    debug_assert_eq!(got, Reply::Granted);
    rec
}

/// The mode a local user of a record holds it in (a reader under an exclusive grant reads).
fn user_mode(rec: &CachedLock) -> Mode {
    match rec.users() {
        (_, true) => Mode::Exclusive,
        _ => Mode::Shared,
    }
}

impl<C: Connection> RowGroupLocks<C> {
    /// Reads the revokes the server sent this worker and acts on them (module doc): cached
    /// keys are given back or downgraded now, keys of the open transaction at its end; what a
    /// give-back left owed is sent again. Returns how many cached keys went back. `Err` when
    /// the client is gone.
    pub fn poll_revokes(&mut self) -> Result<usize, Status> {
        self.health()?;
        if !self.cfg.cached || self.caches_nothing() && self.client.events_may_wait() {
            return Ok(0);
        }
        let mut events = std::mem::take(&mut self.events);
        let read = self.client.poll_events(|e| events.push(e));
        let mut back = 0;
        let mut failed = None;
        // Read once per look, and only when something came.
        let now = if events.is_empty() {
            0
        } else {
            self.client.now_ms()
        };
        for e in events.drain(..) {
            match self.on_event(e, now) {
                Ok(n) => back += n,
                Err(s) => failed = failed.or(Some(s)),
            }
        }
        self.events = events;
        read.map_err(|e| self.check(e.status()))?;
        failed.map_or(Ok(()), Err)?;
        self.send_owed()?;
        self.warn_overdue();
        Ok(back)
    }

    /// Whether the server holds no cached grant for this worker, and nothing is owed: no key in
    /// the cache, and every key of the open transaction never cached (asked for plain, or
    /// granted plain on a contended lock: `Held::never_cached`, what the server was asked,
    /// not what the filter says now). Then no
    /// revoke is for anything it holds, and a look at the events may wait while the client's
    /// trust bound holds
    /// ([`Client::events_may_wait`](dlock_transport::client::Client::events_may_wait)): an
    /// acquisition pays no event poll — over TCP a system call — on top of an uncached one's.
    fn caches_nothing(&self) -> bool {
        self.cache.is_empty() && self.owed.is_empty() && self.held.iter().all(|h| h.never_cached)
    }

    /// One event, read at `now`; how many cached keys it gave back.
    fn on_event(&mut self, e: Event, now: u64) -> Result<usize, Status> {
        match e {
            Event::Revoke {
                lock,
                wanted,
                fence,
            } => {
                let Some(&key) = self.ids.get(&lock) else {
                    return Ok(0);
                };
                // The open transaction's keys, in the order they were taken (few).
                if let Some(i) = self.held.iter().position(|h| h.id == lock) {
                    let h = &mut self.held[i];
                    let first = h.rec.revoke().is_none();
                    let act = h.rec.on_revoke(wanted, fence, now);
                    let reuses = h.reuses;
                    if act != OnRevoke::Ignore && first {
                        self.demote(key, reuses);
                    }
                    if let OnRevoke::Send(op) = act {
                        // Readers of an exclusive grant, shared wanted: it goes shared now.
                        self.drive_held(i, op)?;
                    }
                    return Ok(0);
                }
                let Some(c) = self.cache.get_mut(&key) else {
                    return Ok(0);
                };
                match c.rec.on_revoke(wanted, fence, now) {
                    OnRevoke::Send(op) => {
                        let reuses = c.reuses;
                        self.demote(key, reuses);
                        self.drive_cached(key, op).map(usize::from)
                    }
                    OnRevoke::Ignore | OnRevoke::Deferred => Ok(0),
                }
            }
            Event::Overflow => {
                // The open transaction's keys have their users: given back at its end.
                on_overflow(
                    self.held.iter_mut().map(|h| (h.key, &mut h.rec)),
                    now,
                    |_, _| {},
                );
                let mut sends = std::mem::take(&mut self.overflowed);
                let cached = self.cache.iter_mut().map(|(&key, c)| (key, &mut c.rec));
                on_overflow(cached, now, |key, act| {
                    if let OnRevoke::Send(op) = act {
                        sends.push((key, op));
                    }
                });
                let back = sends.drain(..).try_fold(0, |n, (key, op)| {
                    Ok(n + usize::from(self.drive_cached(key, op)?))
                });
                self.overflowed = sends;
                back
            }
        }
    }

    /// Sends `op` for cached `key` and hands the replies to its record (module doc): gone from
    /// the cache once given back, kept (shared) after a downgrade, kept owed when the server
    /// did not answer. Whether it was given back.
    fn drive_cached(&mut self, key: RowGroup, op: ServerOp) -> Result<bool, Status> {
        let c = self.cache[&key];
        let (rec, owed) = self.drive(c.id, c.rec, op)?;
        if owed.is_some() {
            self.owed.push(key);
        }
        if rec.held().is_none() && owed.is_none() {
            self.cache.remove(&key);
            return Ok(true);
        }
        self.cache.insert(key, Cached { rec, owed, ..c });
        Ok(false)
    }

    /// Sends `op` (a downgrade) for the open transaction's `held[i]`; one not answered is
    /// sent again when the transaction ends.
    fn drive_held(&mut self, i: usize, op: ServerOp) -> Result<(), Status> {
        let h = self.held[i];
        let (rec, owed) = self.drive(h.id, h.rec, op)?;
        let h = &mut self.held[i];
        h.rec = rec;
        h.mode = rec.held().unwrap_or(h.mode);
        h.owed = owed.map(|(op, _)| op);
        Ok(())
    }

    /// Sends `op` for lock `id` and hands the reply to `rec`, again while it asks
    /// ([`drive_op`]): the record after, and the op still owed (with the status it failed
    /// with) when the server did not answer. A fatal status ends the client (`Err`).
    fn drive(
        &mut self,
        id: LockId,
        rec: CachedLock,
        op: ServerOp,
    ) -> Result<(CachedLock, Option<Owed>), Status> {
        let held_token = FencingToken(rec.token());
        let mut cx = (&mut *self, rec);
        let done = drive_op(
            &mut cx,
            op,
            |(w, _), op| match send_op(&mut w.client, id, op) {
                (status, _) if is_fatal(status) => Err(w.check(status)),
                answered => Ok(answered),
            },
            |(_, rec)| rec,
        )?;
        let rec = cx.1;
        match done.reply {
            Reply::Send(next) => {
                tracing::warn!(lock = ?id, status = %done.status, "dlock: a cached row-group key's give-back is owed");
                Ok((rec, Some((next, done.status))))
            }
            Reply::Lost => {
                self.lose(id, held_token);
                Ok((rec, None))
            }
            _ => Ok((rec, None)),
        }
    }

    /// The server no longer held lock `id` (its grant's token `token`) while the open
    /// transaction read under it (a downgrade refused: the revoke lapsed first): the key is
    /// lost, as when the client dies, and the transaction must abort.
    fn lose(&mut self, id: LockId, token: FencingToken) {
        let Some(&key) = self.ids.get(&id) else {
            return;
        };
        tracing::warn!(lock = ?id, "dlock: a row-group key's grant was lost while a transaction read under it");
        self.report_lost(key, token);
    }

    /// Sends again what the server did not answer (cached keys; a transaction's own go with
    /// its end).
    fn send_owed(&mut self) -> Result<(), Status> {
        for key in std::mem::take(&mut self.owed) {
            if let Some((op, _)) = self.cache.get_mut(&key).and_then(|c| c.owed.take()) {
                self.drive_cached(key, op)?;
            }
        }
        Ok(())
    }

    /// Warns of revokes the open transaction outlived by the lease (as `CachedLocks`): the
    /// server has let those keys go.
    fn warn_overdue(&mut self) {
        // Only when a key of the open transaction has a revoke, or was warned about one (its
        // mark is cleared below): every look passes here, and most find nothing to warn of,
        // with no clock read.
        if !self
            .held
            .iter()
            .any(|h| h.warned || h.rec.revoke().is_some())
        {
            return;
        }
        let (now, lease_ms) = (self.client.now_ms(), self.lease_ms().max(1));
        for h in &mut self.held {
            warn_overdue(h.id, &h.rec, &mut h.warned, now, lease_ms);
        }
    }

    /// Records a revoke of `key`'s grant, reused `reuses` times (`manager::Demotion`, and
    /// `manager::Payback` when it had not paid yet).
    fn demote(&mut self, key: RowGroup, reuses: u32) {
        if reuses < Demotion::REUSES_THAT_PAY {
            self.payback = self.payback.wasted();
        }
        let d = self
            .contended
            .get(&key)
            .copied()
            .unwrap_or(Demotion::NONE)
            .revoked(reuses);
        self.set_demotion(key, d);
    }

    /// Keeps `key`'s demotion record, or drops it when it says nothing.
    fn set_demotion(&mut self, key: RowGroup, d: Demotion) {
        if d == Demotion::NONE {
            self.contended.remove(&key);
        } else {
            self.contended.insert(key, d);
        }
    }

    /// Whether `key`'s use that just ended, its grant reused `reuses` times, keeps it cached:
    /// not while the key is demoted (one of its plain uses is counted off), nor, for a fresh
    /// grant, while caching is suspended for this worker (`manager::Payback`).
    fn keeps(&mut self, key: RowGroup, reuses: u32) -> bool {
        if let Some(&d) = self.contended.get(&key) {
            let (keep, d) = d.keep();
            self.set_demotion(key, d);
            if !keep {
                return false;
            }
        }
        let (keep, p) = self.payback.keep(reuses > 0);
        self.payback = p;
        keep
    }

    /// Whether `key` in `mode` is covered by a cached grant: if so it moves to the open
    /// transaction (no message) and `true`; its end keeps it cached only if the filter still
    /// does (`keep`).
    pub(super) fn take_cached(&mut self, key: RowGroup, mode: Mode, keep: bool) -> bool {
        let Some(c) = self.cache.get_mut(&key) else {
            return false;
        };
        // Only what the grant covers: anything else would put a conversion in flight (or, with
        // nothing held, an acquisition).
        let covers = c
            .rec
            .held()
            .is_some_and(|held| held == Mode::Exclusive || mode == Mode::Shared);
        if !covers || c.rec.acquire(mode) != Acquire::Local {
            return false;
        }
        let c = self.cache.remove(&key).expect("checked");
        let (held, token) = (c.rec.held().expect("covers"), c.rec.token());
        self.held.push(Held {
            key,
            id: c.id,
            // A cached exclusive grant taken for a read stays exclusive: the server holds it so.
            mode: held,
            token: dlock_core::FencingToken(token),
            reuses: c.reuses.saturating_add(1),
            rec: c.rec,
            owed: None,
            warned: false,
            // Asked for cacheable and granted so (only such grants are cached): the server may
            // revoke it whatever the filter says now, so its revokes are read.
            never_cached: false,
            kept: keep,
        });
        if c.reuses + 1 == Demotion::REUSES_THAT_PAY {
            self.payback = self.payback.paid();
        }
        self.cache_hits += 1;
        true
    }

    /// Gives back the cached shared grants of keys the call wants exclusive (the RW lock has
    /// no upgrade): they are then asked for as any key. One the server did not answer stays
    /// owed, and the call fails with its status, as it does while an earlier one is owed.
    pub(super) fn drop_cached_upgrades(
        &mut self,
        wants: &[(RowGroup, Mode)],
    ) -> Result<(), Status> {
        for &(key, mode) in wants {
            if mode != Mode::Exclusive {
                continue;
            }
            let Some(c) = self.cache.get_mut(&key) else {
                continue;
            };
            if c.rec.held() != Some(Mode::Shared) {
                continue;
            }
            // Shared held, exclusive wanted: the record puts the shared grant's give-back in
            // flight (a conversion).
            let (id, asked) = (c.id, c.rec.acquire(Mode::Exclusive));
            let op = match asked {
                Acquire::Send(op) => op,
                // Waiting for a give-back or downgrade owed (all a cached key has in flight;
                // `poll_revokes` just sent it again): its failure is the answer.
                Acquire::Wait => return Err(c.owed.map_or(Status::Eagain, |(_, s)| s)),
                Acquire::Local | Acquire::Refuse(_) => continue,
            };
            let rec = self.cache[&key].rec;
            let (rec, owed) = self.drive(id, rec, op)?;
            if let Some((op, status)) = owed {
                let c = self.cache.get_mut(&key).expect("checked");
                (c.rec, c.owed) = (rec, Some((op, status)));
                self.owed.push(key);
                return Err(status);
            }
            self.cache.remove(&key);
        }
        Ok(())
    }

    /// Ends the use of the open transaction's keys from `from` on: into the cache, except
    /// those a revoke asked back meanwhile, never cached (asked for plain, or granted plain:
    /// protocol 8), the filter did not keep when they were taken, or the policy lets go, which
    /// are left in `held[from..]`, their give-backs in flight, for the caller to unlock (in
    /// its batch).
    pub(super) fn cache_from(&mut self, from: usize) -> Result<(), Status> {
        let mut keep = from;
        for i in from..self.held.len() {
            let mut h = self.held[i];
            let released = h.rec.release(user_mode(&h.rec));
            if h.rec.held().is_none() {
                // Lost (reported when it was found): nothing to cache or give back.
                continue;
            }
            // A downgrade the server did not answer during the transaction is sent first.
            let mut op = h.owed.take().or(match released {
                Release::Send(op) => Some(op),
                Release::Keep | Release::Refuse(_) => None,
            });
            if op == Some(ServerOp::Downgrade) {
                let (rec, owed) = self.drive(h.id, h.rec, ServerOp::Downgrade)?;
                h.rec = rec;
                if let Some(owed) = owed {
                    self.keep_owed(h, owed);
                    continue;
                }
                if rec.held().is_none() {
                    // Given back as well (a stronger revoke came after), or lost.
                    continue;
                }
                (h.mode, op) = (Mode::Shared, None);
            }
            let asked_back = matches!(op, Some(ServerOp::GiveBack(_)));
            // A grant made plain goes back as the plain unlock it is, before the policy counts
            // a use it never had (`keeps`).
            if asked_back || h.never_cached || !h.kept || !self.keeps(h.key, h.reuses) {
                if !asked_back {
                    // The policy's give-back: the record puts it in flight.
                    let _ = h.rec.give_back();
                }
                self.held[keep] = h;
                keep += 1;
            } else {
                self.cache.insert(
                    h.key,
                    Cached {
                        id: h.id,
                        rec: h.rec,
                        reuses: h.reuses,
                        owed: None,
                    },
                );
            }
        }
        self.held.truncate(keep);
        Ok(())
    }

    /// Keeps `h`, whose `owed` give-back or downgrade the server did not answer, in the cache
    /// until it is sent again.
    fn keep_owed(&mut self, h: Held, owed: Owed) {
        self.cache.insert(
            h.key,
            Cached {
                id: h.id,
                rec: h.rec,
                reuses: h.reuses,
                owed: Some(owed),
            },
        );
        self.owed.push(h.key);
    }

    /// After `h`'s unlock answered `status` (not a fatal one: that ended the client): a
    /// give-back the server did not answer stays owed in the cache.
    pub(super) fn unlocked(&mut self, h: Held, status: Status) {
        if !self.cfg.cached || !h.rec.giving_back() {
            return;
        }
        let mut rec = h.rec;
        if let Reply::Send(op) = rec.on_reply(status, 0) {
            tracing::warn!(lock = ?h.id, status = %status, "dlock: a cached row-group key's give-back is owed");
            self.keep_owed(Held { rec, ..h }, (op, status));
        }
    }
}
