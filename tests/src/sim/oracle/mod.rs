//! The oracle both simulators share: what must hold after every step, checked against an
//! independent model built from what the server answered (the request and reply bytes, as they
//! cross the network), from what the clients believe ([`beliefs`]), and from the server's own
//! tables ([`Server::check_invariants`]).
//!
//! * **Grants** (server side): a grant, an extend that revives a grant, or a claim a recovering
//!   server accepts is never given while another client holds a conflicting grant that has not
//!   run out by the server's clock (exclusive against anything, a writer beside readers). A
//!   grant lasts until its unlock, its expiry (atomic and fair: `now + expire_ms`, lengthened by
//!   extends), or its client's removal (death, deinit, eviction).
//! * **Claims**: the first claim a recovering server accepts keeps the lock; a later one that
//!   conflicts with it is a violation. A claim refused must not leave the server holding the
//!   lock for its client (who forgets it).
//! * **Fencing tokens** strictly increase per lock name, across server replacements.
//! * **Fair order**: exclusive grants of a fair lock go to tickets in increasing ticket order.
//! * **Objects** are linearizable: the server executes object commands one at a time, so each
//!   result must be exactly what a sequential register gives in that order (FAA returns the
//!   value before and adds, CAS returns the value seen and swaps only on a match); FAA results
//!   never repeat (the simulated clients only ever move values up).
//! * **Beliefs** (client side, [`beliefs`]): no two clients that trust their lease believe they
//!   hold a lock in conflicting modes, and none believes it holds a lock under a fencing token
//!   older than one another believer already held it under.
//! * **Tables**: the server's tables agree with one another after every step.
//!
//! [`Server::check_invariants`]: dlock_core::server::Server::check_invariants

pub mod beliefs;
pub mod values;

use std::collections::{HashMap, HashSet};

use dlock_core::manager::retain::Role;
use dlock_core::manager::value::{ValueBlock, ValueRead};
use dlock_core::proto::{
    Command, CommandResult, ControlRequest, ControlResponse, LockCommand, LockOp, ObjectCommand,
    ObjectOp, decode_control_request, decode_control_response, decode_data_request,
    decode_data_response,
};
use dlock_core::proto::{Held, LockFlags};
use dlock_core::server::{Routing, Server, WaitReply};
use dlock_core::word::fair::{FairWord, ticket_before};
use dlock_core::{LockKind, Mode, Status};

/// A grant the server gave, as the oracle tracks it.
#[derive(Clone, Copy, Debug)]
struct Holder {
    /// The server's client id.
    client: u32,
    mode: Mode,
    /// Last server tick at which the grant is still held (`u64::MAX`: until released).
    until: u64,
    /// Last server tick at which a cached grant whose revoke its holder ignores is still held:
    /// the server lapses it at the revoke timeout (`u64::MAX`: not revoked).
    lapses: u64,
    /// The grant asked to be retained on its holder's death (`LockFlags::RETAIN`).
    retain: bool,
    /// Its holder died and the server retains it: held until a recoverer's `recovery_done`.
    retained: bool,
}

impl Holder {
    /// Whether the grant is still held at `now`.
    fn live(&self, now: u64) -> bool {
        self.until.min(self.lapses) >= now
    }
}

/// The independent model.
#[derive(Debug, Default)]
pub struct Oracle {
    /// Lock names, and the index of each.
    names: Vec<(Vec<u8>, LockKind)>,
    name_index: HashMap<Vec<u8>, usize>,
    /// Grants per lock name.
    holders: Vec<Vec<Holder>>,
    /// The highest fencing token granted per lock name, over every incarnation.
    max_token: Vec<u64>,
    /// Lock ids of this server incarnation and the names they stand for.
    ids: HashMap<u32, usize>,
    /// The last exclusive ticket granted per fair lock id, this incarnation.
    fair_last: HashMap<u32, u16>,
    /// The value of each object id, this incarnation, once first seen.
    objects: HashMap<u32, u64>,
    /// FAA results seen per object id.
    faa_seen: HashMap<u32, HashSet<u64>>,
    /// The rules about what clients believe.
    pub beliefs: beliefs::Beliefs,
    /// The lock value blocks.
    pub values: values::Values,
    /// Checks made (grants, claims and object results compared against the model, and table
    /// checks).
    pub checks: u64,
    /// Downgrades the server answered with success (a simulator that cannot see its clients'
    /// records counts them here).
    pub downgrades: u64,
    /// Value blocks written by exclusive unlocks and downgrades the server answered with
    /// success.
    pub values_written: u64,
    /// Prints every lock result (`DLOCK_SIM_TRACE=1`), to read a replayed failure.
    pub trace: bool,
}

