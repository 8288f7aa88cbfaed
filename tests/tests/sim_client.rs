//! The real `dlock_transport::client::Client` — its decisions, lock records, batches, pipeline,
//! async operations and reinit — driven over a simulated network by one seeded thread.
//!
//! `Client` reaches its server through the `Connection` trait; here that is [`SimConn`], whose
//! messages go through a deterministic world: the server state machine, a clock that moves only
//! when the world does, and per-connection FIFO delivery with random delays (so replies of
//! different clients interleave in every order), plus connection resets that lose whatever was
//! in flight. A client's blocking call steps the world until its reply comes or its deadline
//! passes in simulated time; other clients act only when the scheduler picks them, so one that
//! is not picked for a while is a paused process. Clients also crash (dropped without a word),
//! deinit and come back, and the server itself dies now and then: a replacement with a larger
//! epoch starts recovering for the clients registered with the old one, and each client goes
//! through the real `reinit`, `update_all_locks` and `reinit_done` (what it claims, and whether
//! its lease lapsed, is the client's own decision).
//!
//! After every step an oracle checks what the clients *believe*, from their own records: never
//! two exclusive holders (or a writer beside readers) of one lock among clients whose lease and
//! grant are both still running; fencing tokens of one lock strictly increase; no FAA value is
//! handed out twice. A failure prints the seed and step; `DLOCK_SIM_SEED=<seed> cargo test
//! --release -p dlock-tests --test sim_client replay` reruns it, `DLOCK_SIM_OPS` sizes a
//! campaign. (The wider simulator in `tests/src/sim` adds duplication, clock jumps and full
//! tables, with up to 1,000 model clients built on the same `dlock_core::client` records.)

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::io;
use std::rc::Rc;
use std::time::{Duration, Instant};

use dlock_core::proto::{
    COMMAND_LEN, DATA_HEADER_LEN, DATA_RESPONSE_MAX, LockOp, OBJECT_KIND, peek_data_header,
};
use dlock_core::server::{Delivery, Dispatched, Routing, Server, SlotRouting, Source};
use dlock_core::{Config, LockId, LockKind, Mode, ObjectId, Session, Status};
use dlock_tests::sim::Rng;
use dlock_tests::sim::rng::{seed_entropy, sim_entropy};
use dlock_transport::Region;
use dlock_transport::client::{AsyncOp, Client, ClientConfig, Connection, Endpoint};

/// A message on its way.
#[derive(Debug)]
struct Flight {
    at: u64,
    seq: u64,
    conn: usize,
    to_server: bool,
    bytes: Vec<u8>,
}

#[derive(Debug, Default)]
struct ConnState {
    alive: bool,
    /// The client the connection was attached for (data messages of others are dropped).
    client: Option<u32>,
    /// When the last message each way is delivered (FIFO per direction, as TCP).
    last_to_server: u64,
    last_to_client: u64,
    inbox: Vec<Vec<u8>>,
}

/// Fault rates, per million.
#[derive(Clone, Copy, Debug)]
struct Faults {
    reset: u32,
    delay_max_ms: u64,
}

#[derive(Debug, Default)]
struct Counts {
    server_crashes: u64,
    messages: u64,
    resets: u64,
    crashes: u64,
    reinits: u64,
    parked: u64,
}

struct World<'r> {
    server: Server<'r>,
    /// The configuration the server runs with (its epoch grows at each replacement).
    cfg: Config,
    /// Tables for the replacement servers still to come (each in a region of its own).
    spare: Vec<dlock_core::table::Tables<'r>>,
    now_ms: u64,
    base: Instant,
    rng: Rng,
    faults: Faults,
    flights: Vec<Flight>,
    seq: u64,
    conns: Vec<ConnState>,
    /// Per slot: where a parked request's reply goes, and which connection speaks for it (the
    /// runtime's rules and state, from the core).
    routing: Routing<'r>,
    out: Vec<u8>,
    next_tick: u64,
    counts: Counts,
    /// Turns refused exclusive trylocks into grants on their way to the client: a broken
    /// server or transport, for the test that proves the oracle sees it.
    sabotage: bool,
    /// The servers share a session key (see `start_server`).
    keyed: bool,
}

