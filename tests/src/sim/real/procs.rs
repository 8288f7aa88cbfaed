//! The simulated processes: each a real `Client` driven by a random application (every third
//! one through the native API instead: [`native`](super::native); and, in seeds with cached
//! locks, a share of the others through `CachedLocks`: [`cached`](super::cached)), and what
//! each believes it holds.

use std::cell::Cell;
use std::collections::{HashMap, HashSet};
use std::rc::Rc;
use std::time::Duration;

use dlock_core::proto::LockFlags;
use dlock_core::{LockId, LockKind, Mode, ObjectId, Status};
use dlock_transport::client::{AsyncOp, Client, ClientConfig, Endpoint, LocalLock};

use super::cached::Cached;
use super::conn::{Shared, SimConn};
use super::native::Native;
use crate::sim::Rng;
use crate::sim::oracle::beliefs::Belief;

/// The roll of a downgrade ([`Sim::operate`]; the application's own rolls start at 2).
const DOWNGRADE: u64 = 1;

/// Every client's lease (ms).
pub(super) const CLIENT_LEASE_MS: u64 = 400;

/// A simulated process: its client (none while crashed) and what the oracle needs of it.
pub(super) struct Proc<'r> {
    pub client: Option<Client<SimConn<'r>>>,
    /// A process of the native API instead (every third one): its handle and guards.
    pub native: Option<Native<'r>>,
    /// A process of cached locks instead (the seed's `cache_ppm` of the other slots).
    pub cached: Option<Cached<'r>>,
    /// Whether the slot runs cached locks (drawn once per run).
    pub caches: bool,
    /// Sim time of the client's start (its records count from there).
    pub start_ms: u64,
    /// The send time of the last request whose reply showed the server renewing its lease
    /// (its connection keeps it): the lease runs from no earlier.
    pub heard: Rc<Cell<u64>>,
    pub lease_ms: u64,
    /// The server incarnation it last re-synced with; its beliefs count only in that one.
    pub synced: u32,
    /// The server incarnation it last registered with (re-syncing or not).
    pub registered: u32,
    /// Tokens of grants it re-claimed across a server incarnation it missed
    /// (`oracle::beliefs` says why the fencing rule skips them).
    pub unfenced: HashSet<u64>,
    pub ids: HashMap<usize, LockId>,
    /// Locks (by name) the application asked to release and does not use, whatever the
    /// client's record says (an unlock whose reply was lost leaves the record holding, and a
    /// trylock would be answered from it as a re-entry).
    pub releasing: HashSet<usize>,
    /// Locks (by name) the application asked to downgrade and was not told it had, with the
    /// token of the grant it asked for: it writes no more under that grant, whatever its
    /// record says (a lost reply leaves the record exclusive while the server may already
    /// have let readers in).
    pub downgrading: HashMap<usize, u64>,
    pub object: Option<ObjectId>,
    /// Down (crashed) or stopped (paused) until this sim time.
    pub down_until: u64,
    pub paused_until: u64,
}

impl Proc<'_> {
    pub fn new() -> Self {
        Proc {
            client: None,
            native: None,
            cached: None,
            caches: false,
            start_ms: 0,
            heard: Rc::new(Cell::new(0)),
            lease_ms: 0,
            synced: 0,
            registered: 0,
            unfenced: HashSet::new(),
            ids: HashMap::new(),
            releasing: HashSet::new(),
            downgrading: HashMap::new(),
            object: None,
            down_until: 0,
            paused_until: 0,
        }
    }

    /// What the process believes it holds at `now` while the server is incarnation
    /// `incarnation`, by lock name (`name_of` reads it from the lock's id on that server).
    pub fn beliefs(
        &self,
        p: usize,
        now: u64,
        incarnation: u32,
        name_of: impl Fn(LockId) -> Option<usize>,
    ) -> Vec<(usize, Belief)> {
        if self.synced != incarnation || now >= self.heard.get() + self.lease_ms {
            // Its registration may be gone: it must not act on beliefs.
            return Vec::new();
        }
        if let Some(n) = &self.native {
            // What its live guards say, each within its own lease.
            let live = n
                .beliefs()
                .filter(|h| h.until.is_none_or(|until| now < until));
            let belief = |mode, token| Belief {
                holder: p,
                mode,
                token,
                fenced: true,
            };
            return live.map(|h| (h.k, belief(h.mode, h.token))).collect();
        }
        if let Some(c) = &self.cached {
            let belief = |mode, token| Belief {
                holder: p,
                mode,
                token,
                fenced: true,
            };
            return c
                .beliefs(now, incarnation)
                .into_iter()
                .map(|h| (h.k, belief(h.mode, h.token)))
                .collect();
        }
        let Some(c) = &self.client else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for (&id, l) in c.locks() {
            let Some(mode) = l.state.held_mode() else {
                continue;
            };
            if now > self.grant_until(l) {
                continue;
            }
            let Some(name) = name_of(id) else {
                continue;
            };
            if self.releasing.contains(&name) {
                continue;
            }
            let mode = match self.downgrading.get(&name) {
                Some(&t) if t == l.token.0 => Mode::Shared,
                _ => mode,
            };
            out.push((
                name,
                Belief {
                    holder: p,
                    mode,
                    token: l.token.0,
                    fenced: !self.unfenced.contains(&l.token.0),
                },
            ));
        }
        out
    }

    /// The last sim tick of a grant by the client's own count (RW grants do not expire).
    fn grant_until(&self, l: &LocalLock) -> u64 {
        match l.kind {
            LockKind::Rw => u64::MAX,
            LockKind::Atomic | LockKind::Fair => {
                self.start_ms + l.granted_at_ms + u64::from(l.expire_ms)
            }
        }
    }
}

