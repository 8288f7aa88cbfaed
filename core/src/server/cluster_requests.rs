//! The control requests a cluster adds (`GetMap`, `ClientJoin`, `ReclaimDone`), on the state
//! of `cluster.rs`.

use super::cluster::{ClusterCore, verdict_status};
use super::{Counter, Server};
use crate::cluster::{Class, Verdict};
use crate::ids::{ClientId, Peer, Session};
use crate::proto::MapChunk;
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
        raw: u32,
        version: u8,
        lease_ms: u32,
        session: &Session,
        now_ms: u64,
    ) -> Result<ClientId, Status> {
        self.stats.bump(Counter::ControlRequests);
        if self.cluster.is_none() {
            return Err(self.refuse(Status::Einval));
        }
        let id = ClientId::new(raw).ok_or_else(|| self.refuse(Status::Einval))?;
        let Some((key, mac)) = &self.session_key else {
            return Err(self.refuse(Status::Einval));
        };
        if !session.is_minted_for(key, *mac, raw) {
            self.stats.bump(Counter::SessionsRefused);
            return Err(self.refuse(Status::Einval));
        }
        if let Some(slot) = self.client_slot(raw) {
            let c = &mut self.t.clients[slot as usize];
            if !c.session.matches(session) {
                return Err(self.refuse(Status::ServerNoResource));
            }
            c.last_seen_ms = now_ms;
            c.version = version;
            if c.client_state() == ClientState::Abnormal {
                c.state = ClientState::Active as u8;
            }
            return Ok(id);
        }
        let slot = self.register(id, peer, ClientState::Active, version, lease_ms, now_ms)?;
        self.t.clients[slot as usize].session = *session;
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
        self.stats.bump(Counter::ControlRequests);
        let slot = self.client_slot(raw).ok_or(Status::ClientNotInit);
        let slot = slot.map_err(|s| self.refuse(s))?;
        self.t.clients[slot as usize].last_seen_ms = now_ms;
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
        if let Some(i) = c.tracked_index(raw) {
            let (w, m) = ClusterCore::grid_bit(partition, i);
            let s = &mut c.side.parts[usize::from(partition)];
            if c.side.reclaims[w] & m != 0 && s.awaiting != u32::MAX {
                c.side.reclaims[w] &= !m;
                s.awaiting -= 1;
            }
        }
        self.cluster_tick(now_ms);
        Ok(())
    }
}