impl std::fmt::Debug for World<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("World")
            .field("now_ms", &self.now_ms)
            .finish()
    }
}

impl World<'_> {
    fn open(&mut self) -> usize {
        self.conns.push(ConnState {
            alive: true,
            ..ConnState::default()
        });
        self.conns.len() - 1
    }

    /// The server dies with everything in flight; a replacement with a larger epoch starts on
    /// the same address, recovering for the `expected` clients registered with the old one.
    /// False when no replacement is left to start.
    fn crash(&mut self, expected: u32) -> bool {
        let Some(tables) = self.spare.pop() else {
            return false;
        };
        self.cfg.epoch += 1;
        self.cfg.recovery_clients = expected.min(self.cfg.clients_max);
        self.server = start_server(tables, &self.cfg, self.keyed);
        for c in &mut self.conns {
            c.alive = false;
            c.inbox.clear();
        }
        self.flights.clear();
        self.routing.clear();
        self.counts.server_crashes += 1;
        true
    }

    fn reset(&mut self, conn: usize) {
        self.conns[conn].alive = false;
        self.conns[conn].inbox.clear();
        self.flights.retain(|f| f.conn != conn);
        // A request parked over the lost connection is cancelled, as the runtime does.
        let now = self.now_ms;
        self.server
            .stream_closed(&mut self.routing, conn as u32, now);
        self.counts.resets += 1;
    }

    fn enqueue(&mut self, conn: usize, to_server: bool, bytes: Vec<u8>) {
        let delay = self.rng.range(0, self.faults.delay_max_ms);
        let c = &mut self.conns[conn];
        let last = if to_server {
            &mut c.last_to_server
        } else {
            &mut c.last_to_client
        };
        let at = (self.now_ms + delay).max(*last);
        *last = at;
        self.seq += 1;
        self.flights.push(Flight {
            at,
            seq: self.seq,
            conn,
            to_server,
            bytes,
        });
    }

    /// Moves the clock to the next event (at most to `until`, at least one millisecond on when
    /// nothing is due) and delivers what is due.
    fn step(&mut self, until: u64) {
        let next = self.flights.iter().map(|f| f.at).min();
        let target = match next {
            Some(at) if at <= self.now_ms => self.now_ms,
            Some(at) => at.min(until).max(self.now_ms + 1),
            None => (self.now_ms + 1).min(until.max(self.now_ms + 1)),
        };
        self.now_ms = target;
        let now = self.now_ms;
        let mut due: Vec<Flight> = Vec::new();
        let mut k = 0;
        while k < self.flights.len() {
            if self.flights[k].at <= now {
                due.push(self.flights.swap_remove(k));
            } else {
                k += 1;
            }
        }
        due.sort_by_key(|f| (f.at, f.seq));
        for f in due {
            if !self.conns[f.conn].alive {
                continue;
            }
            if !f.to_server {
                self.conns[f.conn].inbox.push(f.bytes);
                continue;
            }
            self.counts.messages += 1;
            // What the runtime's TCP connections do with a message (`Server::dispatch_stream`):
            // ownership, execution, the route of a parked request.
            let mut out = std::mem::take(&mut self.out);
            let at = Source::Stream {
                conn: f.conn as u32,
                generation: 0,
            };
            match self
                .server
                .dispatch(&mut self.routing, at, &f.bytes, &mut out, now)
            {
                // The simulated clients send no joins.
                Dispatched::Replied(n) | Dispatched::Joined { reply: n, .. } => {
                    self.enqueue(f.conn, false, out[..n].to_vec())
                }
                Dispatched::Parked => self.counts.parked += 1,
                // Not the connection's client, or no data message: the connection closes.
                Dispatched::Refused => self.reset(f.conn),
            }
            self.out = out;
        }
        self.server.poll_waiters(now);
        let mut replies = Vec::new();
        let mut out = std::mem::take(&mut self.out);
        self.server
            .dispatch_replies(&mut self.routing, &mut out, |delivery, _, bytes| {
                if let Delivery::Stream { conn, .. } = delivery {
                    replies.push((conn as usize, bytes.to_vec()));
                }
            });
        self.out = out;
        for (conn, bytes) in replies {
            self.enqueue(conn, false, bytes);
        }
        if now >= self.next_tick {
            self.server.tick(now);
            self.next_tick = now + 10;
        }
    }
}

