//! The model-client simulator: the real server state machine and up to 1,000 clients running
//! the client's real per-lock decision code (`dlock_core::client`), over the shared network
//! ([`net`]) with the seed's fault mix ([`swarm`](super::swarm)).
//!
//! | part        | what it models                                                                  |
//! |-------------|---------------------------------------------------------------------------------|
//! | [`World`]   | time, the server incarnations, the event loop                                   |
//! | `wire`      | what crosses the network: requests served, replies delivered, links that break  |
//! | `faults`    | client crashes and pauses, clock jumps, server crashes, the compound faults     |
//! | `client`    | a client: registration, heartbeats, failover re-claims, [`LocalLock`] records    |
//! | `workload`  | what clients do: every lock kind and operation, batches, blocking lock, objects |
//! | `manager`   | what they do with the lock manager: cached grants, value blocks, `recovery_done` |
//! | `replies`   | how a client reads a reply, as the transport's `Client` does                   |
//!
//! Time: the server's monotonic clock is `now + clock_offset`; a clock jump moves it forward
//! (a VM that was frozen, a host that slept). Clients measure their leases and grants on the same
//! clock, counted from when they *sent* the request (the server's lease or grant starts no
//! earlier), so a client's belief never outlives the server's grant.
//!
//! [`LocalLock`]: dlock_transport::client::LocalLock

pub mod client;
mod faults;
mod manager;
mod replies;
mod wire;
mod workload;

use std::collections::HashMap;

use dlock_core::manager::retain::Role;
use dlock_core::proto::PROTO_VERSION;
use dlock_core::server::{Server, ServerState, SlotRouting};
use dlock_core::table::ClientState;
use dlock_core::{Config, LockKind};

use super::endpoint::Endpoint;
use super::net::{self, Net};
use super::oracle::Oracle;
use super::oracle::beliefs::Belief;
use super::swarm::ReplyFate;
use super::{Failure, FaultPlan, Faults, Report, Rng, sim_session_key};
use client::{Phase, SimClient};

/// How often the runtime would call `Server::tick` (ms).
const TICK_MS: u64 = 50;
/// How long a client waits for a reply before it takes the link for broken (ms).
const REQUEST_TIMEOUT_MS: u64 = 1_000;

/// The shape of one run, drawn from its seed (its faults are the seed's [`FaultPlan`]).
#[derive(Clone, Copy, Debug)]
pub struct Params {
    pub clients: usize,
    pub cfg: Config,
    pub lock_names: usize,
    pub object_names: usize,
    /// The servers share a session key: sessions are minted and grants proved under it, and
    /// clients sometimes claim locks they never held (a thief), which must be refused. Without
    /// one, recovery takes claims at their word (`insecure_recovery`) and no client steals.
    pub session_key: bool,
}

impl Params {
    /// Draws a run's shape: mostly small contended groups, sometimes a thousand clients; tables
    /// small enough to fill.
    pub fn draw(rng: &mut Rng) -> Params {
        const SIZES: [usize; 12] = [2, 2, 3, 3, 4, 5, 6, 8, 12, 16, 48, 1_000];
        let mut clients = SIZES[rng.index(SIZES.len())];
        if clients == 1_000 && rng.below(3) != 0 {
            clients = 200;
        }
        let locks_max = rng.range(3, 24) as u32;
        let clients_max = if rng.below(4) == 0 {
            // Fewer entries than clients: registrations meet a full table.
            (clients as u32).saturating_sub(1).max(1)
        } else {
            clients as u32 + 2
        };
        let lease_max = 1_500;
        let cfg = Config {
            locks_max,
            clients_max,
            objects_max: rng.range(1, 4) as u32,
            client_lease_ms: 1_000,
            client_lease_max_ms: lease_max,
            recovery_clients: 0,
            epoch: 1,
            recovery_deadline_ms: rng.range(u64::from(lease_max), 3_000) as u32,
            clients_per_peer_max: 0,
            // The seed's plan sets the minimum hold ([`World::new`]); revokes lapse at the
            // holder's lease.
            timing: dlock_core::manager::Timing::DEFAULT,
        };
        Params {
            clients,
            cfg,
            lock_names: (u64::from(locks_max) + rng.range(0, u64::from(locks_max))) as usize,
            object_names: rng.range(1, 5) as usize,
            session_key: rng.below(4) != 0,
        }
    }
}