/// The processes and the application they run.
pub(super) struct Sim<'r> {
    pub world: Shared<'r>,
    pub rng: Rng,
    pub names: Vec<(String, LockKind)>,
    pub procs: Vec<Proc<'r>>,
    pub ops: u64,
    /// Guards (and sets) the native processes took.
    pub native_guards: u64,
    /// Decides, apart from `rng`, which actions on a lock held exclusively downgrade it
    /// (the plan's `downgrade_ppm`), so a seed without them runs as it did before.
    pub downgrades: Rng,
    /// Decides, apart from `rng`, which locks ask for value blocks and which exclusive
    /// releases write one (the plan's `value_ppm`), and draws the blocks.
    pub values: Rng,
    /// Decides, apart from `rng`, which cached processes reconnect after their connection
    /// broke (the plan's `reconnect_ppm`).
    pub reconnects: Rng,
    /// Decides, apart from `rng` and `downgrades`, which write guards a cached process drops
    /// downgrade instead (the plan's `downgrade_ppm`), so that a seed's reference-shaped
    /// processes downgrade as they did before.
    pub cached_downgrades: Rng,
    pub crashes: u64,
    pub reinits: u64,
}

impl<'r> Sim<'r> {
    pub fn now(&self) -> u64 {
        self.world.borrow().now_ms
    }

    pub(super) fn config() -> ClientConfig {
        // The endpoint is not used by a client over a `Connection` of its own.
        ClientConfig::new(Endpoint::Local {
            unix_socket: "/nonexistent".into(),
            shm_name: "sim".into(),
        })
        .with_lease(Duration::from_millis(CLIENT_LEASE_MS))
        .with_timeout(Duration::from_millis(50))
    }

    /// Whether process `p` uses the native API.
    fn is_native(p: usize) -> bool {
        p % 3 == 1
    }

    /// Whether process `p` is running (not crashed or gone).
    pub fn running(&self, p: usize) -> bool {
        let proc = &self.procs[p];
        proc.client.is_some() || proc.native.is_some() || proc.cached.is_some()
    }

    pub fn start_client(&mut self, p: usize) {
        let now = self.now();
        let incarnation = self.world.borrow().incarnation;
        let proc = &mut self.procs[p];
        proc.heard = Rc::new(Cell::new(0));
        if Self::is_native(p) {
            let heard = Rc::clone(&proc.heard);
            if let Some((n, lease)) = Native::start(&self.world, p, heard, self.names.len()) {
                proc.native = Some(n);
                proc.lease_ms = lease.as_millis() as u64;
                proc.start_ms = now;
                proc.synced = incarnation;
                proc.registered = incarnation;
            }
            return;
        }
        if proc.caches {
            let heard = Rc::clone(&proc.heard);
            if let Some(c) = Cached::start(&self.world, p, heard, self.names.len()) {
                proc.cached = Some(c);
                proc.lease_ms = CLIENT_LEASE_MS;
                proc.start_ms = now;
                proc.synced = incarnation;
                proc.registered = incarnation;
            }
            return;
        }
        let conn = SimConn::new(Rc::clone(&self.world), p, Rc::clone(&proc.heard));
        proc.ids.clear();
        proc.releasing.clear();
        proc.downgrading.clear();
        proc.object = None;
        match Client::over(conn, Self::config()) {
            Ok(c) => {
                proc.lease_ms = c.lease().as_millis() as u64;
                proc.client = Some(c);
                proc.start_ms = now;
                proc.synced = incarnation;
                proc.registered = incarnation;
                proc.unfenced.clear();
            }
            Err(_) => proc.client = None,
        }
    }