impl Oracle {
    /// An oracle for the lock `names` (name, kind) the clients use.
    pub fn new(names: Vec<(Vec<u8>, LockKind)>) -> Self {
        let name_index = names
            .iter()
            .enumerate()
            .map(|(i, (n, _))| (n.clone(), i))
            .collect();
        Oracle {
            holders: vec![Vec::new(); names.len()],
            max_token: vec![0; names.len()],
            beliefs: beliefs::Beliefs::new(names.len()),
            values: values::Values::new(names.len()),
            name_index,
            names,
            trace: std::env::var_os("DLOCK_SIM_TRACE").is_some(),
            ..Oracle::default()
        }
    }

    /// The lock names (name, kind), by index.
    pub fn names(&self) -> &[(Vec<u8>, LockKind)] {
        &self.names
    }

    /// The name a lock id of this server incarnation stands for, if the server gave it out.
    pub fn name_of_id(&self, raw: u32) -> Option<usize> {
        self.ids.get(&raw).copied()
    }

    /// The index of lock name `name`.
    pub fn name_index(&self, name: &[u8]) -> Option<usize> {
        self.name_index.get(name).copied()
    }

    /// The server's tables agree, and the routing the runtime keeps through it (checked after
    /// every step that reached the server).
    pub fn tables(&mut self, srv: &Server<'_>, routing: &Routing<'_>) -> Result<(), String> {
        self.checks += 1;
        srv.check_invariants()
            .and_then(|()| srv.check_routing(routing))
            .map_err(|v| format!("server tables: {v}"))
    }

    /// A new server took over: it knows nothing of earlier grants until they are re-claimed,
    /// numbers locks and objects afresh, and keeps no object value.
    pub fn new_incarnation(&mut self) {
        self.holders.iter_mut().for_each(Vec::clear);
        self.ids.clear();
        self.values.new_incarnation();
        self.fair_last.clear();
        self.objects.clear();
        self.faa_seen.clear();
    }

    /// The server gave lock id `raw` to name `name` (restoring it from a claim if `claimed`).
    fn name_lock(&mut self, raw: u32, name: usize, claimed: bool) {
        self.ids.insert(raw, name);
        self.values.named(name, raw, claimed);
    }

    /// Forgets the grants of clients the server no longer has (`registered` says who) at
    /// `now`: an exclusive grant lost so leaves its lock's value block invalid.
    pub fn forget_gone(&mut self, now: u64, registered: impl Fn(u32) -> bool) {
        let trace = self.trace;
        for (name, hs) in self.holders.iter_mut().enumerate() {
            let mut lost = None;
            hs.retain_mut(|h| {
                if h.retained || registered(h.client) {
                    return true;
                }
                if h.mode == Mode::Exclusive {
                    lost = Some(lost.unwrap_or(true) && h.live(now));
                }
                // A grant that asked to be retained outlives its dead holder, whatever its
                // lease said (the server keeps it out of the word's reach) — if it still ran.
                let retained = h.retain && h.live(now);
                if trace {
                    let end = if retained { "is retained" } else { "ends" };
                    eprintln!(
                        "client {:#x} gone: its {:?} grant of lock {name} {end}",
                        h.client, h.mode
                    );
                }
                if retained {
                    (h.retained, h.until, h.lapses) = (true, u64::MAX, u64::MAX);
                }
                retained
            });
            if let Some(running) = lost {
                self.values.lost(name, running);
            }
        }
    }

    /// Grants of the clients, per lock name, still held at `now` (for the final check).
    pub fn held_names(&self, now: u64) -> Vec<usize> {
        (0..self.holders.len())
            .filter(|&n| self.holders[n].iter().any(|h| h.live(now)))
            .collect()
    }

    /// Whether server client `client` holds a grant on `name` in `mode` at `now`.
    pub fn holds(&self, name: usize, client: u32, mode: Mode, now: u64) -> bool {
        self.holders[name]
            .iter()
            .any(|h| h.client == client && h.mode == mode && h.live(now))
    }

    /// The server revoked client `client`'s cached grant of lock id `raw`: if the client
    /// ignores it, the grant lapses after tick `held_until` (a cached holder is a holder until
    /// it gives the grant back or its revoke lapses, like a lease).
    pub fn revoked(&mut self, client: u32, raw: u32, held_until: u64) {
        let Some(&name) = self.ids.get(&raw) else {
            return;
        };
        if self.trace {
            eprintln!(
                "client {client:#x} asked to give lock {name} back; lapses after {held_until}"
            );
        }
        for h in self.holders[name].iter_mut().filter(|h| h.client == client) {
            h.lapses = h.lapses.min(held_until);
        }
    }

