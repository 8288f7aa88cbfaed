//! Deterministic simulation: the real server state machine, many clients running the real
//! client decision code, and a faulty network, all in one thread and driven by one seed.
//!
//! A run is a pure function of its seed (`DLOCK_SIM_SEED`): the workload, every fault, every
//! delay, the server's entropy and its clock all come from one [`Rng`]. After each event the
//! [`Oracle`] and the belief check below compare what happened with what must hold; the first
//! violation stops the run with a [`Failure`] that names the seed and the step, and
//! `DLOCK_SIM_SEED=<seed>` replays it step for step.
//!
//! | part                 | what it models                                                                 |
//! |----------------------|--------------------------------------------------------------------------------|
//! | [`World`]            | time, the server incarnations, faults, the event loop                          |
//! | `client`             | a client: registration, heartbeats, failover re-claims, [`LocalLock`] records   |
//! | `workload`           | what clients do: every lock kind and operation, batches, blocking lock, objects |
//! | [`net`]              | messages in flight: delay, reordering, duplicated replies, loss (a broken connection) |
//! | [`oracle`]           | the independent model of grants, tokens, fair order and objects                 |
//!
//! Time: the server's monotonic clock is `now + clock_offset`; a clock jump moves it forward
//! (a VM that was frozen, a host that slept). Clients measure their leases and grants on the same
//! clock, counted from when they *sent* the request (the server's lease or grant starts no
//! earlier), so a client's belief never outlives the server's grant.
//!
//! [`LocalLock`]: dlock_transport::client::LocalLock

pub mod client;
pub mod net;
pub mod oracle;
pub mod rng;
mod workload;

use std::collections::HashMap;
use std::fmt;

use dlock_core::proto::Command;
use dlock_core::proto::{
    CONTROL_FRAME_MAX, ControlRequest, ControlResponse, DATA_RESPONSE_MAX, decode_control_request,
    decode_control_response, decode_data_request, decode_data_response,
};
use dlock_core::server::{Server, ServerState};
use dlock_core::{Config, LockKind, Status};

use client::{Phase, SimClient, SimLock};
use net::{Dir, Message, Net};
use oracle::Oracle;
pub use rng::Rng;

/// How often the runtime would call `Server::tick` (ms).
const TICK_MS: u64 = 50;
/// How long a client waits for a reply before it takes the connection for broken (ms).
const REQUEST_TIMEOUT_MS: u64 = 1_000;

/// The seed from `DLOCK_SIM_SEED`, if set (decimal or `0x` hex).
pub fn seed_from_env() -> Option<u64> {
    let v = std::env::var("DLOCK_SIM_SEED").ok()?;
    let v = v.trim();
    Some(match v.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).expect("DLOCK_SIM_SEED is a hex number"),
        None => v.parse().expect("DLOCK_SIM_SEED is a number"),
    })
}

/// The total operations a campaign asks for with `DLOCK_SIM_OPS` (`1e9` or `1000000`).
pub fn ops_from_env() -> Option<u64> {
    let v = std::env::var("DLOCK_SIM_OPS").ok()?;
    let n: f64 = v
        .trim()
        .parse()
        .expect("DLOCK_SIM_OPS is a number such as 1e9");
    Some(n as u64)
}

/// Faults injected, by kind.
#[derive(Clone, Copy, Debug, Default)]
pub struct Faults {
    pub messages_lost: u64,
    pub replies_duplicated: u64,
    pub messages_delayed: u64,
    pub connections_reset: u64,
    pub crashes_holding: u64,
    pub crashes_waiting: u64,
    pub crashes_other: u64,
    pub pauses: u64,
    pub pauses_beyond_lease: u64,
    pub clock_jumps: u64,
    pub server_crashes: u64,
    pub recoveries_ended_by_deadline: u64,
    pub tables_full: u64,
    /// Claims of locks a client never held (a thief's), all of which must be refused.
    pub forged_claims: u64,
}