    /// Process `p` crashes: gone without a word; the server expires it.
    pub fn crash(&mut self, p: usize) {
        let now = self.now();
        self.procs[p].client = None;
        if let Some(n) = self.procs[p].native.take() {
            n.crash(&self.world);
        }
        if let Some(c) = self.procs[p].cached.take() {
            c.crash(&self.world);
        }
        self.procs[p].down_until = now + self.rng.range(0, 2 * CLIENT_LEASE_MS);
        self.crashes += 1;
    }

    /// Process `p` stops for `ms` (a pause; the scheduler does not run it).
    pub fn pause(&mut self, p: usize, ms: u64) {
        let now = self.now();
        let until = &mut self.procs[p].paused_until;
        *until = (*until).max(now + ms);
    }

    /// Whether process `p` believes it holds any lock now.
    pub fn holding(&self, p: usize) -> bool {
        let w = self.world.borrow();
        let name_of = |id: LockId| w.oracle.name_of_id(id.raw());
        !self.procs[p]
            .beliefs(p, w.now_ms, w.incarnation, name_of)
            .is_empty()
    }

    /// One scheduled action of process `p`.
    pub fn act(&mut self, p: usize) -> Result<(), String> {
        let now = self.now();
        if now < self.procs[p].paused_until {
            return Ok(());
        }
        if !self.running(p) {
            if now >= self.procs[p].down_until {
                self.start_client(p);
            }
            return Ok(());
        }
        if self.procs[p].native.is_some() {
            self.act_native(p, now);
            return Ok(());
        }
        if self.procs[p].cached.is_some() {
            return self.act_cached(p, now);
        }
        let k = self.rng.index(self.names.len());
        let (name, kind) = self.names[k].clone();
        let mode = match kind {
            LockKind::Atomic => Mode::Exclusive,
            _ if self.rng.below(2) == 0 => Mode::Shared,
            _ => Mode::Exclusive,
        };
        let expire = self.rng.range(20, 300) as u32;
        // A lock the application asked to release is only ever unlocked again.
        let roll = if self.procs[p].releasing.contains(&k) {
            36
        } else {
            self.rng.range(2, 99)
        };
        let values = !self.procs[p].ids.contains_key(&k) && self.asks_values();
        let proc = &mut self.procs[p];
        let c = proc.client.as_mut().expect("checked above");
        let id = match proc.ids.get(&k) {
            Some(&id) => id,
            None => match c.get_lock(kind, name.as_bytes()) {
                Ok(id) => {
                    proc.ids.insert(k, id);
                    if values {
                        // Local: every grant of the lock returns its block from now on.
                        let _ = c.set_value_blocks(id, true);
                    }
                    id
                }
                Err(_) => return self.after_error(p, now),
            },
        };
        let roll = if self.downgrades_now(p, k, id) {
            DOWNGRADE
        } else {
            roll
        };
        self.ops += 1;
        if matches!(roll, DOWNGRADE | 36..=60) {
            self.stage_value(p, id);
        }
        let outcome = self.operate(p, k, id, roll, mode, expire);
        match outcome {
            Err(Status::BadResponse | Status::NotReady | Status::ClientNotInit) => {
                self.after_error(p, now)
            }
            _ => Ok(()),
        }
    }

