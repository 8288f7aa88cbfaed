//! Model-based tests of the server: random operation sequences from four clients on two locks of
//! one kind, sent through the real [`Server`] the way the reference client library sends them,
//! with an oracle that checks after every step what the lock kind promises.
//!
//! Each simulated client keeps only what its replies told it (idle, holding, or queued with a
//! ticket) and sends only what the client protocol allows in that state; a `Fail` on an unlock,
//! extend or ticket retry sends it back to idle, as the reference client does. The oracle knows
//! more than any one client: every reply, and which fair-lock grants a preemption ended without
//! telling their holders. After every step it checks
//!
//! - mutual exclusion among the grants that, by the replies, still stand and have not expired;
//! - that the lock word agrees with the holders (owner, reader count, next tickets);
//! - that fencing tokens grow strictly per lock and an extend returns the current grant's token;
//! - that a fair lock grants in ticket order unless it preempts;
//! - that a silent client is declared dead exactly when its lease is over, and what it held is
//!   then free for the others;
//! - that every status is one the protocol allows for the (state, operation) sent.
//!
//! Silence is what a hung or partitioned client looks like: it stops heartbeating while the
//! others go on. A fifth client that never acts keeps both locks referenced, so they are never
//! freed (and their counters never restart) when all four happen to be dead at once.
//!
//! The three simulations share the world (server, clients, time, tokens) and differ in the
//! client states and the oracle, which is why this file holds all three. After every step the
//! server's tables must also agree with one another (`Server::check_invariants`, through
//! `dlock_tests::run` and after each tick).
//!
//! This is a different kind of test from the simulators (`dlock_tests::sim`), not a third
//! one: a property test of one lock kind's protocol on a small world, with no network, no
//! failover and no model of what clients believe, whose oracle predicts the *exact* status of
//! every reply and the exact lock word from the (state, operation) sent, and whose failures
//! proptest shrinks to a minimal sequence. The simulators check the whole system under faults
//! and can only check what must hold whatever the interleaving (they cannot predict a status);
//! this checks that each step is the one the protocol table says.

use dlock_core::proto::{CommandResult, LockOp};
use dlock_core::server::{Counter, Server};
use dlock_core::table::LockCell;
use dlock_core::word::atomic::AtomicWord;
use dlock_core::word::fair::{FairWord, ticket_before};
use dlock_core::word::rw::RwWord;
use dlock_core::{ClientId, Config, LockId, LockKind, Mode, Status, Ticket};
use dlock_tests::{region, run, server, ticket_cmd, ticket_of};
use dlock_transport::Region;
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

/// Clients that act.
const CLIENTS: usize = 4;
/// Locks of the kind under test.
const LOCKS: usize = 2;
/// Every client's lease: far longer than any grant or pause but the one meant to outlast it.
const LEASE_MS: u32 = 10_000;
/// Cases per lock kind. A case takes about 5 ms in a debug build, so the three tests take about
/// 6 s on two cores (9 s on one), inside the 20-second budget.
const CASES: u32 = 1_024;

fn config() -> Config {
    Config {
        locks_max: 16,
        clients_max: 8,
        objects_max: 4,
        client_lease_ms: LEASE_MS,
        ..Config::default()
    }
}

/// What a client does with its turn; what that means depends on its state (see each `step`).
#[derive(Clone, Copy, Debug)]
enum Act {
    /// The protocol's next move: lock when idle, retry when queued, unlock when holding.
    Advance,
    /// Extend a grant (otherwise as `Advance`).
    Extend,
    /// Unlock while queued, giving the ticket up (otherwise as `Advance`).
    Abandon,
    /// Stop sending anything, heartbeats included, until declared dead.
    Silence,
}

/// One step of a run: time passes, then one client acts on one lock.
#[derive(Clone, Copy, Debug)]
struct Step {
    client: usize,
    lock: usize,
    act: Act,
    exclusive: bool,
    expire_ms: u32,
    dt_ms: u64,
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    let act = prop_oneof![
        24 => Just(Act::Advance),
        4 => Just(Act::Extend),
        4 => Just(Act::Abandon),
        1 => Just(Act::Silence),
    ];
    // Mostly short pauses, so queued clients often claim their turn within the fair lock's 2 s
    // hand-off; often pauses of up to 3 s, so grants (up to 4 s) expire and are taken over or
    // preempted; now and then a pause past the lease, after which every silent client is dead.
    let dt_ms = prop_oneof![8 => 0u64..100, 3 => 0u64..3_000, 1 => Just(u64::from(LEASE_MS) + 1)];
    let step = (0..CLIENTS, 0..LOCKS, act, any::<bool>(), 0u32..4_000, dt_ms).prop_map(
        |(client, lock, act, exclusive, expire_ms, dt_ms)| Step {
            client,
            lock,
            act,
            exclusive,
            expire_ms,
            dt_ms,
        },
    );
    proptest::collection::vec(step, 1..200)
}

