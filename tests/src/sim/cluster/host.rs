//! One cluster server of the simulation: the real `Server` with its cluster side enabled, the
//! memory it lives in (kept across restarts: a restarted server formats it again, as a new
//! process would map a fresh region), and what the runtime around it knows — the clients it
//! registered (for the agent to persist) and the map it handed the data thread.

use std::collections::BTreeSet;

use dlock_core::Config;
use dlock_core::cluster::{MAP_ENCODED_MAX, Map, PARTITIONS_MAX, Partitions, ServerId};
use dlock_core::server::{ClusterSettings, ClusterSide, PartState, Server};
use dlock_transport::Region;

use super::agent::Agent;
use crate::sim::{Rng, rng, sim_session_key};

/// The cluster side's memory (what the runtime's `ClusterMemory` allocates).
struct SideMemory {
    map: Box<Map>,
    encoded: Vec<u8>,
    parts: Vec<PartState>,
    expected: Vec<u32>,
    reclaims: Vec<u64>,
}

/// A simulated cluster server (module doc).
pub struct Host {
    pub id: ServerId,
    /// Its clock is the model clock plus this (clocks agree on rate, not on time).
    pub offset: u64,
    /// Incarnations of the process so far (a restart raises it; messages to an earlier one
    /// are lost with it).
    pub life: u32,
    /// The process, while it runs.
    pub server: Option<Server<'static>>,
    pub agent: Agent,
    /// Client ids registered with this process (for the agent to persist).
    pub registered: BTreeSet<u32>,
    /// A crashed process starts again at this model instant.
    pub restart_at: Option<u64>,
    /// The table memory and the cluster memory, owned here (freed in `Drop`, after the server
    /// that borrows them).
    region: *mut Region,
    side: *mut SideMemory,
}

impl std::fmt::Debug for Host {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Host")
            .field("id", &self.id)
            .field("life", &self.life)
            .field("running", &self.server.is_some())
            .finish()
    }
}

impl Host {
    /// Server `id` with tables of `cfg` (not started).
    pub fn new(id: ServerId, cfg: &Config, offset: u64, partitions: Partitions) -> Host {
        let region = Region::anonymous(cfg).expect("map region");
        let side = SideMemory {
            map: Box::new(Map::new(partitions)),
            encoded: vec![0; MAP_ENCODED_MAX],
            parts: vec![PartState::default(); usize::from(PARTITIONS_MAX)],
            expected: vec![0; cfg.clients_max as usize],
            reclaims: vec![0; ClusterSide::reclaims_len(cfg.clients_max)],
        };
        Host {
            id,
            offset,
            life: 0,
            server: None,
            agent: Agent::default(),
            registered: BTreeSet::new(),
            restart_at: None,
            region: Box::into_raw(Box::new(region)),
            side: Box::into_raw(Box::new(side)),
        }
    }

    /// This server's clock at model instant `now`.
    pub fn clock(&self, now: u64) -> u64 {
        now + self.offset
    }

    /// Starts a new process over the host's memory (the old one, if any, is gone): fresh
    /// tables, cluster side, entropy from `(seed, id, life)`, no map and no authority yet.
    pub fn start(&mut self, cfg: &Config, settings: ClusterSettings, seed: u64) {
        self.server = None;
        self.life += 1;
        self.agent = Agent::default();
        self.registered.clear();
        self.restart_at = None;
        // SAFETY: `region` and `side` come from `Box::into_raw` in `new` and are freed only in
        // `drop`. The one `Server` that borrowed them was dropped just above, so these are the
        // only references to them now; the new server holds them until it is dropped the same
        // way (a restart, or `drop`, which drops it before freeing).
        let (region, side) = unsafe { (&mut *self.region, &mut *self.side) };
        let tables = region.tables().expect("carve tables");
        let mix = u64::from(self.id.get()) << 32 | u64::from(self.life);
        rng::seed_entropy(Rng::new(seed ^ mix.wrapping_mul(0x9E37_79B9_7F4A_7C15)).next_u64());
        let mut srv = Server::new(tables, cfg, rng::sim_entropy);
        srv.set_session_key(sim_session_key(), dlock_transport::runtime::hmac_sha256);
        srv.enable_cluster(
            ClusterSide {
                map: &mut side.map,
                encoded: &mut side.encoded,
                parts: &mut side.parts,
                expected: &mut side.expected,
                reclaims: &mut side.reclaims,
            },
            settings,
        );
        self.server = Some(srv);
    }

    /// The process dies (kill -9): its state is gone; it starts again at `restart_at`.
    pub fn crash(&mut self, restart_at: u64) {
        self.server = None;
        self.agent = Agent::default();
        self.registered.clear();
        self.restart_at = Some(restart_at);
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        // The server borrows the memory: it goes first.
        self.server = None;
        // SAFETY: both pointers come from `Box::into_raw` in `new`, are freed only here, and
        // nothing borrows them any more (the server was dropped above).
        unsafe {
            drop(Box::from_raw(self.region));
            drop(Box::from_raw(self.side));
        }
    }
}
