//! The control requests a cluster adds (`GetMap`, `ClientJoin`, `ReclaimDone`, and
//! protocol 6's `ReclaimDones`), on the state
//! of `cluster.rs`.

use super::cluster::verdict_status;
use super::{Counter, FrameError, Rejoin, Server};
use crate::cluster::{Class, Verdict};
use crate::ids::{ClientId, Peer};
use crate::proto::{
    ControlHeader, ControlResponse, MapChunk, PartitionStatus, PartitionStatuses,
    RECLAIM_DONES_MAX, ReclaimDones, encode_control_response,
};
use crate::status::Status;
use crate::table::ClientState;

impl<'r> Server<'r> {
    /// `GetMap { offset }`: the chunk of the applied map's encoding (`Einval`: standalone, no
    /// map yet, or an offset outside it).
    pub(super) fn map_chunk(&self, offset: u32) -> Result<MapChunk<'_>, Status> {
        let c = self.cluster.as_ref().ok_or(Status::Einval)?;
        if c.incarnation == 0 || c.encoded_len == 0 {
            return Err(Status::Einval);
        }
        MapChunk::of(
            c.side.map.version(),
            &c.side.encoded[..c.encoded_len],
            offset,
        )
        .ok_or(Status::Einval)
    }

    /// `ClientJoin`: registers client `raw`, registered with another server of the cluster,
    /// here with the same id and session (verified under the cluster's session key). A join of
    /// an id registered here under another session is `ServerNoResource`: the id is in use
    /// (two servers minted it; their index bits make that impossible, see
    /// [`Server::fresh_client_id`]'s cluster rule). A join of the same session resumes it.
    pub(super) fn client_join(
        &mut self,
        peer: Peer,
        back: Rejoin<'_>,
        now_ms: u64,
    ) -> Result<ClientId, Status> {
        self.stats.bump(Counter::ControlRequests);
        if self.cluster.is_none() {
            return Err(self.refuse(Status::Einval));
        }
        let id = ClientId::new(back.raw).ok_or_else(|| self.refuse(Status::Einval))?;
        let Some((key, mac)) = &self.session_key else {
            return Err(self.refuse(Status::Einval));
        };
        if !back.session.is_minted_for(key, *mac, back.raw) {
            self.stats.bump(Counter::SessionsRefused);
            return Err(self.refuse(Status::Einval));
        }
        if let Some(slot) = self.client_slot(back.raw) {
            if !self.t.clients[slot as usize].session.matches(back.session) {
                return Err(self.refuse(Status::ServerNoResource));
            }
            self.resume_client(slot, back.version, now_ms);
            return Ok(id);
        }
        let slot = self.register(
            id,
            peer,
            ClientState::Active,
            back.version,
            back.lease_ms,
            now_ms,
        )?;
        self.t.clients[slot as usize].session = *back.session;
        Ok(id)
    }

    /// `ReclaimDone { partition, epoch }` from client `raw`: it has re-claimed what it held in
    /// `partition`. Counted only while the partition recovers at `epoch` here, and only for a
    /// client the old owner had persisted.
    pub(super) fn reclaim_done(
        &mut self,
        raw: u32,
        partition: u16,
        epoch: u32,
        now_ms: u64,
    ) -> Result<(), Status> {
        let tracked = self.reclaim_done_from(raw, now_ms)?;
        let done = self.count_reclaim_done(tracked, partition, epoch, now_ms);
        self.cluster_tick(now_ms);
        done
    }

    /// `ReclaimDones` from client `raw` (protocol 6): [`Self::reclaim_done`] for each
    /// partition of `dones`, in one message. A client not registered, or a standalone server,
    /// refuses the whole message, as either refuses a `ReclaimDone`; otherwise each partition
    /// is answered on its own in `statuses`, with the status its `ReclaimDone` alone would
    /// have got (`Success`, or `NotReady`/`PartitionMoved` for a partition whose new map this
    /// server has not applied yet, which the client says again).
    pub(super) fn reclaim_dones<'s>(
        &mut self,
        raw: u32,
        dones: &ReclaimDones<'_>,
        statuses: &'s mut [PartitionStatus; RECLAIM_DONES_MAX],
        now_ms: u64,
    ) -> Result<PartitionStatuses<'s>, Status> {
        let tracked = self.reclaim_done_from(raw, now_ms)?;
        let n = dones.len();
        for (done, out) in dones.iter().zip(statuses.iter_mut()) {
            let counted = self.count_reclaim_done(tracked, done.partition, done.epoch, now_ms);
            *out = PartitionStatus {
                partition: done.partition,
                status: counted.err().unwrap_or(Status::Success),
            };
        }
        self.cluster_tick(now_ms);
        Ok(PartitionStatuses::from_slice(&statuses[..n]))
    }

    /// The checks a `ReclaimDone` and a `ReclaimDones` share before any partition: counted as
    /// a control request, from a registered client (whose lease it renews), on a cluster
    /// server. Returns the client's index among the clients the recovering partitions await
    /// (`None`: not awaited), looked up once for every partition of the message.
    fn reclaim_done_from(&mut self, raw: u32, now_ms: u64) -> Result<Option<usize>, Status> {
        self.stats.bump(Counter::ControlRequests);
        self.stats.bump(Counter::ReclaimDoneMessages);
        let slot = self.client_slot(raw).ok_or(Status::ClientNotInit);
        let slot = slot.map_err(|s| self.refuse(s))?;
        self.t.clients[slot as usize].last_seen_ms = now_ms;
        let Some(c) = self.cluster.as_ref() else {
            return Err(self.refuse(Status::Einval));
        };
        Ok(c.tracked_index(raw))
    }

    /// Counts a client's word that it re-claimed `partition` at `epoch`, if the partition
    /// recovers at that epoch here and the old owner had persisted the client (`tracked`, its
    /// index among the awaited clients: [`Self::reclaim_done_from`]).
    fn count_reclaim_done(
        &mut self,
        tracked: Option<usize>,
        partition: u16,
        epoch: u32,
        now_ms: u64,
    ) -> Result<(), Status> {
        let Some(c) = self.cluster.as_mut() else {
            return Err(self.refuse(Status::Einval));
        };
        match c.verdict(partition, epoch, Class::Reclaim, now_ms) {
            Verdict::Serve => {}
            // Recovery is over already: nothing left to count.
            Verdict::ReclaimClosed => return Ok(()),
            v => {
                let (s, _) = verdict_status(v).unwrap_or((Status::Einval, 0));
                return Err(self.refuse(s));
            }
        }
        if let Some(i) = tracked {
            let (w, m) = c.grid_bit(partition, i);
            let s = &mut c.side.parts[usize::from(partition)];
            if c.side.reclaims[w] & m != 0 && s.awaiting != u32::MAX {
                c.side.reclaims[w] &= !m;
                s.awaiting -= 1;
            }
        }
        Ok(())
    }

    /// Answers a `ReclaimDones` frame into `out` (its reply borrows a buffer of statuses kept
    /// here, on the stack).
    pub(super) fn reclaim_dones_frame(
        &mut self,
        header: &ControlHeader,
        dones: &ReclaimDones<'_>,
        out: &mut [u8],
        now_ms: u64,
    ) -> Result<usize, FrameError> {
        let blank = PartitionStatus {
            partition: 0,
            status: Status::Success,
        };
        let mut statuses = [blank; RECLAIM_DONES_MAX];
        let reply = |status: Status| ControlHeader {
            word: status as u16 as u32,
            ..*header
        };
        Ok(
            match self.reclaim_dones(header.word, dones, &mut statuses, now_ms) {
                Ok(s) => {
                    let body = ControlResponse::PartitionStatuses(s);
                    encode_control_response(&reply(Status::Success), &body, out)?
                }
                Err(s) => encode_control_response(&reply(s), &ControlResponse::Empty, out)?,
            },
        )
    }
}
