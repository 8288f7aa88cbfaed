//! The server state machine: every operation of the reference's client API, executed against
//! the tables.
//!
//! A [`Server`] owns its [`Tables`] and is driven by the transport's threads: control requests
//! (registration, named-lock and object lifecycle, heartbeat, recovery) through the
//! `client_*`/`get_lock`/`object_*`/`update_lock` methods or [`Server::handle_control`], lock
//! and object commands through [`Server::handle_data`], and the passage of time through
//! [`Server::tick`], which declares silent clients dead. Every method takes the current monotonic
//! tick (`now_ms`, below 2^40) and none reads a clock, allocates or blocks, so a run is a pure
//! function of its inputs and can be replayed.
//!
//! A transport that serves many clients over mailboxes, connections and queue pairs goes
//! through [`Server::control`], [`Server::dispatch`] and [`Server::dispatch_stream`] instead:
//! they apply the rules of who may send what on which path and where a reply goes ([`route`],
//! [`control`]) over the per-slot state of a [`Routing`], so a transport keeps none of it and
//! only moves bytes and wakes threads.
//!
//! The methods take `&mut self`: one thread at a time runs the state machine. Within it the
//! ownership of ARCHITECTURE.md still holds — lock words and holds change only in `data`,
//! names, references and the client table only in the control modules — so the runtime can put
//! the two halves on two threads without changing any semantics.

mod all_or_nothing;
mod clients;
mod cluster;
mod cluster_awaited;
mod cluster_claims;
mod cluster_counters;
mod cluster_requests;
mod cluster_slots;
pub mod control;
mod data;
mod dispatch;
mod embedded;
mod frames;
pub mod invariants;
mod locks;
mod objects;
mod peers;
pub mod proof;
mod recovery;
pub mod retained;
mod revokes;
pub mod route;
mod routing;
pub mod stats;
mod steps;
mod waiters;

use crate::config::Config;
use crate::ids::{ClientId, FencingToken, SessionKey, SessionMac};
use crate::status::Status;
use crate::table::{ClientState, Tables};
pub use clients::Rejoin;
pub use cluster::{ClusterSettings, ClusterSide, ClusterWork, PartState, RESERVE_QUEUE_MAX};
pub use control::{ControlAdmission, ControlConn};
pub use dispatch::{Dispatched, Source, Streamed};
pub use embedded::MessageValues;
pub use frames::FrameError;
pub use recovery::RecoveryProgress;
pub use route::{
    Admission, Binding, Delivery, EventPath, Joining, Route, admit, event_path, joining,
    owns_mailbox,
};
pub use routing::{Controlled, Registration, Routing, SlotRouting, StreamControlled};
pub use stats::{Counter, Stats};
pub use waiters::{Disposition, WaitReply};

/// Whether the server is serving or waiting for clients to re-sync after a failover.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ServerState {
    /// Serving every request.
    Ready,
    /// Waiting for this many clients to finish `client_reinit` … `reinit_done`; every other
    /// request gets `NotReady`.
    Recovering {
        /// Clients still expected.
        remaining: u32,
    },
}

/// One dlock server's state machine.
#[derive(Debug)]
pub struct Server<'r> {
    t: Tables<'r>,
    cfg: Config,
    /// Clients still expected to finish recovery; 0 = ready.
    recovering: u32,
    /// Dead clients' slots keeping retained grants (`ClientState::Retaining`): while zero, no
    /// acquisition looks for a retained grant in its way (`retained.rs`).
    retaining: u32,
    /// Client entries (of any state but free) registered below protocol 8
    /// (`PROTO_VERSION_PLAIN_GRANTS`), which read a contended grant's notice from their event
    /// ring rather than from its result: while zero, an acquisition of a contended lock
    /// nobody caches skips the holders' scan (`revokes.rs`), whose only work there is to wake
    /// such a holder.
    old_clients: u32,
    /// A revoke was written into an event ring since the transport last asked
    /// ([`Server::take_events_pending`]).
    events_pending: bool,
    /// How recovery went so far (see [`Server::recovery_progress`]).
    progress: RecoveryProgress,
    /// The next fencing token: the epoch in the high bits, a counter below. One counter for the
    /// whole server makes tokens grow per lock even when a name is released and re-created in
    /// another slot.
    next_token: u64,
    /// Where client ids, session secrets and the name-hash key come from.
    entropy: Entropy,
    /// The key sessions are minted under, shared with a replacement server (see [`SessionKey`]).
    session_key: Option<(SessionKey, SessionMac)>,
    /// Key of the name hash, drawn from `entropy` so a peer cannot choose names that collide.
    name_key: u64,
    stats: Stats,
    /// Parked blocking requests not yet decided.
    waiting: u32,
    /// Decided parked requests whose replies wait for `take_replies`.
    ready: u32,
    /// The earliest tick at which a parked request may need a time-based retry.
    next_timer_ms: u64,
    /// The earliest tick at which a revoke a request that did not wait left due is to go out
    /// (`revokes.rs`; `u64::MAX`: none).
    revokes_due_ms: u64,
    /// The cluster half (`cluster.rs`); `None` on a standalone server.
    cluster: Option<cluster::ClusterCore<'r>>,
}

