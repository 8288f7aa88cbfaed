//! How a model client reads a reply, as the transport's `Client` does: what it applies to its
//! records, when its lease counts as renewed, and what it re-claims after a failover.

use dlock_core::proto::{
    BatchEntry, ControlRequest, ControlResponse, Event, LockFlags, LockOp, decode_control_response,
    decode_data_response, decode_event_message,
};
use dlock_core::server::Server;
use dlock_core::{GrantProof, LockId, Mode, Status};
use dlock_transport::client::LocalLock;

use super::World;
use super::client::{Cache, Ctl, FORGED, Item, Out, Pending, Phase, SimLock};
use crate::sim::net::Channel;
use crate::sim::{FaultPlan, Rng};

/// Whether a status says the server no longer knows the client.
pub(super) fn registration_gone(s: Status) -> bool {
    matches!(s, Status::ClientNotInit | Status::ClientRemovedByServer)
}

/// Whether a reply shows the server holds this client's registration, so its lease runs from
/// the request's send. `NotReady` does not: a recovering server answers it to every client,
/// registered or not (seed 0x992060a53de32c8: a client the old server had expired took a
/// recovering server's `NotReady`s as renewals and trusted the grants it had lost).
pub(super) fn renews_lease(s: Status) -> bool {
    !registration_gone(s) && s != Status::NotReady
}