    /// A conflicting live grant of another client on `name`, if any.
    fn conflict(&self, name: usize, client: u32, mode: Mode, now: u64) -> Option<Holder> {
        self.holders[name].iter().copied().find(|h| {
            h.client != client
                && h.live(now)
                && (mode == Mode::Exclusive || h.mode == Mode::Exclusive)
        })
    }

    fn add(&mut self, name: usize, h: Holder) {
        let hs = &mut self.holders[name];
        hs.retain(|o| o.client != h.client);
        hs.push(h);
    }

    /// The server answered control request `req` with `reply` at its tick `now`; `registered`
    /// says who it still knows. Returns the reply's status.
    pub fn control(
        &mut self,
        req: &[u8],
        reply: &[u8],
        (now, role): (u64, Role),
        registered: impl Fn(u32) -> bool,
    ) -> Result<Option<Status>, String> {
        let req = decode_control_request(req).map_err(|e| format!("own request: {e:?}"))?;
        let rep = decode_control_response(reply).map_err(|e| format!("server reply: {e:?}"))?;
        let client = req.header.word;
        let status = rep.header.status();
        match (req.body, rep.body) {
            (ControlRequest::RecoveryDone { dead }, _) if status == Some(Status::Success) => {
                self.checks += 1;
                if role != Role::Recoverer {
                    return Err(format!(
                        "client {client:#x}, no recoverer, had recovery_done({dead:#x}) accepted"
                    ));
                }
                // The dead client's retained grants end: now a new holder may take them.
                for hs in &mut self.holders {
                    hs.retain(|h| h.client != dead);
                }
            }
            (ControlRequest::ClientDeinit, _) if status == Some(Status::Success) => {
                // A graceful exit releases everything, retained or not.
                for hs in &mut self.holders {
                    hs.retain(|h| h.client != client);
                }
                self.forget_gone(now, registered);
            }
            (ControlRequest::GetLock { name, .. }, ControlResponse::Lock { lock }) => {
                if let Some(n) = self.name_index(name) {
                    self.name_lock(lock, n, false);
                }
            }
            (ControlRequest::BatchGetLock(b), ControlResponse::Entries(e)) => {
                for (i, entry) in e.iter().enumerate() {
                    if entry.status == Status::Success
                        && let Some((_, name)) = b.get(i)
                        && let Some(n) = self.name_index(name)
                    {
                        self.name_lock(entry.id, n, false);
                    }
                }
            }
            (ControlRequest::BatchUpdateLocks(claims), ControlResponse::Entries(e)) => {
                for (claim, entry) in claims.iter().zip(e.iter()) {
                    let Some(name) = self.name_index(claim.name) else {
                        continue;
                    };
                    if self.trace {
                        eprintln!(
                            "tick {now}: client {client:#x} claims {:?} {:?} of lock {name} token {:#x}: {}",
                            claim.kind, claim.held, claim.token, entry.status
                        );
                    }
                    if entry.status != Status::Success {
                        continue;
                    }
                    self.name_lock(entry.id, name, true);
                    let mode = claimed_mode(claim.held);
                    if mode.is_some()
                        && let Some(offered) = &claim.value
                    {
                        self.values.reclaim(name, offered);
                    }
                    self.claim_accepted(now, client, name, claim.kind, mode, claim.remaining_ms)?;
                }
            }
            (
                ControlRequest::ClientDeinit
                | ControlRequest::ClientInit { .. }
                | ControlRequest::ClientReinit { .. },
                _,
            ) => self.forget_gone(now, registered),
            _ => {}
        }
        Ok(status)
    }

    /// A recoverer released dead client `dead`'s retained grants outside the wire (the
    /// simulator's operator, once traffic stopped).
    pub fn recovered(&mut self, dead: u32) {
        for hs in &mut self.holders {
            hs.retain(|h| h.client != dead);
        }
    }

    /// The server answered data message `req` with `reply` at its tick `now`.
    pub fn data(&mut self, req: &[u8], reply: &[u8], now: u64) -> Result<(), String> {
        let req = decode_data_request(req).map_err(|e| format!("own request: {e:?}"))?;
        let rep = decode_data_response(reply).map_err(|e| format!("server reply: {e:?}"))?;
        let client = req.header().client;
        for (i, c) in req.commands().enumerate() {
            let r = rep.result(i).result;
            match c {
                Command::Lock(l) => {
                    // A command writes the block its trailer entry holds only when flagged.
                    let writes = l.flags.contains(LockFlags::VALUE_BLOCK);
                    let blocks = (req.value_block(i).filter(|_| writes), rep.value(i));
                    self.lock_result(now, client, &l, &r, blocks)?;
                }
                Command::Object(o) => self.object_result(&o, &r)?,
                // Joins belong to multiplexing clients; the simulators send none.
                Command::Join(_) => return Err("a join reached the state machine".into()),
            }
        }
        Ok(())
    }

