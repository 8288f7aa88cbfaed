//! The real-client simulator: the real `dlock_transport::client::Client` — its decisions, lock
//! records, batches, async operations and reinit — driven over the shared network
//! ([`net`](super::net)) by one seeded thread.
//!
//! `Client` reaches its server through the `Connection` trait; here that is `SimConn`, whose
//! messages go through the world: the server state machine behind the runtime's rules
//! ([`endpoint`](super::endpoint)), a clock that moves only when the world does, and the
//! seed's fault mix ([`swarm`](super::swarm)). A client's blocking call steps the world until
//! its reply comes or its deadline passes in simulated time; other processes act only when the
//! scheduler picks them, and one it stops (a pause) is not picked. Processes also crash
//! (dropped without a word), deinit and come back, and the server itself dies now and then: a
//! replacement with a larger epoch starts recovering for the clients registered with the old
//! one, and each client goes through the real `reinit`, `update_all_locks` and `reinit_done`
//! (what it claims, and whether its lease lapsed, is the client's own decision).
//!
//! Every third process uses the native API instead (`native`): a `Locks` over the same
//! connection, typed handles, guards held across steps, blocking and async calls, sets, and
//! drops that send their unlocks without reading the answers. In a seed with cached locks
//! (its `cache_ppm`), that share of the other slots runs an engine's `CachedLocks` instead
//! (`cached`): cacheable RW grants, local guards, revokes read off the data stream and
//! answered, deaf spells that leave revokes to lapse. The server's revokes travel as event
//! messages on the data channel, in order with the replies, as on a TCP data connection.
//!
//! The lock manager's other drives are toggles of the seed ([`swarm`](super::swarm)), each
//! drawn apart from the run's generator so that a seed without it runs as it did before it
//! existed: reference-shaped processes downgrade RW locks their records hold exclusively
//! (`downgrade_ppm`; cached processes downgrade when a revoke wants shared, and by the same
//! toggle downgrade a write guard in place instead of dropping it); lock records and
//! cached handles ask for value blocks (`value_ppm`): exclusive unlocks and downgrades write
//! one half the time, and cached writers set one for their give-back; and a cached process
//! whose connection broke reconnects (`reconnect_ppm`, `Client::reinit`) instead of starting
//! over.
//! The oracle learns downgrades and blocks from the server's answers and checks every block a
//! grant returns ([`values`](super::oracle::values)).
//!
//! After every step the oracle checks the server's answers and its tables, and what the
//! clients *believe* from their own records, or a native process from its live guards
//! ([`beliefs`](super::oracle::beliefs)).
//!
//! | part      | what it is                                                        |
//! |-----------|-------------------------------------------------------------------|
//! | `world`   | the server incarnations, the network, the clock                   |
//! | `conn`    | `SimConn`, a client's `Connection` through the world              |
//! | `procs`   | the processes: a real client each, the application driving it, and its beliefs |
//! | `native`  | the processes of the native API: a `Locks` each, its handles and guards |
//! | `cached`  | the processes of cached locks: a `CachedLocks` each, its handles and guards, and the rules of a cached grant |

mod cached;
mod conn;
mod native;
mod procs;
mod world;

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;

use dlock_core::server::SlotRouting;
use dlock_core::{Config, LockKind};
use dlock_transport::Region;

use super::oracle::Oracle;
use super::oracle::beliefs::Belief;
use super::rng::seed_entropy;
use super::{Failure, FaultPlan, Report, Rng};
use procs::{CLIENT_LEASE_MS, Proc, Sim};
use world::{World, start_server};

/// Server replacements per run at most (one region each is made up front).
const SERVER_CRASHES_MAX: usize = 6;
/// A scheduling step of this simulator does more than one of the model simulator's: its
/// per-step fault rates are the plan's times this.
const STEP_SCALE: u32 = 5;

/// Runs seed `seed` for `ops` scheduled actions; `Err` on the first violation.
pub fn run(seed: u64, ops: u64) -> Result<Report, Failure> {
    run_with(seed, ops, false)
}

/// [`run`] with refused exclusive trylocks turned into grants on their way to the clients:
/// a broken server or transport, for the test that proves the oracle sees it.
pub fn run_sabotaged(seed: u64, ops: u64) -> Result<Report, Failure> {
    run_with(seed, ops, true)
}