    /// Runs the operation `roll` picks on lock `k` (id `id`) for process `p`.
    fn operate(
        &mut self,
        p: usize,
        k: usize,
        id: LockId,
        roll: u64,
        mode: Mode,
        expire: u32,
    ) -> Result<(), Status> {
        let proc = &mut self.procs[p];
        let c = proc.client.as_mut().expect("a live client");
        match roll {
            DOWNGRADE => {
                let token = c.local_lock(id).map(|l| l.token.0);
                let r = c.downgrade(id).map(drop).map_err(Status::from);
                // Told it has: the record must say so (`DowngradeStaysExclusive` is the bug).
                match (r, token) {
                    (Ok(()), _) => proc.downgrading.remove(&k),
                    (Err(_), Some(t)) => proc.downgrading.insert(k, t),
                    (Err(_), None) => None,
                };
                r
            }
            2..=35 => c.trylock(id, mode, expire).map(drop).map_err(Status::from),
            36..=60 => {
                // The application stops using the lock now, whatever the answer; a record that
                // still holds after a lost reply keeps it "releasing" until an unlock lands.
                let r = c.unlock(id).map(drop).map_err(Status::from);
                let held = c
                    .locks()
                    .any(|(lid, l)| *lid == id && l.state.held_mode().is_some());
                if held && r.is_err() {
                    proc.releasing.insert(k);
                } else if !held {
                    proc.releasing.remove(&k);
                }
                r
            }
            61..=70 => {
                let wait = Duration::from_millis(self.rng.range(1, 40));
                c.lock(id, mode, expire, wait)
                    .map(drop)
                    .map_err(Status::from)
            }
            71..=78 => self.batch(p, mode, expire),
            79..=82 => {
                let held: Vec<LockId> = c
                    .locks()
                    .filter(|(_, l)| l.state.held_mode().is_some())
                    .map(|(&id, _)| id)
                    .take(31)
                    .collect();
                let mut out = vec![Err(Status::Einval); held.len()];
                let r = c.batch_unlock(&held, &mut out).map_err(Status::from);
                // Every lock it asked to release, by name: some may have records from before a
                // failover that this process never looked up again.
                let w = self.world.borrow();
                let proc = &mut self.procs[p];
                let c = proc.client.as_ref().expect("a live client");
                for id in held {
                    let still = c
                        .locks()
                        .any(|(lid, l)| *lid == id && l.state.held_mode().is_some());
                    if let Some(name) = w.oracle.name_of_id(id.raw()) {
                        if still {
                            proc.releasing.insert(name);
                        } else {
                            proc.releasing.remove(&name);
                        }
                    }
                }
                r
            }
            83..=86 => self.async_lock(p, id, mode, expire),
            87..=92 => self.faa(p),
            93..=96 => c.heartbeat().map_err(Status::from),
            _ => {
                let mut c = proc.client.take().expect("a live client");
                if c.try_deinit().map_err(Status::from) == Err(Status::NotReady) {
                    // A recovering server keeps the client and its locks, and so does the
                    // process, which leaves later. `NotReady` renews nothing: no new anchor.
                    self.procs[p].client = Some(c);
                    return Err(Status::NotReady);
                }
                self.procs[p].down_until = self.now();
                Ok(())
            }
        }
    }

    /// Whether process `p`'s action on lock `k` (id `id`) is a downgrade instead (the plan's
    /// `downgrade_ppm`): its record holds the RW lock exclusively, and the application has not
    /// asked to release it (which it only ever unlocks again).
    fn downgrades_now(&mut self, p: usize, k: usize, id: LockId) -> bool {
        let ppm = self.world.borrow().plan.downgrade_ppm;
        let proc = &self.procs[p];
        let Some(c) = proc.client.as_ref() else {
            return false;
        };
        let exclusive = c.local_lock(id).is_some_and(|l| {
            l.kind == LockKind::Rw && l.state.held_mode() == Some(Mode::Exclusive)
        });
        ppm > 0 && exclusive && !proc.releasing.contains(&k) && self.downgrades.chance(ppm)
    }

    /// Whether a lock asks for its value block (the plan's `value_ppm`, per lock record).
    pub(super) fn asks_values(&mut self) -> bool {
        let ppm = self.world.borrow().plan.value_ppm;
        ppm > 0 && self.values.chance(ppm)
    }

    /// A fresh value block: 16 random bytes (zero-padded to the block's size by the client),
    /// so that every write can be told from every other.
    pub(super) fn value_block(&mut self) -> [u8; 16] {
        let mut b = [0; 16];
        b[..8].copy_from_slice(&self.values.next_u64().to_le_bytes());
        b[8..].copy_from_slice(&self.values.next_u64().to_le_bytes());
        b
    }

