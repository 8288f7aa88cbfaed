//! What simulated clients do: the registration and failover protocol of the transport's
//! `Client`, and a random mix of every lock operation and object command, decided by the real
//! [`LocalLock`] records.
//!
//! [`LocalLock`]: dlock_transport::client::LocalLock

use dlock_core::config::BATCH_MAX;
use dlock_core::manager::value::ValueBlock;
use dlock_core::proto::{
    Batch, Command, ControlHeader, ControlRequest, ControlRequestFrame, DATA_MESSAGE_MAX,
    DataHeader, FLAG_ALL_OR_NOTHING, Held, LockClaim, LockFlags, LockOp, ObjectCommand, ObjectOp,
    PROTO_VERSION, encode_control_request, encode_data_request, finish_value_requests,
    put_value_request,
};
use dlock_core::server::Server;
use dlock_core::{GrantProof, LockKind, Mode, Ticket};
use dlock_transport::client::{Decision, LocalState};

use super::client::{Ctl, FORGED, Item, Out, Pending, Phase, idle_for_trylock, releasable};
use super::manager::stage_value;
use super::{REQUEST_TIMEOUT_MS, World};
use crate::sim::net::Channel;

impl World<'_> {
    /// Client `i` takes its turn.
    pub(super) fn act(&mut self, srv: &mut Server<'_>, i: usize) -> Result<(), String> {
        let now = self.server_now();
        let c = &self.clients[i];
        if c.phase == Phase::Dead {
            if self.dead[i].is_none() && !self.draining && self.rng.below(500) == 0 {
                // A new process takes the crashed one's place (a fresh identity).
                self.clients[i] = super::client::SimClient::new(self.rng.range(1, 6) as usize);
            }
            return Ok(());
        }
        if c.paused_until > self.now {
            return Ok(());
        }
        if let Some(p) = &c.pending {
            let wait = match p.out {
                Out::Data { wait_ms, .. } => u64::from(wait_ms),
                Out::Control(_) => 0,
            };
            if now > p.sent_at + REQUEST_TIMEOUT_MS + wait {
                self.close_link(i);
                return Ok(());
            }
            if c.heartbeat.is_none() && c.connected && self.heartbeat_due(i) {
                self.send_heartbeat(i);
            }
            return Ok(());
        }
        if !c.connected && c.id.is_some() {
            if self.now >= c.notice_at {
                self.send_reinit(i);
            }
            return Ok(());
        }
        match c.phase {
            Phase::Idle if !self.draining && self.rng.below(4) == 0 => {
                let lease_ms = self.rng.range(300, 1_600) as u32;
                let body = ControlRequest::ClientInit {
                    min_version: PROTO_VERSION,
                    lease_ms,
                };
                self.clients[i].phase = Phase::Initing;
                self.send_control(i, 0, body, Ctl::Init);
            }
            Phase::Ready if self.draining => {
                self.clients[i].phase = Phase::Deiniting;
                let id = self.clients[i].id.unwrap_or(0);
                self.send_control(i, id, ControlRequest::ClientDeinit, Ctl::Deinit);
            }
            Phase::Ready => {
                if self.heartbeat_due(i) && self.clients[i].heartbeat.is_none() {
                    self.send_heartbeat(i);
                }
                self.workload(srv, i)?;
            }
            _ => {}
        }
        Ok(())
    }

    fn heartbeat_due(&self, i: usize) -> bool {
        let c = &self.clients[i];
        c.id.is_some() && self.server_now() > c.lease_anchor + u64::from(c.lease_ms) / 3
    }

    fn send_heartbeat(&mut self, i: usize) {
        let id = self.clients[i].id.unwrap_or(0);
        let message_id = self.clients[i].message_id();
        let bytes = control_bytes(id, message_id, ControlRequest::Heartbeat);
        self.clients[i].heartbeat = Some(Pending {
            out: Out::Control(Ctl::Init),
            message_id,
            sent_at: self.server_now(),
        });
        self.ops += 1;
        self.send_to_server(i, Channel::Control, bytes);
    }

    fn send_reinit(&mut self, i: usize) {
        let c = &mut self.clients[i];
        c.phase = Phase::Reiniting;
        let body = ControlRequest::ClientReinit {
            min_version: PROTO_VERSION,
            lease_ms: c.lease_ms,
            session: c.session,
        };
        let id = c.id.unwrap_or(0);
        self.send_control(i, id, body, Ctl::Reinit);
    }

    pub(super) fn send_control(&mut self, i: usize, word: u32, body: ControlRequest<'_>, ctl: Ctl) {
        let message_id = self.clients[i].message_id();
        let bytes = control_bytes(word, message_id, body);
        self.clients[i].pending = Some(Pending {
            out: Out::Control(ctl),
            message_id,
            sent_at: self.server_now(),
        });
        self.ops += 1;
        self.send_to_server(i, Channel::Control, bytes);
    }

    /// Sends the lock and object commands of `items` as one data message.
    pub(super) fn send_data(
        &mut self,
        i: usize,
        items: Vec<Item>,
        commands: &[Command],
        flags: u32,
    ) {
        let c = &mut self.clients[i];
        let message_id = c.message_id();
        let header = DataHeader {
            version: PROTO_VERSION,
            count: 0,
            message_id,
            client: c.id.unwrap_or(0),
            flags,
        };
        let mut buf = vec![0u8; DATA_MESSAGE_MAX];
        let mut n = encode_data_request(&header, commands, &mut buf).expect("encode data request");
        // The blocks exclusive unlocks write ride in the request's value trailer.
        let blocks: Vec<_> = items
            .iter()
            .map(|item| match item {
                Item::Lock { req, .. } => req.value_block(),
                Item::Object { .. } => None,
            })
            .collect();
        if blocks.iter().any(Option::is_some) {
            let count = commands.len();
            for (k, b) in blocks.iter().enumerate() {
                let b = b.unwrap_or(ValueBlock::ZERO);
                put_value_request(&mut buf, count, k, &b, k == 0).expect("value trailer");
            }
            n = finish_value_requests(&mut buf, count).expect("value trailer");
        }
        buf.truncate(n);
        let wait_ms = match commands {
            [Command::Lock(l)] => l.wait_ms,
            _ => 0,
        };
        c.pending = Some(Pending {
            out: Out::Data {
                items,
                wait_ms,
                all_or_nothing: flags & FLAG_ALL_OR_NOTHING != 0,
            },
            message_id,
            sent_at: self.now + self.clock_offset,
        });
        self.ops += commands.len() as u64;
        self.send_to_server(i, Channel::Data, buf);
    }

    /// A registered, idle client does one random thing, after a cached grant it owes back.
    fn workload(&mut self, srv: &mut Server<'_>, i: usize) -> Result<(), String> {
        let owed = self.clients[i].locks.iter().position(|l| {
            l.as_ref()
                .is_some_and(super::client::SimLock::give_back_due)
        });
        if let Some(rec) = owed {
            self.give_back(i, rec);
            return Ok(());
        }
        let r = self.rng.below(1_000);
        let records: Vec<usize> = self.clients[i].live_records().collect();
        if (records.len() < self.clients[i].appetite && r < 150) || records.is_empty() {
            return self.get_locks(i);
        }
        match r {
            0..=2 => {
                // Graceful exit; a new registration follows later. The records stay until the
                // server says it released them: a recovering one refuses (`NotReady`) and keeps
                // them.
                let c = &mut self.clients[i];
                c.phase = Phase::Deiniting;
                let id = c.id.unwrap_or(0);
                self.send_control(i, id, ControlRequest::ClientDeinit, Ctl::Deinit);
            }
            3..=30 => {
                let pick = records[self.rng.index(records.len())];
                if self.clients[i].locks[pick].as_ref().is_some_and(releasable) {
                    let lock = self.clients[i].locks[pick]
                        .as_ref()
                        .map_or(0, |l| l.local.id.raw());
                    let id = self.clients[i].id.unwrap_or(0);
                    self.send_control(
                        i,
                        id,
                        ControlRequest::ReleaseLock { lock },
                        Ctl::Release(pick),
                    );
                }
            }
            31..=160 => self.object_op(i),
            161..=170 if self.plan.retain_ppm > 0 => self.recovery_op(i),
            _ => self.lock_op(srv, i, &records)?,
        }
        Ok(())
    }

    fn get_locks(&mut self, i: usize) -> Result<(), String> {
        let want = if self.rng.below(3) == 0 {
            self.rng.range(2, 4)
        } else {
            1
        };
        let mut names = Vec::new();
        for _ in 0..want {
            let n = self.rng.index(self.oracle.names().len());
            if self.clients[i].record_of(n).is_none() && !names.contains(&n) {
                names.push(n);
            }
        }
        let id = self.clients[i].id.unwrap_or(0);
        match names.as_slice() {
            [] => {}
            [n] => {
                let (name, kind) = self.oracle.names()[*n].clone();
                let body = ControlRequest::GetLock { kind, name: &name };
                self.send_control(i, id, body, Ctl::GetLock(names.clone()));
            }
            _ => {
                let entries: Vec<(LockKind, &[u8])> = names
                    .iter()
                    .map(|&n| {
                        (
                            self.oracle.names()[n].1,
                            self.oracle.names()[n].0.as_slice(),
                        )
                    })
                    .collect();
                let message_id = self.clients[i].message_id();
                let bytes = control_bytes(
                    id,
                    message_id,
                    ControlRequest::BatchGetLock(Batch::from_slice(&entries)),
                );
                self.clients[i].pending = Some(Pending {
                    out: Out::Control(Ctl::GetLock(names)),
                    message_id,
                    sent_at: self.server_now(),
                });
                self.ops += 1;
                self.send_to_server(i, Channel::Control, bytes);
            }
        }
        Ok(())
    }

    fn object_op(&mut self, i: usize) {
        let id = self.clients[i].id.unwrap_or(0);
        if self.clients[i].objects.is_empty() || self.rng.below(20) == 0 {
            let n = self.rng.index(self.object_names.len());
            let name = self.object_names[n].clone();
            let held = self.clients[i].objects.iter().position(|o| o.0 == n);
            if let Some(k) = held {
                let object = self.clients[i].objects[k].1.raw();
                self.send_control(
                    i,
                    id,
                    ControlRequest::ObjectRelease { object },
                    Ctl::Release(usize::MAX - k),
                );
            } else if self.rng.below(2) == 0 {
                let body = ControlRequest::ObjectCreate {
                    name: &name,
                    init: self.rng.below(1 << 20),
                    lease_s: 1,
                };
                self.send_control(i, id, body, Ctl::ObjectCreate(n));
            } else {
                let body = ControlRequest::ObjectGet {
                    name: &name,
                    lease_s: 1,
                };
                self.send_control(i, id, body, Ctl::ObjectGet(n));
            }
            return;
        }
        let count = self.rng.range(1, 3) as usize;
        let mut items = Vec::new();
        let mut commands = Vec::new();
        for _ in 0..count {
            let k = self.rng.index(self.clients[i].objects.len());
            let object = self.clients[i].objects[k].1.raw();
            let last = self.clients[i].last_value[k];
            let (op, a, b) = match self.rng.below(3) {
                0 => (ObjectOp::Faa, self.rng.range(1, 5), 0),
                // Values only move up, so FAA results stay unique.
                1 => (ObjectOp::Cas, last, last + self.rng.range(1, 5)),
                _ => (ObjectOp::Snapshot, 0, 0),
            };
            items.push(Item::Object { obj: k });
            commands.push(Command::Object(ObjectCommand {
                op,
                object,
                a,
                b,
                partition_epoch: 0,
            }));
        }
        self.send_data(i, items, &commands, 0);
    }

    /// One lock operation (or a batch) on the client's records, decided by `LocalLock`.
    fn lock_op(&mut self, srv: &mut Server<'_>, i: usize, records: &[usize]) -> Result<(), String> {
        let _ = srv;
        let now = self.server_now();
        let pick = records[self.rng.index(records.len())];
        let Some(l) = self.clients[i].locks[pick].clone() else {
            return Ok(());
        };
        let expire = self.rng.range(30, 1_500) as u32;
        let mode = if l.local.kind == LockKind::Atomic || self.rng.below(2) == 0 {
            Mode::Exclusive
        } else {
            Mode::Shared
        };
        let r = self.rng.below(100);
        // Batches: several records at once, per item or all-or-nothing.
        if r < 12 && records.len() > 1 {
            let unlock = l.local.state.held_mode().is_some();
            let all_or_nothing = !unlock && self.rng.below(2) == 0;
            let mut items = Vec::new();
            let mut commands = Vec::new();
            for &rec in records.iter().take(BATCH_MAX) {
                let Some(rl) = self.clients[i].locks[rec].as_mut() else {
                    continue;
                };
                let d = if unlock {
                    if rl.local.state.held_mode().is_none() {
                        continue;
                    }
                    rl.local.unlock()
                } else {
                    if !idle_for_trylock(rl) || rl.local.state.held_mode().is_some() {
                        continue;
                    }
                    let m = if rl.local.kind == LockKind::Atomic {
                        Mode::Exclusive
                    } else {
                        mode
                    };
                    rl.local.trylock(m, expire, 0)
                };
                self.ops += 1;
                if let Decision::Send(req) = d {
                    if is_unlock(req.command().op) && rl.local.state.held_mode().is_some() {
                        rl.releasing = true;
                    }
                    items.push(Item::Lock {
                        rec,
                        req,
                        cacheable: false,
                    });
                    commands.push(Command::Lock(req.command()));
                }
            }
            if !commands.is_empty() {
                self.ops -= commands.len() as u64;
                let flags = if all_or_nothing {
                    FLAG_ALL_OR_NOTHING
                } else {
                    0
                };
                self.send_data(i, items, &commands, flags);
            }
            return Ok(());
        }
        if self.clients[i].locks[pick]
            .as_ref()
            .is_some_and(|l| l.cache.cached && !l.releasing)
        {
            return self.cached_op(i, pick, r);
        }
        let cacheable = l.local.kind != LockKind::Fair
            && self.plan.cache_ppm > 0
            && self.rng.chance(self.plan.cache_ppm);
        let retain = self.plan.retain_ppm > 0 && self.rng.chance(self.plan.retain_ppm);
        let l = self.clients[i].locks[pick].as_mut().expect("picked record");
        let d = match (l.releasing, l.local.state) {
            (true, _) => l.local.unlock(),
            (false, LocalState::ExclusiveLocked | LocalState::SharedLocked) => {
                let held = l.local.state.held_mode().unwrap_or(Mode::Exclusive);
                match r {
                    0..=59 => {
                        stage_value(l, &mut self.rng, &mut self.faults);
                        l.local.unlock()
                    }
                    60..=79 => l.local.extend(held, if r == 79 { 0 } else { expire }),
                    _ => l.local.trylock(held, expire, 0),
                }
            }
            (false, LocalState::ExclusiveTicketed | LocalState::SharedTicketed) => {
                let queued = l.local.state.ticket_mode().unwrap_or(Mode::Exclusive);
                match r {
                    0..=14 => l.local.unlock(),
                    15..=49 => l
                        .local
                        .trylock(queued, expire, self.rng.range(5, 600) as u32),
                    _ => l.local.trylock(queued, expire, 0),
                }
            }
            (false, LocalState::Initialized | LocalState::Unlocked) => {
                if r < 45 {
                    l.local.trylock(mode, expire, self.rng.range(5, 800) as u32)
                } else {
                    l.local.trylock(mode, expire, 0)
                }
            }
        };
        self.ops += 1;
        match d {
            Decision::Answer(_) => {
                let name = l.name;
                if l.used_mode().is_some() {
                    self.note_belief(i, name)?;
                }
                let _ = now;
            }
            Decision::Send(req) => {
                if is_unlock(req.command().op) && l.local.state.held_mode().is_some() {
                    l.releasing = true;
                }
                self.ops -= 1;
                let mut c = req.command();
                let cacheable = cacheable && c.op.acquires();
                if cacheable {
                    c.flags = c.flags.union(LockFlags::CACHEABLE);
                }
                if retain && c.op.acquires() {
                    c.flags = c.flags.union(LockFlags::RETAIN);
                }
                self.send_data(
                    i,
                    vec![Item::Lock {
                        rec: pick,
                        req,
                        cacheable,
                    }],
                    &[Command::Lock(c)],
                    0,
                );
            }
        }
        Ok(())
    }

    /// Sends the claims of the records from index `from` on (up to 31), or `ReinitDone` when
    /// none is left.
    pub(super) fn send_claims(&mut self, i: usize, from: usize) {
        let now = self.server_now();
        let c = &mut self.clients[i];
        let id = c.id.unwrap_or(0);
        let mut recs = Vec::new();
        let mut claims = Vec::new();
        for rec in from..c.locks.len() {
            if recs.len() == BATCH_MAX {
                break;
            }
            let Some(l) = &c.locks[rec] else { continue };
            let Some(claim) = l.local.claim(now) else {
                c.locks[rec] = None;
                continue;
            };
            recs.push(rec);
            claims.push(LockClaim {
                value: None,
                kind: l.local.kind,
                held: claim.held,
                name: &self.oracle.names()[l.name].0,
                old_lock: l.local.id.raw(),
                word: l.local.word,
                ticket: claim.ticket,
                remaining_ms: claim.remaining_ms,
                age_ms: claim.age_ms,
                token: claim.token,
                proof: claim.proof,
            });
        }
        if !recs.is_empty()
            && recs.len() < BATCH_MAX
            && self.p.session_key
            && self.rng.below(4) == 0
        {
            // A thief: a client the failed server really registered claims, beside its own,
            // a lock it holds no grant of, with the best proof it has.
            let n = self.rng.index(self.oracle.names().len());
            let c = &self.clients[i];
            // A lock it has no record of, so one the server holds nothing of for it (a claim
            // of what the server holds for it — a grant whose reply was lost, say — is its own,
            // not a theft: seed 0xb771773dfebc31f1).
            if c.record_of(n).is_none() {
                let (name, kind) = &self.oracle.names()[n];
                let own = c
                    .locks
                    .iter()
                    .flatten()
                    .map(|l| l.local.proof)
                    .find(|p| !p.is_none());
                let proof = match self.rng.below(3) {
                    0 => GrantProof::NONE,
                    1 => own.unwrap_or(GrantProof::NONE),
                    _ => GrantProof {
                        epoch: u32::from(self.epoch.saturating_sub(1)),
                        mac: self
                            .rng
                            .next_u64()
                            .to_le_bytes()
                            .repeat(2)
                            .try_into()
                            .unwrap_or([1; 16]),
                    },
                };
                let token =
                    (u64::from(self.epoch.saturating_sub(1)) << 48) + self.rng.range(1, 1_000);
                claims.push(LockClaim {
                    value: None,
                    kind: *kind,
                    held: Held::Exclusive,
                    name,
                    old_lock: 0,
                    word: 0,
                    ticket: Ticket::default(),
                    remaining_ms: 60_000,
                    age_ms: 1,
                    token,
                    proof,
                });
                recs.push(FORGED);
                self.faults.forged_claims += 1;
            }
        }
        let c = &mut self.clients[i];
        if recs.is_empty() {
            c.phase = Phase::Finishing;
            c.reclaim = false;
            self.send_control(i, id, ControlRequest::ReinitDone, Ctl::Done);
            return;
        }
        let message_id = c.message_id();
        let bytes = control_bytes(
            id,
            message_id,
            ControlRequest::BatchUpdateLocks(Batch::from_slice(&claims)),
        );
        c.pending = Some(Pending {
            out: Out::Control(Ctl::Claims(recs)),
            message_id,
            sent_at: now,
        });
        self.ops += 1;
        self.send_to_server(i, Channel::Control, bytes);
    }
}

/// A control request frame.
fn control_bytes(word: u32, message_id: u16, body: ControlRequest<'_>) -> Vec<u8> {
    let frame = ControlRequestFrame {
        header: ControlHeader {
            version: PROTO_VERSION,
            msg: body.msg_type(),
            message_id,
            word,
        },
        body,
    };
    let mut buf = vec![0u8; dlock_core::proto::CONTROL_FRAME_MAX];
    let n = encode_control_request(&frame, &mut buf).expect("encode control request");
    buf.truncate(n);
    buf
}

/// Whether `op` releases a grant or abandons a ticket.
fn is_unlock(op: LockOp) -> bool {
    matches!(op, LockOp::UnlockExclusive | LockOp::UnlockShared)
}
