//! The rules of a dlock cluster that need no etcd: where a name lives, who owns it at which
//! epoch, what a server answers a request for a partition, how partitions are spread over the
//! servers, which fencing token a grant carries, when a server may grant, and how far ahead of
//! the values it hands out a counter's high-water mark must be.
//!
//! A cluster has a fixed number of virtual partitions `P` ([`Partitions`], set when the cluster
//! is created; [`PARTITIONS_DEFAULT`]). A name belongs to partition [`partition_of`]`(name, P)`;
//! a `{tag}` in a name makes only the tag count, so a table and its row groups share one
//! partition. The [`Map`] says which server owns each partition at which epoch; it is written
//! only by the cluster's elected coordinator (the etcd agent, package `dlock-cluster`) with
//! [`assign()`], published in etcd, and fetched by clients from any server in its
//! [wire encoding](Map::encode). Every server checks each request's (partition, epoch) against
//! its map with [`check()`] and never serves a partition it does not own at that epoch.
//!
//! | module     | owns                                                                   |
//! |------------|------------------------------------------------------------------------|
//! | [`hash`]   | the name hash, `{tag}` extraction, `partition_of`                      |
//! | [`map`]    | the map: partition → (server, epoch, handover), the server table       |
//! | `wire`     | the map's versioned byte encoding ([`Map::encode`], [`Map::decode`])    |
//! | [`mod@check`]  | what a server does with a request's (partition, epoch)                 |
//! | [`mod@assign`] | the coordinator's rebalancing: even, minimal moves, epochs raised      |
//! | [`token`]  | the cluster fencing-token layout (`epoch:32 \| counter:32`)             |
//! | [`timing`] | self-fencing, the new owner's wait and the grace period, with the proof |
//! | [`counter`]| high-water marks of `umo_atomic64` counters kept ahead of handed-out values |
//!
//! Nothing here reads a clock, allocates or talks to etcd: time comes in as `now_ms`, memory as
//! a [`Map`] the caller owns (about 80 KiB at the limits: keep it off small stacks), and etcd is
//! the agent's business. The simulators drive these same functions.

pub mod assign;
pub mod check;
pub mod counter;
pub mod hash;
pub mod map;
pub mod timing;
pub mod token;
mod wire;

#[cfg(test)]
mod tests;

pub use assign::{AssignError, Change, Member, assign};
pub use check::{Class, Local, Verdict, check};
pub use hash::{hash_tag, name_hash, partition_of};
pub use map::{Handover, Map, Owner, ServerEntry};
pub use timing::{Phase, Takeover, Timing};
pub use wire::MAP_ENCODED_MAX;

use core::num::NonZeroU32;

/// Most partitions a cluster may have. 4,096 keeps the map's wire form under 64 KiB with
/// [`SERVERS_MAX`] servers, and is far more than the servers a cluster can have, so every
/// server still gets many partitions to balance with.
pub const PARTITIONS_MAX: u16 = 4_096;
/// Partitions of a cluster created without saying how many.
pub const PARTITIONS_DEFAULT: u16 = 256;
/// Most servers a cluster's map can name (members beyond it are refused by [`assign()`]).
/// 256 servers × 51,200 locks is 13 million locks, and at the default `P` every server still
/// owns at least one partition.
pub const SERVERS_MAX: usize = 256;
/// Longest advertised address of a server in the map, in bytes (opaque to `dlock-core`: the
/// agent and the client agree on its form, e.g. `host:port`).
pub const ADDRESS_LEN_MAX: usize = 122;

/// The number of partitions of a cluster: `1..=PARTITIONS_MAX`, fixed when the cluster is
/// created (every server and client must agree, or names land in different partitions).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Partitions(u16);

impl Partitions {
    /// The default ([`PARTITIONS_DEFAULT`]).
    pub const DEFAULT: Partitions = Partitions(PARTITIONS_DEFAULT);

    /// `None` outside `1..=PARTITIONS_MAX`.
    #[inline]
    #[must_use]
    pub const fn new(count: u16) -> Option<Self> {
        if count == 0 || count > PARTITIONS_MAX {
            None
        } else {
            Some(Partitions(count))
        }
    }

    /// The count.
    #[inline]
    pub const fn get(self) -> u16 {
        self.0
    }
}

impl Default for Partitions {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// A server of a cluster: a non-zero number the operator gives it (`--server-id`), unique in the
/// cluster and kept across restarts, so its etcd key and its place in the map stay its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(transparent)]
pub struct ServerId(NonZeroU32);

impl ServerId {
    /// `None` for 0 (0 means "no server" in the map's encoding).
    #[inline]
    #[must_use]
    pub const fn new(raw: u32) -> Option<Self> {
        match NonZeroU32::new(raw) {
            Some(v) => Some(ServerId(v)),
            None => None,
        }
    }

    /// The raw value.
    #[inline]
    pub const fn get(self) -> u32 {
        self.0.get()
    }
}

impl core::fmt::Display for ServerId {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "server {}", self.get())
    }
}