    /// The server decided parked request `w` at its tick `now`. Parked replies decided in one
    /// turn must come in grant (token) order.
    pub fn parked(&mut self, w: &WaitReply, now: u64) -> Result<(), String> {
        self.lock_result(now, w.client, &w.command, &w.result, (None, w.value))
    }

    /// The server answered lock command `c` of client `client` with `r` at server tick `now`;
    /// `(written, read)` are the value block the command wrote and the one its reply read.
    fn lock_result(
        &mut self,
        now: u64,
        client: u32,
        c: &LockCommand,
        r: &CommandResult,
        (written, read): (Option<ValueBlock>, Option<ValueRead>),
    ) -> Result<(), String> {
        if self.trace {
            eprintln!(
                "tick {now}: client {client:#x} {:?} {:?} lock {:#x} (name {:?}) expire {} wait {} ticket {:?} -> {} aux {:#x}",
                c.kind,
                c.op,
                c.lock,
                self.ids.get(&c.lock),
                c.expire_ms,
                c.wait_ms,
                c.ticket,
                r.status,
                r.aux
            );
        }
        let Some(&name) = self.ids.get(&c.lock) else {
            // A lock id this incarnation never gave out can only be refused.
            return match r.status {
                Status::Success => Err(format!("lock {:#x} unknown to the oracle granted", c.lock)),
                _ => Ok(()),
            };
        };
        if !matches!(r.status, Status::Success | Status::Done) {
            return Ok(());
        }
        let mode = c.op.mode();
        let until = |expire: u32| match c.kind {
            LockKind::Rw => u64::MAX,
            LockKind::Atomic | LockKind::Fair => now + u64::from(expire),
        };
        match c.op {
            LockOp::TryExclusive
            | LockOp::TryShared
            | LockOp::TicketExclusive
            | LockOp::TicketShared => {
                self.checks += 1;
                if let Some(h) = self.conflict(name, client, mode, now) {
                    return Err(format!(
                        "lock {name} granted {mode:?} to client {client:#x} at {now} while client {:#x} holds it {:?} until {}",
                        h.client, h.mode, h.until
                    ));
                }
                if r.aux <= self.max_token[name] {
                    return Err(format!(
                        "lock {name}: token {:#x} granted to client {client:#x} is not above {:#x}",
                        r.aux, self.max_token[name]
                    ));
                }
                self.max_token[name] = r.aux;
                // An exclusive grant of another client the model saw run out is taken over: the
                // server invalidates the block if its holder is still in the word.
                if self.holders[name]
                    .iter()
                    .any(|h| h.client != client && h.mode == Mode::Exclusive && !h.live(now))
                {
                    self.values.lost(name, false);
                }
                if let Some(v) = read {
                    self.values.read(name, &v, client, now)?;
                }
                if c.kind == LockKind::Fair && mode == Mode::Exclusive {
                    let tx = FairWord::from_bits(r.word).mx();
                    if let Some(&last) = self.fair_last.get(&c.lock)
                        && !ticket_before(last, tx)
                    {
                        return Err(format!(
                            "fair lock {name}: exclusive ticket {tx} granted after ticket {last}"
                        ));
                    }
                    self.fair_last.insert(c.lock, tx);
                }
                self.add(
                    name,
                    Holder {
                        client,
                        mode,
                        until: until(c.expire_ms),
                        lapses: u64::MAX,
                        retain: c.flags.contains(LockFlags::RETAIN),
                        retained: false,
                    },
                );
            }
            LockOp::ExtendExclusive | LockOp::ExtendShared => {
                self.checks += 1;
                // An owner may extend an atomic grant that expired if nobody took it since:
                // the grant is alive again, which must conflict with nothing.
                if let Some(h) = self.conflict(name, client, mode, now) {
                    return Err(format!(
                        "lock {name} extended {mode:?} for client {client:#x} at {now} while client {:#x} holds it {:?} until {}",
                        h.client, h.mode, h.until
                    ));
                }
                let (old, lapses, retain) = self.holders[name]
                    .iter()
                    .find(|h| h.client == client)
                    .map_or((0, u64::MAX, false), |h| (h.until, h.lapses, h.retain));
                let new = if c.expire_ms == 0 {
                    old
                } else {
                    old.max(until(c.expire_ms))
                };
                // An extend does not answer a revoke: the grant lapses as before.
                self.add(
                    name,
                    Holder {
                        client,
                        mode,
                        until: new,
                        lapses,
                        retain,
                        retained: false,
                    },
                );
            }
            LockOp::UnlockExclusive | LockOp::UnlockShared => {
                if c.op == LockOp::UnlockExclusive {
                    self.values_written += u64::from(written.is_some());
                    self.values.released(name, written);
                }
                self.holders[name].retain(|h| h.client != client);
            }
            // The exclusive holder stays, as a reader (RW grants never lapse; a revoke
            // outstanding still may, which a later grant would show).
            LockOp::Downgrade => {
                self.downgrades += 1;
                self.values_written += u64::from(written.is_some());
                self.values.released(name, written);
                let (lapses, retain) = self.holders[name]
                    .iter()
                    .find(|h| h.client == client)
                    .map_or((u64::MAX, false), |h| (h.lapses, h.retain));
                self.add(
                    name,
                    Holder {
                        client,
                        mode: Mode::Shared,
                        until: u64::MAX,
                        lapses,
                        retain,
                        retained: false,
                    },
                );
            }
        }
        Ok(())
    }

