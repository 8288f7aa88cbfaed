//! One [`super::Txn::acquire`] call: plan (sort, merge, re-entrancy), resolve names, take the
//! keys in order batch by batch, wait for a busy key alone.

use std::time::{Duration, Instant};

use dlock_core::config::BATCH_MAX;
use dlock_core::manager::cache::Acquire;
use dlock_core::{LockId, LockKind, Mode, Status};
use dlock_transport::client::cached::wait_sliced;
use dlock_transport::client::{Connection, Grant};

use super::{AcquireOptions, Held, Name, RowGroup, RowGroupLocks};

/// Fills unused slots of fixed request arrays; never sent.
pub(super) const NO_LOCK: LockId = LockId::new(0, 1);

/// The longest wait the client's `lock()` can express (its `wait_ms` is 32 bits, the core's
/// `MS_MAX`); longer waits are cut to it, which also keeps `Instant + wait` from overflowing.
const WAIT_MAX: Duration = dlock_core::time::MS_MAX;

/// A key the current call must take.
#[derive(Clone, Copy, Debug)]
pub(super) struct Want {
    key: RowGroup,
    mode: Mode,
    /// Filled by `resolve`.
    id: Option<LockId>,
    /// Asked for as cacheable (its name's flag, set by `resolve`): what the server is asked
    /// for this key in this call.
    cacheable: bool,
    /// The cache filter keeps the key (`caches`, asked by `resolve`).
    keep: bool,
}

impl Want {
    fn id(&self) -> LockId {
        self.id.expect("resolve fills every id before take")
    }
}

/// Sorts a key's requests exclusive first, so merging keeps the stronger mode.
fn strength(m: Mode) -> u8 {
    match m {
        Mode::Exclusive => 0,
        Mode::Shared => 1,
    }
}

impl<C: Connection> RowGroupLocks<C> {
    pub(super) fn acquire(
        &mut self,
        requests: &[(RowGroup, Mode)],
        opts: AcquireOptions,
    ) -> Result<(), Status> {
        self.health()?;
        if self.cfg.cached {
            self.poll_revokes()?;
            self.drop_cached_upgrades(requests)?;
        }
        self.plan(requests)?;
        if self.todo.is_empty() {
            return Ok(());
        }
        self.resolve()?;
        // Keys below the largest key held before this call are out of order: never waited for.
        let floor = self.held.last().map(|h| h.key);
        let first_new = self.held.len();
        let wait = opts.wait.min(WAIT_MAX);
        let deadline = Instant::now() + wait;
        let taken = self.take(floor, deadline, AcquireOptions { wait, ..opts });
        if taken.is_err() && opts.all_or_nothing {
            // A failure here is fatal and already reported as a loss; the call's error stands.
            let _ = self.let_go_from(first_new);
        }
        // This call's keys were appended in order, but may sort before earlier calls' keys.
        self.held.sort_unstable_by_key(|h| h.key);
        taken
    }

    /// Fills `todo` with the keys not held yet, sorted and merged; `Einval` (nothing taken) for
    /// an upgrade of a key held shared. A key the transaction reads under a cached exclusive
    /// grant and now wants exclusive becomes its record's writer: counted as a reader, a revoke
    /// wanting shared would downgrade the grant under its writes.
    fn plan(&mut self, requests: &[(RowGroup, Mode)]) -> Result<(), Status> {
        self.todo.clear();
        self.todo.extend(requests.iter().map(|&(key, mode)| Want {
            key,
            mode,
            id: None,
            cacheable: false,
            keep: false,
        }));
        self.todo
            .sort_unstable_by_key(|w| (w.key, strength(w.mode)));
        self.todo.dedup_by_key(|w| w.key);
        // One pass: the keys not held yet stay in `todo` (moved to its front), the writers
        // held readers become are noted, and written only once no key refused (the call then
        // changes nothing).
        self.writers.clear();
        let mut kept = 0;
        for at in 0..self.todo.len() {
            let w = self.todo[at];
            let Ok(i) = self.find(w.key) else {
                self.todo[kept] = w;
                kept += 1;
                continue;
            };
            let h = &self.held[i];
            if w.mode != Mode::Exclusive || h.rec.users().1 {
                continue;
            }
            if h.mode == Mode::Shared {
                return Err(Status::Einval);
            }
            // A reader of an exclusive grant (taken from the cache for a read).
            let mut rec = h.rec;
            if rec.reader_to_writer() != Acquire::Local {
                return Err(Status::Einval);
            }
            self.writers.push((i, rec));
        }
        self.todo.truncate(kept);
        for &(i, rec) in &self.writers {
            self.held[i].rec = rec;
        }
        Ok(())
    }