fn mode(exclusive: bool) -> Mode {
    if exclusive {
        Mode::Exclusive
    } else {
        Mode::Shared
    }
}

/// The op for `mode`: `exclusive` or `shared`.
fn by_mode(mode: Mode, exclusive: LockOp, shared: LockOp) -> LockOp {
    match mode {
        Mode::Exclusive => exclusive,
        Mode::Shared => shared,
    }
}

/// Fails the case unless `got` is one of `allowed`.
fn expect_status(got: Status, allowed: &[Status], what: &str) -> Result<(), TestCaseError> {
    prop_assert!(
        allowed.contains(&got),
        "{}: {:?} is not one of {:?}",
        what,
        got,
        allowed
    );
    Ok(())
}

/// A registered client as the simulation sees it.
struct Client {
    id: ClientId,
    locks: [LockId; LOCKS],
    silent: bool,
    /// When the server last heard from it, which is when its lease was renewed.
    last_sent_ms: u64,
}

/// Registers a client and joins both locks, as a (re)starting client process does.
fn register(s: &mut Server<'_>, kind: LockKind, now_ms: u64) -> Client {
    let id = s.client_init(2, 0, now_ms).expect("room for a client");
    let locks = [b"model/0".as_slice(), b"model/1"].map(|name| {
        s.get_lock(id.get(), kind, name, now_ms)
            .expect("room for a lock")
    });
    Client {
        id,
        locks,
        silent: false,
        last_sent_ms: now_ms,
    }
}

/// What every simulation shares: the server, the clients, time and the tokens seen.
struct World<'r> {
    s: Server<'r>,
    kind: LockKind,
    now_ms: u64,
    anchor: Client,
    clients: [Client; CLIENTS],
    /// The latest fencing token granted on each lock (0 before the first).
    fence: [u64; LOCKS],
}

impl<'r> World<'r> {
    fn new(region: &'r mut Region, kind: LockKind) -> Self {
        let mut s = server(region);
        let anchor = register(&mut s, kind, 0);
        let clients = [(); CLIENTS].map(|()| register(&mut s, kind, 0));
        Self {
            s,
            kind,
            now_ms: 0,
            anchor,
            clients,
            fence: [0; LOCKS],
        }
    }

    /// Whether client `st.client` sends nothing this step: it is silent, or goes silent now.
    fn silent(&mut self, st: &Step) -> bool {
        let c = &mut self.clients[st.client];
        c.silent |= matches!(st.act, Act::Silence);
        c.silent
    }

    /// Sends one lock command from client `i`.
    fn send(
        &mut self,
        i: usize,
        lock: usize,
        op: LockOp,
        expire_ms: u32,
        ticket: Ticket,
    ) -> CommandResult {
        let c = &mut self.clients[i];
        c.last_sent_ms = self.now_ms;
        let cmd = ticket_cmd(self.kind, op, c.locks[lock], expire_ms, ticket);
        run(&mut self.s, c.id, cmd, self.now_ms)
    }

    /// Lets `dt_ms` pass: every client that is not silent heartbeats (as the reference client's
    /// heartbeat thread does), then the server's tick declares clients dead. Only the silent may
    /// die, and exactly when their lease is over. The dead re-register at once with new ids;
    /// returns which they were.
    fn advance(&mut self, dt_ms: u64) -> Result<[bool; CLIENTS], TestCaseError> {
        self.now_ms += dt_ms;
        let now_ms = self.now_ms;
        for c in core::iter::once(&mut self.anchor).chain(&mut self.clients) {
            if !c.silent {
                prop_assert_eq!(self.s.heartbeat(c.id.get(), now_ms), Ok(()));
                c.last_sent_ms = now_ms;
            }
        }
        let died = self.s.tick(now_ms);
        if let Err(v) = self.s.check_invariants() {
            prop_assert!(
                false,
                "server tables after the tick at {} ms: {}",
                now_ms,
                v
            );
        }
        let mut dead = [false; CLIENTS];
        for (i, gone) in dead.iter_mut().enumerate() {
            let c = &self.clients[i];
            let lease_over = now_ms > c.last_sent_ms + u64::from(LEASE_MS);
            *gone = !self.s.is_registered(c.id.get());
            prop_assert_eq!(
                *gone,
                lease_over,
                "client {} last heard at {} ms, tick at {} ms",
                i,
                c.last_sent_ms,
                now_ms
            );
            if *gone {
                self.clients[i] = register(&mut self.s, self.kind, now_ms);
            }
        }
        prop_assert_eq!(died as usize, dead.iter().filter(|&&d| d).count());
        Ok(dead)
    }