/// Whether the event loop goes on with this server.
enum Flow {
    Continue,
    /// The server crashed: start a replacement.
    Crashed,
    /// Traffic stopped and the final checks passed.
    Finished,
}

/// The whole simulated system but the server, which each incarnation borrows from its region.
#[derive(Debug)]
pub struct World<'s> {
    seed: u64,
    rng: Rng,
    p: Params,
    plan: FaultPlan,
    now: u64,
    clock_offset: u64,
    steps: u64,
    ops: u64,
    ops_max: u64,
    draining: bool,
    drain_started: u64,
    net: Net,
    endpoint: Endpoint<'s>,
    clients: Vec<SimClient>,
    by_id: HashMap<u32, usize>,
    object_names: Vec<Vec<u8>>,
    /// Clients that may believe they hold each name (checked lazily).
    believers: Vec<Vec<usize>>,
    oracle: Oracle,
    faults: Faults,
    epoch: u16,
    expected: u32,
    next_tick: u64,
    /// A compound fault's server crash, due at this tick of `now`.
    crash_at: Option<u64>,
    /// Per crashed client: (server id, last tick the server heard of it, its lease).
    dead: Vec<Option<(u32, u64, u32)>>,
    /// Clients apply replies at their arrival instead of at their send (see
    /// [`run_counting_leases_from_reply`]).
    lease_from_reply: bool,
}

/// Runs seed `seed` for about `ops` client operations; `Err` on the first violation.
pub fn run(seed: u64, ops: u64) -> Result<Report, Failure> {
    run_with(seed, ops, false)
}

/// [`run`] with clients that count grants and leases from the reply instead of the send — the
/// transport client's mistake before the simulator found it. Only for the test that proves the
/// belief check catches it.
pub fn run_counting_leases_from_reply(seed: u64, ops: u64) -> Result<Report, Failure> {
    run_with(seed, ops, true)
}