    /// Gives every key in `todo` its lock id: from the cache, or from the server 31 names per
    /// request (after evicting idle names if the cache would outgrow its bound).
    fn resolve(&mut self) -> Result<(), Status> {
        let missing = self
            .todo
            .iter()
            .filter(|w| !self.names.contains_key(&w.key))
            .count();
        if missing > 0 && self.names.len() + missing > self.cfg.names_max {
            self.evict_idle_names()?;
        }
        let mut at = [0usize; BATCH_MAX];
        let mut names = [[0u8; RowGroup::NAME_LEN]; BATCH_MAX];
        let mut k = 0;
        for i in 0..self.todo.len() {
            let key = self.todo[i].key;
            let keep = self.caches(key);
            self.todo[i].keep = keep;
            if let Some(&name) = self.names.get(&key) {
                self.todo[i].cacheable = self.ask_cacheable(key, name, keep)?;
                self.todo[i].id = Some(name.id);
                continue;
            }
            (at[k], names[k]) = (i, key.lock_name());
            k += 1;
            if k == BATCH_MAX {
                self.get_names(&at[..k], &names[..k])?;
                k = 0;
            }
        }
        if k > 0 {
            self.get_names(&at[..k], &names[..k])?;
        }
        Ok(())
    }

    /// Resolves `names` (of `todo[at[j]]`) in one request.
    fn get_names(
        &mut self,
        at: &[usize],
        names: &[[u8; RowGroup::NAME_LEN]],
    ) -> Result<(), Status> {
        let mut batch: [(LockKind, &[u8]); BATCH_MAX] = [(LockKind::Rw, &[]); BATCH_MAX];
        for (b, name) in batch.iter_mut().zip(names) {
            b.1 = name;
        }
        let got = self
            .client
            .batch_get_lock(&batch[..names.len()])
            .map_err(|e| self.check(e.status()))?;
        for (&i, r) in at.iter().zip(got) {
            let id = r.map_err(|s| self.check(s))?;
            let cacheable = self.todo[i].keep;
            if cacheable {
                // Local: every acquisition of the name asks for a cacheable grant until
                // `ask_cacheable` says otherwise.
                self.client
                    .set_cacheable(id, true)
                    .map_err(|e| self.check(e.status()))?;
            }
            if self.cfg.cached {
                // Local: a wait for the name ends when the server revokes a key this worker
                // caches (`wait_for` answers the revoke and waits again), whether or not this
                // key is cached itself.
                self.client
                    .set_wake_on_revoke(id, true)
                    .map_err(|e| self.check(e.status()))?;
            }
            self.names.insert(self.todo[i].key, Name { id, cacheable });
            self.ids.insert(id, self.todo[i].key);
            self.todo[i].id = Some(id);
            self.todo[i].cacheable = cacheable;
        }
        Ok(())
    }

    /// Whether this call asks for resolved `key` (its `name`) as cacheable: as the filter now
    /// says (`keep`), the name flagged again when that changed (local, no message), except
    /// while the worker caches a grant of it — one asked for cacheable, which the client's
    /// flag must keep describing (its overflow reports, failover re-claims) until it goes back;
    /// the call then takes it from the cache, or, given back meanwhile, asks cacheable once
    /// more, and its end gives back a grant the filter does not keep (`Held::kept`).
    fn ask_cacheable(&mut self, key: RowGroup, name: Name, keep: bool) -> Result<bool, Status> {
        if name.cacheable == keep || self.cache.contains_key(&key) {
            return Ok(name.cacheable);
        }
        self.client
            .set_cacheable(name.id, keep)
            .map_err(|e| self.check(e.status()))?;
        self.names.insert(
            key,
            Name {
                cacheable: keep,
                ..name
            },
        );
        Ok(keep)
    }