impl World<'_> {
    /// A reply reached client `i`.
    pub(super) fn on_reply(
        &mut self,
        srv: &mut Server<'_>,
        i: usize,
        channel: Channel,
        bytes: &[u8],
    ) -> Result<(), String> {
        match channel {
            Channel::Data => match decode_event_message(bytes) {
                Ok(events) => self.on_events(i, events.events()),
                Err(_) => self.on_data_reply(i, bytes),
            },
            Channel::Control => self.on_control_reply(srv, i, bytes),
        }
    }

    fn on_data_reply(&mut self, i: usize, bytes: &[u8]) -> Result<(), String> {
        let rep =
            decode_data_response(bytes).map_err(|e| format!("client decodes reply: {e:?}"))?;
        let now = self.now + self.clock_offset;
        let from_reply = self.lease_from_reply;
        let c = &mut self.clients[i];
        let matches = matches!(&c.pending, Some(p) if p.message_id == rep.header().message_id
            && matches!(p.out, Out::Data { .. }));
        if !matches {
            // A duplicate or a reply to a request given up on.
            return Ok(());
        }
        let Some(Pending {
            out:
                Out::Data {
                    items,
                    all_or_nothing,
                    ..
                },
            sent_at,
            ..
        }) = c.pending.take()
        else {
            return Ok(());
        };
        // An all-or-nothing message the server undid reports `Eagain` for what had worked:
        // nothing took effect, so nothing is applied (as the transport client does). Reading
        // those `Eagain`s as fair-lock queueing once left records holding ticket 0 that was
        // never issued (seed 0xf14da6f465e231e0), which two clients then re-claimed.
        let undone = all_or_nothing
            && (0..rep.len()).any(|k| rep.result(k).result.status != Status::Success);
        if items.len() != rep.len() {
            return Err(format!(
                "reply has {} results for {} commands",
                rep.len(),
                items.len()
            ));
        }
        let mut gone = false;
        let mut grants = Vec::new();
        for (k, item) in items.iter().enumerate() {
            let r = rep.result(k).result;
            gone |= registration_gone(r.status);
            match *item {
                Item::Lock { .. } if undone => {}
                Item::Lock {
                    rec,
                    req,
                    cacheable,
                } => {
                    let Some(l) = c.locks.get_mut(rec).and_then(Option::as_mut) else {
                        continue;
                    };
                    if l.local.id.raw() != req.command().lock {
                        continue;
                    }
                    let before = l.used_mode();
                    // The grant and its lease are counted from the send: the server's start
                    // no earlier, so the client never trusts a grant longer than the server.
                    let at = if from_reply { now } else { sent_at };
                    let proof = GrantProof {
                        epoch: u32::from(c.epoch),
                        mac: rep.proof_mac(k),
                    };
                    let _ = l.local.apply(&req, &r, proof, rep.value(k), at);
                    if cacheable && r.status == Status::Success && req.command().op.acquires() {
                        // A fresh cached grant, in use by the user that asked; or, made plain
                        // by the server on a contended lock (protocol 8's mark in the result),
                        // a plain grant, whose user's release is the unlock.
                        l.cache = Cache {
                            cached: !r.plain,
                            ..Cache::default()
                        };
                    }
                    if l.local.state.held_mode().is_none() {
                        l.releasing = false;
                        l.cache = Cache::default();
                    } else if req.command().op == LockOp::Downgrade && r.status.is_success() {
                        // The revoke is answered: the grant stays cached, shared.
                        (l.cache.revoked, l.cache.wants_shared, l.cache.ignoring) =
                            (false, false, false);
                        self.faults.downgrades += 1;
                    }
                    if l.used_mode().is_some() && before != l.used_mode()
                        || l.used_mode().is_some() && r.status == Status::Success
                    {
                        grants.push(l.name);
                    }
                }
                Item::Object { obj } => {
                    if let Some(v) = c.last_value.get_mut(obj) {
                        *v = r.aux;
                    }
                }
            }
        }
        if gone {
            c.forget_all();
            return Ok(());
        }
        if (0..rep.len()).any(|k| renews_lease(rep.result(k).result.status)) {
            c.lease_anchor = c.lease_anchor.max(sent_at);
        }
        c.data_anchor = c.data_anchor.max(sent_at);
        for name in grants {
            self.note_belief(i, name)?;
        }
        Ok(())
    }

    /// An event message reached client `i`: each revoke of a grant it caches is recorded
    /// (ignored, as the cache's rules say, when it holds nothing or the revoke was sent for an
    /// earlier grant); an overflow revokes every cached grant.
    fn on_events(&mut self, i: usize, events: impl Iterator<Item = Event>) -> Result<(), String> {
        for e in events {
            let c = &mut self.clients[i];
            let (lock, fence, wanted) = match e {
                // The transport client's rule, and its mutation: an overflow revokes every
                // cached grant.
                Event::Overflow if dlock_core::mutated!(OverflowDropped) => continue,
                Event::Overflow => {
                    c.revoke_all_cached();
                    continue;
                }
                Event::Revoke {
                    lock,
                    fence,
                    wanted,
                } => (lock, fence, wanted),
            };
            let Some(rec) = c.rec_with_id(lock) else {
                continue;
            };
            let Some(l) = c.locks[rec].as_mut() else {
                continue;
            };
            let held = l.local.state.held_mode().is_some();
            if !l.cache.cached || !held || fence < l.local.token.0 {
                continue;
            }
            if l.cache.revoked {
                // An exclusive revoke outranks a shared one: the grant goes back whole.
                l.cache.wants_shared &= wanted == Mode::Shared;
                continue;
            }
            l.cache.revoked = true;
            l.cache.wants_shared = wanted == Mode::Shared;
            if self.plan.revoke_ignore_ppm > 0 && self.rng.chance(self.plan.revoke_ignore_ppm) {
                l.cache.ignoring = true;
                self.faults.revokes_ignored += 1;
            }
        }
        Ok(())
    }

    fn on_control_reply(
        &mut self,
        srv: &mut Server<'_>,
        i: usize,
        bytes: &[u8],
    ) -> Result<(), String> {
        let rep =
            decode_control_response(bytes).map_err(|e| format!("client decodes reply: {e:?}"))?;
        let status = rep.header.status().unwrap_or(Status::BadResponse);
        let server_now = self.server_now();
        let c = &mut self.clients[i];
        if let Some(hb) = &c.heartbeat
            && hb.message_id == rep.header.message_id
        {
            let sent_at = hb.sent_at;
            c.heartbeat = None;
            if registration_gone(status) {
                c.forget_all();
            } else if renews_lease(status) {
                c.lease_anchor = c.lease_anchor.max(sent_at);
            }
            return Ok(());
        }
        let Some(p) = c
            .pending
            .as_ref()
            .filter(|p| p.message_id == rep.header.message_id)
        else {
            return Ok(());
        };
        let Out::Control(ctl) = p.out.clone() else {
            return Ok(());
        };
        let sent_at = p.sent_at;
        c.pending = None;
        if registration_gone(status) && !matches!(ctl, Ctl::Init) {
            c.forget_all();
            return Ok(());
        }
        // Silent longer than its lease when it asked: the old server may have freed its grants.
        let lapsed = sent_at > c.lease_anchor + u64::from(c.lease_ms);
        if !matches!(ctl, Ctl::Init | Ctl::Deinit) && renews_lease(status) {
            c.lease_anchor = c.lease_anchor.max(sent_at);
        }
        match (ctl, rep.body) {
            (Ctl::Init, ControlResponse::Init(r)) => {
                c.id = Some(r.client);
                c.session = r.session;
                c.epoch = r.epoch;
                c.lease_ms = r.lease_ms;
                c.lease_anchor = sent_at;
                c.connected = true;
                c.phase = Phase::Ready;
                self.by_id.insert(r.client, i);
                // Its data channel attaches with the session, as a transport's does.
                if let Some(link) = c.link {
                    self.endpoint
                        .attach(srv, link, r.client, &r.session, server_now);
                }
            }
            (Ctl::Init, _) => c.phase = Phase::Idle,
            (Ctl::Reinit, ControlResponse::Init(r)) => {
                c.connected = true;
                // A server that still knows the client hands its session back; a replacement
                // that took it back in recovery mints a new one (as `Client::reinit` reads it).
                let resumed = c.session == r.session;
                // A server between the last one it re-synced with and this one ran without it.
                let gap = r.epoch > c.epoch.wrapping_add(1);
                c.session = r.session;
                c.epoch = r.epoch;
                c.lease_anchor = sent_at;
                c.lease_ms = r.lease_ms;
                if let Some(link) = c.link {
                    self.endpoint
                        .attach(srv, link, r.client, &r.session, server_now);
                }
                if r.recovering {
                    // A new server: objects are not carried over; locks are re-claimed, unless
                    // the lease lapsed (as the transport client does: seed 0x85ec716077c31d6).
                    c.objects.clear();
                    c.last_value.clear();
                    // A revoked cached grant is not re-claimed: it may have lapsed on the old
                    // server and been granted to another since. The rest are, as plain grants
                    // (a claim does not ask for a cached one), and go back by unlock.
                    for l in c.locks.iter_mut().flatten() {
                        if l.cache.revoked {
                            l.local = LocalLock::new(l.local.id, l.local.kind);
                            l.releasing = false;
                        }
                        l.cache = Cache::default();
                    }
                    // Only a replacement can have lost the grants of a client that lapsed: the
                    // recovering server it resumes with holds what it restored (seed
                    // 0xb799db5439a43212: a client whose reinit to that same server found its
                    // lease lapsed by its own count claimed nothing, and forgot a lock the
                    // server kept for it).
                    // (`ClientLeaseLapse` puts the model's bug back with the transport's.)
                    if lapsed && !resumed && !dlock_core::mutated!(ClientLeaseLapse) {
                        for l in c.locks.iter_mut().flatten() {
                            l.local = LocalLock::new(l.local.id, l.local.kind);
                            l.releasing = false;
                        }
                    }
                    if gap {
                        for l in c.locks.iter_mut().flatten() {
                            l.unfenced = Some(l.local.token.0);
                        }
                    }
                    c.phase = Phase::Claiming;
                    c.reclaim = true;
                    self.send_claims(i, 0);
                } else if c.reclaim {
                    // Its re-claim was cut short (a reply lost) and the server serves now: the
                    // records still carry the failed server's ids, so it re-claims late, as the
                    // transport client does (the server answers with the ids it restored).
                    c.phase = Phase::Claiming;
                    self.send_claims(i, 0);
                } else {
                    c.phase = Phase::Ready;
                    self.note_beliefs(i)?;
                }
            }
            (Ctl::Reinit, _) => {
                // Refused (a wrong session cannot happen here): start over.
                c.forget_all();
            }
            (Ctl::Claims(recs), ControlResponse::Entries(e)) => {
                if e.len() != recs.len() {
                    return Err("claims answered with the wrong count".into());
                }
                let last = recs.iter().rev().find(|&&r| r != FORGED).copied();
                let mut forgotten = Vec::new();
                for (rec, entry) in recs.iter().zip(e.iter()) {
                    if *rec == FORGED {
                        if entry.status == Status::Success {
                            return Err(format!(
                                "client {:?} claimed a lock it has no record of, and the claim \
                                 was taken: a theft, or a lock the server held for a client \
                                 that had forgotten it",
                                c.id
                            ));
                        }
                        continue;
                    }
                    if entry.status != Status::Success
                        && let Some(l) = &c.locks[*rec]
                    {
                        forgotten.push(l.name);
                    }
                    claim_answered(&mut c.locks[*rec], entry);
                }
                // A refused claim makes the client forget the lock: the server must not hold
                // it for this client any more.
                let (id, now) = (c.id.unwrap_or(0), self.server_now());
                for name in forgotten {
                    if [Mode::Exclusive, Mode::Shared]
                        .into_iter()
                        .any(|m| self.oracle.holds(name, id, m, now))
                    {
                        return Err(format!(
                            "client {id:#x}'s claim of lock {name} was refused, so it forgets \
                             the lock, while the server still holds it for the client"
                        ));
                    }
                }
                let next = last.map_or(self.clients[i].locks.len(), |l| l + 1);
                self.send_claims(i, next);
            }
            (Ctl::Claims(_), _) => {
                // The batch was refused whole: try the whole reinit again, over a new link (as
                // `Client::reinit` reconnects first: the runtime closes a control connection
                // that registers twice).
                c.connected = false;
                c.notice_at = self.now;
                if let Some(link) = c.link.take() {
                    self.net.break_link(link);
                }
            }
            (Ctl::Done, _) => {
                // Re-synced: what it re-claimed it believes it holds again.
                c.phase = Phase::Ready;
                self.note_beliefs(i)?;
            }
            (Ctl::Deinit, _) if status == Status::NotReady => {
                // Refused: the server keeps the registration and every lock, and so does the
                // client, which leaves once the server serves.
                c.phase = Phase::Ready;
                self.note_beliefs(i)?;
            }
            (Ctl::Deinit, _) => c.forget_all(),
            (Ctl::GetLock(names), ControlResponse::Lock { lock }) => {
                if let (Some(&n), Some(id)) = (names.first(), LockId::from_raw(lock)) {
                    let kind = self.oracle.names()[n].1;
                    let local = asking(LocalLock::new(id, kind), &mut self.rng, &self.plan);
                    c.locks.push(Some(SimLock::new(n, local)));
                }
            }
            (Ctl::GetLock(names), ControlResponse::Entries(e)) => {
                for (n, entry) in names.iter().zip(e.iter()) {
                    if let (Status::Success, Some(id)) = (entry.status, LockId::from_raw(entry.id))
                    {
                        let kind = self.oracle.names()[*n].1;
                        let local = asking(LocalLock::new(id, kind), &mut self.rng, &self.plan);
                        c.locks.push(Some(SimLock::new(*n, local)));
                    }
                }
            }
            (Ctl::GetLock(_), _) => {}
            (Ctl::Release(k), _) if k > usize::MAX / 2 => {
                let k = usize::MAX - k;
                if k < c.objects.len() {
                    c.objects.remove(k);
                    c.last_value.remove(k);
                }
            }
            (Ctl::Release(rec), _) => {
                if status == Status::Success {
                    c.locks[rec] = None;
                }
            }
            (Ctl::ObjectCreate(_), _) => {}
            (Ctl::ObjectGet(n), ControlResponse::ObjectRef { object, .. }) => {
                if let Some(id) = dlock_core::ObjectId::from_raw(object)
                    && !c.objects.iter().any(|o| o.0 == n)
                {
                    c.objects.push((n, id));
                    c.last_value.push(0);
                }
            }
            (Ctl::ObjectGet(_), _) => {}
            (Ctl::ListRetained, ControlResponse::Retained(page)) => {
                if let Some(e) = page.entries.iter().next() {
                    let id = c.id.unwrap_or(0);
                    let body = ControlRequest::RecoveryDone { dead: e.client };
                    self.send_control(i, id, body, Ctl::RecoveryDone(e.client));
                }
            }
            (Ctl::ListRetained, _) => {}
            (Ctl::RecoveryDone(_), _) => {
                if status == Status::Success {
                    self.faults.recoveries_done += 1;
                }
            }
        }
        Ok(())
    }
}

/// Files a claim's answer: the new id on success, else the record is gone (the grant is lost,
/// as `Client::update_all_locks` forgets it).
fn claim_answered(slot: &mut Option<SimLock>, entry: BatchEntry) {
    match (entry.status, LockId::from_raw(entry.id), slot.as_mut()) {
        (Status::Success, Some(id), Some(l)) => l.local.id = id,
        _ => *slot = None,
    }
}

/// A new lock record, asking for value blocks as the seed's plan says.
fn asking(mut local: LocalLock, rng: &mut Rng, plan: &FaultPlan) -> LocalLock {
    if plan.value_ppm > 0 && rng.chance(plan.value_ppm) {
        local.ask = LockFlags::VALUE_BLOCK;
    }
    local
}