fn config() -> Config {
    Config {
        locks_max: 64,
        clients_max: 24,
        objects_max: 8,
        client_lease_ms: CLIENT_LEASE_MS as u32,
        client_lease_max_ms: CLIENT_LEASE_MS as u32,
        recovery_deadline_ms: 2 * CLIENT_LEASE_MS as u32,
        epoch: 1,
        ..Config::default()
    }
}

fn run_with(seed: u64, ops: u64, sabotage: bool) -> Result<Report, Failure> {
    let plan = FaultPlan::draw(seed);
    let mut cfg = config();
    // The seed's minimum hold of a cached grant; revokes lapse at the holder's lease. Its
    // contention window too (0 for half the seeds, as the model simulator draws it), not the
    // server's default: a second-long window would grant most fought-over locks plain, and
    // leave the revoke paths the seeds exercise undriven.
    cfg.timing.min_hold_ms = plan.min_hold_ms;
    cfg.timing.contention_window_ms = plan.contention_window_ms;
    // One region per server incarnation, made up front: the servers borrow their tables.
    let mut regions = (0..=SERVER_CRASHES_MAX)
        .map(|_| Region::anonymous(&cfg))
        .collect::<Result<Vec<_>, _>>()
        .expect("map regions");
    seed_entropy(seed);
    let mut tables = regions
        .iter_mut()
        .map(|r| r.tables())
        .collect::<Result<Vec<_>, _>>()
        .expect("carve tables");
    let first = tables.pop().expect("a region");
    // The runtime's per-slot routing, which every server incarnation starts afresh.
    let mut slots = vec![SlotRouting::default(); cfg.clients_max as usize];
    // Three seeds in four run with a session key: every grant then carries a proof the real
    // client keeps and shows when it re-claims.
    let keyed = !seed.is_multiple_of(4);
    let mut rng = Rng::new(seed);
    let kinds = [LockKind::Atomic, LockKind::Rw, LockKind::Fair];
    let n_locks = rng.range(2, 8) as usize;
    let n_procs = rng.range(2, 12) as usize;
    let names: Vec<(String, LockKind)> = (0..n_locks)
        .map(|i| (format!("lock-{i}"), kinds[i % 3]))
        .collect();
    let oracle = Oracle::new(
        names
            .iter()
            .map(|(n, k)| (n.clone().into_bytes(), *k))
            .collect(),
    );
    let server = start_server(first, &cfg, keyed);
    let mut world = World::new(
        server,
        cfg,
        tables,
        keyed,
        oracle,
        Rng::new(seed ^ 0x5eed),
        plan,
        &mut slots,
    );
    world.sabotage = sabotage;
    world.endpoint.lose_events(seed, plan.event_loss_ppm);
    world.breaks = Rng::new(seed ^ 0xb4ea_0000_57e4);
    let world = Rc::new(RefCell::new(world));
    let mut caching = Rng::new(seed ^ 0xcac4_ed00);
    let mut sim = Sim {
        world: Rc::clone(&world),
        rng,
        names,
        procs: (0..n_procs)
            .map(|_| Proc::new())
            .enumerate()
            .map(|(p, mut proc)| {
                // Drawn apart from the run's generator, so a seed without cached locks runs
                // as it did before they existed.
                proc.caches = p % 3 != 1 && caching.chance(plan.cache_ppm);
                proc
            })
            .collect(),
        ops: 0,
        native_guards: 0,
        downgrades: Rng::new(seed ^ 0xd0_a4ad_e000),
        values: Rng::new(seed ^ 0x7a1_0eb1_0c00),
        reconnects: Rng::new(seed ^ 0x4ec0_44ec_7000),
        cached_downgrades: Rng::new(seed ^ 0xcac4_d0a4_ad00),
        crashes: 0,
        reinits: 0,
    };
    for p in 0..n_procs {
        sim.start_client(p);
    }
    let mut step = 0;
    while sim.ops < ops {
        step += 1;
        let verdict = sim.step().and_then(|()| sim.check());
        if let Err(message) = verdict {
            return Err(Failure {
                sim: "sim_client",
                seed,
                step,
                ops: sim.ops,
                tick: sim.now(),
                message,
            });
        }
    }
    let w = world.borrow();
    let mut faults = w.faults;
    // The server's answers count what no process can see of another's records.
    faults.downgrades = w.oracle.downgrades;
    faults.values_written = w.oracle.values_written;
    Ok(Report {
        seed,
        ops: sim.ops,
        steps: step,
        checks: w.oracle.checks + w.oracle.beliefs.checks + w.oracle.values.checks,
        clients: n_procs,
        faults,
        guards: sim.native_guards,
    })
}