    /// Releases the server references of the names neither held nor wanted by this call.
    #[cold]
    fn evict_idle_names(&mut self) -> Result<(), Status> {
        let idle: Vec<(RowGroup, LockId)> = self
            .names
            .iter()
            .filter(|&(&key, _)| {
                self.find(key).is_err()
                    && !self.cache.contains_key(&key)
                    && self.todo.binary_search_by_key(&key, |w| w.key).is_err()
            })
            .map(|(&key, name)| (key, name.id))
            .collect();
        let mut ids = [NO_LOCK; BATCH_MAX];
        for chunk in idle.chunks(BATCH_MAX) {
            for (id, &(_, lock)) in ids.iter_mut().zip(chunk) {
                *id = lock;
            }
            let released = self
                .client
                .batch_release_lock(&ids[..chunk.len()])
                .map_err(|e| self.check(e.status()))?;
            // A name the server would not release stays cached: it is still ours.
            for (&(key, lock), r) in chunk.iter().zip(released) {
                if r.is_ok() {
                    self.names.remove(&key);
                    self.ids.remove(&lock);
                }
            }
        }
        Ok(())
    }

    /// Takes `todo` in order; see the module doc. Appends what it takes to `held`.
    fn take(
        &mut self,
        floor: Option<RowGroup>,
        deadline: Instant,
        opts: AcquireOptions,
    ) -> Result<(), Status> {
        // Without waiting, all-or-nothing is the batch command's own: the server undoes a
        // batch that fails, and `acquire` unlocks the batches before it.
        let atomic_batches = opts.all_or_nothing && opts.wait.is_zero();
        let expire_ms = self.lease_ms();
        let mut requests = [(NO_LOCK, Mode::Exclusive, 0); BATCH_MAX];
        let mut out = [Err(Status::Einval); BATCH_MAX];
        let mut i = 0;
        while i < self.todo.len() {
            // A key the cache covers is taken here, in its place in the order (no message).
            let w = self.todo[i];
            if self.cfg.cached && self.take_cached(w.key, w.mode, w.keep) {
                i += 1;
                continue;
            }
            let n = self.todo[i..]
                .iter()
                .take(BATCH_MAX)
                .take_while(|w| !self.cache.contains_key(&w.key))
                .count()
                // A cached key the cache could not cover (never after `drop_cached_upgrades`)
                // is asked for as any key.
                .max(1);
            let want = self.todo[i];
            if n == 1 && self.waits_at_once(want, floor, opts) {
                // Caching, a key asked for alone — its neighbours in the order are cached —
                // goes straight to the wait: a trylock refused for a key another worker
                // caches sends the same revoke and is only followed by the wait, one message
                // more per contended key (a free key is granted by either in one message).
                let g = self.wait_for(want, Status::Fail, floor, deadline, opts)?;
                self.held.push(held(&want, &g));
                i += 1;
                continue;
            }
            for (r, w) in requests.iter_mut().zip(&self.todo[i..i + n]) {
                // RW grants have no expiry; the lease only satisfies the "0 reads the cache" rule.
                *r = (w.id(), w.mode, expire_ms);
            }
            self.client
                .batch_trylock(&requests[..n], atomic_batches, &mut out[..n])
                .map_err(|e| self.check(e.status()))?;
            let granted = out[..n].iter().take_while(|r| r.is_ok()).count();
            for (w, r) in self.todo[i..i + granted].iter().zip(&out) {
                if let Ok(g) = r {
                    self.held.push(held(w, g));
                }
            }
            if granted == n {
                i += n;
                continue;
            }
            // In an undone batch the entries that had worked say `Eagain`; blame the other one.
            let refused = out[granted..n]
                .iter()
                .filter_map(|r| r.err())
                .find(|&s| !(atomic_batches && s == Status::Eagain))
                .unwrap_or(Status::Eagain);
            // Keeping grants past the refused key while waiting for it would break the order.
            self.give_back(&requests[granted + 1..n], &out[granted + 1..n])?;
            let want = self.todo[i + granted];
            let g = self.wait_for(want, refused, floor, deadline, opts)?;
            self.held.push(held(&want, &g));
            i += granted + 1;
        }
        Ok(())
    }

