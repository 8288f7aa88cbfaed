//! The partition map: which server owns each partition, at which epoch, how it came to own it,
//! and where each server can be reached.
//!
//! | field                | meaning                                                             |
//! |----------------------|---------------------------------------------------------------------|
//! | `version`            | raised by one at every change; the coordinator's compare-and-swap keeps it linear |
//! | `partitions`         | `P`, fixed for the cluster's life                                   |
//! | server table         | `(id, address)` of every live member, sorted by id, at most [`SERVERS_MAX`] |
//! | `owners[p].server`   | the owning server, or `None` (no live server could take it)         |
//! | `owners[p].epoch`    | raised at every change of `p`'s owner (and at a renewal); never lowered; 0 = never owned |
//! | `owners[p].handover` | how the owner came to own `p` at this epoch ([`Handover`])           |
//!
//! The server table lives in the map, not beside it: the coordinator copies each member's
//! advertised address from its membership record when it writes the map, so one fetch gives a
//! client everything it needs to route (no second round trip, and no moment at which it knows
//! an owner but not where it is). A server whose address changes re-registers, and the
//! coordinator writes a new map version.
//!
//! The map is about 80 KiB at the limits; it lives where the caller puts it (a `Box` in the
//! agent, a static or the region in a server) and is filled in place by [`super::assign()`] and
//! [`Map::decode`](super::Map::decode).

use super::{ADDRESS_LEN_MAX, PARTITIONS_MAX, Partitions, SERVERS_MAX, ServerId};

/// How a partition's owner came to own it at its current epoch. It decides what the owner must
/// do before its first grant ([`super::timing::Timing::takeover`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[repr(u8)]
pub enum Handover {
    /// Epoch 1: nobody ever owned the partition, nothing to wait for or re-claim.
    #[default]
    First = 0,
    /// The previous owner's etcd lease had expired when the map was written (its membership
    /// key was gone): it stopped granting before that (self-fencing), so the new owner waits
    /// only the drift margin, then takes re-claims of its grants during the grace period.
    Expired = 1,
    /// The previous owner was still a member (draining, or a rebalance moved the partition): it
    /// may go on granting until it next confirms the map, at most a lease TTL after the map
    /// was written, so the new owner waits a TTL, then takes re-claims during the grace period.
    Moved = 2,
    /// The same owner, a new epoch (its token counter for the old one was running out): keep
    /// serving, no wait and no grace.
    Renewal = 3,
}

impl Handover {
    /// The handover with this wire value.
    #[inline]
    pub const fn from_u8(v: u8) -> Option<Self> {
        match v {
            0 => Some(Handover::First),
            1 => Some(Handover::Expired),
            2 => Some(Handover::Moved),
            3 => Some(Handover::Renewal),
            _ => None,
        }
    }
}

/// Who owns one partition.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Owner {
    /// The owning server; `None` while no live server could take the partition.
    pub server: Option<ServerId>,
    /// The partition's epoch: 0 until its first owner, then raised at every ownership change
    /// and renewal. The high half of every fencing token issued in it.
    pub epoch: u32,
    /// How the owner came to own it at this epoch.
    pub handover: Handover,
}

/// One server of the map's table: its id, the incarnation it was registered under, and its
/// advertised address.
///
/// The incarnation is the id of the etcd lease the server's membership key is bound to, new at
/// every registration. A partition is owned by an id *and* an incarnation: a server that
/// restarted, or lost its lease and registered again, is a new member whose old partitions are
/// moved (at a raised epoch) even if they come back to it — it must not resume an ownership
/// whose state and token counter it may have lost.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct ServerEntry {
    id: u32,
    incarnation: u64,
    address_len: u8,
    address: [u8; ADDRESS_LEN_MAX],
}

impl ServerEntry {
    const EMPTY: ServerEntry = ServerEntry {
        id: 0,
        incarnation: 0,
        address_len: 0,
        address: [0; ADDRESS_LEN_MAX],
    };

    /// An entry for `id` registered as `incarnation` at `address`; `None` if the address is
    /// empty or longer than [`ADDRESS_LEN_MAX`].
    #[must_use]
    pub fn new(id: ServerId, incarnation: u64, address: &[u8]) -> Option<Self> {
        if address.is_empty() || address.len() > ADDRESS_LEN_MAX {
            return None;
        }
        let mut e = ServerEntry {
            id: id.get(),
            incarnation,
            address_len: address.len() as u8,
            ..Self::EMPTY
        };
        e.address[..address.len()].copy_from_slice(address);
        Some(e)
    }

    /// The server.
    #[inline]
    pub fn id(&self) -> ServerId {
        ServerId::new(self.id).expect("table entries below `servers` have ids")
    }

    /// The registration it was assigned under (its etcd lease id).
    #[inline]
    pub fn incarnation(&self) -> u64 {
        self.incarnation
    }

