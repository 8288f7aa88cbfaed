//! After a partition changed owner: the client re-claims at the new owner every lock it knows
//! in that partition — each grant or ticket with the proof the old owner gave it, references
//! alone otherwise — in batches of at most 31 (`BatchUpdateLocks`), then says
//! `ReclaimDone(partition, epoch)` (`CLUSTER-SPEC` §5).
//!
//! | answer to a claim          | the link's record                                        |
//! |----------------------------|----------------------------------------------------------|
//! | `Success`                  | filed under the new owner's id, epoch and incarnation    |
//! | `Fail`                     | the grant is gone: forgotten; the reference taken again at next use |
//! | any other status           | kept as it was (claimed again at the next use or refresh) |
//! | no answer (a lost reply)   | kept as it was                                           |
//!
//! A client that was silent past the old owner's lease claims nothing but its references: the
//! old owner may have freed its grants before it died (the lease-lapse rule of
//! `Client::reinit`). The same owner at a new epoch (a renewal of its token counter) needs no
//! re-claim: its ids stay valid.

use std::io;
use std::time::Instant;

use dlock_core::Status;
use dlock_core::cluster::ServerId;
use dlock_core::proto::{
    Batch, BatchEntry, CONTROL_FRAME_MAX, ControlRequest, ControlResponse, LockClaim,
    decode_control_response,
};

use super::{ClusterLink, Dial, garbage};
use crate::client::LocalLock;

/// Claims per `BatchUpdateLocks` (the batch limit).
const CLAIMS_MAX: usize = dlock_core::config::BATCH_MAX;

impl<D: Dial> ClusterLink<D> {
    /// Refreshes the map (from `first`, then the others) and, if it changed, re-claims every
    /// partition that moved. Whether the map changed.
    pub(super) fn follow_map(&mut self, first: Option<ServerId>, deadline: Instant) -> bool {
        let before = self.map.clone();
        let changed = self.refresh(first, deadline);
        if changed {
            self.rehome(deadline);
            self.done_without_records(&before, deadline);
        }
        changed
    }

    /// Says `ReclaimDone` to the new owner of every partition that moved away from a server
    /// the client is registered with, and in which it knows no lock (those with locks said it
    /// after their re-claims, in `rehome`). The old owner persisted the client's id, so the
    /// new owner waits for this client's word in *every* partition it took from that owner
    /// before it serves: without it, one client that never used a partition held the
    /// partition in `NotReady` until the grace deadline (the longest grant lease, 30 s by
    /// default), after every failover and every planned move.
    fn done_without_records(&mut self, before: &dlock_core::cluster::Map, deadline: Instant) {
        for p in 0..self.map.partitions().get() {
            let (old, new) = match (before.owner(p), self.map.owner(p)) {
                (Some(old), Some(new)) => (*old, *new),
                _ => continue,
            };
            let (Some(old_server), Some(new_server)) = (old.server, new.server) else {
                continue;
            };
            let moved = old_server != new_server
                || before.server(old_server).map(|e| e.incarnation())
                    != self.map.server(new_server).map(|e| e.incarnation());
            if !moved
                || !self.members.contains_key(&old_server)
                || !self.routes.in_partition(p).is_empty()
            {
                continue;
            }
            if let Err(e) = self.say_done(p, new_server, new.epoch, deadline) {
                tracing::debug!(partition = p, %new_server, error = %e, "dlock: ReclaimDone not sent");
            }
        }
    }

    /// Re-claims every partition the client knows locks in whose owner changed in the map.
    pub(super) fn rehome(&mut self, deadline: Instant) {
        for p in self.routes.partitions() {
            self.rehome_partition(p, deadline);
        }
    }

    /// Brings the routes of partition `p` to the map's owner of it: a new epoch of the same
    /// owner is only noted; a new owner gets the partition's re-claims. Failures are logged
    /// and leave the routes as they were, to be re-claimed at the next use.
    pub(super) fn rehome_partition(&mut self, p: u16, deadline: Instant) {
        let owner = self.map.owner(p).copied().unwrap_or_default();
        let Some(server) = owner.server else {
            return;
        };
        let incarnation = self.map.server(server).map_or(0, |e| e.incarnation());
        let ids = self.routes.in_partition(p);
        let mut stale = Vec::new();
        for &id in &ids {
            let Some(r) = self.routes.get_mut(id) else {
                continue;
            };
            if (r.server, r.incarnation) == (server, incarnation) {
                r.epoch = owner.epoch;
            } else {
                stale.push(id);
            }
        }
        if stale.is_empty() {
            return;
        }
        if let Err(e) = self.reclaim(p, server, incarnation, owner.epoch, &stale, deadline) {
            tracing::warn!(partition = p, %server, error = %e, "dlock: re-claims not done; kept for the next try");
        }
    }