    /// Checks a grant's fencing token against every token granted before on the lock (all of
    /// them positive) and records it.
    fn grant_token(&mut self, lock: usize, r: &CommandResult) -> Result<u64, TestCaseError> {
        prop_assert!(
            r.aux > self.fence[lock],
            "token {} granted after {} on lock {}",
            r.aux,
            self.fence[lock],
            lock
        );
        self.fence[lock] = r.aux;
        Ok(r.aux)
    }

    /// The lock's slot as the server holds it.
    fn cell(&self, lock: usize) -> LockCell {
        self.s.tables().lock_cells[self.anchor.locks[lock].index() as usize]
    }

    fn preemptions(&self) -> u64 {
        self.s.stats().get(Counter::Preemptions)
    }

    /// A client that may act on a lock to show it free: `idle` there and not silent, preferably
    /// one that did not just die.
    fn idle_client(&self, dead: &[bool; CLIENTS], idle: impl Fn(usize) -> bool) -> usize {
        (0..CLIENTS)
            .filter(|&j| idle(j) && !self.clients[j].silent)
            .min_by_key(|&j| dead[j])
            .expect("a client that just re-registered is idle and not silent")
    }
}

// ---------------------------------------------------------------------------------------------
// Atomic lock

#[derive(Clone, Copy, Debug, PartialEq)]
enum AtomicLocal {
    Idle,
    Holding { token: u64, until_ms: u64 },
}

struct AtomicSim<'r> {
    w: World<'r>,
    local: [[AtomicLocal; LOCKS]; CLIENTS],
    /// The client the lock word names, by the replies: set by a grant, cleared by its unlock or
    /// its holder's death. An expired grant stays named until another client takes it over.
    owner: [Option<usize>; LOCKS],
}

impl<'r> AtomicSim<'r> {
    fn new(region: &'r mut Region) -> Self {
        Self {
            w: World::new(region, LockKind::Atomic),
            local: [[AtomicLocal::Idle; LOCKS]; CLIENTS],
            owner: [None; LOCKS],
        }
    }

    /// The client other than `i` holding a grant on `lock` that has not expired.
    fn live_holder(&self, lock: usize, i: usize) -> Option<usize> {
        (0..CLIENTS).find(|&j| {
            j != i
                && matches!(self.local[j][lock], AtomicLocal::Holding { until_ms, .. }
                    if self.w.now_ms <= until_ms)
        })
    }

    fn step(&mut self, st: Step) -> Result<(), TestCaseError> {
        let dead = self.w.advance(st.dt_ms)?;
        self.bury(&dead)?;
        if !self.w.silent(&st) {
            let (i, lock) = (st.client, st.lock);
            match (st.act, self.local[i][lock]) {
                (_, AtomicLocal::Idle) => drop(self.try_lock(i, lock, st.expire_ms.max(1))?),
                (Act::Extend, AtomicLocal::Holding { .. }) => self.extend(i, lock, st.expire_ms)?,
                (_, AtomicLocal::Holding { .. }) => self.unlock(i, lock)?,
            }
        }
        self.check()
    }

    /// Forgets what the dead held, then shows every lock the word named one of them on free for
    /// the others.
    fn bury(&mut self, dead: &[bool; CLIENTS]) -> Result<(), TestCaseError> {
        let mut freed = [false; LOCKS];
        for i in (0..CLIENTS).filter(|&i| dead[i]) {
            self.local[i] = [AtomicLocal::Idle; LOCKS];
            for (lock, freed) in freed.iter_mut().enumerate() {
                if self.owner[lock] == Some(i) {
                    self.owner[lock] = None;
                    *freed = true;
                }
            }
        }
        for lock in (0..LOCKS).filter(|&lock| freed[lock]) {
            // The word named a dead client, so nobody else holds the lock: the server must have
            // freed it for whoever asks next.
            let j = self
                .w
                .idle_client(dead, |j| self.local[j][lock] == AtomicLocal::Idle);
            let status = self.try_lock(j, lock, 1_000)?;
            prop_assert_eq!(status, Status::Success, "lock {} not freed by death", lock);
        }
        Ok(())
    }

    fn try_lock(&mut self, i: usize, lock: usize, expire_ms: u32) -> Result<Status, TestCaseError> {
        let r = self
            .w
            .send(i, lock, LockOp::TryExclusive, expire_ms, Ticket::default());
        expect_status(r.status, &[Status::Success, Status::Fail], "atomic trylock")?;
        // Free means nobody else holds a grant that has not expired.
        let holder = self.live_holder(lock, i);
        prop_assert_eq!(
            r.status == Status::Success,
            holder.is_none(),
            "holder {:?}",
            holder
        );
        if r.status == Status::Success {
            let token = self.w.grant_token(lock, &r)?;
            let until_ms = self.w.now_ms + u64::from(expire_ms);
            self.local[i][lock] = AtomicLocal::Holding { token, until_ms };
            self.owner[lock] = Some(i);
        }
        Ok(r.status)
    }

