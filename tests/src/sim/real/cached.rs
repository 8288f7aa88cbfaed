//! Processes of the real-client simulator that run an engine's cached locks: a
//! `dlock_transport::client::CachedLocks` over the simulator's connection, whose RW locks are
//! asked for as cacheable, guards taken (from the server, or locally from a grant it keeps)
//! and held across steps, dropped (kept cached, or given back when a revoke waits for them),
//! and the revoke channel polled as an engine's loop polls it.
//!
//! The seed's toggles ([`swarm`](crate::sim::swarm)) shape them: `cache_ppm` is the share of
//! the reference-shaped process slots that run cached locks instead, `min_hold_ms` the
//! server's minimum hold, and `revoke_ignore_ppm` how often such a process goes deaf for a
//! while — it keeps its guards and its lease (heartbeats) but neither polls nor takes, so the
//! revokes that come meanwhile lie unread and its grants lapse at the revoke timeout.
//!
//! With `value_ppm`, some handles ask for value blocks and half their write guards set one,
//! which the handle writes when it gives the grant back or downgrades it; with
//! `downgrade_ppm`, a write guard let go is now and then downgraded in place instead
//! ([`Sim::cached_downgrade`]): its user reads on, the handle's record must hold the lock
//! shared, and the server's block must be the one the guard reads (the one its writer set,
//! or the grant's); with
//! `reconnect_ppm`, a process whose connection broke registers again over a new one
//! ([`Sim::cached_reconnect`]) instead of starting over, keeping its guards.
//!
//! What such a process believes is what its live guards say, within the rules of a cached
//! grant ([`Cached::beliefs`]); a guard handed out with no message must also keep the rules
//! the real client relies on ([`Cached::check_local`]) and read the block its grant came with
//! or a local writer of that grant set since ([`Cached::check_value`]). A broken connection
//! revokes every grant held when it broke (`manager::trust`, rule 2: `SimConn::reconnect`
//! files it as an overflow would be), and a guard from before a failover stands on nothing
//! (rule 3).

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;

use dlock_core::manager::conflicts;
use dlock_core::manager::value::ValueRead;
use dlock_core::{LockKind, Mode, Status};
use dlock_transport::client::{
    CachedLocks, CachedReadGuard, CachedRwLock, CachedWriteGuard, Client, Error, ErrorKind,
};

use super::conn::{EVERY_LOCK, SeenRevoke, Shared, SimConn, Watch};
use super::native::Held;
use super::procs::{CLIENT_LEASE_MS, Sim};
use crate::sim::net::LinkId;
use crate::sim::oracle::values::Block;

/// A guard the process holds.
enum Guard<'r> {
    Read(CachedReadGuard<SimConn<'r>>),
    Write(CachedWriteGuard<SimConn<'r>>),
}

impl Guard<'_> {
    /// The fencing token of the grant the guard stands on.
    fn token(&self) -> u64 {
        match self {
            Guard::Read(g) => g.token().0,
            Guard::Write(g) => g.token().0,
        }
    }

    /// The value block the guard reads.
    fn value(&self) -> Option<ValueRead> {
        match self {
            Guard::Read(g) => g.value(),
            Guard::Write(g) => g.value(),
        }
    }
}

