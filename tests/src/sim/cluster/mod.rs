//! The cluster simulator: a model of etcd, several real `Server`s in cluster mode — each in
//! its own region, each with an agent that keeps its lease alive over a faultable link — and
//! model clients that route by the map, all in one thread and driven by one seed. One oracle
//! checks failovers, moves and servers cut off from etcd (`oracle`): never two holders of a
//! lock whose leases run, tokens increasing per lock across owners, fetch-and-add values never
//! repeated; and `Server::check_invariants` on every server after every step that reached it.
//!
//! | part      | what it models                                                                 |
//! |-----------|--------------------------------------------------------------------------------|
//! | `etcd`    | linearizable keys with revisions, compare-and-swap, leases on the model clock, the election, outages |
//! | `agent`   | confirmation rounds and self-fencing, registration, the coordinator running `cluster::assign`, client lists, counter marks, the runtime's map hand-over |
//! | `host`    | one server process: the real `Server` over its own memory, restarted after a crash |
//! | `clients` | clients routing by the map, joins, epochs, `PartitionMoved` refreshes, `ReclaimDone` |
//! | `serve`   | calls executed at a server and replies read by a client                         |
//! | `oracle`  | the three properties above                                                      |
//!
//! Faults, each on or off per seed: server crashes (kill -9, restarted later as a new
//! incarnation), a server cut off from etcd but not from its clients, etcd down for a while,
//! lost and delayed messages (clients ↔ servers, agents ↔ etcd), and drains (a server asks
//! to be drained, and later joins again). Servers' clocks differ by an offset; they run at one
//! rate (the drift bound is exercised by `core`'s timing property test, not here).

mod agent;
mod clients;
mod etcd;
mod host;
mod oracle;
mod serve;

use std::collections::BTreeMap;

use dlock_core::Config;
use dlock_core::cluster::{Partitions, ServerId, Timing};
use dlock_core::server::ClusterSettings;

use super::{Failure, Report, Rng};
use agent::RoundBack;
use clients::{Client, Rep, Req};
use etcd::Etcd;
use host::Host;
use oracle::ClusterOracle;

/// How often the runtime calls `Server::tick` (ms).
const TICK_MS: u64 = 50;
/// A client's call deadline (ms): a reply after it is dropped.
const CALL_TIMEOUT_MS: u64 = 1_000;
/// The longest lock lease a client asks for; below the client lease, so a belief never
/// outlives the server's grant.
const EXPIRE_MAX_MS: u64 = 900;

/// The shape of one run and the faults it has, drawn from its seed.
#[derive(Clone, Copy, Debug)]
pub struct Params {
    pub servers: usize,
    pub clients: usize,
    pub partitions: Partitions,
    pub lock_names: usize,
    pub counters: usize,
    pub timing: Timing,
    pub cfg: Config,
    /// Per-million chances per step of each fault (0: off in this run).
    pub crash: u32,
    pub cut: u32,
    pub outage: u32,
    pub drain: u32,
    /// Per-million chance that a message is lost, and of a long delay.
    pub loss: u32,
    pub slow: u32,
}

impl Params {
    pub fn draw(rng: &mut Rng) -> Params {
        let on = |rng: &mut Rng, p: u32| if rng.below(3) == 0 { 0 } else { p };
        let ttl = [1_000, 1_500, 2_000][rng.index(3)];
        Params {
            servers: rng.range(2, 5) as usize,
            clients: rng.range(2, 13) as usize,
            partitions: Partitions::new([2, 4, 8, 16][rng.index(4)]).expect("partitions"),
            lock_names: rng.range(3, 24) as usize,
            counters: rng.range(1, 4) as usize,
            timing: Timing {
                ttl_ms: ttl,
                drift_ppm: 10_000,
                grant_lease_max_ms: 1_500,
            },
            cfg: Config {
                locks_max: 64,
                clients_max: 32,
                objects_max: 8,
                client_lease_ms: 1_000,
                client_lease_max_ms: 1_500,
                recovery_clients: 0,
                epoch: 1,
                recovery_deadline_ms: 1_500,
                clients_per_peer_max: 0,
                timing: dlock_core::manager::Timing::DEFAULT,
            },
            crash: on(rng, 60),
            cut: on(rng, 60),
            outage: on(rng, 30),
            drain: on(rng, 60),
            loss: on(rng, 5_000),
            slow: on(rng, 3_000),
        }
    }
}