type Shared<'r> = Rc<RefCell<World<'r>>>;

/// A client's connection through the world.
struct SimConn<'r> {
    world: Shared<'r>,
    conn: usize,
    seq: u64,
    /// (ticket, message id) awaiting replies, and replies arrived by ticket.
    awaited: Vec<(u64, u16)>,
    arrived: Vec<(u64, Vec<u8>)>,
}

impl std::fmt::Debug for SimConn<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimConn").field("conn", &self.conn).finish()
    }
}

fn lost() -> io::Error {
    io::Error::new(io::ErrorKind::ConnectionReset, "simulated reset")
}

impl<'r> SimConn<'r> {
    fn new(world: Shared<'r>) -> Self {
        let conn = world.borrow_mut().open();
        SimConn {
            world,
            conn,
            seq: 0,
            awaited: Vec::new(),
            arrived: Vec::new(),
        }
    }

    /// Files the replies that reached this connection under their tickets.
    fn collect(&mut self) -> io::Result<()> {
        let mut w = self.world.borrow_mut();
        let c = &mut w.conns[self.conn];
        if !c.alive {
            return Err(lost());
        }
        for bytes in c.inbox.drain(..) {
            let Ok((h, _)) = peek_data_header(&bytes) else {
                continue;
            };
            if let Some(k) = self.awaited.iter().position(|&(_, id)| id == h.message_id) {
                let (ticket, _) = self.awaited.remove(k);
                self.arrived.push((ticket, bytes));
            }
        }
        Ok(())
    }
}

/// Rewrites every refused exclusive trylock in a data reply into a grant (the sabotage).
fn grant_refused_trylocks(reply: &mut [u8]) {
    // The results only: a proof trailer may follow them.
    let n = usize::from(reply[5]);
    let results = DATA_HEADER_LEN..(DATA_HEADER_LEN + n * COMMAND_LEN).min(reply.len());
    for c in reply[results].chunks_exact_mut(COMMAND_LEN) {
        let status = u16::from_le_bytes([c[2], c[3]]);
        let refused = [Status::Fail as u16, Status::Eagain as u16].contains(&status);
        if c[0] < OBJECT_KIND && c[1] == LockOp::TryExclusive as u8 && refused {
            c[2..4].copy_from_slice(&0u16.to_le_bytes());
        }
    }
}

