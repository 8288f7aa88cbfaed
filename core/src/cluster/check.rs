//! What a server does with a request for partition `p` at epoch `e`, given its map, its
//! authority (self-fencing) and, for a partition it took over, its phase.
//!
//! A client sends the epoch its cached map gives the partition with every request. The server
//! compares it with its own map and answers anything but an exact match **without serving**,
//! telling the client the map version it knows so the client can refresh (from this server, or
//! any other) and retry within its deadline:
//!
//! | the server's map says                | the request              | then                                   |
//! |--------------------------------------|--------------------------|----------------------------------------|
//! | `p` ≥ `P`                            | any                      | `BadPartition` (a hostile or broken client) |
//! | another server (or nobody) owns `p`, or the map was written for another registration of mine | any | `NotOwner { version }` |
//! | I own `p` at epoch `E`, `e < E`      | any                      | `StaleEpoch { version }`               |
//! | I own `p` at `E`, `e > E`            | any                      | `FutureEpoch { version }`              |
//! | I own `p` at `e`, authority lapsed   | any                      | `Fenced { version }`                   |
//! | I own `p` at `e`, recovering         | a re-claim               | `Serve`                                |
//! | I own `p` at `e`, recovering         | anything else            | `NotReady`                             |
//! | I own `p` at `e`, serving            | a re-claim               | `ReclaimClosed`                        |
//! | I own `p` at `e`, serving            | anything else            | `Serve`                                |
//!
//! `FutureEpoch` is either a client with a newer map than this server (the server has not
//! seen it yet: the client retries shortly, or refreshes elsewhere) or a forged epoch; either
//! way it is answered, never served — serving it would let a client talk a server into
//! granting under an epoch it was never given. `Fenced` means this server cannot be sure it
//! still owns anything (it lost etcd for most of a lease TTL, [`super::timing`]): the client
//! should refresh its map from another server. The epoch check comes before the phase, so a
//! client with a stale map learns so even while the partition recovers.

use super::ServerId;
use super::map::Map;
use super::timing::Phase;

/// What a request is, as far as the partition rules care.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    /// A re-claim of a grant the previous owner issued (`update_lock` with its MAC).
    Reclaim,
    /// Everything else: grants, unlocks, extends, object operations.
    Ordinary,
}

/// The decision ([`check`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub enum Verdict {
    /// Execute the request.
    Serve,
    /// `p` is not below `P`.
    BadPartition,
    /// Another server (or none) owns `p`; this server's map has `version`.
    NotOwner {
        /// The map version this server knows.
        version: u64,
    },
    /// The client's epoch is older than this server's: its map is stale.
    StaleEpoch {
        /// The map version this server knows.
        version: u64,
    },
    /// The client's epoch is newer than this server's: its map is newer, or the epoch forged.
    FutureEpoch {
        /// The map version this server knows.
        version: u64,
    },
    /// This server fenced itself: it cannot be sure its etcd lease (and so its map) is current.
    Fenced {
        /// The map version this server knows.
        version: u64,
    },
    /// The partition is recovering; only re-claims are taken (`NotReady`).
    NotReady,
    /// A re-claim after recovery ended (the grant was given up on).
    ReclaimClosed,
}

/// What a server knows of itself when it checks a request.
#[derive(Clone, Copy, Debug)]
pub struct Local<'m> {
    /// The newest map it has applied.
    pub map: &'m Map,
    /// Its id.
    pub me: ServerId,
    /// Its registration (the etcd lease id its membership key is bound to).
    pub incarnation: u64,
    /// [`Timing::may_grant`](super::Timing::may_grant) now.
    pub authority: bool,
}

/// The rule of the module doc for a request naming `partition` at `epoch`; `phase` is the
/// partition's (from its [`Takeover`](super::Takeover); [`Phase::Serving`] for one that needs
/// none).
#[inline]
pub fn check(local: &Local<'_>, partition: u16, epoch: u32, class: Class, phase: Phase) -> Verdict {
    let map = local.map;
    let version = map.version();
    let Some(owner) = map.owner(partition) else {
        return Verdict::BadPartition;
    };
    if owner.server != Some(local.me) || !map.is_for(local.me, local.incarnation) {
        return Verdict::NotOwner { version };
    }
    if epoch < owner.epoch {
        return Verdict::StaleEpoch { version };
    }
    if epoch > owner.epoch {
        return Verdict::FutureEpoch { version };
    }
    if !local.authority {
        return Verdict::Fenced { version };
    }
    match (phase, class) {
        (Phase::Recovering, Class::Reclaim) | (Phase::Serving, Class::Ordinary) => Verdict::Serve,
        (Phase::Recovering, Class::Ordinary) => Verdict::NotReady,
        (Phase::Serving, Class::Reclaim) => Verdict::ReclaimClosed,
    }
}