/// What happens at an instant of the model clock.
#[derive(Debug)]
enum Event {
    /// An agent's round reaches etcd.
    AtEtcd {
        host: usize,
        life: u32,
        round: u64,
        sent_ms: u64,
    },
    /// Its answer reaches the agent.
    Back {
        host: usize,
        life: u32,
        back: Box<RoundBack>,
    },
    /// A client's call reaches a server (whether or not the client still waits for it).
    Call {
        client: usize,
        seq: u64,
        host: usize,
        life: u32,
        req: Req,
    },
    /// Its answer reaches the client.
    Answer { client: usize, seq: u64, rep: Rep },
}

/// Counts of what a run did.
#[derive(Clone, Copy, Debug, Default)]
pub struct Counts {
    pub crashes: u64,
    pub cuts: u64,
    pub outages: u64,
    pub drains: u64,
    pub maps_applied: u64,
    pub moved_answers: u64,
    pub not_ready: u64,
    pub reclaim_dones: u64,
    /// Servers that registered a new incarnation after losing their lease while running.
    pub reregistrations: u64,
}

/// The whole simulated cluster.
#[derive(Debug)]
pub struct World {
    seed: u64,
    rng: Rng,
    p: Params,
    now: u64,
    steps: u64,
    ops: u64,
    ops_max: u64,
    seq: u64,
    events: BTreeMap<(u64, u64), Event>,
    etcd: Etcd,
    hosts: Vec<Host>,
    clients: Vec<Client>,
    oracle: ClusterOracle,
    next_tick: u64,
    /// Hosts a step reached (their invariants are checked at its end).
    touched: Vec<bool>,
    pub counts: Counts,
    pub(super) trace: bool,
    /// The agent's flaw for [`run_never_fencing`]: authority for ever.
    never_fence: bool,
}

/// Runs seed `seed` for about `ops` client calls; `Err` on the first violation.
pub fn run(seed: u64, ops: u64) -> Result<(Report, Counts), Failure> {
    run_with(seed, ops, false)
}

/// [`run`] with agents that never fence their server: authority for ever, whatever etcd
/// says. Only for the test that proves the oracle sees two owners grant at once.
pub fn run_never_fencing(seed: u64, ops: u64) -> Result<(Report, Counts), Failure> {
    run_with(seed, ops, true)
}

fn run_with(seed: u64, ops: u64, never_fence: bool) -> Result<(Report, Counts), Failure> {
    let mut w = World::new(seed, ops);
    w.never_fence = never_fence;
    let (mut last_ops, mut last_at) = (0, w.now);
    while w.ops < w.ops_max {
        if w.ops != last_ops {
            (last_ops, last_at) = (w.ops, w.now);
        }
        let stalled = w.now > last_at + 60_000;
        let result = if stalled {
            Err(format!(
                "no client called anything for 60 s: {:?}",
                w.counts
            ))
        } else {
            w.step()
        };
        if let Err(message) = result {
            return Err(Failure {
                sim: "sim_cluster",
                seed,
                step: w.steps,
                ops: w.ops,
                tick: w.now,
                message,
            });
        }
    }
    Ok((w.report(), w.counts))
}

impl World {
    fn new(seed: u64, ops_max: u64) -> World {
        let mut rng = Rng::new(seed);
        let p = Params::draw(&mut rng);
        let mut hosts: Vec<Host> = (0..p.servers)
            .map(|i| {
                let id = ServerId::new(i as u32 + 1).expect("server id");
                Host::new(id, &p.cfg, rng.range(0, 100_000), p.partitions)
            })
            .collect();
        for h in &mut hosts {
            let settings = settings(h.id, p.timing);
            h.start(&p.cfg, settings, seed);
        }
        World {
            seed,
            p,
            now: 1_000,
            steps: 0,
            ops: 0,
            ops_max,
            seq: 0,
            events: BTreeMap::new(),
            etcd: Etcd::default(),
            touched: vec![false; hosts.len()],
            hosts,
            clients: (0..p.clients).map(|_| Client::default()).collect(),
            oracle: ClusterOracle::default(),
            next_tick: 0,
            counts: Counts::default(),
            trace: std::env::var_os("DLOCK_SIM_TRACE").is_some(),
            never_fence: false,
            rng,
        }
    }