impl Connection for SimConn<'_> {
    fn reconnect(&mut self) -> io::Result<()> {
        let mut w = self.world.borrow_mut();
        if w.conns[self.conn].alive {
            w.reset(self.conn);
        }
        self.conn = w.open();
        self.awaited.clear();
        self.arrived.clear();
        Ok(())
    }

    fn control(
        &mut self,
        req: &[u8],
        reply: &mut [u8],
        _deadline: Option<Instant>,
    ) -> io::Result<usize> {
        let mut w = self.world.borrow_mut();
        if !w.conns[self.conn].alive {
            return Err(lost());
        }
        let now = w.now_ms;
        w.server
            .handle_control(req, reply, now)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{e:?}")))
    }

    fn attach(&mut self, client: u32, _slot: u32, session: Session) -> io::Result<()> {
        let mut w = self.world.borrow_mut();
        let Some(slot) = w.server.authenticate(client, &session) else {
            return Err(io::Error::new(io::ErrorKind::PermissionDenied, "refused"));
        };
        w.conns[self.conn].client = Some(client);
        // The runtime binds as the core says; an older connection it vacates is left to the
        // simulated client, which no longer uses it.
        let now = w.now_ms;
        let w = &mut *w;
        let at = (self.conn as u32, 0);
        let _vacated = w
            .server
            .bind_stream(&mut w.routing, (slot, client), at, now);
        Ok(())
    }

    fn depth(&self) -> usize {
        4
    }

    fn send_data(&mut self, req: &[u8]) -> io::Result<u64> {
        let (h, _) = peek_data_header(req)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "not a data message"))?;
        let mut w = self.world.borrow_mut();
        if !w.conns[self.conn].alive {
            return Err(lost());
        }
        let reset = w.faults.reset;
        if w.rng.chance(reset) {
            w.reset(self.conn);
            return Err(lost());
        }
        w.enqueue(self.conn, true, req.to_vec());
        drop(w);
        self.seq += 1;
        self.awaited.push((self.seq, h.message_id));
        Ok(self.seq)
    }

    fn try_recv_data(&mut self, ticket: u64, reply: &mut [u8]) -> io::Result<Option<usize>> {
        self.collect()?;
        Ok(match self.arrived.iter().position(|(t, _)| *t == ticket) {
            Some(k) => {
                let (_, mut bytes) = self.arrived.remove(k);
                if self.world.borrow().sabotage {
                    grant_refused_trylocks(&mut bytes);
                }
                reply[..bytes.len()].copy_from_slice(&bytes);
                Some(bytes.len())
            }
            None => None,
        })
    }

    fn recv_data(
        &mut self,
        ticket: u64,
        reply: &mut [u8],
        deadline: Option<Instant>,
    ) -> io::Result<Option<usize>> {
        let until = {
            let w = self.world.borrow();
            deadline.map_or(u64::MAX, |d| {
                d.saturating_duration_since(w.base).as_millis() as u64
            })
        };
        loop {
            if let Some(n) = self.try_recv_data(ticket, reply)? {
                return Ok(Some(n));
            }
            let mut w = self.world.borrow_mut();
            if w.now_ms >= until {
                return Ok(None);
            }
            w.step(until);
        }
    }

    fn now(&self) -> Instant {
        let w = self.world.borrow();
        w.base + Duration::from_millis(w.now_ms)
    }
}

/// A simulated process: its client (none while crashed) and what the oracle needs of it.
struct Proc<'r> {
    client: Option<Client<SimConn<'r>>>,
    /// Sim time of the client's start (its records count from there).
    start_ms: u64,
    /// Sim time of the start of the last call the server answered: its lease runs from no
    /// earlier.
    lease_anchor_ms: u64,
    lease_ms: u64,
    ids: HashMap<usize, LockId>,
    object: Option<ObjectId>,
    /// Down until this sim time (crashed).
    down_until: u64,
}

const CLIENT_LEASE_MS: u64 = 400;
/// Server replacements per run at most, and their rate per scheduled action.
const SERVER_CRASHES_MAX: usize = 6;
const SERVER_CRASH_PER_MILLION: u32 = 400;

struct Sim<'r> {
    world: Shared<'r>,
    rng: Rng,
    names: Vec<(String, LockKind)>,
    procs: Vec<Proc<'r>>,
    /// Per lock: the highest token seen granted, and the highest exclusive one; per (process,
    /// lock): the token it last showed.
    tokens: HashMap<usize, (u64, u64)>,
    shown: HashMap<(usize, usize), u64>,
    faa_seen: HashSet<u64>,
    step: u64,
}

impl<'r> Sim<'r> {
    fn now(&self) -> u64 {
        self.world.borrow().now_ms
    }