/// A process running cached locks.
pub(super) struct Cached<'r> {
    locks: CachedLocks<SimConn<'r>>,
    /// Its link, cut when it crashes (a crash sends nothing).
    link: LinkId,
    watch: Rc<RefCell<Watch>>,
    /// Per lock name, its handle, its id's raw value, and whether it asks for value blocks
    /// (RW names only).
    handles: Vec<Option<(CachedRwLock<SimConn<'r>>, u32, bool)>>,
    /// Live guards, each with the lock (name, mode), the lock id's raw value, and the server
    /// incarnation it was taken from.
    held: Vec<(Guard<'r>, Held, u32, u32)>,
    /// Per grant the server gave (lock id's raw value, token), how many of the connection's
    /// revokes the client had read when it came: an overflow read later revokes it.
    grants: HashMap<(u32, u64), usize>,
    /// Per grant (lock id's raw value, token), the value block its guards read: as the
    /// server's grant returned it (which the oracle checks), or as a local writer set it since.
    values: HashMap<(u32, u64), Option<ValueRead>>,
    /// Deaf (module doc) until this sim time.
    deaf_until: u64,
}

/// The revoke timeout every cached grant of the simulator has: the holder's lease
/// (`Timing::revoke_timeout_for` with none configured).
const REVOKE_TIMEOUT_MS: u64 = CLIENT_LEASE_MS;

impl<'r> Cached<'r> {
    /// Registers over a fresh link of process `owner`, whose lease counts from `heard`;
    /// `None` when refused.
    pub(super) fn start(
        world: &Shared<'r>,
        owner: usize,
        heard: Rc<Cell<u64>>,
        names: usize,
    ) -> Option<Cached<'r>> {
        let conn = SimConn::new(Rc::clone(world), owner, heard);
        let (link, watch) = (conn.link(), conn.watch());
        let client = Client::over(conn, Sim::config()).ok()?;
        Some(Cached {
            locks: CachedLocks::new(client),
            link,
            watch,
            handles: (0..names).map(|_| None).collect(),
            held: Vec::new(),
            grants: HashMap::new(),
            values: HashMap::new(),
            deaf_until: 0,
        })
    }

    /// Whether `r`, the `i`th revoke the connection saw, is meant for grant `token` of lock id
    /// `raw`, which came when the client had read `since` of them: a revoke of the lock sent
    /// for it or a later grant (its fence), or an overflow after it.
    fn revokes(r: &SeenRevoke, i: usize, raw: u32, token: u64, since: usize) -> bool {
        match r.lock {
            EVERY_LOCK => i >= since,
            lock => lock == raw && r.fence >= token,
        }
    }

    /// The latest sim time a guard of grant `token` on lock id `raw` is still sure to be held
    /// on the server: the grant lapses no earlier than the revoke timeout after the last
    /// data request answered (every revoke not yet arrived was sent after it: the stream is in
    /// order, `dlock_core::manager::trust`) and after the floor of every revoke for it that did
    /// arrive (an overflow stands where the lost revokes would have been). Until it gives the
    /// grant back, a cached holder is a holder within that.
    fn sure_until(&self, watch: &Watch, raw: u32, token: u64) -> u64 {
        let since = self.grants.get(&(raw, token)).copied().unwrap_or(0);
        let floor = watch
            .revokes
            .iter()
            .enumerate()
            .filter(|&(i, r)| Self::revokes(r, i, raw, token, since))
            .map(|(_, r)| r.floor)
            .fold(watch.anchor, u64::min);
        floor + REVOKE_TIMEOUT_MS
    }

    /// What its live guards say at `now`, while the server is incarnation `incarnation`
    /// (module doc), each under the token its guard reads. A guard from an earlier server
    /// stands on nothing: a failover re-claims no cached grant (`manager::trust`, rule 3).
    pub(super) fn beliefs(&self, now: u64, incarnation: u32) -> Vec<Held> {
        let watch = self.watch.borrow();
        self.held
            .iter()
            .filter(|(g, _, raw, from)| {
                *from == incarnation && now < self.sure_until(&watch, *raw, g.token())
            })
            .map(|(g, h, _, _)| Held {
                token: g.token(),
                ..*h
            })
            .collect()
    }

    /// The rules of a guard handed out with no message at `now`, in `mode` under grant
    /// `token` of lock id `raw`: the client trusts the grant only within the revoke timeout of
    /// the last data request answered (`manager::trust`), and takes no new user once it has
    /// read a revoke of the grant that conflicts with the user's mode (`manager::cache`). (The
    /// handle reads its events once as it starts a take; one that arrives during the
    /// give-backs that reading led to is read at its next look: the belief rule still counts
    /// it from its arrival.)
    fn check_local(&self, now: u64, raw: u32, mode: Mode, token: u64) -> Result<(), String> {
        let watch = self.watch.borrow();
        if now >= watch.anchor + REVOKE_TIMEOUT_MS {
            return Err(format!(
                "a cached guard ({mode:?}, token {token:#x}) handed out locally at {now}, past the \
                 trust bound: the last data request answered was sent at {}",
                watch.anchor
            ));
        }
        let since = self.grants.get(&(raw, token)).copied().unwrap_or(0);
        if let Some((_, r)) = watch.revokes[..watch.read]
            .iter()
            .enumerate()
            .find(|&(i, r)| Self::revokes(r, i, raw, token, since) && conflicts(mode, r.wanted))
        {
            return Err(format!(
                "a cached guard ({mode:?}, token {token:#x}) handed out locally at {now} after a \
                 revoke of its grant arrived ({r:?})"
            ));
        }
        Ok(())
    }

    /// A guard of grant `token` on lock id `raw` handed out with no message reads `read`: the
    /// block the grant came with, or the one a local writer of the same grant set since.
    fn check_value(&self, raw: u32, token: u64, read: Option<ValueRead>) -> Result<(), String> {
        match self.values.get(&(raw, token)) {
            Some(&want) if want != read => Err(format!(
                "a cached guard (token {token:#x}) handed out locally reads the value block \
                 {read:?}, while its grant's is {want:?}"
            )),
            _ => Ok(()),
        }
    }

    /// Gone without a word: its link is cut first, so its guards' drops send nothing.
    pub(super) fn crash(self, world: &Shared<'r>) {
        {
            let mut w = world.borrow_mut();
            w.net.break_link(self.link);
            w.links_broken();
        }
        drop(self);
    }
}