    fn report(&self) -> Report {
        Report {
            seed: self.seed,
            ops: self.ops,
            steps: self.steps,
            checks: self.oracle.checks,
            clients: self.p.clients,
            ..Report::default()
        }
    }

    fn at(&mut self, delay: u64, e: Event) {
        self.seq += 1;
        self.events.insert((self.now + delay, self.seq), e);
    }

    /// A message's delay, or `None` if it is lost.
    fn transit(&mut self) -> Option<u64> {
        if self.rng.chance(self.p.loss) {
            return None;
        }
        Some(if self.rng.chance(self.p.slow) {
            self.rng.range(50, 700)
        } else {
            self.rng.range(0, 4)
        })
    }

    /// One step: time passes, due events happen, timers and faults, one client acts, and the
    /// servers reached are checked.
    fn step(&mut self) -> Result<(), String> {
        self.steps += 1;
        self.now += self.rng.range(0, 3);
        while let Some((&(at, seq), _)) = self.events.first_key_value() {
            if at > self.now {
                break;
            }
            let e = self.events.remove(&(at, seq)).expect("just seen");
            self.happen(e)?;
        }
        self.timers();
        self.faults();
        let i = self.rng.index(self.clients.len());
        self.act(i)?;
        for h in 0..self.hosts.len() {
            if std::mem::take(&mut self.touched[h])
                && let Some(srv) = &self.hosts[h].server
            {
                srv.check_invariants()
                    .map_err(|v| format!("server {} broke an invariant: {v:?}", h + 1))?;
            }
        }
        Ok(())
    }

    fn happen(&mut self, e: Event) -> Result<(), String> {
        if self.trace {
            eprintln!("{}: {e:?}", self.now);
        }
        match e {
            Event::AtEtcd {
                host,
                life,
                round,
                sent_ms,
            } => {
                let h = &mut self.hosts[host];
                if h.life != life || h.server.is_none() || self.now < h.agent.cut_until {
                    return Ok(());
                }
                let (ttl, parts) = (u64::from(self.p.timing.ttl_ms), self.p.partitions);
                let back = agent::visit(&mut self.etcd, h, ttl, parts, (round, sent_ms), self.now);
                if let Some(back) = back
                    && self.now >= self.hosts[host].agent.cut_until
                    && let Some(d) = self.transit()
                {
                    let back = Box::new(back);
                    self.at(d, Event::Back { host, life, back });
                }
                Ok(())
            }
            Event::Back { host, life, back } => {
                self.round_back(host, life, *back);
                Ok(())
            }
            Event::Call {
                client,
                seq,
                host,
                life,
                req,
            } => self.call(client, (seq, host, life), req),
            Event::Answer { client, seq, rep } => self.answer(client, seq, rep),
        }
    }

    /// A round's answer reaches the agent: the runtime hands over what it brought, and
    /// publishes the authority if the round confirmed the map the server applied.
    fn round_back(&mut self, host: usize, life: u32, back: RoundBack) {
        let timing = self.p.timing;
        let h = &mut self.hosts[host];
        if h.life != life || back.round != h.agent.round {
            return;
        }
        let now = h.clock(self.now);
        h.agent.in_flight_until = self.now;
        let Some(srv) = h.server.as_mut() else { return };
        self.touched[host] = true;
        for (name, mark) in &back.marks {
            let _ = srv.counter_mark(name, *mark, now);
        }
        if let Some(map) = &back.map {
            if h.agent
                .applied
                .as_ref()
                .is_some_and(|(_, inc)| *inc != back.incarnation)
            {
                self.counts.reregistrations += 1;
            }
            let stale =
                h.agent.applied.as_ref().is_none_or(|(old, inc)| {
                    map.version() > old.version() || *inc != back.incarnation
                });
            if stale {
                let lists: Vec<_> = back
                    .old_clients
                    .iter()
                    .map(|(s, i, ids)| (*s, *i, ids.as_slice()))
                    .collect();
                if srv.apply_map(map, back.incarnation, &lists, now) {
                    self.counts.maps_applied += 1;
                }
                if self.trace {
                    eprintln!(
                        "{}: server {} applies map {} as {:x}: owners {:?}, marks {:?}",
                        self.now,
                        h.id,
                        map.version(),
                        back.incarnation,
                        map.owners()
                            .iter()
                            .map(|o| (o.server.map(|s| s.get()), o.epoch, o.handover))
                            .collect::<Vec<_>>(),
                        back.marks
                    );
                }
                h.agent.applied = Some((map.clone(), back.incarnation));
            }
        }
        for &id in &back.persisted {
            srv.client_persisted(id);
        }
        for &(object, mark) in &back.reserves {
            match mark {
                Some(m) => srv.mark_confirmed(object, m),
                None => srv.mark_failed(object),
            }
        }
        let applied = h.agent.applied.as_ref().map(|(m, _)| m.version());
        if self.never_fence {
            srv.set_authority_until(Some(u64::MAX));
        } else if back.alive && back.map.as_ref().map(|m| m.version()) == applied {
            srv.set_authority_until(Some(timing.authority_until_ms(back.sent_ms)));
        }
    }