    fn config() -> ClientConfig {
        // The endpoint is not used by a client over a `Connection` of its own.
        ClientConfig::new(Endpoint::Local {
            unix_socket: "/nonexistent".into(),
            shm_name: "sim".into(),
        })
        .with_lease(Duration::from_millis(CLIENT_LEASE_MS))
        .with_timeout(Duration::from_millis(50))
    }

    fn start_client(&mut self, p: usize) {
        let now = self.now();
        let conn = SimConn::new(Rc::clone(&self.world));
        let proc = &mut self.procs[p];
        proc.ids.clear();
        proc.object = None;
        match Client::over(conn, Self::config()) {
            Ok(c) => {
                proc.lease_ms = c.lease().as_millis() as u64;
                proc.client = Some(c);
                proc.start_ms = now;
                proc.lease_anchor_ms = now;
            }
            Err(_) => proc.client = None,
        }
    }

    /// One scheduled action of process `p`.
    fn act(&mut self, p: usize) -> Result<(), String> {
        let now = self.now();
        if self.procs[p].client.is_none() {
            if now >= self.procs[p].down_until {
                self.start_client(p);
            }
            return Ok(());
        }
        if self.rng.chance(3_000) {
            // Crash: gone without a word; the server expires it.
            self.procs[p].client = None;
            self.procs[p].down_until = now + self.rng.range(0, 2 * CLIENT_LEASE_MS);
            self.world.borrow_mut().counts.crashes += 1;
            return Ok(());
        }
        let k = self.rng.index(self.names.len());
        let (name, kind) = self.names[k].clone();
        let mode = match kind {
            LockKind::Atomic => Mode::Exclusive,
            _ if self.rng.below(2) == 0 => Mode::Shared,
            _ => Mode::Exclusive,
        };
        let expire = self.rng.range(20, 300) as u32;
        let roll = self.rng.range(2, 99);
        let proc = &mut self.procs[p];
        let c = proc.client.as_mut().expect("checked above");
        let id = match proc.ids.get(&k) {
            Some(&id) => id,
            None => match c.get_lock(kind, name.as_bytes()) {
                Ok(id) => {
                    proc.ids.insert(k, id);
                    id
                }
                Err(_) => return self.after_error(p, now),
            },
        };
        let c = self.procs[p].client.as_mut().expect("checked above");
        let outcome: Result<(), Status> = match roll {
            2..=35 => c.trylock(id, mode, expire).map(drop).map_err(Status::from),
            36..=60 => c.unlock(id).map(drop).map_err(Status::from),
            61..=70 => c
                .lock(
                    id,
                    mode,
                    expire,
                    Duration::from_millis(self.rng.range(1, 40)),
                )
                .map(drop)
                .map_err(Status::from),
            71..=78 => {
                let n = self.rng.range(2, 5) as usize;
                let mut reqs = Vec::new();
                for _ in 0..n {
                    let j = self.rng.index(self.names.len());
                    if let Some(&jid) = self.procs[p].ids.get(&j)
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
                let c = self.procs[p].client.as_mut().expect("checked above");
                c.batch_trylock(&reqs, aon, &mut out).map_err(Status::from)
            }
            79..=82 => {
                let held: Vec<LockId> = c
                    .locks()
                    .filter(|(_, l)| l.state.held_mode().is_some())
                    .map(|(&id, _)| id)
                    .take(31)
                    .collect();
                let mut out = vec![Err(Status::Einval); held.len()];
                c.batch_unlock(&held, &mut out).map_err(Status::from)
            }
            83..=86 => {
                // The reference's async pair, driven to its end.
                let op = AsyncOp::Lock(mode, expire);
                match c.lock_request_async(id, op).map_err(Status::from) {
                    Ok(()) => loop {
                        match c.lock_result_check().map_err(Status::from) {
                            Err(Status::AsyncAgain) => {
                                let until = self.world.borrow().now_ms + 1;
                                self.world.borrow_mut().step(until);
                            }
                            Err(Status::NoAsync) => break Ok(()),
                            r => break r.map(drop),
                        }
                    },
                    Err(s) => Err(s),
                }
            }
            87..=92 => self.faa(p),
            93..=96 => c.heartbeat().map_err(Status::from),
            _ => {
                let mut c = self.procs[p].client.take().expect("checked above");
                if c.try_deinit().map_err(Status::from) == Err(Status::NotReady) {
                    // A recovering server keeps the client and its locks, and so does the
                    // process, which leaves later. `NotReady` renews nothing: no new anchor.
                    self.procs[p].client = Some(c);
                    return Ok(());
                }
                self.procs[p].down_until = now;
                Ok(())
            }
        };
        match outcome {
            Err(Status::BadResponse | Status::NotReady | Status::ClientNotInit) => {
                self.after_error(p, now)
            }
            _ => {
                if self.procs[p].client.is_some() {
                    self.procs[p].lease_anchor_ms = now;
                }
                Ok(())
            }
        }
    }

    fn faa(&mut self, p: usize) -> Result<(), Status> {
        let proc = &mut self.procs[p];
        let c = proc.client.as_mut().expect("a live client");
        let object = match proc.object {
            Some(o) => o,
            None => {
                // Created anew only once every holder of the last one is gone: a new life,
                // whose values may repeat the old one's.
                if c.atomic64_create(b"xid", 1, 3_600).is_ok() {
                    self.faa_seen.clear();
                }
                let o = c.atomic64_get(b"xid", 3_600)?;
                proc.object = Some(o);
                o
            }
        };
        let v = c.atomic64_faa(object, 1)?;
        if !self.faa_seen.insert(v) {
            // Reported by `check` through the flag below.
            self.faa_seen.insert(u64::MAX);
        }
        Ok(())
    }

    /// A transport or registration error: reinit, or start over if the server forgot us.
    fn after_error(&mut self, p: usize, now: u64) -> Result<(), String> {
        let names = &self.names;
        let proc = &mut self.procs[p];
        let Some(c) = proc.client.as_mut() else {
            return Ok(());
        };
        self.world.borrow_mut().counts.reinits += 1;
        match c.reinit() {
            // A replacement server: re-claim what it holds (the real client decides what a
            // claim may say), then tell it this client is done. Until then its grants are
            // uncertain, so nothing counts as renewed on failure.
            Ok(true) => {
                proc.object = None;
                if c.update_all_locks().and_then(|()| c.reinit_done()).is_ok() {
                    proc.lease_anchor_ms = now;
                    // Claims that failed were forgotten, and the ids are the new server's: an
                    // old id may name another lock now.
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
            }
            Ok(false) => proc.lease_anchor_ms = now,
            Err(_) => {
                // Registration gone: what it believed is void (its locks were freed).
                proc.client = None;
                proc.down_until = now;
            }
        }
        Ok(())
    }

    /// The oracle.
    fn check(&mut self) -> Result<(), String> {
        if self.faa_seen.contains(&u64::MAX) {
            return Err("an FAA value was handed out twice".into());
        }
        let now = self.now();
        let mut holders: BTreeMap<usize, Vec<(usize, Mode)>> = BTreeMap::new();
        for (p, proc) in self.procs.iter().enumerate() {
            let Some(c) = &proc.client else { continue };
            if now >= proc.lease_anchor_ms + proc.lease_ms {
                continue; // its registration may be gone: it must not act on beliefs
            }
            for (&k, &id) in &proc.ids {
                let Some((_, l)) = c.locks().find(|(lid, _)| **lid == id) else {
                    continue;
                };
                let Some(mode) = l.state.held_mode() else {
                    continue;
                };
                let until = proc.start_ms + l.granted_at_ms + u64::from(l.expire_ms);
                if l.expire_ms != 0 && now >= until {
                    continue;
                }
                holders.entry(k).or_default().push((p, mode));
                // A token this process has not shown for this lock is a new grant. Grants are
                // seen when their replies land, so two shared grants may show in either order;
                // but a grant that excludes another (either one exclusive) came after the
                // other's belief ended, and must carry the higher token.
                let token = l.token.0;
                if self.shown.insert((p, k), token) != Some(token) {
                    let (all, exclusive) = self.tokens.entry(k).or_insert((0, 0));
                    let above = match mode {
                        Mode::Exclusive => *all,
                        Mode::Shared => *exclusive,
                    };
                    if token <= above {
                        return Err(format!(
                            "lock {}: a {mode:?} grant with token {token:#x} after {above:#x}",
                            self.names[k].0
                        ));
                    }
                    *all = (*all).max(token);
                    if mode == Mode::Exclusive {
                        *exclusive = token;
                    }
                }
            }
        }
        for (k, hs) in holders {
            let exclusive = hs.iter().filter(|(_, m)| *m == Mode::Exclusive).count();
            if exclusive > 1 || (exclusive == 1 && hs.len() > 1) {
                return Err(format!(
                    "lock {} ({:?}) believed held by {hs:?} at {now} ms",
                    self.names[k].0, self.names[k].1
                ));
            }
        }
        Ok(())
    }
}

/// A server over `tables`; with `keyed`, under the session key every incarnation shares.
fn start_server<'r>(
    tables: dlock_core::table::Tables<'r>,
    cfg: &Config,
    keyed: bool,
) -> Server<'r> {
    let mut server = Server::new(tables, cfg, sim_entropy);
    if keyed {
        server.set_session_key(
            dlock_tests::sim::sim_session_key(),
            dlock_transport::runtime::hmac_sha256,
        );
    }
    server
}