    /// Where clients reach it.
    #[inline]
    pub fn address(&self) -> &[u8] {
        &self.address[..usize::from(self.address_len)]
    }
}

impl core::fmt::Debug for ServerEntry {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let addr = self.address();
        match core::str::from_utf8(addr) {
            Ok(s) => write!(f, "{}.{:x}@{s}", self.id, self.incarnation),
            Err(_) => write!(f, "{}.{:x}@{addr:?}", self.id, self.incarnation),
        }
    }
}

/// The partition map (module doc). Fixed capacity: no allocation, ever. Two maps are equal
/// when their version, `P`, table and owners are (whatever the unused capacity holds).
#[derive(Clone)]
pub struct Map {
    pub(super) version: u64,
    pub(super) partitions: Partitions,
    pub(super) servers: u16,
    pub(super) table: [ServerEntry; SERVERS_MAX],
    pub(super) owners: [Owner; PARTITIONS_MAX as usize],
}

impl Map {
    /// The map of a cluster just created: version 0, no servers, every partition unowned at
    /// epoch 0.
    #[must_use]
    pub fn new(partitions: Partitions) -> Map {
        Map {
            version: 0,
            partitions,
            servers: 0,
            table: [ServerEntry::EMPTY; SERVERS_MAX],
            owners: [Owner::default(); PARTITIONS_MAX as usize],
        }
    }

    /// The map's version: raised by one at every change.
    #[inline]
    pub fn version(&self) -> u64 {
        self.version
    }

    /// `P`.
    #[inline]
    pub fn partitions(&self) -> Partitions {
        self.partitions
    }

    /// The owner of partition `p`; `None` if `p` is not below `P`.
    #[inline]
    pub fn owner(&self, p: u16) -> Option<&Owner> {
        self.owners().get(usize::from(p))
    }

    /// Every partition's owner, in partition order.
    #[inline]
    pub fn owners(&self) -> &[Owner] {
        &self.owners[..usize::from(self.partitions.get())]
    }

    /// The server table, sorted by id.
    #[inline]
    pub fn servers(&self) -> &[ServerEntry] {
        &self.table[..usize::from(self.servers)]
    }

    /// The table entry of server `id`.
    #[inline]
    pub fn server(&self, id: ServerId) -> Option<&ServerEntry> {
        let servers = self.servers();
        servers
            .binary_search_by_key(&id.get(), |e| e.id)
            .ok()
            .map(|i| &servers[i])
    }

    /// Partitions owned by `id`.
    pub fn owned_by(&self, id: ServerId) -> impl Iterator<Item = u16> + '_ {
        self.owners()
            .iter()
            .enumerate()
            .filter(move |(_, o)| o.server == Some(id))
            .map(|(p, _)| p as u16)
    }

    /// Whether this map was written for server `id` in registration `incarnation`: only then
    /// may the server take the partitions it assigns to `id` as its own (a map written for an
    /// earlier registration of the same id names partitions this one never learned).
    #[inline]
    pub fn is_for(&self, id: ServerId, incarnation: u64) -> bool {
        self.server(id)
            .is_some_and(|e| e.incarnation == incarnation)
    }

    /// The first broken invariant, if any: table sorted by id without duplicates or holes,
    /// every owner in the table with an epoch of at least 1, `First` only at epoch 1.
    /// [`Map::decode`] refuses any input that breaks one; tests and the coordinator call it
    /// after every change.
    pub fn check_invariants(&self) -> Result<(), &'static str> {
        if usize::from(self.servers) > SERVERS_MAX {
            return Err("more servers than the table holds");
        }
        let servers = self.servers();
        if servers.iter().any(|e| e.id == 0 || e.address_len == 0) {
            return Err("a table entry without id or address");
        }
        if servers.windows(2).any(|w| w[0].id >= w[1].id) {
            return Err("table not sorted by id, or an id twice");
        }
        for o in self.owners() {
            match o.server {
                Some(id) if self.server(id).is_none() => return Err("an owner not in the table"),
                Some(_) if o.epoch == 0 => return Err("an owned partition at epoch 0"),
                _ => {}
            }
            if o.handover == Handover::First && o.server.is_some() && o.epoch != 1 {
                return Err("a first owner past epoch 1");
            }
        }
        Ok(())
    }
}

impl PartialEq for Map {
    fn eq(&self, other: &Map) -> bool {
        self.version == other.version
            && self.partitions == other.partitions
            && self.servers() == other.servers()
            && self.owners() == other.owners()
    }
}

impl Eq for Map {}

impl core::fmt::Debug for Map {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Map")
            .field("version", &self.version)
            .field("partitions", &self.partitions.get())
            .field("servers", &self.servers())
            .finish_non_exhaustive()
    }
}