    /// Half the time, process `p` stages a value block for the unlock or downgrade it is about
    /// to send on lock `id`, if its record holds the lock exclusively and asks for blocks: the
    /// exclusive turn's end writes it.
    fn stage_value(&mut self, p: usize, id: LockId) {
        let Some(c) = self.procs[p].client.as_ref() else {
            return;
        };
        let writer = c.local_lock(id).is_some_and(|l| {
            l.ask.contains(LockFlags::VALUE_BLOCK) && l.state.held_mode() == Some(Mode::Exclusive)
        });
        if !writer || self.values.below(2) == 0 {
            return;
        }
        let block = self.value_block();
        let c = self.procs[p].client.as_mut().expect("checked above");
        let _ = c.stage_value(id, &block);
    }

    /// A batch of trylocks, per item or all-or-nothing.
    fn batch(&mut self, p: usize, mode: Mode, expire: u32) -> Result<(), Status> {
        let n = self.rng.range(2, 5) as usize;
        let mut reqs = Vec::new();
        for _ in 0..n {
            let j = self.rng.index(self.names.len());
            if let Some(&jid) = self.procs[p].ids.get(&j)
                && !self.procs[p].releasing.contains(&j)
                && !reqs.iter().any(|&(r, _, _)| r == jid)
            {
                let m = if self.names[j].1 == LockKind::Atomic {
                    Mode::Exclusive
                } else {
                    mode
                };
                reqs.push((jid, m, expire));
            }
        }
        let aon = self.rng.below(2) == 0;
        let mut out = vec![Err(Status::Einval); reqs.len()];
        let c = self.procs[p].client.as_mut().expect("a live client");
        c.batch_trylock(&reqs, aon, &mut out).map_err(Status::from)
    }

    /// The reference's async pair, driven to its end.
    fn async_lock(&mut self, p: usize, id: LockId, mode: Mode, expire: u32) -> Result<(), Status> {
        let c = self.procs[p].client.as_mut().expect("a live client");
        c.lock_request_async(id, AsyncOp::Lock(mode, expire))?;
        loop {
            match c.lock_result_check().map_err(Status::from) {
                Err(Status::AsyncAgain) => {
                    let until = self.world.borrow().now_ms + 1;
                    self.world.borrow_mut().step(until);
                }
                Err(Status::NoAsync) => return Ok(()),
                r => return r.map(drop),
            }
        }
    }

    fn faa(&mut self, p: usize) -> Result<(), Status> {
        let proc = &mut self.procs[p];
        let c = proc.client.as_mut().expect("a live client");
        let object = match proc.object {
            Some(o) => o,
            None => {
                let _ = c.atomic64_create(b"xid", 1, 3_600);
                let o = c.atomic64_get(b"xid", 3_600)?;
                proc.object = Some(o);
                o
            }
        };
        // The oracle checks the value against the server's sequence of FAAs.
        c.atomic64_faa(object, 1).map(drop).map_err(Status::from)
    }

    /// A transport or registration error: reinit, or start over if the server forgot us.
    fn after_error(&mut self, p: usize, now: u64) -> Result<(), String> {
        let names = &self.names;
        let world = &self.world;
        let proc = &mut self.procs[p];
        let Some(c) = proc.client.as_mut() else {
            return Ok(());
        };
        self.reinits += 1;
        let resynced = match c.reinit() {
            // A replacement server: re-claim what it holds (the real client decides what a
            // claim may say), then tell it this client is done. Until then its grants are
            // uncertain, so nothing counts as believed on failure.
            Ok(true) => {
                // A server between the last one it registered with and this one ran without it.
                let incarnation = world.borrow().incarnation;
                if proc.registered + 1 < incarnation {
                    let held = c.locks().filter(|(_, l)| l.state.held_mode().is_some());
                    proc.unfenced.extend(held.map(|(_, l)| l.token.0));
                }
                proc.registered = incarnation;
                c.update_all_locks().and_then(|()| c.reinit_done()).is_ok()
            }
            Ok(false) => {
                proc.registered = world.borrow().incarnation;
                true
            }
            Err(_) => {
                // Registration gone: what it believed is void (its locks were freed).
                proc.client = None;
                proc.down_until = now;
                return Ok(());
            }
        };
        let incarnation = world.borrow().incarnation;
        if resynced && proc.synced != incarnation {
            // Re-synced with a replacement: objects are gone, and the ids are the new
            // server's (an old id may name another lock now).
            proc.object = None;
            proc.ids.retain(|k, id| {
                let (name, kind) = &names[*k];
                match c.get_lock(*kind, name.as_bytes()) {
                    Ok(new) => {
                        *id = new;
                        true
                    }
                    Err(_) => false,
                }
            });
        }
        if resynced {
            proc.synced = incarnation;
        }
        Ok(())
    }
}