/// Runs one seed for `ops` scheduled actions; the report of counts, or the failure.
fn run(seed: u64, ops: u64) -> Result<String, String> {
    run_with(seed, ops, false)
}

fn run_with(seed: u64, ops: u64, sabotage: bool) -> Result<String, String> {
    let cfg = Config {
        locks_max: 64,
        clients_max: 24,
        objects_max: 8,
        client_lease_ms: CLIENT_LEASE_MS as u32,
        client_lease_max_ms: CLIENT_LEASE_MS as u32,
        recovery_deadline_ms: 2 * CLIENT_LEASE_MS as u32,
        epoch: 1,
        ..Config::default()
    };
    // One region per server incarnation, made up front: the servers borrow their tables.
    let mut regions = (0..=SERVER_CRASHES_MAX)
        .map(|_| Region::anonymous(&cfg))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?;
    seed_entropy(seed);
    let mut tables = regions
        .iter_mut()
        .map(|r| r.tables())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|s| s.to_string())?;
    let first = tables.pop().ok_or("no region")?;
    let mut routing = vec![SlotRouting::default(); cfg.clients_max as usize];
    // Three seeds in four run with a session key: every grant then carries a proof the real
    // client keeps and shows when it re-claims.
    let keyed = !seed.is_multiple_of(4);
    let server = start_server(first, &cfg, keyed);
    let mut rng = Rng::new(seed);
    let faults = Faults {
        reset: rng.range(0, 3_000) as u32,
        delay_max_ms: rng.range(0, 8),
    };
    let world = Rc::new(RefCell::new(World {
        server,
        cfg,
        spare: tables,
        now_ms: 0,
        base: Instant::now(),
        rng: Rng::new(seed ^ 0x5eed),
        faults,
        flights: Vec::new(),
        seq: 0,
        conns: Vec::new(),
        routing: Routing::new(&mut routing),
        out: vec![0; DATA_RESPONSE_MAX],
        next_tick: 0,
        counts: Counts::default(),
        sabotage,
        keyed,
    }));
    let kinds = [LockKind::Atomic, LockKind::Rw, LockKind::Fair];
    let n_locks = rng.range(2, 8) as usize;
    let n_procs = rng.range(2, 12) as usize;
    let mut sim = Sim {
        world: Rc::clone(&world),
        rng,
        names: (0..n_locks)
            .map(|i| (format!("lock-{i}"), kinds[i % 3]))
            .collect(),
        procs: (0..n_procs)
            .map(|_| Proc {
                client: None,
                start_ms: 0,
                lease_anchor_ms: 0,
                lease_ms: 0,
                ids: HashMap::new(),
                object: None,
                down_until: 0,
            })
            .collect(),
        tokens: HashMap::new(),
        shown: HashMap::new(),
        faa_seen: HashSet::new(),
        step: 0,
    };
    for p in 0..n_procs {
        sim.start_client(p);
    }
    for _ in 0..ops {
        sim.step += 1;
        if sim.rng.chance(SERVER_CRASH_PER_MILLION) {
            let expected = sim.procs.iter().filter(|p| p.client.is_some()).count() as u32;
            world.borrow_mut().crash(expected);
        }
        let p = sim.rng.index(n_procs);
        sim.act(p)?;
        // Time passes between actions too: messages in flight land, leases run.
        if sim.rng.below(4) == 0 {
            let until = sim.now() + sim.rng.range(1, 20);
            world.borrow_mut().step(until);
        }
        sim.check()
            .map_err(|e| format!("seed {seed:#x} step {}: {e}", sim.step))?;
    }
    let c = &world.borrow().counts;
    Ok(format!(
        "{} processes, {} locks, {} messages, {} resets, {} crashes, {} reinits, {} parked, \
         {} server replacements",
        n_procs, n_locks, c.messages, c.resets, c.crashes, c.reinits, c.parked, c.server_crashes
    ))
}

