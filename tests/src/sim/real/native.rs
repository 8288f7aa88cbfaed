//! Processes of the real-client simulator that use the native API: a `Locks` over the
//! simulator's connection, typed handles, guards held across steps, blocking and async calls
//! (the futures driven by an executor that moves the simulated world while they wait), lock
//! sets, and drops that send their unlocks without reading the answers.
//!
//! What such a process believes is what its live guards say: a guard it dropped is no belief
//! any more, whatever its client's record says until the unlock's answer is read. The oracle
//! checks those beliefs as it checks the reference-shaped clients' records
//! ([`beliefs`](crate::sim::oracle::beliefs)). Such a process never re-claims: when its
//! transport fails it starts over with a new handle, as a native API user does, so whatever a
//! server crash took from it is no belief (it has not re-synced with the replacement).

use std::cell::Cell;
use std::future::Future;
use std::pin::pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use dlock_core::{LockKind, Mode};
use dlock_transport::client::{
    AtomicLock, AtomicLockGuard, Client, Error, ErrorKind, FairLock, FairLockReadGuard,
    FairLockWriteGuard, GuardSet, LockOptions, Locks, RwLock, RwLockReadGuard, RwLockWriteGuard,
    SetEntry, SetMode,
};

use super::conn::{Shared, SimConn};
use super::procs::Sim;
use crate::sim::net::LinkId;