    /// Rounds due, restarts due, and the runtime's tick.
    fn timers(&mut self) {
        let tick = self.now >= self.next_tick;
        if tick {
            self.next_tick = self.now + TICK_MS;
        }
        let round_every = u64::from(self.p.timing.ttl_ms) / 5;
        for host in 0..self.hosts.len() {
            let h = &mut self.hosts[host];
            if h.server.is_none() {
                if h.restart_at.is_some_and(|t| t <= self.now) {
                    let settings = settings(h.id, self.p.timing);
                    h.start(&self.p.cfg, settings, self.seed);
                }
                continue;
            }
            if tick {
                let now = h.clock(self.now);
                let srv = h.server.as_mut().expect("running");
                srv.tick(now);
                self.touched[host] = true;
            }
            self.collect_work(host);
            let h = &mut self.hosts[host];
            if self.now >= h.agent.next_round && self.now >= h.agent.in_flight_until {
                h.agent.round += 1;
                h.agent.next_round = self.now + round_every;
                h.agent.in_flight_until = self.now + round_every * 2;
                let (round, sent_ms, life) = (h.agent.round, h.clock(self.now), h.life);
                let cut = self.now < h.agent.cut_until;
                if !cut && let Some(d) = self.transit() {
                    self.at(
                        d,
                        Event::AtEtcd {
                            host,
                            life,
                            round,
                            sent_ms,
                        },
                    );
                }
            }
        }
    }

    /// Moves the server's requests for the membership to its agent (`runtime::cluster::serve`).
    fn collect_work(&mut self, host: usize) {
        let h = &mut self.hosts[host];
        let Some(srv) = h.server.as_mut() else { return };
        let reserves = &mut h.agent.reserves;
        srv.cluster_work(|w| {
            if let dlock_core::server::ClusterWork::Reserve {
                partition,
                object,
                name,
                mark,
                map_version,
            } = w
            {
                reserves.push((object, partition, name.to_vec(), mark, map_version));
            }
            // Renewals need 2^31 grants in one partition: never reached here.
        });
    }

    /// The seed's faults.
    fn faults(&mut self) {
        let n = self.hosts.len();
        if self.rng.chance(self.p.crash) {
            let running = self.hosts.iter().filter(|h| h.server.is_some()).count();
            let h = self.rng.index(n);
            if running > 1 && self.hosts[h].server.is_some() {
                let at = self.now + self.rng.range(100, 4_000);
                self.hosts[h].crash(at);
                self.counts.crashes += 1;
            }
        }
        if self.rng.chance(self.p.cut) {
            let h = self.rng.index(n);
            let until = self.now + self.rng.range(200, 8_000);
            self.hosts[h].agent.cut_until = until;
            self.counts.cuts += 1;
        }
        if self.rng.chance(self.p.outage) {
            let ms = self.rng.range(100, 4_000);
            self.etcd.outage(self.now, ms);
            self.counts.outages += 1;
        }
        if self.rng.chance(self.p.drain) {
            let h = self.rng.index(n);
            let a = &mut self.hosts[h].agent;
            a.draining = !a.draining;
            self.counts.drains += u64::from(a.draining);
        }
    }
}

fn settings(me: ServerId, timing: Timing) -> ClusterSettings {
    ClusterSettings {
        me,
        timing,
        counter_step: 16,
    }
}