    fn unlock(&mut self, i: usize, lock: usize) -> Result<(), TestCaseError> {
        let r = self
            .w
            .send(i, lock, LockOp::UnlockExclusive, 0, Ticket::default());
        expect_status(r.status, &[Status::Success, Status::Fail], "atomic unlock")?;
        // Expired or not, the grant is the holder's to give up until someone takes it over.
        prop_assert_eq!(r.status == Status::Success, self.owner[lock] == Some(i));
        if r.status == Status::Success {
            self.owner[lock] = None;
        }
        self.local[i][lock] = AtomicLocal::Idle;
        Ok(())
    }

    fn extend(&mut self, i: usize, lock: usize, expire_ms: u32) -> Result<(), TestCaseError> {
        let r = self.w.send(
            i,
            lock,
            LockOp::ExtendExclusive,
            expire_ms,
            Ticket::default(),
        );
        expect_status(r.status, &[Status::Success, Status::Fail], "atomic extend")?;
        prop_assert_eq!(r.status == Status::Success, self.owner[lock] == Some(i));
        let AtomicLocal::Holding { token, until_ms } = &mut self.local[i][lock] else {
            unreachable!("only holders extend");
        };
        if r.status == Status::Success {
            prop_assert_eq!(r.aux, *token, "an extend returns the grant's token");
            // Never shortens; 0 only checks the grant is still ours.
            if expire_ms != 0 {
                *until_ms = (*until_ms).max(self.w.now_ms + u64::from(expire_ms));
            }
        } else {
            self.local[i][lock] = AtomicLocal::Idle;
        }
        Ok(())
    }

