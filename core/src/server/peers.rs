//! The per-peer cap on registrations: one remote peer may hold at most
//! [`Config::clients_per_peer`](crate::Config::clients_per_peer) entries of the client table.
//!
//! Registrations that keep heartbeating are never expired, so without a cap one peer could
//! hold the whole table and every other peer would get `ServerNoResource` for as long as it
//! ran (100 registrations from one address did that to a 100-client server). The reference has
//! no such cap; the trust model here says no peer may stop others from registering.
//!
//! *Who a peer is* is the transport's call, handed in as a [`Peer`] tag with each control
//! frame (`Server::handle_control_from`): under TLS the client certificate's key, otherwise
//! the address (`dlock_transport::runtime::peer` says why). Local clients (the Unix socket,
//! the embedded server) come as [`Peer::EXEMPT`]: whoever may use the socket may map the
//! region and act as any local client, so a cap would bind nobody.
//!
//! The tag is stored in the client's entry, and a peer's count is the entries carrying its tag:
//! whatever frees an entry (deinit, lease expiry, eviction, a recovery given up) gives the
//! place back, with no second count to keep in step. Counting is a scan of the table, paid
//! once per registration (a few microseconds at 1,000 clients; registration is rare).
//!
//! | the peer holds | it has an abnormal client | a new registration from it |
//! |---|---|---|
//! | fewer than the cap | — | proceeds as before (may evict any abnormal client when the table is full) |
//! | the cap | yes | evicts its own first abnormal client (released as a lease expiry would) and takes its place |
//! | the cap | no | `ServerNoResource`, counted in `clients_refused_peer_cap` |
//!
//! Evicting the peer's own abnormal client at its cap means an engine that restarts does not
//! wait for its dead registrations' leases to run out, yet never takes another peer's place.
//! The cap applies where an entry is created: `client_init`, and `client_reinit` on a
//! recovering server. A reinit that resumes a live registration keeps the entry (and the peer
//! it was counted under): it needs the registration's secret, so it adds nothing.

use super::{Counter, Server};
use crate::ids::Peer;
use crate::manager::retain::Departure;
use crate::status::Status;
use crate::table::ClientState;

impl Server<'_> {
    /// A slot for a new registration from `peer`, if its cap allows one: `Ok(None)` when the
    /// peer is under its cap (the caller takes a free slot as before), `Ok(Some(slot))` when it
    /// was at its cap and one of its own abnormal clients was evicted to make room, and
    /// `Err(ServerNoResource)` (counted) when it is at its cap with nothing of its own to evict.
    pub(super) fn peer_room(&mut self, peer: Peer, now_ms: u64) -> Result<Option<u32>, Status> {
        if peer.is_exempt() {
            return Ok(None);
        }
        let (held, abnormal) = self.peer_clients(peer, now_ms);
        if held < self.cfg.clients_per_peer() {
            return Ok(None);
        }
        let Some(slot) = abnormal else {
            self.stats.bump(Counter::ClientsRefusedPeerCap);
            return Err(self.refuse(Status::ServerNoResource));
        };
        self.remove_client(slot, Departure::Died, now_ms);
        self.stats.bump(Counter::ClientsEvicted);
        if self.t.clients[slot as usize].client_state() == ClientState::Retaining {
            // It kept retained grants, so its slot still counts against the peer: no room.
            self.stats.bump(Counter::ClientsRefusedPeerCap);
            return Err(self.refuse(Status::ServerNoResource));
        }
        Ok(self.t.client_free.pop())
    }

    /// How many registered clients `peer` holds, and the first of them that is abnormal.
    fn peer_clients(&self, peer: Peer, now_ms: u64) -> (u32, Option<u32>) {
        let mut held = 0;
        let mut abnormal = None;
        for slot in 0..self.t.client_free.high_water() {
            let c = &self.t.clients[slot as usize];
            if c.client_state() == ClientState::Free || c.peer != peer.tag() {
                continue;
            }
            held += 1;
            if abnormal.is_none() && self.evictable(slot, now_ms) {
                abnormal = Some(slot);
            }
        }
        (held, abnormal)
    }

    /// The peer client `raw` registered from ([`Peer::EXEMPT`] for a local one).
    pub fn client_peer(&self, raw: u32) -> Option<Peer> {
        let slot = self.client_slot_of(raw)?;
        Some(Peer::from_tag(self.t.clients[slot as usize].peer))
    }
}