    /// Re-claims the locks `ids` of partition `p` at `server`, which owns it at `epoch`.
    fn reclaim(
        &mut self,
        p: u16,
        server: ServerId,
        incarnation: u64,
        epoch: u32,
        ids: &[u32],
        deadline: Instant,
    ) -> io::Result<()> {
        // Read before the new owner is joined (which replaces the old one's record when the
        // same server came back as another incarnation).
        let now = Instant::now();
        for &id in ids {
            let lapsed = self
                .routes
                .get(id)
                .is_some_and(|r| self.lapsed(r.server, now));
            if lapsed && let Some(r) = self.routes.get_mut(id) {
                r.record = LocalLock::new(r.record.id, r.record.kind);
            }
        }
        let mut reply = vec![0u8; CONTROL_FRAME_MAX];
        let mut all = true;
        let new = Owned {
            server,
            incarnation,
            epoch,
        };
        for chunk in ids.chunks(CLAIMS_MAX) {
            let (ids, names, claims) = self.claims(chunk);
            let claims: Vec<LockClaim<'_>> = claims
                .iter()
                .zip(&names)
                .map(|(c, name)| LockClaim { name, ..*c })
                .collect();
            let body = ControlRequest::BatchUpdateLocks(Batch::from_slice(&claims));
            let m = self.control_with(server, body, &mut reply, deadline)?;
            let frame = decode_control_response(&reply[..m])
                .map_err(|_| garbage("a re-claim reply is malformed"))?;
            let entries: Vec<BatchEntry> = match (frame.header.status(), frame.body) {
                (Some(Status::Success), ControlResponse::Entries(e)) if e.len() == ids.len() => {
                    e.iter().collect()
                }
                (Some(Status::Success), _) => {
                    return Err(garbage("a re-claim reply has another count"));
                }
                (status, _) => {
                    return Err(io::Error::other(format!(
                        "the re-claims were refused whole: {status:?}"
                    )));
                }
            };
            all &= self.file(&ids, &entries, new);
        }
        if all {
            self.say_done(p, server, epoch, deadline)?;
        }
        Ok(())
    }

    /// Sends `ReclaimDone(p, epoch)` to `server`, again after a pause while it is answered
    /// `NotReady` or `PartitionMoved` and `deadline` lasts. The client can learn a map (from
    /// one server) before the new owner applied it, which then refuses the message as naming
    /// a future epoch; a `ReclaimDone` dropped there is never sent again, and the new owner
    /// waits for it until its grace deadline.
    fn say_done(
        &mut self,
        p: u16,
        server: ServerId,
        epoch: u32,
        deadline: Instant,
    ) -> io::Result<()> {
        let mut reply = vec![0u8; CONTROL_FRAME_MAX];
        let mut pause = super::control::PAUSE_MIN;
        loop {
            let body = ControlRequest::ReclaimDone {
                partition: p,
                epoch,
            };
            let m = self.control_with(server, body, &mut reply, deadline)?;
            let status = decode_control_response(&reply[..m])
                .ok()
                .and_then(|f| f.header.status());
            match status {
                Some(Status::Success) => return Ok(()),
                Some(Status::NotReady | Status::PartitionMoved) if Instant::now() < deadline => {
                    pause = self.pause(pause, deadline);
                }
                _ => {
                    tracing::debug!(partition = p, ?status, "dlock: ReclaimDone not taken");
                    return Ok(());
                }
            }
        }
    }

    /// The claims of the routes `chunk` (each with its name apart, for the borrow): a grant
    /// or ticket with its proof, or the reference alone for a record no claim can describe.
    fn claims(&self, chunk: &[u32]) -> (Vec<u32>, Vec<Vec<u8>>, Vec<LockClaim<'static>>) {
        let now_ms = self.now_ms();
        let (mut ids, mut names, mut claims) = (Vec::new(), Vec::new(), Vec::new());
        for &id in chunk {
            let Some(r) = self.routes.get(id) else {
                continue;
            };
            let c = r.record.claim(now_ms).unwrap_or_else(|| {
                tracing::warn!(lock = ?r.name, "dlock: lock record inconsistent; only its reference is claimed");
                LocalLock::new(r.record.id, r.record.kind)
                    .claim(now_ms)
                    .expect("a fresh record can always claim its reference")
            });
            ids.push(id);
            names.push(r.name.clone());
            claims.push(LockClaim {
                kind: r.record.kind,
                held: c.held,
                name: &[],
                old_lock: r.server_lock.unwrap_or(0),
                word: r.record.word,
                ticket: c.ticket,
                remaining_ms: c.remaining_ms,
                age_ms: c.age_ms,
                token: c.token,
                proof: c.proof,
                value: c.value,
            });
        }
        (ids, names, claims)
    }

    /// Files the new owner's answers to the claims of `ids` (the table in the module doc);
    /// whether every claim was answered for good (taken or refused).
    fn file(&mut self, ids: &[u32], entries: &[BatchEntry], new: Owned) -> bool {
        let mut all = true;
        for (id, entry) in ids.iter().zip(entries) {
            let Some(r) = self.routes.get_mut(*id) else {
                continue;
            };
            let server_lock = match entry.status {
                Status::Success => Some(entry.id),
                Status::Fail => {
                    // The new owner says the grant is gone: forget it, keep the name.
                    r.record = LocalLock::new(r.record.id, r.record.kind);
                    None
                }
                other => {
                    tracing::debug!(lock = ?r.name, status = ?other, "dlock: a claim was not taken; kept");
                    all = false;
                    continue;
                }
            };
            r.server = new.server;
            r.incarnation = new.incarnation;
            r.epoch = new.epoch;
            r.server_lock = server_lock;
        }
        all
    }
}

/// A partition's new owner, as the map gives it.
#[derive(Clone, Copy, Debug)]
struct Owned {
    server: ServerId,
    incarnation: u64,
    epoch: u32,
}