    fn check(&self) -> Result<(), TestCaseError> {
        let now_ms = self.w.now_ms;
        for lock in 0..LOCKS {
            let believers = (0..CLIENTS)
                .filter(|&j| {
                    matches!(self.local[j][lock], AtomicLocal::Holding { until_ms, .. }
                        if now_ms <= until_ms)
                })
                .count();
            prop_assert!(
                believers <= 1,
                "{} live holders of lock {}",
                believers,
                lock
            );
            let word = AtomicWord::from_bits(self.w.cell(lock).word);
            let owner = self.owner[lock].map_or(0, |j| self.w.clients[j].id.get());
            prop_assert_eq!(word.owner(), owner, "owner of lock {}", lock);
            if let Some(j) = self.owner[lock] {
                let AtomicLocal::Holding { until_ms, .. } = self.local[j][lock] else {
                    return Err(TestCaseError::fail("the named owner thinks it is idle"));
                };
                prop_assert_eq!(word.expiry_ms(), until_ms, "expiry of lock {}", lock);
            }
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// Reader-writer lock

#[derive(Clone, Copy, Debug, PartialEq)]
enum RwLocal {
    Idle,
    Holding(Mode),
}

struct RwSim<'r> {
    w: World<'r>,
    local: [[RwLocal; LOCKS]; CLIENTS],
}

impl<'r> RwSim<'r> {
    fn new(region: &'r mut Region) -> Self {
        Self {
            w: World::new(region, LockKind::Rw),
            local: [[RwLocal::Idle; LOCKS]; CLIENTS],
        }
    }

    /// How many clients hold `lock` in `mode` (RW grants never expire).
    fn holders(&self, lock: usize, mode: Mode) -> usize {
        (0..CLIENTS)
            .filter(|&j| self.local[j][lock] == RwLocal::Holding(mode))
            .count()
    }

    fn step(&mut self, st: Step) -> Result<(), TestCaseError> {
        let dead = self.w.advance(st.dt_ms)?;
        self.bury(&dead)?;
        if !self.w.silent(&st) {
            let (i, lock) = (st.client, st.lock);
            match (st.act, self.local[i][lock]) {
                (_, RwLocal::Idle) => drop(self.try_lock(i, lock, mode(st.exclusive))?),
                (Act::Extend, RwLocal::Holding(mode)) => self.extend(i, lock, mode)?,
                (_, RwLocal::Holding(mode)) => self.unlock(i, lock, mode)?,
            }
        }
        self.check()
    }

    /// Forgets what the dead held, then shows every lock that only the dead held free for the
    /// others.
    fn bury(&mut self, dead: &[bool; CLIENTS]) -> Result<(), TestCaseError> {
        let mut held = [false; LOCKS];
        for i in (0..CLIENTS).filter(|&i| dead[i]) {
            for (lock, held) in held.iter_mut().enumerate() {
                *held |= self.local[i][lock] != RwLocal::Idle;
            }
            self.local[i] = [RwLocal::Idle; LOCKS];
        }
        for lock in (0..LOCKS).filter(|&lock| held[lock]) {
            if self.holders(lock, Mode::Exclusive) + self.holders(lock, Mode::Shared) == 0 {
                // The dead held the only grants: a writer must get in now.
                let j = self
                    .w
                    .idle_client(dead, |j| self.local[j][lock] == RwLocal::Idle);
                let status = self.try_lock(j, lock, Mode::Exclusive)?;
                prop_assert_eq!(status, Status::Success, "lock {} not freed by death", lock);
            }
        }
        Ok(())
    }

    fn try_lock(&mut self, i: usize, lock: usize, mode: Mode) -> Result<Status, TestCaseError> {
        let op = by_mode(mode, LockOp::TryExclusive, LockOp::TryShared);
        let free = match mode {
            Mode::Exclusive => {
                self.holders(lock, Mode::Exclusive) + self.holders(lock, Mode::Shared)
            }
            Mode::Shared => self.holders(lock, Mode::Exclusive),
        } == 0;
        let r = self.w.send(i, lock, op, 0, Ticket::default());
        expect_status(r.status, &[Status::Success, Status::Fail], "rw trylock")?;
        prop_assert_eq!(
            r.status == Status::Success,
            free,
            "{:?} on lock {}",
            op,
            lock
        );
        if r.status == Status::Success {
            self.w.grant_token(lock, &r)?;
            self.local[i][lock] = RwLocal::Holding(mode);
        }
        Ok(r.status)
    }

    fn unlock(&mut self, i: usize, lock: usize, mode: Mode) -> Result<(), TestCaseError> {
        let op = by_mode(mode, LockOp::UnlockExclusive, LockOp::UnlockShared);
        let r = self.w.send(i, lock, op, 0, Ticket::default());
        // Nothing expires or preempts on an RW lock: a holder's unlock always succeeds.
        expect_status(r.status, &[Status::Success], "rw unlock")?;
        self.local[i][lock] = RwLocal::Idle;
        Ok(())
    }

    fn extend(&mut self, i: usize, lock: usize, mode: Mode) -> Result<(), TestCaseError> {
        let op = by_mode(mode, LockOp::ExtendExclusive, LockOp::ExtendShared);
        let before = self.w.cell(lock);
        let r = self.w.send(i, lock, op, 1_000, Ticket::default());
        // RW grants have no expiry to extend (the reference answers EINVAL) and nothing changes.
        expect_status(r.status, &[Status::Einval], "rw extend")?;
        prop_assert_eq!(r.aux, 0);
        prop_assert_eq!(self.w.cell(lock), before);
        Ok(())
    }

    fn check(&self) -> Result<(), TestCaseError> {
        for lock in 0..LOCKS {
            let writers = self.holders(lock, Mode::Exclusive);
            let readers = self.holders(lock, Mode::Shared);
            prop_assert!(writers <= 1, "{} writers on lock {}", writers, lock);
            prop_assert!(
                writers == 0 || readers == 0,
                "writer beside readers on {}",
                lock
            );
            let word = RwWord::from_bits(self.w.cell(lock).word);
            prop_assert_eq!(word.readers() as usize, readers, "readers of lock {}", lock);
            let writer = (0..CLIENTS)
                .find(|&j| self.local[j][lock] == RwLocal::Holding(Mode::Exclusive))
                .map_or(0, |j| self.w.clients[j].id.get());
            prop_assert_eq!(word.owner(), writer, "writer of lock {}", lock);
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// Fair lock

#[derive(Clone, Copy, Debug, PartialEq)]
enum FairLocal {
    Idle,
    Ticketed {
        mode: Mode,
        ticket: Ticket,
    },
    Holding {
        mode: Mode,
        ticket: Ticket,
        token: u64,
        until_ms: u64,
    },
}

/// What became of a ticket.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Fate {
    /// Its holder may still retry with it.
    Waiting,
    Granted,
    /// Its holder unlocked while queued, or died.
    Abandoned,
    /// A preemption by another client voided it (and passed it, if it was earlier): the
    /// server voids every other outstanding ticket (it cannot tell which ones the reference
    /// would keep), so a retry is refused as a passed one (`Fail`: the client starts over) and
    /// an unlock finds nothing to give up (`Fail`).
    Voided,
}

#[derive(Clone, Copy, Debug)]
struct Issued {
    mode: Mode,
    ticket: Ticket,
    fate: Fate,
}

impl Issued {
    /// Whether this ticket was issued before `ticket` in its own mode's queue.
    fn before(&self, ticket: Ticket) -> bool {
        ticket_before(counter(self.mode, self.ticket), counter(self.mode, ticket))
    }

    fn is(&self, mode: Mode, ticket: Ticket) -> bool {
        self.mode == mode && counter(mode, self.ticket) == counter(mode, ticket)
    }
}

/// A ticket's place in the queue of `mode`.
fn counter(mode: Mode, ticket: Ticket) -> u16 {
    match mode {
        Mode::Exclusive => ticket.exclusive,
        Mode::Shared => ticket.shared,
    }
}

struct FairSim<'r> {
    w: World<'r>,
    local: [[FairLocal; LOCKS]; CLIENTS],
    /// Grants that a preemption by another client ended. Their holders are not told; they find
    /// out when their unlock or extend fails.
    ended: [[bool; LOCKS]; CLIENTS],
    /// Every ticket issued on each lock, in order, and what became of it.
    issued: [Vec<Issued>; LOCKS],
    /// `(mx, ms)` as the oracle counts first attempts: the ticket the next one gets.
    next: [Ticket; LOCKS],
}

impl<'r> FairSim<'r> {
    fn new(region: &'r mut Region) -> Self {
        Self {
            w: World::new(region, LockKind::Fair),
            local: [[FairLocal::Idle; LOCKS]; CLIENTS],
            ended: [[false; LOCKS]; CLIENTS],
            issued: [Vec::new(), Vec::new()],
            next: [Ticket::default(); LOCKS],
        }
    }

    fn fate(&mut self, lock: usize, mode: Mode, ticket: Ticket) -> &mut Fate {
        let entry = self.issued[lock].iter_mut().find(|e| e.is(mode, ticket));
        &mut entry.expect("every ticket a client holds was issued").fate
    }

    fn step(&mut self, st: Step) -> Result<(), TestCaseError> {
        let dead = self.w.advance(st.dt_ms)?;
        self.bury(&dead);
        if !self.w.silent(&st) {
            let (i, lock, expire_ms) = (st.client, st.lock, st.expire_ms);
            match (st.act, self.local[i][lock]) {
                (_, FairLocal::Idle) => {
                    self.first(i, lock, mode(st.exclusive), expire_ms.max(1))?
                }
                (Act::Abandon, FairLocal::Ticketed { mode, ticket }) => {
                    self.abandon(i, lock, mode, ticket)?;
                }
                (_, FairLocal::Ticketed { mode, ticket }) => {
                    self.retry(i, lock, mode, ticket, expire_ms.max(1))?;
                }
                (Act::Extend, FairLocal::Holding { .. }) => self.extend(i, lock, expire_ms)?,
                (_, FairLocal::Holding { .. }) => self.unlock(i, lock)?,
            }
        }
        self.check()
    }

    /// Forgets what the dead held. The server released their grants; a ticket one of them held
    /// is simply never retried, as if abandoned. (Fair locks stay queued after a death, so there
    /// is no "free at once" to show.)
    fn bury(&mut self, dead: &[bool; CLIENTS]) {
        for i in (0..CLIENTS).filter(|&i| dead[i]) {
            for lock in 0..LOCKS {
                if let FairLocal::Ticketed { mode, ticket } = self.local[i][lock] {
                    let fate = self.fate(lock, mode, ticket);
                    if *fate == Fate::Waiting {
                        *fate = Fate::Abandoned;
                    }
                }
                self.local[i][lock] = FairLocal::Idle;
                self.ended[i][lock] = false;
            }
        }
    }

    /// A first attempt: granted only when nothing is queued ahead, otherwise a ticket.
    fn first(
        &mut self,
        i: usize,
        lock: usize,
        mode: Mode,
        expire_ms: u32,
    ) -> Result<(), TestCaseError> {
        let op = by_mode(mode, LockOp::TryExclusive, LockOp::TryShared);
        let preemptions = self.w.preemptions();
        let r = self.w.send(i, lock, op, expire_ms, Ticket::default());
        // `Fail` would mean a full queue, which four clients cannot fill.
        expect_status(
            r.status,
            &[Status::Success, Status::Eagain],
            "fair first attempt",
        )?;
        prop_assert_eq!(
            self.w.preemptions(),
            preemptions,
            "a first attempt preempted"
        );
        let ticket = ticket_of(&r);
        prop_assert_eq!(
            ticket,
            self.next[lock],
            "the ticket a first attempt gets is (mx, ms)"
        );
        let next = &mut self.next[lock];
        match mode {
            Mode::Exclusive => next.exclusive = next.exclusive.wrapping_add(1),
            Mode::Shared => next.shared = next.shared.wrapping_add(1),
        }
        let fate = if r.status == Status::Success {
            self.in_turn(lock, mode, ticket)?;
            self.grant(i, lock, mode, ticket, &r, expire_ms)?;
            Fate::Granted
        } else {
            prop_assert_eq!(r.aux, queued_aux(ticket));
            self.local[i][lock] = FairLocal::Ticketed { mode, ticket };
            Fate::Waiting
        };
        self.issued[lock].push(Issued { mode, ticket, fate });
        Ok(())
    }

    /// A retry with a ticket: granted in turn or by preempting, queued, or refused as passed.
    fn retry(
        &mut self,
        i: usize,
        lock: usize,
        mode: Mode,
        ticket: Ticket,
        expire_ms: u32,
    ) -> Result<(), TestCaseError> {
        let op = by_mode(mode, LockOp::TicketExclusive, LockOp::TicketShared);
        let fate = *self.fate(lock, mode, ticket);
        let preemptions = self.w.preemptions();
        let r = self.w.send(i, lock, op, expire_ms, ticket);
        let statuses = [Status::Success, Status::Eagain, Status::Fail];
        expect_status(r.status, &statuses, "fair ticket retry")?;
        // The reply does not say whether a grant preempted; the server's counter does.
        let preempted = self.w.preemptions() != preemptions;
        prop_assert!(!preempted || r.status == Status::Success);
        if fate == Fate::Voided {
            prop_assert_eq!(r.status, Status::Fail, "{:?} {:?} was voided", mode, ticket);
        }
        match r.status {
            Status::Success => {
                prop_assert_eq!(ticket_of(&r), ticket, "the reply carries the ticket served");
                if preempted {
                    self.preempt(i, lock, mode, ticket);
                } else {
                    self.in_turn(lock, mode, ticket)?;
                }
                *self.fate(lock, mode, ticket) = Fate::Granted;
                self.grant(i, lock, mode, ticket, &r, expire_ms)?;
            }
            Status::Eagain => prop_assert_eq!(r.aux, queued_aux(ticket)),
            _ => {
                prop_assert_eq!(
                    fate,
                    Fate::Voided,
                    "{:?} {:?} refused unvoided",
                    mode,
                    ticket
                );
                self.local[i][lock] = FairLocal::Idle;
            }
        }
        Ok(())
    }

    /// Checks that granting `ticket` without a preemption keeps ticket order: every exclusive
    /// ticket before it, and for a writer every shared one too, was granted, abandoned or
    /// passed. (For a first attempt that means nothing was queued at all.)
    fn in_turn(&self, lock: usize, mode: Mode, ticket: Ticket) -> Result<(), TestCaseError> {
        for e in &self.issued[lock] {
            let ahead = e.before(ticket) && (e.mode == Mode::Exclusive || mode == Mode::Exclusive);
            prop_assert!(
                !(ahead && e.fate == Fate::Waiting),
                "{:?} {:?} granted while {:?} waits",
                mode,
                ticket,
                e
            );
        }
        Ok(())
    }

    /// A timeout preemption by client `i` with `ticket`: every other grant on the lock ends, and
    /// every other outstanding ticket is void (see [`Fate::Voided`]).
    fn preempt(&mut self, i: usize, lock: usize, mode: Mode, ticket: Ticket) {
        for j in (0..CLIENTS).filter(|&j| j != i) {
            if matches!(self.local[j][lock], FairLocal::Holding { .. }) {
                self.ended[j][lock] = true;
            }
        }
        for e in &mut self.issued[lock] {
            if e.fate == Fate::Waiting && !(e.mode == mode && e.ticket == ticket) {
                e.fate = Fate::Voided;
            }
        }
    }

    fn grant(
        &mut self,
        i: usize,
        lock: usize,
        mode: Mode,
        ticket: Ticket,
        r: &CommandResult,
        expire_ms: u32,
    ) -> Result<(), TestCaseError> {
        let token = self.w.grant_token(lock, r)?;
        let until_ms = self.w.now_ms + u64::from(expire_ms);
        self.local[i][lock] = FairLocal::Holding {
            mode,
            ticket,
            token,
            until_ms,
        };
        self.ended[i][lock] = false;
        Ok(())
    }

    fn abandon(
        &mut self,
        i: usize,
        lock: usize,
        mode: Mode,
        ticket: Ticket,
    ) -> Result<(), TestCaseError> {
        let op = by_mode(mode, LockOp::UnlockExclusive, LockOp::UnlockShared);
        let r = self.w.send(i, lock, op, 0, ticket);
        let voided = *self.fate(lock, mode, ticket) == Fate::Voided;
        let expected = if voided {
            Status::Fail
        } else {
            Status::Success
        };
        expect_status(r.status, &[expected], "fair unlock while queued")?;
        let fate = self.fate(lock, mode, ticket);
        if *fate == Fate::Waiting {
            *fate = Fate::Abandoned;
        }
        self.local[i][lock] = FairLocal::Idle;
        Ok(())
    }

    fn unlock(&mut self, i: usize, lock: usize) -> Result<(), TestCaseError> {
        let FairLocal::Holding { mode, ticket, .. } = self.local[i][lock] else {
            unreachable!("only holders unlock");
        };
        let op = by_mode(mode, LockOp::UnlockExclusive, LockOp::UnlockShared);
        let r = self.w.send(i, lock, op, 0, ticket);
        expect_status(r.status, &[Status::Success, Status::Fail], "fair unlock")?;
        // Expired or not, a grant no preemption ended is its holder's to give up.
        let ended = self.ended[i][lock];
        prop_assert_eq!(
            r.status == Status::Success,
            !ended,
            "{:?} ended: {}",
            mode,
            ended
        );
        self.local[i][lock] = FairLocal::Idle;
        self.ended[i][lock] = false;
        Ok(())
    }

    fn extend(&mut self, i: usize, lock: usize, expire_ms: u32) -> Result<(), TestCaseError> {
        let FairLocal::Holding {
            mode,
            ticket,
            token,
            until_ms,
        } = self.local[i][lock]
        else {
            unreachable!("only holders extend");
        };
        let op = by_mode(mode, LockOp::ExtendExclusive, LockOp::ExtendShared);
        let r = self.w.send(i, lock, op, expire_ms, ticket);
        expect_status(r.status, &[Status::Success, Status::Fail], "fair extend")?;
        let ended = self.ended[i][lock];
        prop_assert_eq!(
            r.status == Status::Success,
            !ended,
            "{:?} ended: {}",
            mode,
            ended
        );
        if r.status != Status::Success {
            self.local[i][lock] = FairLocal::Idle;
            self.ended[i][lock] = false;
            return Ok(());
        }
        // Readers share one grant's expiry and have no token of their own: the lock's latest.
        prop_assert_eq!(
            r.aux,
            self.w.fence[lock],
            "an extend returns the current token"
        );
        if mode == Mode::Exclusive {
            prop_assert_eq!(r.aux, token, "a writer's extend returns its own token");
        }
        if expire_ms != 0 {
            let until_ms = until_ms.max(self.w.now_ms + u64::from(expire_ms));
            self.local[i][lock] = FairLocal::Holding {
                mode,
                ticket,
                token,
                until_ms,
            };
        }
        Ok(())
    }

    fn check(&self) -> Result<(), TestCaseError> {
        let now_ms = self.w.now_ms;
        for lock in 0..LOCKS {
            // Grants no preemption ended; `live`: and not past their holder's expiry either.
            let holding = |want: Mode, live: bool| {
                (0..CLIENTS).filter(move |&j| {
                    !self.ended[j][lock]
                        && matches!(self.local[j][lock], FairLocal::Holding { mode, until_ms, .. }
                            if mode == want && (!live || now_ms <= until_ms))
                })
            };
            let writers = holding(Mode::Exclusive, true).count();
            let readers = holding(Mode::Shared, true).count();
            prop_assert!(writers <= 1, "{} live writers on lock {}", writers, lock);
            prop_assert!(
                writers == 0 || readers == 0,
                "live writer beside readers on {}",
                lock
            );
            let cell = self.w.cell(lock);
            let word = FairWord::from_bits(cell.word);
            // Expired readers still count until they unlock; readers a preemption voided do not.
            let readers = holding(Mode::Shared, false).count();
            prop_assert_eq!(word.rcnt() as usize, readers, "rcnt of lock {}", lock);
            let writer = holding(Mode::Exclusive, false)
                .next()
                .map_or(0, |j| self.w.clients[j].id.get());
            prop_assert_eq!(cell.ext, writer, "exclusive owner of lock {}", lock);
            let next = Ticket {
                exclusive: word.mx(),
                shared: word.ms(),
            };
            prop_assert_eq!(next, self.next[lock], "next tickets of lock {}", lock);
        }
        Ok(())
    }
}

/// The `aux` of a fair-lock `Eagain`: the ticket, `tx | ts << 16`.
fn queued_aux(t: Ticket) -> u64 {
    u64::from(t.exclusive) | u64::from(t.shared) << 16
}

proptest! {
    // Failures are not persisted (this crate keeps no regression files); a failure prints its
    // shrunk sequence, which replays exactly because the server reads no clock.
    #![proptest_config(ProptestConfig {
        failure_persistence: None,
        ..ProptestConfig::with_cases(CASES)
    })]