/// A lock name resolved through the handle, by kind.
enum Handle<'r> {
    Atomic(AtomicLock<SimConn<'r>>),
    Rw(RwLock<SimConn<'r>>),
    Fair(FairLock<SimConn<'r>>),
}

/// A guard (or a set of them) the process holds.
enum Guard<'r> {
    Atomic(AtomicLockGuard<SimConn<'r>>),
    RwRead(RwLockReadGuard<SimConn<'r>>),
    RwWrite(RwLockWriteGuard<SimConn<'r>>),
    FairRead(FairLockReadGuard<SimConn<'r>>),
    FairWrite(FairLockWriteGuard<SimConn<'r>>),
    Set(GuardSet<SimConn<'r>>),
}

impl Guard<'_> {
    /// A single guard's token (a set has one per entry).
    fn token(&self) -> u64 {
        match self {
            Guard::Atomic(g) => g.token().0,
            Guard::RwRead(g) => g.token().0,
            Guard::RwWrite(g) => g.token().0,
            Guard::FairRead(g) => g.token().0,
            Guard::FairWrite(g) => g.token().0,
            Guard::Set(_) => 0,
        }
    }

    /// Unlocks and waits for the answer, blocking or as a future.
    fn unlock(self, world: &Shared<'_>, asynchronous: bool) -> Result<(), Error> {
        match (self, asynchronous) {
            (Guard::Atomic(g), true) => block_on(world, g.unlock_async()),
            (Guard::RwRead(g), true) => block_on(world, g.unlock_async()),
            (Guard::RwWrite(g), true) => block_on(world, g.unlock_async()),
            (Guard::FairRead(g), true) => block_on(world, g.unlock_async()),
            (Guard::FairWrite(g), true) => block_on(world, g.unlock_async()),
            (Guard::Atomic(g), false) => g.unlock(),
            (Guard::RwRead(g), false) => g.unlock(),
            (Guard::RwWrite(g), false) => g.unlock(),
            (Guard::FairRead(g), false) => g.unlock(),
            (Guard::FairWrite(g), false) => g.unlock(),
            (Guard::Set(s), _) => s.unlock(),
        }
    }

    /// Extends a leased grant; `None` for one without a lease of its own.
    fn extend(&mut self, lease: Duration) -> Option<Result<(), Error>> {
        match self {
            Guard::Atomic(g) => Some(g.extend(lease)),
            Guard::FairRead(g) => Some(g.extend(lease)),
            Guard::FairWrite(g) => Some(g.extend(lease)),
            _ => None,
        }
    }
}

/// One grant a live guard stands for: the lock (by name index), the mode, the token, and until
/// when (sim ms) its lease runs, counted from before its request was sent (`None`: an RW grant,
/// which lasts while the client's lease does).
#[derive(Clone, Copy, Debug)]
pub(super) struct Held {
    pub(super) k: usize,
    pub(super) mode: Mode,
    pub(super) token: u64,
    pub(super) until: Option<u64>,
}

/// A process using the native API.
pub(super) struct Native<'r> {
    locks: Locks<SimConn<'r>>,
    /// Its link, cut when it crashes (a crash sends nothing).
    link: LinkId,
    handles: Vec<Option<Handle<'r>>>,
    held: Vec<(Guard<'r>, Vec<Held>)>,
}

impl<'r> Native<'r> {
    /// Registers over a fresh link of process `owner`, whose lease counts from `heard` (as
    /// [`SimConn`] keeps it): the process and its lease; `None` when refused.
    pub(super) fn start(
        world: &Shared<'r>,
        owner: usize,
        heard: Rc<Cell<u64>>,
        names: usize,
    ) -> Option<(Native<'r>, Duration)> {
        let conn = SimConn::new(Rc::clone(world), owner, heard);
        let link = conn.link();
        let client = Client::over(conn, Sim::config()).ok()?;
        let lease = client.lease();
        let n = Native {
            locks: Locks::new(client),
            link,
            handles: (0..names).map(|_| None).collect(),
            held: Vec::new(),
        };
        Some((n, lease))
    }

    /// What its live guards say.
    pub(super) fn beliefs(&self) -> impl Iterator<Item = &Held> {
        self.held.iter().flat_map(|(_, b)| b)
    }

    /// Gone without a word: its link is cut first, so its guards' drops send nothing (the
    /// kernel closes a dead process's connections; the server sees them close).
    pub(super) fn crash(self, world: &Shared<'r>) {
        {
            let mut w = world.borrow_mut();
            w.net.break_link(self.link);
            w.links_broken();
        }
        drop(self);
    }
}

/// Polls `f` to its end, moving the simulated world a millisecond whenever it waits.
fn block_on<F: Future>(world: &Shared<'_>, f: F) -> F::Output {
    let mut cx = Context::from_waker(Waker::noop());
    let mut f = pin!(f);
    loop {
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        let until = world.borrow().now_ms + 1;
        world.borrow_mut().step(until);
    }
}

/// How a take asks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum How {
    Try,
    Wait,
    Async,
}

impl<'r> Sim<'r> {
    /// One scheduled action of native process `p`, which is running.
    pub(super) fn act_native(&mut self, p: usize, now: u64) {
        self.ops += 1;
        let outcome = match self.rng.range(0, 100) {
            0..=29 => self.native_take(p, now, How::Try),
            30..=39 => self.native_take(p, now, How::Wait),
            40..=47 => self.native_take(p, now, How::Async),
            48..=61 => {
                // Dropped: the unlock goes out, its answer is read by a later call.
                if let Some(i) = self.pick_held(p) {
                    drop(self.native(p).held.swap_remove(i));
                }
                Ok(())
            }
            62..=71 => self.native_unlock(p),
            72..=79 => self.native_set(p, now),
            80..=86 => self.native_extend(p, now),
            87..=97 => self.native(p).locks.heartbeat(),
            _ => {
                // Leaves: its guards' unlocks are sent as it goes.
                self.procs[p].native = None;
                self.procs[p].down_until = now;
                return;
            }
        };
        // (The lease counts from the last call the server renewed it on: `SimConn` keeps it.)
        if let Err(e) = outcome
            && e.kind() == ErrorKind::Disconnected
        {
            // What a native API user does after a transport failure: a new handle, later.
            if let Some(n) = self.procs[p].native.take() {
                n.crash(&self.world);
            }
            self.procs[p].down_until = now;
        }
    }

    fn native(&mut self, p: usize) -> &mut Native<'r> {
        self.procs[p]
            .native
            .as_mut()
            .expect("a running native process")
    }

    /// One of the guards (or sets) the process holds, drawn at random.
    fn pick_held(&mut self, p: usize) -> Option<usize> {
        match self.native(p).held.len() {
            0 => None,
            n => Some(self.rng.index(n)),
        }
    }

    /// A lock this process holds no guard on (its handle resolved), if the draw found one.
    fn free_lock(&mut self, p: usize) -> Result<Option<usize>, Error> {
        let k = self.rng.index(self.names.len());
        if self.native(p).beliefs().any(|b| b.k == k) {
            // Asking again would wait for its own guard, on the real clock.
            return Ok(None);
        }
        let (name, kind) = self.names[k].clone();
        let n = self.native(p);
        if n.handles[k].is_none() {
            n.handles[k] = Some(match kind {
                LockKind::Atomic => Handle::Atomic(n.locks.atomic(&name)?),
                LockKind::Rw => Handle::Rw(n.locks.rw(&name)?),
                LockKind::Fair => Handle::Fair(n.locks.fair(&name)?),
            });
        }
        Ok(Some(k))
    }

    fn native_take(&mut self, p: usize, now: u64, how: How) -> Result<(), Error> {
        let Some(k) = self.free_lock(p)? else {
            return Ok(());
        };
        let shared = self.rng.below(2) == 0;
        let lease_ms = self.rng.range(20, 300);
        let lease = Duration::from_millis(lease_ms);
        let opts = LockOptions::new(lease).with_wait(Duration::from_millis(self.rng.range(1, 40)));
        let world = Rc::clone(&self.world);
        let n = self.native(p);
        let handle = n.handles[k].as_ref().expect("resolved by free_lock");
        let (guard, mode, until) = match handle {
            Handle::Atomic(l) => {
                let g = match how {
                    How::Try => l.try_lock(lease),
                    How::Wait => l.lock(opts),
                    How::Async => block_on(&world, l.lock_async(opts)),
                };
                (g.map(Guard::Atomic)?, Mode::Exclusive, Some(now + lease_ms))
            }
            Handle::Rw(l) => {
                let wait = opts.wait;
                let g = match (how, shared) {
                    (How::Try, true) => l.try_read().map(Guard::RwRead),
                    (How::Try, false) => l.try_write().map(Guard::RwWrite),
                    (How::Wait, true) => l.read(wait).map(Guard::RwRead),
                    (How::Wait, false) => l.write(wait).map(Guard::RwWrite),
                    (How::Async, true) => block_on(&world, l.read_async(wait)).map(Guard::RwRead),
                    (How::Async, false) => {
                        block_on(&world, l.write_async(wait)).map(Guard::RwWrite)
                    }
                };
                (g?, mode_of(shared), None)
            }
            Handle::Fair(l) => {
                let g = match (how, shared) {
                    (How::Try, true) => l.try_read(lease).map(Guard::FairRead),
                    (How::Try, false) => l.try_write(lease).map(Guard::FairWrite),
                    (How::Wait, true) => l.read(opts).map(Guard::FairRead),
                    (How::Wait, false) => l.write(opts).map(Guard::FairWrite),
                    (How::Async, true) => block_on(&world, l.read_async(opts)).map(Guard::FairRead),
                    (How::Async, false) => {
                        block_on(&world, l.write_async(opts)).map(Guard::FairWrite)
                    }
                };
                (g?, mode_of(shared), Some(now + lease_ms))
            }
        };
        let token = guard.token();
        let belief = Held {
            k,
            mode,
            token,
            until,
        };
        n.held.push((guard, vec![belief]));
        self.native_guards += 1;
        Ok(())
    }

    /// Unlocks a guard (or set) and waits for the answer.
    fn native_unlock(&mut self, p: usize) -> Result<(), Error> {
        let asynchronous = self.rng.below(2) == 0;
        let world = Rc::clone(&self.world);
        let Some(i) = self.pick_held(p) else {
            return Ok(());
        };
        let (guard, _) = self.native(p).held.swap_remove(i);
        match guard.unlock(&world, asynchronous) {
            // A grant lost to its lease is no news to a process that believes no more.
            Err(e) if e.kind() == ErrorKind::NotHeld => Ok(()),
            r => r,
        }
    }

    /// Takes two to four locks as one set, all or nothing or per item.
    fn native_set(&mut self, p: usize, now: u64) -> Result<(), Error> {
        let mut ks = Vec::new();
        for _ in 0..self.rng.range(2, 5) {
            if let Some(k) = self.free_lock(p)?
                && !ks.contains(&k)
            {
                ks.push(k);
            }
        }
        let modes: Vec<Mode> = ks.iter().map(|_| mode_of(self.rng.below(2) == 0)).collect();
        let set_mode = match self.rng.below(2) {
            0 => SetMode::AllOrNothing,
            _ => SetMode::PerItem,
        };
        let lease_ms = self.rng.range(20, 300);
        let n = self.native(p);
        let entries: Vec<(SetEntry<'_, SimConn<'r>>, Mode)> = ks
            .iter()
            .zip(&modes)
            .map(|(&k, &m)| match n.handles[k].as_ref().expect("resolved") {
                Handle::Atomic(l) => (l.into(), Mode::Exclusive),
                Handle::Rw(l) => ((l, m).into(), m),
                Handle::Fair(l) => ((l, m).into(), m),
            })
            .collect();
        let taken: Vec<Mode> = entries.iter().map(|&(_, m)| m).collect();
        let lease = Duration::from_millis(lease_ms);
        let set = n
            .locks
            .try_lock_all(entries.into_iter().map(|(e, _)| e), lease, set_mode)?;
        let beliefs: Vec<Held> = ks
            .iter()
            .zip(&taken)
            .enumerate()
            .filter_map(|(i, (&k, &mode))| {
                let token = set.token(i)?.0;
                let leased = self.names[k].1 != LockKind::Rw;
                let until = leased.then_some(now + lease_ms);
                Some(Held {
                    k,
                    mode,
                    token,
                    until,
                })
            })
            .collect();
        if !beliefs.is_empty() {
            self.native(p).held.push((Guard::Set(set), beliefs));
            self.native_guards += 1;
        }
        Ok(())
    }

    /// Extends a leased guard; its belief lasts from now.
    fn native_extend(&mut self, p: usize, now: u64) -> Result<(), Error> {
        let lease_ms = self.rng.range(20, 300);
        let Some(i) = self.pick_held(p) else {
            return Ok(());
        };
        let (guard, beliefs) = &mut self.native(p).held[i];
        match guard.extend(Duration::from_millis(lease_ms)) {
            Some(Ok(())) => {
                for b in beliefs {
                    b.until = Some(now + lease_ms);
                }
                Ok(())
            }
            // Lost to its lease: the process stops believing in it.
            Some(Err(e)) if e.kind() == ErrorKind::NotHeld => {
                drop(self.native(p).held.swap_remove(i));
                Ok(())
            }
            Some(Err(e)) => Err(e),
            None => Ok(()),
        }
    }
}

fn mode_of(shared: bool) -> Mode {
    if shared {
        Mode::Shared
    } else {
        Mode::Exclusive
    }
}