    /// A recovering server accepted client `client`'s claim of `name` in `mode` with
    /// `remaining_ms` left (`None`: a reference or a ticket, not a grant).
    fn claim_accepted(
        &mut self,
        now: u64,
        client: u32,
        name: usize,
        kind: LockKind,
        mode: Option<Mode>,
        remaining_ms: u32,
    ) -> Result<(), String> {
        if self.trace {
            eprintln!(
                "tick {now}: client {client:#x} claim of lock {name} ({kind:?}) {mode:?} accepted, {remaining_ms} ms left"
            );
        }
        let Some(mode) = mode else {
            return Ok(());
        };
        self.checks += 1;
        // A repeated claim (its batch re-sent after a lost reply) merges nothing twice: the
        // server answers with the id and keeps the grant as the first claim left it, expiry
        // included (seed 0xb771772df2f03200: the repeat, counted from its own later arrival,
        // stretched the model's grant past the server's).
        if self.holders[name]
            .iter()
            .any(|h| h.client == client && h.mode == mode)
        {
            return Ok(());
        }
        // The first claim accepted keeps the lock: a later one that conflicts with a live
        // grant displaced a claim already answered `Success` (`recovery.rs`).
        if let Some(h) = self.conflict(name, client, mode, now) {
            return Err(format!(
                "lock {name}: a {mode:?} claim of client {client:#x} accepted at {now} while client {:#x} holds it {:?} until {}",
                h.client, h.mode, h.until
            ));
        }
        let until = match kind {
            LockKind::Rw => u64::MAX,
            _ => now + u64::from(remaining_ms),
        };
        self.add(
            name,
            Holder {
                client,
                mode,
                until,
                lapses: u64::MAX,
                retain: false,
                retained: false,
            },
        );
        Ok(())
    }

    /// The server answered object command `o` with `r`.
    fn object_result(&mut self, o: &ObjectCommand, r: &CommandResult) -> Result<(), String> {
        if !matches!(r.status, Status::Success | Status::ObjectCasFailed) {
            return Ok(());
        }
        self.checks += 1;
        let seen = r.aux;
        let model = *self.objects.entry(o.object).or_insert(seen);
        if seen != model {
            return Err(format!(
                "object {:#x}: {:?} saw {seen}, a sequential register holds {model}",
                o.object, o.op
            ));
        }
        let next = match (o.op, r.status) {
            (ObjectOp::Faa, _) => {
                if !self.faa_seen.entry(o.object).or_default().insert(seen) {
                    return Err(format!("object {:#x}: FAA returned {seen} twice", o.object));
                }
                model.wrapping_add(o.a)
            }
            (ObjectOp::Cas, Status::Success) if model == o.a => o.b,
            (ObjectOp::Cas, Status::ObjectCasFailed) if model != o.a => model,
            (ObjectOp::Cas, s) => {
                return Err(format!(
                    "object {:#x}: CAS expecting {} answered {s} with value {model}",
                    o.object, o.a
                ));
            }
            (ObjectOp::Snapshot, _) => model,
        };
        self.objects.insert(o.object, next);
        Ok(())
    }
}

/// What a claim asks to keep: the mode for a grant, `None` for a reference or a ticket.
pub fn claimed_mode(held: Held) -> Option<Mode> {
    match held {
        Held::Exclusive => Some(Mode::Exclusive),
        Held::Shared => Some(Mode::Shared),
        Held::Reference | Held::Ticketed(_) => None,
    }
}