impl Faults {
    /// Adds `o` to these counts.
    pub fn add(&mut self, o: &Faults) {
        self.messages_lost += o.messages_lost;
        self.replies_duplicated += o.replies_duplicated;
        self.messages_delayed += o.messages_delayed;
        self.connections_reset += o.connections_reset;
        self.crashes_holding += o.crashes_holding;
        self.crashes_waiting += o.crashes_waiting;
        self.crashes_other += o.crashes_other;
        self.pauses += o.pauses;
        self.pauses_beyond_lease += o.pauses_beyond_lease;
        self.clock_jumps += o.clock_jumps;
        self.server_crashes += o.server_crashes;
        self.recoveries_ended_by_deadline += o.recoveries_ended_by_deadline;
        self.tables_full += o.tables_full;
        self.forged_claims += o.forged_claims;
    }
}

/// What a finished run did.
#[derive(Clone, Copy, Debug, Default)]
pub struct Report {
    pub seed: u64,
    /// Client operations issued (each command of a batch counts).
    pub ops: u64,
    /// Events processed.
    pub steps: u64,
    /// Oracle comparisons made.
    pub checks: u64,
    pub clients: usize,
    pub faults: Faults,
}

/// A violated property, with what it takes to replay it.
#[derive(Clone, Debug)]
pub struct Failure {
    pub seed: u64,
    pub step: u64,
    pub tick: u64,
    pub message: String,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "simulation seed {:#x} failed at step {} (server tick {}): {}\n\
             replay: DLOCK_SIM_SEED={:#x} cargo test -p dlock-tests --test sim replay -- --nocapture",
            self.seed, self.step, self.tick, self.message, self.seed
        )
    }
}

/// The shape of one run, drawn from its seed.
#[derive(Clone, Copy, Debug)]
pub struct Params {
    pub clients: usize,
    pub cfg: Config,
    pub lock_names: usize,
    pub object_names: usize,
    /// Per-million chances per message.
    pub loss_ppm: u32,
    pub dup_ppm: u32,
    pub long_delay_ppm: u32,
    /// Per-million chances per step.
    pub crash_ppm: u32,
    pub pause_ppm: u32,
    pub jump_ppm: u32,
    pub server_crash_ppm: u32,
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
            // The simulator asks for no cached grants yet, so the timing never applies.
            timing: dlock_core::manager::Timing::DEFAULT,
        };
        let calm = rng.below(5) == 0;
        let f = |ppm: u64| if calm { 0 } else { ppm as u32 };
        Params {
            clients,
            cfg,
            lock_names: (u64::from(locks_max) + rng.range(0, u64::from(locks_max))) as usize,
            object_names: rng.range(1, 5) as usize,
            loss_ppm: f(rng.range(0, 3_000)),
            dup_ppm: f(rng.range(0, 20_000)),
            long_delay_ppm: f(rng.range(0, 50_000)),
            crash_ppm: f(rng.range(0, 400)),
            pause_ppm: f(rng.range(0, 400)),
            jump_ppm: f(rng.range(0, 60)),
            server_crash_ppm: f(rng.range(0, 40)),
            // Not drawn from `rng`, so a seed's other parameters stay what they were.
            session_key: false,
        }
    }
}