    /// Atomic locks: at most one live holder, the word names the last grantee and its expiry,
    /// trylock succeeds exactly when no other grant is live, unlock and extend exactly for the
    /// client the word names, and tokens grow.
    #[test]
    fn atomic_lock_sequences_keep_mutual_exclusion_and_token_order(steps in steps()) {
        let mut region = region(&config());
        let mut sim = AtomicSim::new(&mut region);
        for st in steps {
            sim.step(st)?;
        }
    }

    /// RW locks: one writer or any number of readers, the word's reader count and owner match
    /// the holders, trylocks succeed exactly when the mode is free, and tokens grow.
    #[test]
    fn rw_lock_sequences_keep_writers_and_readers_apart(steps in steps()) {
        let mut region = region(&config());
        let mut sim = RwSim::new(&mut region);
        for st in steps {
            sim.step(st)?;
        }
    }

    /// Fair locks: grants follow ticket order unless they preempt, a preemption ends every
    /// other grant, live grants exclude each other, `rcnt`, the owner and `(mx, ms)` match the
    /// oracle, and tokens grow.
    #[test]
    fn fair_lock_sequences_grant_in_ticket_order(steps in steps()) {
        let mut region = region(&config());
        let mut sim = FairSim::new(&mut region);
        for st in steps {
            sim.step(st)?;
        }
    }
}