    /// Whether `want` may be waited for without a trylock first: caching (whose waits end at a
    /// revoke), waiting asked for, and in order (`wait_for`'s own conditions).
    fn waits_at_once(&self, want: Want, floor: Option<RowGroup>, opts: AcquireOptions) -> bool {
        self.cfg.cached && !opts.wait.is_zero() && floor.is_none_or(|f| want.key >= f)
    }

    /// Unlocks the entries of `requests` that `out` says were granted.
    fn give_back(
        &mut self,
        requests: &[(LockId, Mode, u32)],
        out: &[Result<Grant, Status>],
    ) -> Result<(), Status> {
        let mut ids = [NO_LOCK; BATCH_MAX];
        let mut n = 0;
        for (r, o) in requests.iter().zip(out) {
            if o.is_ok() {
                ids[n] = r.0;
                n += 1;
            }
        }
        if n == 0 {
            return Ok(());
        }
        let mut undone = [Err(Status::Einval); BATCH_MAX];
        self.client
            .batch_unlock(&ids[..n], &mut undone[..n])
            .map_err(|e| self.check(e.status()))?;
        // Only a fatal status matters: anything else means the grant is not held.
        match undone[..n]
            .iter()
            .filter_map(|r| r.err())
            .find(|&s| super::is_fatal(s))
        {
            Some(s) => Err(self.check(s)),
            None => Ok(()),
        }
    }

    /// After `want` was refused with `refused`: waits for it alone when that may help and is
    /// allowed (busy, waiting asked for, in order, time left), otherwise fails.
    fn wait_for(
        &mut self,
        want: Want,
        refused: Status,
        floor: Option<RowGroup>,
        deadline: Instant,
        opts: AcquireOptions,
    ) -> Result<Grant, Status> {
        let out_of_order = floor.is_some_and(|f| want.key < f);
        if refused != Status::Fail || opts.wait.is_zero() || out_of_order {
            return Err(self.check(refused));
        }
        let expire_ms = self.lease_ms();
        if deadline <= Instant::now() {
            return Err(Status::Etimeout);
        }
        if !self.cfg.cached {
            let left = deadline.saturating_duration_since(Instant::now());
            return self
                .client
                .lock(want.id(), want.mode, expire_ms, left)
                .map_err(|e| self.check(e.status()));
        }
        // Caching, the wait goes in slices with the revokes answered between them
        // (`dlock_transport::client::cached::wait_sliced`): a worker blocked here while another
        // waits for a key it merely caches would otherwise hold that key until one of the two
        // waits ran out. A revoke sent while the request is parked ends the slice at once
        // (`set_wake_on_revoke`, set on every name); the slice remains for one that came
        // between the look below and the parking.
        self.poll_revokes()?;
        wait_sliced(
            self,
            deadline,
            |w| w.poll_revokes().map(drop),
            |w, slice| {
                w.client
                    .lock(want.id(), want.mode, expire_ms, slice)
                    .map_err(|e| w.check(e.status()))
            },
            |s| *s == Status::Etimeout,
        )
    }
}

/// The record of `w`'s grant `g`: never cached when it was asked for plain or granted plain,
/// whatever the filter says now.
fn held(w: &Want, g: &Grant) -> Held {
    Held {
        key: w.key,
        id: w.id(),
        mode: w.mode,
        token: g.token,
        reuses: 0,
        rec: super::cache::granted(w.mode, g.token.0),
        owed: None,
        warned: false,
        never_cached: g.plain || !w.cacheable,
        kept: w.keep,
    }
}
