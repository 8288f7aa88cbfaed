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
//! | held by the open transaction | any       | given back when the transaction ends, not cached |
//! | (an event-ring overflow)     | —         | every cached key given back, every held key at the end |
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
//! The engine's loop calls `keep_leases` between transactions anyway, so an idle worker answers
//! its revokes within a quarter lease; one that does not answer loses the grant at the server's
//! revoke timeout (the lease by default), which the server then counts (`revokes_lapsed`).

use dlock_core::manager::Demotion;
use dlock_core::proto::Event;
use dlock_core::{FencingToken, LockId, Mode, Status};

use dlock_transport::client::Connection;

use super::{Held, RowGroup, RowGroupLocks};

/// A grant kept after its transaction ended.
#[derive(Clone, Copy, Debug)]
pub(super) struct Cached {
    pub(super) id: LockId,
    pub(super) mode: Mode,
    pub(super) token: FencingToken,
    /// How many times it was taken again from the cache since the server granted it
    /// (`manager::Demotion`).
    pub(super) reuses: u32,
}

impl<C: Connection> RowGroupLocks<C> {
    /// Reads the revokes the server sent this worker and acts on them (module doc): cached
    /// keys are given back or downgraded now, keys of the open transaction at its end. Returns
    /// how many cached keys went back. `Err` when the client is gone.
    pub fn poll_revokes(&mut self) -> Result<usize, Status> {
        self.health()?;
        if !self.cfg.cached {
            return Ok(0);
        }
        let mut events = std::mem::take(&mut self.events);
        let read = self.client.poll_events(|e| events.push(e));
        let mut back = 0;
        let mut failed = None;
        for e in events.drain(..) {
            match self.on_event(e) {
                Ok(n) => back += n,
                Err(s) => failed = failed.or(Some(s)),
            }
        }
        self.events = events;
        read.map_err(|e| self.check(e.status()))?;
        failed.map_or(Ok(back), Err)
    }

    /// One event; how many cached keys it gave back.
    fn on_event(&mut self, e: Event) -> Result<usize, Status> {
        match e {
            Event::Revoke {
                lock,
                wanted,
                fence,
            } => {
                if let Some(&h) = self.held.iter().find(|h| h.id == lock) {
                    if fence >= h.token.0 && !self.revoked.contains(&lock) {
                        self.revoked.push(lock);
                        self.demote(h.key, h.reuses);
                    }
                    return Ok(0);
                }
                let Some((&key, &c)) = self.cache.iter().find(|(_, c)| c.id == lock) else {
                    return Ok(0);
                };
                if fence < c.token.0 {
                    return Ok(0);
                }
                self.demote(key, c.reuses);
                self.give_back_cached(key, c, wanted).map(|()| 1)
            }
            Event::Overflow => {
                let all: Vec<(RowGroup, Cached)> =
                    self.cache.iter().map(|(&k, &c)| (k, c)).collect();
                for h in &self.held {
                    if !self.revoked.contains(&h.id) {
                        self.revoked.push(h.id);
                    }
                }
                for &(key, c) in &all {
                    self.give_back_cached(key, c, Mode::Exclusive)?;
                }
                Ok(all.len())
            }
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

    /// Gives cached `key` back for a want of `wanted`: downgraded when only readers want an
    /// exclusive grant, unlocked otherwise. A refusal (`Fail`: the server let it lapse) leaves
    /// nothing cached either.
    fn give_back_cached(&mut self, key: RowGroup, c: Cached, wanted: Mode) -> Result<(), Status> {
        if c.mode == Mode::Exclusive && wanted == Mode::Shared {
            let done = self.client.downgrade(c.id);
            match done {
                Ok(_) => {
                    self.cache.insert(
                        key,
                        Cached {
                            mode: Mode::Shared,
                            ..c
                        },
                    );
                    return Ok(());
                }
                Err(e) => {
                    self.cache.remove(&key);
                    return self.gone_or_ok(e.status());
                }
            }
        }
        self.cache.remove(&key);
        match self.client.unlock(c.id) {
            Ok(_) => Ok(()),
            Err(e) => self.gone_or_ok(e.status()),
        }
    }

    /// A failed give-back: fatal statuses end the client; any other means it was not held.
    fn gone_or_ok(&mut self, s: Status) -> Result<(), Status> {
        if super::is_fatal(s) {
            return Err(self.check(s));
        }
        Ok(())
    }

    /// Whether `key` in `mode` is covered by a cached grant: if so it moves to the open
    /// transaction (no message) and `true`.
    pub(super) fn take_cached(&mut self, key: RowGroup, mode: Mode) -> bool {
        let Some(&c) = self.cache.get(&key) else {
            return false;
        };
        if c.mode == Mode::Shared && mode == Mode::Exclusive {
            return false;
        }
        self.cache.remove(&key);
        self.held.push(Held {
            key,
            id: c.id,
            // A cached exclusive grant taken for a read stays exclusive: the server holds it so.
            mode: c.mode,
            token: c.token,
            reuses: c.reuses.saturating_add(1),
        });
        if c.reuses + 1 == Demotion::REUSES_THAT_PAY {
            self.payback = self.payback.paid();
        }
        self.cache_hits += 1;
        true
    }

    /// Gives back the cached shared grants of keys the call wants exclusive (the RW lock has
    /// no upgrade): they are then asked for as any key.
    pub(super) fn drop_cached_upgrades(
        &mut self,
        wants: &[(RowGroup, Mode)],
    ) -> Result<(), Status> {
        for &(key, mode) in wants {
            if mode == Mode::Exclusive
                && let Some(&c) = self.cache.get(&key)
                && c.mode == Mode::Shared
            {
                self.give_back_cached(key, c, Mode::Exclusive)?;
            }
        }
        Ok(())
    }

    /// Moves the open transaction's keys from `from` on into the cache, except those revoked
    /// meanwhile or not cached by the filter, which are left in `held[from..]` for the
    /// caller to unlock.
    pub(super) fn cache_from(&mut self, from: usize) {
        let mut keep = from;
        for i in from..self.held.len() {
            let h = self.held[i];
            if self.revoked.contains(&h.id) || !self.caches(h.key) || !self.keeps(h.key, h.reuses) {
                self.held[keep] = h;
                keep += 1;
            } else {
                self.cache.insert(
                    h.key,
                    Cached {
                        id: h.id,
                        mode: h.mode,
                        token: h.token,
                        reuses: h.reuses,
                    },
                );
            }
        }
        self.held.truncate(keep);
        self.revoked
            .retain(|id| self.held.iter().any(|h| h.id == *id));
    }
}