/// Where a server draws the values a peer must not be able to predict: client ids, session
/// secrets (see [`Session`]) and the name-hash key. It fills the buffer with fresh bytes.
///
/// `dlock-core` reads no entropy itself, as it reads no clock: the runtime passes the operating
/// system's CSPRNG (`getrandom`), and a test or a simulation passes a seeded generator so that a
/// run replays. A predictable source makes every session guessable: never serve a network with
/// one.
///
/// [`Session`]: crate::ids::Session
pub type Entropy = fn(&mut [u8]);

/// An [`Entropy`] for tests, benchmarks and examples: a process-wide counter run through
/// SplitMix64. Its output is **predictable by design** — anyone who sees one session can compute
/// the next — so a server that talks to peers must use the operating system's CSPRNG instead.
pub fn predictable_entropy(out: &mut [u8]) {
    // Relaxed: the counter only has to hand each call a different value; no other memory is
    // published through it.
    static STATE: core::sync::atomic::AtomicU64 = core::sync::atomic::AtomicU64::new(1);
    for chunk in out.chunks_mut(8) {
        let mut z = STATE
            .fetch_add(0x9E37_79B9_7F4A_7C15, core::sync::atomic::Ordering::Relaxed)
            .wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        chunk.copy_from_slice(&z.to_le_bytes()[..chunk.len()]);
    }
}

/// Whether `now` is past `deadline` (strictly, as the reference compares).
#[inline]
const fn past(now_ms: u64, deadline_ms: u64) -> bool {
    now_ms > deadline_ms
}

impl<'r> Server<'r> {
    /// A server over freshly formatted tables. `cfg` must be the config the tables were carved
    /// with; `entropy` supplies client ids and session secrets (see [`Entropy`]).
    pub fn new(tables: Tables<'r>, cfg: &Config, entropy: Entropy) -> Self {
        assert_eq!(
            tables.layout,
            crate::table::Layout::new(cfg),
            "tables carved with another config"
        );
        let mut key = [0u8; 8];
        entropy(&mut key);
        let name_key = u64::from_le_bytes(key);
        Self {
            t: tables,
            cfg: *cfg,
            recovering: cfg.recovery_clients,
            retaining: 0,
            old_clients: 0,
            events_pending: false,
            progress: RecoveryProgress {
                expected: cfg.recovery_clients,
                ..RecoveryProgress::default()
            },
            next_token: FencingToken::standalone(cfg.epoch, 1).0,
            entropy,
            session_key: None,
            name_key,
            stats: {
                let mut stats = Stats::default();
                stats.add(Counter::RecoveryExpected, cfg.recovery_clients.into());
                stats
            },
            waiting: 0,
            ready: 0,
            next_timer_ms: u64::MAX,
            revokes_due_ms: u64::MAX,
            cluster: None,
        }
    }

    /// The configuration the server runs with.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Serving or recovering.
    pub fn state(&self) -> ServerState {
        match self.recovering {
            0 => ServerState::Ready,
            remaining => ServerState::Recovering { remaining },
        }
    }

    /// A copy of the counters.
    pub fn stats(&self) -> Stats {
        let mut s = self.stats;
        // Levels read from the tables now rather than kept in step at every change.
        s.0[Counter::ClientsActive as usize] = u64::from(self.t.client_free.used());
        s.0[Counter::LocksInUse as usize] = u64::from(self.t.lock_free.used());
        s.0[Counter::MapVersion as usize] = self.map_version().unwrap_or(0);
        s
    }