/// Whether an error means the registration or the connection is gone: the process starts
/// over, as an engine reconnects.
fn gone(e: &Error) -> bool {
    e.kind() == ErrorKind::Disconnected
        || matches!(
            e.status(),
            Status::BadResponse | Status::NotReady | Status::ClientNotInit
        )
}

impl<'r> Sim<'r> {
    fn cached(&mut self, p: usize) -> &mut Cached<'r> {
        self.procs[p].cached.as_mut().expect("a cached process")
    }

    /// One scheduled action of cached process `p`, which is running.
    pub(super) fn act_cached(&mut self, p: usize, now: u64) -> Result<(), String> {
        self.ops += 1;
        let outcome = if now < self.cached(p).deaf_until {
            // Deaf: only its lease is kept (a control request reads no event).
            self.cached(p).locks.with_client(|c| c.heartbeat())
        } else {
            match self.rng.range(0, 100) {
                0..=39 => self.cached_take(p, now),
                40..=64 => {
                    // Released locally: kept cached, or given back if a revoke waits for it;
                    // or a writer downgrades and reads on.
                    let n = self.cached(p).held.len();
                    if n == 0 {
                        Ok(())
                    } else {
                        let i = self.rng.index(n);
                        let write = matches!(self.cached(p).held[i].0, Guard::Write(_));
                        let ppm = self.world.borrow().plan.downgrade_ppm;
                        if write && ppm > 0 && self.cached_downgrades.chance(ppm) {
                            self.cached_downgrade(p, i)
                        } else {
                            drop(self.cached(p).held.swap_remove(i));
                            Ok(())
                        }
                    }
                }
                65..=79 => {
                    // The engine's loop: every notice, each given back by the handle itself.
                    let revokes = self.cached(p).locks.revokes();
                    loop {
                        match revokes.try_recv() {
                            Ok(Some(_)) => {}
                            Ok(None) => break Ok(()),
                            Err(e) => break Err(e),
                        }
                    }
                }
                80..=91 => self.cached(p).locks.with_client(|c| c.heartbeat()),
                92..=96 => {
                    let ppm = self.world.borrow().plan.revoke_ignore_ppm;
                    if ppm > 0 && self.rng.chance(ppm) {
                        let until = now + self.rng.range(CLIENT_LEASE_MS / 2, 3 * CLIENT_LEASE_MS);
                        self.cached(p).deaf_until = until;
                        self.world.borrow_mut().faults.cache_deaf_spells += 1;
                    }
                    Ok(())
                }
                97..=98 => {
                    self.cached(p).held.clear();
                    Ok(())
                }
                _ => {
                    // Leaves: its guards go first (given back where revoked).
                    self.procs[p].cached = None;
                    self.procs[p].down_until = now;
                    return Ok(());
                }
            }
        };
        match outcome {
            Err(e) if gone(&e) => {
                let ppm = self.world.borrow().plan.reconnect_ppm;
                if !(ppm > 0 && self.reconnects.chance(ppm) && self.cached_reconnect(p)) {
                    if let Some(c) = self.procs[p].cached.take() {
                        c.crash(&self.world);
                    }
                    self.procs[p].down_until = now;
                }
                Ok(())
            }
            Err(_) | Ok(()) => Ok(()),
        }
    }

    /// Cached process `p`, whose connection or registration broke, reconnects as an engine
    /// would: it registers again over a new connection (`Client::reinit`, which counts every
    /// cached grant as revoked: `manager::trust`, rule 2) and, from a recovering server,
    /// re-claims what it holds (no cached grant: rule 3) and says it is done. False when the
    /// server no longer knows it: it starts over instead.
    fn cached_reconnect(&mut self, p: usize) -> bool {
        self.reinits += 1;
        let incarnation = self.world.borrow().incarnation;
        let c = self.procs[p].cached.as_ref().expect("a cached process");
        let r = c.locks.with_client(|c| match c.reinit() {
            Ok(true) => Ok(c.update_all_locks().and_then(|()| c.reinit_done()).is_ok()),
            Ok(false) => Ok(true),
            Err(e) => Err(e),
        });
        let Ok(resynced) = r else {
            return false;
        };
        self.world.borrow_mut().faults.cache_reconnects += 1;
        let proc = &mut self.procs[p];
        proc.registered = incarnation;
        if resynced {
            proc.synced = incarnation;
        }
        true
    }

    /// Cached process `p` downgrades its `i`th guard, a write guard, in place
    /// (`CachedWriteGuard::downgrade`): told it has, its handle's record must hold the lock
    /// shared, and the server's block (the oracle's model of it) must be the one the guard reads
    /// — the block its writer set, which the downgrade writes, or the grant's. The guard reads
    /// on; an error ends its use.
    fn cached_downgrade(&mut self, p: usize, i: usize) -> Result<(), Error> {
        let (guard, held, raw, from) = self.cached(p).held.swap_remove(i);
        let Guard::Write(w) = guard else {
            unreachable!("a write guard is downgraded");
        };
        let r = w.downgrade()?;
        let mut world = self.world.borrow_mut();
        world.faults.cache_downgrades += 1;
        let c = self.procs[p].cached.as_mut().expect("a cached process");
        let record = c.handles[held.k].as_ref().and_then(|(h, _, _)| h.held());
        let model = world.oracle.values.block(held.k);
        let verdict = match (r.value(), model) {
            _ if record == Some(Mode::Exclusive) => Err(format!(
                "a cached write guard of lock {} (token {:#x}) was told its downgrade succeeded, \
                 and its handle still holds the lock exclusively",
                held.k,
                r.token().0
            )),
            (Some(v), Block::Known(b)) if from == world.incarnation && v.valid && v.block != b => {
                Err(format!(
                    "a cached write guard of lock {} downgraded reading the value block {:?}, \
                     while the server's is {b:?}",
                    held.k,
                    &v.block.as_bytes()[..8]
                ))
            }
            _ => Ok(()),
        };
        if let Err(e) = verdict {
            world.fail_with(format!("process {p}: {e}"));
        }
        let held = Held {
            mode: Mode::Shared,
            ..held
        };
        c.held.push((Guard::Read(r), held, raw, from));
        Ok(())
    }

    /// Takes a guard of a random RW lock without waiting; a local one is checked against the
    /// rules of a cached grant.
    fn cached_take(&mut self, p: usize, now: u64) -> Result<(), Error> {
        let rw: Vec<usize> = (0..self.names.len())
            .filter(|&k| self.names[k].1 == LockKind::Rw)
            .collect();
        let k = rw[self.rng.index(rw.len())];
        let write = self.rng.below(2) == 0;
        let name = self.names[k].0.clone();
        let c = self.procs[p].cached.as_mut().expect("a cached process");
        let fresh = c.handles[k].is_none();
        let values = fresh && self.asks_values();
        let c = self.procs[p].cached.as_mut().expect("a cached process");
        if c.handles[k].is_none() {
            let h = c.locks.rw(name.as_bytes())?;
            let raw = h.id().expect("referenced by rw").raw();
            if values {
                h.set_value_blocks(true)?;
            }
            c.handles[k] = Some((h, raw, values));
        }
        let (h, raw, values) = c.handles[k].as_ref().expect("made above");
        let (raw, values) = (*raw, *values);
        let hits = c.locks.local_hits();
        let (guard, mode, token) = if write {
            let g = h.try_write()?;
            let t = g.token().0;
            (Guard::Write(g), Mode::Exclusive, t)
        } else {
            let g = h.try_read()?;
            let t = g.token().0;
            (Guard::Read(g), Mode::Shared, t)
        };
        if c.locks.local_hits() == hits {
            let read = c.watch.borrow().read;
            c.grants.entry((raw, token)).or_insert(read);
            c.values.insert((raw, token), guard.value());
        } else {
            let verdict = c
                .check_local(now, raw, mode, token)
                .and_then(|()| c.check_value(raw, token, guard.value()));
            let mut w = self.world.borrow_mut();
            w.faults.local_acquires += 1;
            if let Err(e) = verdict {
                w.fail_with(format!("process {p}: {e}"));
            }
        }
        let mut guard = guard;
        if let Guard::Write(g) = &mut guard
            && values
            && self.values.below(2) == 0
        {
            // Written to the server when the exclusive turn ends (a give-back or downgrade).
            let block = self.value_block();
            let c = self.procs[p].cached.as_mut().expect("a cached process");
            if g.set_value(&block).is_ok() {
                c.values.insert((raw, token), g.value());
            }
        }
        // (The token is read off the guard when it is believed.)
        let held = Held {
            k,
            mode,
            token: 0,
            until: None,
        };
        let incarnation = self.world.borrow().incarnation;
        let c = self.procs[p].cached.as_mut().expect("a cached process");
        c.held.push((guard, held, raw, incarnation));
        self.native_guards += 1;
        Ok(())
    }
}