fn ops_from_env(default: u64) -> u64 {
    std::env::var("DLOCK_SIM_OPS")
        .ok()
        .and_then(|v| v.parse::<f64>().ok())
        .map_or(default, |v| v as u64)
}

/// Many seeds of the real client over the simulated network: the oracle holds after every step.
#[test]
fn the_real_client_keeps_mutual_exclusion_over_a_simulated_network() {
    let total = ops_from_env(200_000);
    let per_seed = 2_000.min(total);
    let seeds = total / per_seed;
    for k in 0..seeds {
        let seed = 0xc11e_0000_0000_0000 ^ k.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        if let Err(e) = run(seed, per_seed) {
            panic!(
                "{e}\nreplay: DLOCK_SIM_SEED={seed:#x} DLOCK_SIM_OPS={per_seed} cargo test \
                 --release -p dlock-tests --test sim_client replay -- --nocapture"
            );
        }
    }
}

/// Reruns one seed (`DLOCK_SIM_SEED`, hex with 0x or decimal); without it, a fixed one.
#[test]
fn replay() {
    let seed = std::env::var("DLOCK_SIM_SEED").ok().map_or(0x5eed, |s| {
        s.strip_prefix("0x")
            .map_or_else(|| s.parse().ok(), |h| u64::from_str_radix(h, 16).ok())
            .expect("DLOCK_SIM_SEED is a number")
    });
    match run(seed, ops_from_env(2_000)) {
        Ok(report) => println!("seed {seed:#x}: {report}"),
        Err(e) => panic!("{e}"),
    }
}

/// The oracle is not blind: when refused exclusive trylocks reach the client as grants, it
/// finds a grant that cannot be (a token not above the last, or two exclusive believers)
/// within a few seeds.
#[test]
fn the_oracle_catches_clients_told_they_hold_a_lock_they_were_refused() {
    let caught = (0..20u64).find_map(|k| {
        let seed = 0xbad0_0000_0000_0000 ^ k.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        run_with(seed, 2_000, true).err()
    });
    let message = caught.expect("a sabotaged run fails the oracle");
    assert!(
        message.contains("believed held by") || message.contains("grant with token"),
        "{message}"
    );
}
