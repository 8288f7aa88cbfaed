//! What [`Server::check_invariants`](super::super::Server::check_invariants) reports: the
//! first table disagreement it found, with the slots involved.

use core::fmt;

/// One of the server's tables.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Table {
    /// The lock slots.
    Locks,
    /// The object slots.
    Objects,
    /// The client entries.
    Clients,
}

/// The first broken invariant [`Server::check_invariants`](super::super::Server::check_invariants) found. Slots are table indexes;
/// `client` fields are client slots, `owner` fields client ids.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Violation {
    /// A slot listed free while live, listed twice or beyond the high-water mark, or free and
    /// not listed.
    FreeList { table: Table, slot: u32 },
    /// A live slot the index does not find under its key (or finds another slot for), or an
    /// index entry for a slot that is not live or under another tag.
    Index { table: Table, slot: u32 },
    /// A client entry wrong in itself: free and not blank, live with no id or an unknown
    /// state, or re-syncing while the server serves.
    ClientEntry { slot: u32 },
    /// A client's count of its lock (or object) references is not its number of bits.
    ClientRefs {
        slot: u32,
        table: Table,
        recorded: u32,
        counted: u32,
    },
    /// A reference bit of a free client, or on a slot that is not live.
    StrayRef {
        table: Table,
        client: u32,
        slot: u32,
    },
    /// A live slot's reference count is not the number of bits in its column (or a live lock
    /// nobody references).
    Refs {
        table: Table,
        slot: u32,
        recorded: u32,
        counted: u32,
    },
    /// A hold without a reference, or of a kind the lock does not have.
    Hold { client: u32, lock: u32 },
    /// A dead client keeps a grant it did not ask to retain.
    Retained { client: u32, lock: u32 },
    /// A cached grant on a lock whose manager cell is not marked as having one (the revoke
    /// decision would never scan it).
    Cached { client: u32, lock: u32 },
    /// The owner a lock word names is not a registered client holding it exclusively, or an
    /// exclusive hold of `client` on a lock whose word names another owner.
    Owner { lock: u32, owner: u32, client: u32 },
    /// A lock's reader count is not the number of its shared holds.
    Readers {
        lock: u32,
        recorded: u32,
        counted: u32,
    },
    /// A lock word out of shape: readers beside an owner, fair counters out of order.
    Word { lock: u32, word: u128, owner: u32 },
    /// A live lock's fencing token is not below the next one the server issues.
    Fence { lock: u32, fence: u64, next: u64 },
    /// A waiter not blank while free, of another client than its slot's, waiting on no FIFO,
    /// decided but still linked, or retrying a fair ticket the lock never issued.
    Waiter { slot: u32 },
    /// A FIFO that does not end, or holds a waiter that is not waiting on that lock.
    Queue { lock: u32 },
    /// A parked request with no route for its reply, or one over a stream that answers
    /// another message or goes over a connection that no longer speaks for the slot.
    Route { slot: u32 },
    /// The counts of waiting and decided requests are not what the waiter table holds.
    WaiterCounts {
        waiting: u32,
        ready: u32,
        counted_waiting: u32,
        counted_ready: u32,
    },
    /// An object whose owner is not registered, destroyed with nobody referencing it, or
    /// free and not blank.
    Object { object: u32 },
    /// A remote peer holds more client entries than its cap.
    PeerCap { peer: u32, held: u32 },
    /// The count of client entries registered below protocol 8 (which the revoke decision
    /// reads to skip its scan) is not the number the client table holds.
    OldClients { recorded: u32, counted: u32 },
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Violation::FreeList { table, slot } => {
                write!(
                    f,
                    "{table:?} slot {slot}: free list and live slots disagree"
                )
            }
            Violation::Index { table, slot } => {
                write!(
                    f,
                    "{table:?} slot {slot}: the index does not map it as it should"
                )
            }
            Violation::ClientEntry { slot } => write!(f, "client slot {slot}: entry inconsistent"),
            Violation::ClientRefs {
                slot,
                table,
                recorded,
                counted,
            } => write!(
                f,
                "client slot {slot}: {recorded} {table:?} references recorded, {counted} bits set"
            ),
            Violation::StrayRef {
                table,
                client,
                slot,
            } => write!(
                f,
                "client slot {client} references {table:?} slot {slot}, which cannot be"
            ),
            Violation::Refs {
                table,
                slot,
                recorded,
                counted,
            } => write!(
                f,
                "{table:?} slot {slot}: {recorded} references recorded, {counted} clients' bits set"
            ),
            Violation::Hold { client, lock } => write!(
                f,
                "client slot {client}: a hold on lock {lock} without a reference or of the wrong kind"
            ),
            Violation::Retained { client, lock } => write!(
                f,
                "client slot {client}: dead, and keeps lock {lock} it did not ask to retain"
            ),
            Violation::Cached { client, lock } => write!(
                f,
                "client slot {client}: a cached grant on lock {lock}, which is not marked cached"
            ),
            Violation::Owner {
                lock,
                owner,
                client,
            } => write!(
                f,
                "lock {lock}: the word's owner {owner:#x} and the exclusive hold of client slot {client} disagree"
            ),
            Violation::Readers {
                lock,
                recorded,
                counted,
            } => write!(
                f,
                "lock {lock}: {recorded} readers in the word, {counted} shared holds"
            ),
            Violation::Word { lock, word, owner } => {
                write!(
                    f,
                    "lock {lock}: word {word:#034x} (owner {owner:#x}) out of shape"
                )
            }
            Violation::Fence { lock, fence, next } => write!(
                f,
                "lock {lock}: fencing token {fence:#x} not below the next token {next:#x}"
            ),
            Violation::Waiter { slot } => write!(f, "waiter slot {slot}: inconsistent"),
            Violation::Queue { lock } => write!(f, "lock {lock}: waiter FIFO broken"),
            Violation::Route { slot } => {
                write!(f, "slot {slot}: a parked request's reply has no route")
            }
            Violation::WaiterCounts {
                waiting,
                ready,
                counted_waiting,
                counted_ready,
            } => write!(
                f,
                "{waiting} waiting and {ready} ready recorded, {counted_waiting} and {counted_ready} in the table"
            ),
            Violation::Object { object } => write!(f, "object {object}: entry inconsistent"),
            Violation::PeerCap { peer, held } => {
                write!(f, "peer {peer:#x} holds {held} clients, above its cap")
            }
            Violation::OldClients { recorded, counted } => write!(
                f,
                "{recorded} clients below protocol 8 recorded, {counted} in the table"
            ),
        }
    }
}