    /// Mints every session from now on under `key` (with `mac`) and gives every grant and
    /// fair-lock ticket a proof ([`proof`]); while recovering, re-registers a client this
    /// server does not know only if its session was minted under the same key, and restores a
    /// grant or ticket only if its claim carries its proof. A failed server and its replacement
    /// share the key, so a client proves it is who it was and held what it claims, not just
    /// that it knows an id and a name. Without a key a recovering server takes any reinit and
    /// claim at its word, as the reference does (the runtime starts one only when told to).
    pub fn set_session_key(&mut self, key: SessionKey, mac: SessionMac) {
        self.session_key = Some((key, mac));
    }

    /// Sets counter `c`: for the counters a transport keeps (connections), so that one `Stats`
    /// reply carries them all.
    pub fn set_counter(&mut self, c: Counter, total: u64) {
        self.stats.0[c as usize] = total;
    }

    /// Zeroes the counters.
    pub fn clear_stats(&mut self) {
        self.stats = Stats::default();
    }

    /// Read access to the tables (for the runtime's diagnostics and for tests that check a
    /// failure left them unchanged).
    pub fn tables(&self) -> &Tables<'r> {
        &self.t
    }

    /// Locks, objects and clients in use.
    pub fn usage(&self) -> Usage {
        Usage {
            locks: self.t.lock_free.used(),
            objects: self.t.object_free.used(),
            clients: self.t.client_free.used(),
        }
    }

    /// The object cells, for a transport that lets clients change them one-sided.
    pub fn object_cells(&self) -> &'r [core::sync::atomic::AtomicU64] {
        self.t.object_cells
    }

    /// Issues the next fencing token.
    #[inline]
    fn issue_token(&mut self) -> FencingToken {
        let t = self.next_token;
        // Carrying into the epoch bits after 2^48 grants keeps tokens increasing; a successor
        // server must then start above the epoch `tick`-level stats report (see README).
        self.next_token += 1;
        FencingToken(t)
    }

    /// The client slot of a registered client that may send ordinary requests now.
    #[inline]
    fn serving_client(&mut self, raw: u32, now_ms: u64) -> Result<u32, Status> {
        let slot = self.client_slot(raw);
        self.serving_slot(slot, now_ms)
    }

    /// [`Self::serving_client`] for a client its caller found in `slot` (`None`: not
    /// registered).
    #[inline]
    fn serving_slot(&mut self, slot: Option<u32>, now_ms: u64) -> Result<u32, Status> {
        if self.recovering > 0 {
            // A registered client waiting for the others to re-sync is alive: renew its lease
            // even though the request itself must wait.
            if let Some(slot) = slot {
                self.t.clients[slot as usize].last_seen_ms = now_ms;
            }
            return Err(Status::NotReady);
        }
        let slot = slot.ok_or(Status::ClientNotInit)?;
        let c = &mut self.t.clients[slot as usize];
        match c.client_state() {
            ClientState::Active | ClientState::Abnormal => {
                // Any request proves the client alive and clears an abnormal mark.
                c.last_seen_ms = now_ms;
                c.state = ClientState::Active as u8;
                Ok(slot)
            }
            ClientState::Recovering => Err(Status::NotReady),
            // Out of the client index, so never found by id: its client learns it was removed.
            ClientState::Retaining => Err(Status::ClientRemovedByServer),
            ClientState::Free => Err(Status::ClientNotInit),
        }
    }

    /// The table slot of client `raw`, if registered.
    #[inline]
    fn client_slot(&self, raw: u32) -> Option<u32> {
        let id = ClientId::new(raw)?;
        let clients = &*self.t.clients;
        self.t
            .client_index
            .find(client_tag(id), |s| clients[s as usize].id == id.get())
    }
}

/// Locks, objects and clients in use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Usage {
    /// Lock slots in use.
    pub locks: u32,
    /// Object slots in use.
    pub objects: u32,
    /// Registered clients.
    pub clients: u32,
}

/// The index tag of a client id.
#[inline]
fn client_tag(id: ClientId) -> u32 {
    crate::table::index::mix32(id.get())
}

#[cfg(test)]
mod tests;