/// The session key the servers of a keyed run share: 32 bytes from a CSPRNG (once, by hand).
pub fn sim_session_key() -> dlock_core::SessionKey {
    const KEY: [u8; 32] = [
        0x91, 0x4e, 0x07, 0xd2, 0x3b, 0xa8, 0x65, 0xf1, 0x1c, 0xe9, 0x52, 0x8f, 0x36, 0xc4, 0x7a,
        0x0b, 0xd8, 0x23, 0x9e, 0x61, 0xb5, 0x4c, 0x0f, 0xea, 0x77, 0x18, 0xcd, 0x42, 0xa3, 0x5e,
        0x89, 0x06,
    ];
    dlock_core::SessionKey::new(KEY).expect("a strong key")
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
pub struct World {
    seed: u64,
    rng: Rng,
    p: Params,
    now: u64,
    clock_offset: u64,
    steps: u64,
    ops: u64,
    ops_max: u64,
    draining: bool,
    drain_started: u64,
    net: Net,
    clients: Vec<SimClient>,
    by_id: HashMap<u32, usize>,
    names: Vec<(Vec<u8>, LockKind)>,
    name_index: HashMap<Vec<u8>, usize>,
    object_names: Vec<Vec<u8>>,
    /// Clients that may believe they hold each name (checked lazily).
    believers: Vec<Vec<usize>>,
    oracle: Oracle,
    faults: Faults,
    epoch: u16,
    incarnation: u32,
    expected: u32,
    next_tick: u64,
    /// Per crashed client: (server id, last tick the server heard of it, its lease).
    dead: Vec<Option<(u32, u64, u32)>>,
    /// Clients whose connection broke during the current event.
    resets: Vec<usize>,
    reply: Vec<u8>,
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
    let mut w = World::new(seed, ops);
    w.lease_from_reply = lease_from_reply;
    loop {
        let mut cfg = w.p.cfg;
        cfg.epoch = w.epoch;
        cfg.recovery_clients = w.expected.min(cfg.clients_max);
        let mut region = dlock_transport::Region::anonymous(&cfg).expect("map region");
        rng::seed_entropy(seed ^ u64::from(w.epoch).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let tables = region.tables().expect("carve tables");
        let mut srv = Server::new(tables, &cfg, rng::sim_entropy);
        if w.p.session_key {
            srv.set_session_key(sim_session_key(), dlock_transport::runtime::hmac_sha256);
        }
        match w.serve(&mut srv) {
            Ok(Flow::Finished) => return Ok(w.report()),
            Ok(Flow::Crashed) => continue,
            Ok(Flow::Continue) => unreachable!("serve returns only at the end of a server"),
            Err(message) => {
                return Err(Failure {
                    seed,
                    step: w.steps,
                    tick: w.server_now(),
                    message,
                });
            }
        }
    }
}

impl World {
    fn new(seed: u64, ops_max: u64) -> Self {
        let mut rng = Rng::new(seed);
        let mut p = Params::draw(&mut rng);
        // Three seeds in four: from a hash of the seed rather than the stream.
        p.session_key = Rng::new(seed ^ 0x5E55_10E5_0000_0000).below(4) != 0;
        let kinds = [LockKind::Atomic, LockKind::Rw, LockKind::Fair];
        let names: Vec<(Vec<u8>, LockKind)> = (0..p.lock_names)
            .map(|i| (format!("lock-{i}").into_bytes(), kinds[i % 3]))
            .collect();
        let name_index = names
            .iter()
            .enumerate()
            .map(|(i, (n, _))| (n.clone(), i))
            .collect();
        let clients = (0..p.clients)
            .map(|_| SimClient::new(rng.range(1, 6) as usize))
            .collect();
        let mut oracle = Oracle::new(names.len());
        oracle.trace = std::env::var_os("DLOCK_SIM_TRACE").is_some();
        World {
            seed,
            p,
            now: 1_000,
            clock_offset: 0,
            steps: 0,
            ops: 0,
            ops_max,
            draining: false,
            drain_started: 0,
            net: Net::default(),
            clients,
            by_id: HashMap::new(),
            oracle,
            believers: vec![Vec::new(); names.len()],
            names,
            name_index,
            object_names: (0..p.object_names)
                .map(|i| format!("object-{i}").into_bytes())
                .collect(),
            faults: Faults::default(),
            epoch: 1,
            incarnation: 0,
            expected: 0,
            next_tick: 0,
            dead: vec![None; p.clients],
            resets: Vec::new(),
            reply: vec![0; CONTROL_FRAME_MAX.max(DATA_RESPONSE_MAX)],
            lease_from_reply: false,
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
            faults: self.faults,
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
            self.apply_resets(srv)?;
        }
        srv.poll_waiters(self.server_now());
        self.collect_parked(srv)?;
        if self.now >= self.next_tick {
            self.next_tick = self.now + TICK_MS;
            self.tick(srv)?;
        }
        if !self.draining {
            if self.ops >= self.ops_max {
                self.draining = true;
                self.drain_started = self.now;
            } else if let Some(flow) = self.inject_fault(srv)? {
                return Ok(flow);
            }
        }
        let i = self.rng.index(self.clients.len());
        self.act(srv, i)?;
        self.apply_resets(srv)?;
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

    /// `tick` and the checks that depend on time: dead clients are gone within their lease.
    fn tick(&mut self, srv: &mut Server<'_>) -> Result<(), String> {
        let now = self.server_now();
        srv.tick(now);
        // The dead clients' grants end before the waiters their release woke were granted.
        self.oracle.forget_gone(|id| srv.is_registered(id));
        self.collect_parked(srv)?;
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

    /// Sends `bytes` from or to client `i` on its current connection, with the network's
    /// faults.
    fn transmit(&mut self, i: usize, dir: Dir, bytes: Vec<u8>) {
        if self.rng.chance(self.p.loss_ppm) {
            self.faults.messages_lost += 1;
            self.resets.push(i);
            return;
        }
        let delay = |rng: &mut Rng, faults: &mut Faults, p: &Params| {
            if rng.chance(p.long_delay_ppm) {
                faults.messages_delayed += 1;
                rng.range(20, 400)
            } else {
                rng.range(0, 2)
            }
        };
        let at = self.now + delay(&mut self.rng, &mut self.faults, &self.p);
        let reply = matches!(dir, Dir::ControlReply | Dir::DataReply);
        if reply && self.rng.chance(self.p.dup_ppm) {
            self.faults.replies_duplicated += 1;
            let at = self.now + delay(&mut self.rng, &mut self.faults, &self.p);
            self.net.push(self.message(i, dir, bytes.clone(), at));
        }
        self.net.push(self.message(i, dir, bytes, at));
    }

    fn message(&self, i: usize, dir: Dir, bytes: Vec<u8>, at: u64) -> Message {
        Message {
            at,
            seq: 0,
            client: i,
            conn: self.clients[i].conn,
            incarnation: self.incarnation,
            dir,
            bytes,
        }
    }

    /// Breaks the connections of the clients in `resets`: both ends notice at once (a TCP reset,
    /// a mailbox owner gone), the server marks the client abnormal and drops its parked request.
    fn apply_resets(&mut self, srv: &mut Server<'_>) -> Result<(), String> {
        while let Some(i) = self.resets.pop() {
            let c = &mut self.clients[i];
            if c.phase == Phase::Dead || !c.connected && c.pending.is_none() {
                continue;
            }
            self.faults.connections_reset += 1;
            c.conn += 1;
            c.connected = false;
            c.pending = None;
            c.heartbeat = None;
            c.notice_at = self.now;
            match c.phase {
                Phase::Initing => c.phase = Phase::Idle,
                // The deinit may or may not have arrived; if not, the lease removes the client.
                Phase::Deiniting => c.forget_all(),
                _ => {}
            }
            if let Some(id) = c.id {
                srv.client_disconnected(id, self.now + self.clock_offset);
                self.collect_parked(srv)?;
            }
        }
        Ok(())
    }

    /// Delivers message `m` to the server or to its client.
    fn deliver(&mut self, srv: &mut Server<'_>, m: Message) -> Result<(), String> {
        let c = &self.clients[m.client];
        if m.incarnation != self.incarnation || m.conn != c.conn {
            return Ok(());
        }
        match m.dir {
            Dir::ControlRequest | Dir::DataRequest => self.serve_request(srv, m),
            Dir::ControlReply | Dir::DataReply => {
                if c.phase == Phase::Dead {
                    return Ok(());
                }
                if c.paused_until > self.now {
                    // A paused process reads its socket when it runs again.
                    let at = c.paused_until;
                    self.net.push(Message { at, ..m });
                    return Ok(());
                }
                self.on_reply(srv, m.client, m.dir, &m.bytes)
            }
        }
    }

    /// The server handles one request and its reply is sent.
    fn serve_request(&mut self, srv: &mut Server<'_>, m: Message) -> Result<(), String> {
        let now = self.server_now();
        if let Some(d) = &mut self.dead[m.client] {
            d.1 = now;
        }
        let mut out = std::mem::take(&mut self.reply);
        if self.oracle.trace {
            eprintln!("tick {now}: serve {:?} from sim client {}", m.dir, m.client);
        }
        let result = if m.dir == Dir::ControlRequest {
            let n = srv
                .handle_control(&m.bytes, &mut out, now)
                .map_err(|e| format!("control frame refused: {e:?}"))?;
            if self.oracle.trace {
                let req = dlock_core::proto::peek_control_header(&m.bytes).map(|(h, _)| h.msg);
                let status = dlock_core::proto::peek_control_header(&out[..n])
                    .ok()
                    .and_then(|(h, _)| h.status());
                eprintln!("  control {req:?} -> {status:?}");
            }
            self.observe_control(srv, &m.bytes, &out[..n], now)
                .map(|()| Some((Dir::ControlReply, out[..n].to_vec())))
        } else {
            let n = srv
                .handle_data(&m.bytes, &mut out, now)
                .map_err(|e| format!("data frame refused: {e:?}"))?;
            if n == 0 {
                Ok(None)
            } else {
                self.observe_data(&m.bytes, &out[..n], now)
                    .map(|()| Some((Dir::DataReply, out[..n].to_vec())))
            }
        };
        self.reply = out;
        if let Some((dir, bytes)) = result?
            && self.clients[m.client].phase != Phase::Dead
        {
            self.transmit(m.client, dir, bytes);
        }
        self.collect_parked(srv)
    }

    /// Replies of parked requests the server decided: checked and sent.
    fn collect_parked(&mut self, srv: &mut Server<'_>) -> Result<(), String> {
        if srv.replies_ready() == 0 {
            return Ok(());
        }
        let now = self.server_now();
        let mut ready = Vec::new();
        srv.take_replies(|w| ready.push(w));
        // `take_replies` hands replies over in waiter-slot order; the grants happened in token
        // order, which is the order the oracle must see them in.
        ready.sort_by_key(|w| match w.result.status {
            Status::Success => w.result.aux,
            _ => 0,
        });
        for w in ready {
            self.oracle
                .lock_result(now, w.client, &w.command, &w.result)?;
            let Some(&i) = self.by_id.get(&w.client) else {
                continue;
            };
            if let Some(d) = &mut self.dead[i]
                && d.0 == w.client
            {
                // The server heard of it: its request was decided now.
                d.1 = now;
            }
            let c = &self.clients[i];
            if c.id != Some(w.client) || c.phase == Phase::Dead {
                continue;
            }
            let mut buf = vec![0u8; DATA_RESPONSE_MAX];
            let n = w
                .encode(&mut buf)
                .map_err(|e| format!("late reply: {e:?}"))?;
            buf.truncate(n);
            self.transmit(i, Dir::DataReply, buf);
        }
        Ok(())
    }

    /// Feeds the oracle what a control request did.
    fn observe_control(
        &mut self,
        srv: &Server<'_>,
        req: &[u8],
        reply: &[u8],
        now: u64,
    ) -> Result<(), String> {
        let req = decode_control_request(req).map_err(|e| format!("own request: {e:?}"))?;
        let rep = decode_control_response(reply).map_err(|e| format!("server reply: {e:?}"))?;
        let status = rep.header.status();
        if status == Some(Status::ServerNoResource) || status == Some(Status::ObjectTooMany) {
            self.faults.tables_full += 1;
        }
        let client = req.header.word;
        match (req.body, rep.body) {
            (ControlRequest::GetLock { name, .. }, ControlResponse::Lock { lock }) => {
                self.oracle.name_lock(lock, self.name_index[name]);
            }
            (ControlRequest::BatchGetLock(b), ControlResponse::Entries(e)) => {
                for (i, entry) in e.iter().enumerate() {
                    if entry.status == Status::Success
                        && let Some((_, name)) = b.get(i)
                    {
                        self.oracle.name_lock(entry.id, self.name_index[name]);
                    }
                }
            }
            (ControlRequest::BatchUpdateLocks(claims), ControlResponse::Entries(e)) => {
                for (claim, entry) in claims.iter().zip(e.iter()) {
                    if self.oracle.trace {
                        eprintln!(
                            "tick {now}: client {client:#x} claims {:?} {:?} of lock {} token {:#x}: {}",
                            claim.kind,
                            claim.held,
                            self.name_index[claim.name],
                            claim.token,
                            entry.status
                        );
                    }
                    if entry.status != Status::Success {
                        continue;
                    }
                    let name = self.name_index[claim.name];
                    self.oracle.name_lock(entry.id, name);
                    self.oracle.claim_accepted(
                        now,
                        client,
                        name,
                        claim.kind,
                        SimLock::claimed_mode(claim.held),
                        claim.remaining_ms,
                    )?;
                }
            }
            (
                ControlRequest::ClientDeinit
                | ControlRequest::ClientInit { .. }
                | ControlRequest::ClientReinit { .. },
                _,
            ) => self.oracle.forget_gone(|id| srv.is_registered(id)),
            _ => {}
        }
        Ok(())
    }

    /// Feeds the oracle what a data message did.
    fn observe_data(&mut self, req: &[u8], reply: &[u8], now: u64) -> Result<(), String> {
        let req = decode_data_request(req).map_err(|e| format!("own request: {e:?}"))?;
        let rep = decode_data_response(reply).map_err(|e| format!("server reply: {e:?}"))?;
        let client = req.header().client;
        for (i, c) in req.commands().enumerate() {
            let r = rep.result(i).result;
            match c {
                Command::Lock(l) => self.oracle.lock_result(now, client, &l, &r)?,
                Command::Object(o) => self.oracle.object_result(&o, &r)?,
                // Joins belong to stream transports; the simulator sends none.
                Command::Join(_) => return Err("a join reached the state machine".into()),
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
            srv.poll_waiters(self.server_now());
            self.tick(srv)?;
        }
        let now = self.server_now();
        if srv.state() != ServerState::Ready {
            return Err(format!(
                "server still {:?} after traffic stopped",
                srv.state()
            ));
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

    /// Maybe one fault; `Some(Crashed)` when the server crashed.
    fn inject_fault(&mut self, srv: &mut Server<'_>) -> Result<Option<Flow>, String> {
        let p = self.p;
        if self.rng.chance(p.server_crash_ppm) {
            self.crash_server(srv);
            return Ok(Some(Flow::Crashed));
        }
        if self.rng.chance(p.jump_ppm) {
            self.faults.clock_jumps += 1;
            self.clock_offset += self.rng.range(50, 2_500);
        }
        if self.rng.chance(p.pause_ppm) {
            let i = self.rng.index(self.clients.len());
            let c = &mut self.clients[i];
            if c.phase != Phase::Dead {
                let lease = u64::from(c.lease_ms.max(100));
                let d = if self.rng.below(2) == 0 {
                    self.rng.range(10, lease / 2)
                } else {
                    self.faults.pauses_beyond_lease += 1;
                    self.rng.range(lease + 1, 3 * lease)
                };
                self.faults.pauses += 1;
                self.clients[i].paused_until = self.now.max(self.clients[i].paused_until) + d;
            }
        }
        if self.rng.chance(p.crash_ppm) {
            let i = self.rng.index(self.clients.len());
            self.crash_client(srv, i)?;
        }
        Ok(None)
    }

    /// Client `i` crashes: it sends nothing more and reads nothing; the server learns of it
    /// only if its transport sees the connection drop (half the time).
    fn crash_client(&mut self, srv: &mut Server<'_>, i: usize) -> Result<(), String> {
        let now = self.server_now();
        let c = &self.clients[i];
        if c.phase == Phase::Dead {
            return Ok(());
        }
        if c.locks.iter().flatten().any(|l| l.used_mode().is_some()) {
            self.faults.crashes_holding += 1;
        } else if matches!(&c.pending, Some(p) if matches!(p.out, client::Out::Data { wait_ms, .. } if wait_ms > 0))
        {
            self.faults.crashes_waiting += 1;
        } else {
            self.faults.crashes_other += 1;
        }
        let id = c.id;
        let lease = c.lease_ms;
        let c = &mut self.clients[i];
        c.phase = Phase::Dead;
        c.pending = None;
        c.heartbeat = None;
        if let Some(id) = id
            && srv.is_registered(id)
        {
            self.dead[i] = Some((id, now, lease));
            if self.rng.below(2) == 0 {
                srv.client_disconnected(id, now);
                self.collect_parked(srv)?;
            }
        }
        Ok(())
    }

    /// The server process dies: its region, sockets and everything in flight are gone. Every
    /// client notices after a while and re-registers with the replacement, which expects as
    /// many clients as were registered (an operator's count, dead ones included).
    fn crash_server(&mut self, srv: &Server<'_>) {
        self.faults.server_crashes += 1;
        self.expected = srv.usage().clients;
        self.epoch += 1;
        self.incarnation += 1;
        self.net.clear();
        self.oracle.new_incarnation();
        // A dead client is not registered with the replacement: nothing of it to expire.
        self.dead.iter_mut().for_each(|d| *d = None);
        for c in &mut self.clients {
            c.conn += 1;
            c.connected = false;
            c.pending = None;
            c.heartbeat = None;
            c.notice_at = self.now + self.rng.range(1, 300);
            match c.phase {
                Phase::Initing => c.phase = Phase::Idle,
                Phase::Deiniting => c.forget_all(),
                _ => {}
            }
        }
    }

    /// Checks that no two clients that trust their lease believe they hold lock `name` in
    /// conflicting modes.
    fn check_beliefs(&mut self, name: usize) -> Result<(), String> {
        let now = self.server_now();
        let clients = &self.clients;
        let mut list = std::mem::take(&mut self.believers[name]);
        list.retain(|&i| {
            clients[i]
                .record_of(name)
                .is_some_and(|l| l.used_mode().is_some())
        });
        let mut exclusive = None;
        let mut users = 0;
        for &i in &list {
            let c = &clients[i];
            let Some(l) = c.record_of(name) else { continue };
            if !c.trusts_lease(now) || now > l.grant_until() {
                continue;
            }
            users += 1;
            if l.used_mode() == Some(dlock_core::Mode::Exclusive) {
                exclusive = Some(i);
            }
        }
        self.believers[name] = list;
        if let Some(x) = exclusive
            && users > 1
        {
            let others: Vec<String> = self.believers[name]
                .iter()
                .filter(|&&i| i != x)
                .map(|&i| {
                    let c = &self.clients[i];
                    let l = c.record_of(name);
                    format!(
                        "client {:?} ({:?}, grant until {:?}, lease anchor {}, lease {})",
                        c.id,
                        l.map(|l| l.local.state),
                        l.map(|l| l.grant_until()),
                        c.lease_anchor,
                        c.lease_ms
                    )
                })
                .collect();
            let c = &self.clients[x];
            return Err(format!(
                "lock {name}: client {:?} believes it holds it exclusively (grant until {:?}) at {now} beside {others:?}",
                c.id,
                c.record_of(name).map(|l| l.grant_until())
            ));
        }
        Ok(())
    }

    /// Notes that client `i` may now believe it holds `name`, and checks.
    fn note_belief(&mut self, i: usize, name: usize) -> Result<(), String> {
        if !self.believers[name].contains(&i) {
            self.believers[name].push(i);
        }
        self.check_beliefs(name)
    }
}