fn run_with(seed: u64, ops: u64, lease_from_reply: bool) -> Result<Report, Failure> {
    let mut rng = Rng::new(seed);
    let p = Params::draw(&mut rng);
    // The runtime's per-slot routing, which every server incarnation starts afresh.
    let mut slots = vec![SlotRouting::default(); p.cfg.clients_max as usize];
    let mut w = World::new(seed, ops, (rng, p), &mut slots);
    w.lease_from_reply = lease_from_reply;
    loop {
        let mut cfg = w.p.cfg;
        cfg.epoch = w.epoch;
        cfg.recovery_clients = w.expected.min(cfg.clients_max);
        let mut region = dlock_transport::Region::anonymous(&cfg).expect("map region");
        // Each incarnation's entropy starts at a hash of (seed, epoch): seeded with the two
        // merely XORed, a small seed's streams were one another shifted by a few draws, and a
        // replacement re-minted an id an earlier incarnation had handed out (seed 0x1).
        let entropy = Rng::new(seed ^ u64::from(w.epoch).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        super::rng::seed_entropy(entropy.clone().next_u64());
        let tables = region.tables().expect("carve tables");
        let mut srv = Server::new(tables, &cfg, super::rng::sim_entropy);
        if w.p.session_key {
            srv.set_session_key(sim_session_key(), dlock_transport::runtime::hmac_sha256);
        }
        w.endpoint.restart();
        match w.serve(&mut srv) {
            Ok(Flow::Finished) => return Ok(w.report()),
            Ok(Flow::Crashed) => continue,
            Ok(Flow::Continue) => unreachable!("serve returns only at the end of a server"),
            Err(message) => {
                return Err(Failure {
                    sim: "sim",
                    seed,
                    step: w.steps,
                    ops: w.ops,
                    tick: w.server_now(),
                    message,
                });
            }
        }
    }
}

impl<'s> World<'s> {
    /// The world of seed `seed`, whose draws so far are `rng` and `p`.
    fn new(
        seed: u64,
        ops_max: u64,
        (mut rng, mut p): (Rng, Params),
        slots: &'s mut [SlotRouting],
    ) -> Self {
        let plan = FaultPlan::draw(seed);
        p.cfg.timing.min_hold_ms = plan.min_hold_ms;
        p.cfg.timing.contention_window_ms = plan.contention_window_ms;
        let kinds = [LockKind::Atomic, LockKind::Rw, LockKind::Fair];
        let names: Vec<(Vec<u8>, LockKind)> = (0..p.lock_names)
            .map(|i| (format!("lock-{i}").into_bytes(), kinds[i % 3]))
            .collect();
        let clients = (0..p.clients)
            .map(|_| SimClient::new(rng.range(1, 6) as usize))
            .collect();
        World {
            seed,
            p,
            plan,
            now: 1_000,
            clock_offset: 0,
            steps: 0,
            ops: 0,
            ops_max,
            draining: false,
            drain_started: 0,
            net: Net::default(),
            endpoint: {
                let mut e = Endpoint::new(slots);
                e.lose_events(seed, plan.event_loss_ppm);
                e
            },
            clients,
            by_id: HashMap::new(),
            believers: vec![Vec::new(); names.len()],
            oracle: Oracle::new(names),
            object_names: (0..p.object_names)
                .map(|i| format!("object-{i}").into_bytes())
                .collect(),
            faults: Faults::default(),
            epoch: 1,
            expected: 0,
            next_tick: 0,
            crash_at: None,
            dead: vec![None; p.clients],
            lease_from_reply: false,
            rng,
        }
    }

    fn report(&self) -> Report {
        Report {
            seed: self.seed,
            ops: self.ops,
            steps: self.steps,
            checks: self.oracle.checks + self.oracle.beliefs.checks,
            clients: self.p.clients,
            faults: self.faults,
            guards: 0,
        }
    }

    /// The server's monotonic clock.
    fn server_now(&self) -> u64 {
        self.now + self.clock_offset
    }

    /// Runs one server incarnation until it crashes or the run ends.
    fn serve(&mut self, srv: &mut Server<'_>) -> Result<Flow, String> {
        let mut deadline_counted = false;
        loop {
            if !deadline_counted
                && self.expected > 0
                && srv.state() == ServerState::Ready
                && srv.recovery_progress().deadline_passed
            {
                deadline_counted = true;
                self.faults.recoveries_ended_by_deadline += 1;
            }
            match self.step(srv)? {
                Flow::Continue => {}
                other => return Ok(other),
            }
        }
    }

    /// One event: time passes, due messages arrive, the server's timers run, maybe a fault,
    /// and one client acts.
    fn step(&mut self, srv: &mut Server<'_>) -> Result<Flow, String> {
        self.steps += 1;
        if self.rng.below(self.p.clients as u64) < 8 {
            self.now += self.rng.range(1, 2);
        }
        while let Some(m) = self.net.pop_due(self.now) {
            self.deliver(srv, m)?;
            self.drain_events(srv);
            self.links_broken(srv)?;
            self.drain_events(srv);
        }
        let tick = self.now >= self.next_tick;
        if tick {
            self.next_tick = self.now + TICK_MS;
        }
        self.timers(srv, tick)?;
        self.drain_events(srv);
        if !self.draining {
            if self.ops >= self.ops_max {
                self.draining = true;
                self.drain_started = self.now;
            } else if let Some(flow) = self.inject_fault(srv)? {
                // The last step of this server: its tables must agree too.
                self.endpoint.check(srv, &mut self.oracle)?;
                return Ok(flow);
            }
            self.drain_events(srv);
        }
        let i = self.rng.index(self.clients.len());
        self.act(srv, i)?;
        self.drain_events(srv);
        self.links_broken(srv)?;
        self.drain_events(srv);
        self.send_events();
        self.endpoint.check(srv, &mut self.oracle)?;
        if self.draining && self.drained() {
            self.finish(srv)?;
            return Ok(Flow::Finished);
        }
        if self.draining && self.now > self.drain_started + 600_000 {
            return Err(format!(
                "traffic did not stop within 600 s of draining: {} messages in flight, phases {:?}",
                self.net.len(),
                self.phase_counts()
            ));
        }
        Ok(Flow::Continue)
    }

    fn phase_counts(&self) -> HashMap<String, usize> {
        let mut m = HashMap::new();
        for c in &self.clients {
            *m.entry(format!("{:?}", c.phase)).or_default() += 1;
        }
        m
    }

    /// The runtime's timers and the checks that depend on time: dead clients are gone within
    /// their lease.
    fn timers(&mut self, srv: &mut Server<'_>, tick: bool) -> Result<(), String> {
        let now = self.server_now();
        let mut emptied = Vec::new();
        let decided = self
            .endpoint
            .timers(srv, &mut self.oracle, now, tick, &mut emptied)?;
        self.send_decided(decided);
        // Links whose clients were all removed close, as the runtime closes such connections.
        for link in emptied {
            self.net.break_link(link);
        }
        if !tick {
            return Ok(());
        }
        for i in 0..self.dead.len() {
            let Some((id, seen, lease)) = self.dead[i] else {
                continue;
            };
            if now > seen + u64::from(lease) + 2 * TICK_MS {
                if let Some(slot) = srv.client_slot_of(id) {
                    let t = srv.tables();
                    if t.waiters[slot as usize].state != 0 {
                        // Its last request is parked on the server, which waits for it up to its
                        // deadline: that reply restarts the lease (`dead` is updated then).
                        continue;
                    }
                    return Err(format!(
                        "client {id:#x} died by tick {seen} with a {lease} ms lease and is still registered at {now}: {:?}, {:?}",
                        t.clients[slot as usize], t.waiters[slot as usize]
                    ));
                }
                self.dead[i] = None;
            }
        }
        Ok(())
    }

    /// No client has anything left to do and nothing is in flight.
    fn drained(&self) -> bool {
        self.net.is_empty()
            && self
                .clients
                .iter()
                .all(|c| matches!(c.phase, Phase::Idle | Phase::Dead) && c.pending.is_none())
    }

    /// Traffic stopped: let every lease run out (and a recovery's deadline pass: expected
    /// clients that never come back are given up only then), then everything must be free and
    /// every table empty.
    fn finish(&mut self, srv: &mut Server<'_>) -> Result<(), String> {
        let wait = self
            .p
            .cfg
            .client_lease_max_ms
            .max(self.p.cfg.recovery_deadline_ms);
        let until = self.now + u64::from(wait) + 4 * TICK_MS;
        while self.now < until {
            self.now += TICK_MS;
            self.timers(srv, true)?;
            self.drain_events(srv);
            self.endpoint.check(srv, &mut self.oracle)?;
        }
        let now = self.server_now();
        if srv.state() != ServerState::Ready {
            return Err(format!(
                "server still {:?} after traffic stopped",
                srv.state()
            ));
        }
        // The operator's recoverer releases what dead clients still retain (the simulated one
        // may have died, or not come round to every dead client).
        let t = srv.tables();
        let retaining: Vec<u32> = (0..t.client_free.high_water())
            .map(|s| &t.clients[s as usize])
            .filter(|e| e.client_state() == ClientState::Retaining)
            .map(|e| e.id)
            .collect();
        for dead in retaining {
            srv.recovery_done(Role::Recoverer, dead, now)
                .map_err(|s| format!("recovery_done({dead:#x}) refused the operator: {s}"))?;
            self.oracle.recovered(dead);
            self.faults.recoveries_done += 1;
        }
        let held = self.oracle.held_names(now);
        if !held.is_empty() {
            return Err(format!("locks {held:?} still held after traffic stopped"));
        }
        let u = srv.usage();
        // An object whose owner left while others used it is orphaned, not destroyed: it is a
        // counter (an XID, a CSN) that outlives its users, reachable by name and destroyable
        // by anyone. What may not remain is an object still owned or referenced by somebody.
        let t = srv.tables();
        let claimed = (0..t.object_free.high_water())
            .map(|o| &t.object_meta[o as usize])
            .filter(|m| {
                dlock_core::table::SlotState(m.state).is_live() && (m.owner != 0 || m.refs != 0)
            })
            .count();
        if (u.locks, claimed, u.clients) != (0, 0, 0) || srv.replies_ready() != 0 {
            return Err(format!(
                "tables not empty after traffic stopped: {u:?}, {} replies ready",
                srv.replies_ready()
            ));
        }
        Ok(())
    }

    /// Takes the revokes the server just wrote out of its event rings (call it after every
    /// server turn, so the oracle learns each at the tick it was sent).
    fn drain_events(&mut self, srv: &mut Server<'_>) {
        let now = self.server_now();
        let timing = self.p.cfg.timing;
        self.endpoint
            .drain_events(srv, &mut self.oracle, now, timing);
    }

    /// Sends the revokes due, as event messages on the data channels of their clients.
    fn send_events(&mut self) {
        let lost = self.endpoint.events_lost;
        for (link, bytes, revokes) in self.endpoint.events() {
            self.faults.revokes += revokes as u64;
            self.send_reply(link, net::Channel::Data, bytes, ReplyFate::Normal);
        }
        self.faults.event_messages_lost += self.endpoint.events_lost - lost;
    }

    /// Checks the clients that may believe they hold lock `name`: the belief rules of the
    /// oracle (`oracle::beliefs`) over those that do.
    fn check_beliefs(&mut self, name: usize) -> Result<(), String> {
        let now = self.server_now();
        let timing = self.p.cfg.timing;
        let clients = &self.clients;
        let mut list = std::mem::take(&mut self.believers[name]);
        list.retain(|&i| {
            clients[i]
                .record_of(name)
                .is_some_and(|l| l.used_mode().is_some())
        });
        let believers: Vec<Belief> = list
            .iter()
            .filter_map(|&i| {
                let c = &clients[i];
                let l = c.record_of(name)?;
                let mode = l.used_mode()?;
                // A cached grant may have been revoked with the revoke still on its way, and
                // lapse unknown to the client: it is sure of it only within the revoke timeout
                // of the last data request answered (`SimClient::data_anchor`).
                // The model's clients register at the newest version (`workload.rs`).
                let timeout = u64::from(timing.revoke_timeout_for(c.lease_ms, PROTO_VERSION));
                let unrevoked = !l.cache.cached || now < c.data_anchor + timeout;
                (c.trusts_lease(now) && now <= l.grant_until() && unrevoked).then_some(Belief {
                    holder: i,
                    mode,
                    token: l.local.token.0,
                    fenced: l.fenced(),
                })
            })
            .collect();
        let describe = |i: usize| {
            let c = &clients[i];
            let l = c.record_of(name);
            format!(
                "client {:?} ({:?}, grant until {:?}, lease anchor {}, lease {})",
                c.id,
                l.map(|l| l.local.state),
                l.map(|l| l.grant_until()),
                c.lease_anchor,
                c.lease_ms
            )
        };
        let verdict = self.oracle.beliefs.check(name, now, &believers, describe);
        self.believers[name] = list;
        verdict
    }

    /// Notes that client `i` may now believe it holds `name`, and checks.
    fn note_belief(&mut self, i: usize, name: usize) -> Result<(), String> {
        if !self.believers[name].contains(&i) {
            self.believers[name].push(i);
        }
        self.check_beliefs(name)
    }

    /// Notes every lock client `i` uses as a belief it holds now, and checks.
    fn note_beliefs(&mut self, i: usize) -> Result<(), String> {
        let names: Vec<usize> = self.clients[i]
            .locks
            .iter()
            .flatten()
            .filter(|l| l.used_mode().is_some())
            .map(|l| l.name)
            .collect();
        for n in names {
            self.note_belief(i, n)?;
        }
        Ok(())
    }
}