impl Sim<'_> {
    /// One scheduling step: maybe faults, one process acts, and maybe time passes.
    fn step(&mut self) -> Result<(), String> {
        let plan = self.world.borrow().plan;
        let rate = |ppm| FaultPlan::per_step(ppm, STEP_SCALE);
        if self.rng.chance(rate(plan.server_crash_ppm)) {
            self.world.borrow_mut().crash();
        }
        if self.rng.chance(rate(plan.jump_ppm)) {
            let mut w = self.world.borrow_mut();
            w.faults.clock_jumps += 1;
            w.now_ms += self.rng.range(50, 2_500);
        }
        let n = self.procs.len();
        if self.rng.chance(rate(plan.crash_ppm)) {
            let p = self.rng.index(n);
            if self.running(p) {
                self.world.borrow_mut().faults.crashes_other += 1;
                self.crash(p);
            }
        }
        if self.rng.chance(rate(plan.pause_ppm)) {
            let p = self.rng.index(n);
            let beyond = self.rng.below(2) == 0;
            self.stop(p, beyond);
        }
        let p = self.rng.index(n);
        self.act(p)?;
        let lapses = std::mem::take(&mut self.world.borrow_mut().lapses);
        for p in lapses {
            self.stop(p, true);
        }
        // Time passes between actions too: messages in flight land, leases run.
        if self.rng.below(4) == 0 {
            let until = self.now() + self.rng.range(1, 20);
            self.world.borrow_mut().step(until);
        }
        match self.world.borrow_mut().failure.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Process `p` stops, `beyond` its lease or within half of it. One holding locks that
    /// stops past its lease may take the server down with it (`lapse_then_crash`): the server
    /// expires it, others take its locks, and the server crashes before it wakes.
    fn stop(&mut self, p: usize, beyond: bool) {
        let lease = CLIENT_LEASE_MS;
        let mut ms = if beyond {
            self.rng.range(lease + 1, 3 * lease)
        } else {
            self.rng.range(10, lease / 2)
        };
        let holding = self.holding(p);
        {
            let mut w = self.world.borrow_mut();
            let w = &mut *w;
            w.faults.pauses += 1;
            if beyond {
                w.faults.pauses_beyond_lease += 1;
                if holding
                    && w.crash_at.is_none()
                    && let Some(extra) = w.plan.lapse_then_crash(&mut self.rng, &mut w.faults)
                {
                    let crash_in = lease + 20 + extra;
                    w.crash_at = Some(w.now_ms + crash_in);
                    ms = ms.max(crash_in + self.rng.range(1, 60));
                }
            }
        }
        self.pause(p, ms);
    }

    /// The belief rules over what every process believes now.
    fn check(&mut self) -> Result<(), String> {
        let mut w = self.world.borrow_mut();
        let (now, incarnation) = (w.now_ms, w.incarnation);
        let mut by_lock: BTreeMap<usize, Vec<Belief>> = BTreeMap::new();
        let oracle = &w.oracle;
        let name_of = |id: dlock_core::LockId| oracle.name_of_id(id.raw());
        for (p, proc) in self.procs.iter().enumerate() {
            for (k, b) in proc.beliefs(p, now, incarnation, name_of) {
                by_lock.entry(k).or_default().push(b);
            }
        }
        let procs = &self.procs;
        for (k, believers) in by_lock {
            let describe = |p: usize| match procs.get(p).and_then(|x| x.client.as_ref()) {
                Some(c) => format!("process {p} (client {:#x})", c.id().get()),
                None => format!("process {p}"),
            };
            w.oracle
                .beliefs
                .check(k, now, &believers, describe)
                .map_err(|e| format!("{e} ({:?})", self.names[k]))?;
        }
        Ok(())
    }
}
