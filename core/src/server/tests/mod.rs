//! State-machine tests through the typed API, by subject, over one setup: [`TestServer`], a
//! server over a fresh region of its own with helpers to register clients and run commands.
//!
//! | file                  | subject                                                                |
//! |-----------------------|------------------------------------------------------------------------|
//! | `registration.rs`     | client ids, sessions, reinit and second channels                       |
//! | `locks.rs`            | named locks, references, kinds, release, fencing tokens                |
//! | `unlock.rs`           | who may unlock, per kind and mode                                      |
//! | `rw.rs`               | the reader-writer lock                                                 |
//! | `fair.rs`             | the fair lock and the server's guards                                  |
//! | `fair_records.rs`     | fair tickets the server no longer records                              |
//! | `batches.rs`          | messages as a whole, all-or-nothing batches                            |
//! | `waiters.rs`          | parked requests, wake-ups, deadlines, cancellations                    |
//! | `objects.rs`          | distributed atomic objects                                             |
//! | `liveness.rs`         | silent, deinitialised and evicted clients                              |
//! | `limits.rs`           | full tables, capped leases                                             |
//! | `peers.rs`            | the per-peer registration cap                                          |
//! | `recovery.rs`         | a recovering server and the claims it takes back                       |
//! | `recovery_deadline.rs`| the recovery deadline and progress                                     |
//! | `proofs.rs`           | grant proofs and proven claims                                         |
//! | `dispatch.rs`         | the one way through: a message's path, its client and its route        |
//! | `routing.rs`          | the per-slot routing state and its events                              |
//! | `cluster.rs`          | a cluster server: partitions, fencing, takeovers, counters, the map    |

mod batches;
mod cluster;
mod contention;
mod contention_clients;
mod contention_hold;
mod dispatch;
mod fair;
mod fair_records;
mod limits;
mod liveness;
mod locks;
mod objects;
mod peers;
mod proofs;
mod recovery;
mod recovery_deadline;
mod registration;
mod retained;
mod revokes;
mod routing;
mod rw;
mod standalone;
mod unlock;
mod values;
mod waiters;

use super::*;
use crate::LockKind;
use crate::ids::{LockId, ObjectId, Session, SessionKey, Ticket};
use crate::proto::{
    Command, CommandResult, FLAG_ALL_OR_NOTHING, Held, LockClaim, LockCommand, LockOp,
    ObjectCommand, ObjectOp,
};
use crate::table::Tables;

/// A 64-byte aligned, zeroed heap region.
struct TestRegion(Vec<Line>);

#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

impl TestRegion {
    fn new(cfg: &Config) -> Self {
        let lines = cfg.region_size().unwrap().div_ceil(64);
        TestRegion(vec![Line([0; 64]); lines])
    }

    fn bytes(&mut self) -> &mut [u8] {
        let len = self.0.len() * 64;
        // SAFETY: `Line` is 64 plain bytes with no padding, so the vector's buffer is `len`
        // initialised bytes, borrowed mutably through `self` for the slice's lifetime.
        unsafe { std::slice::from_raw_parts_mut(self.0.as_mut_ptr().cast::<u8>(), len) }
    }
}

/// The configuration most tests run with: small tables, a one-second lease.
pub(crate) fn small() -> Config {
    Config {
        locks_max: 64,
        clients_max: 8,
        objects_max: 16,
        client_lease_ms: 1_000,
        ..Config::default()
    }
}

/// A server for one test, over a region of its own. It dereferences to the [`Server`], so a
/// test calls the state machine's methods on it directly.
pub(crate) struct TestServer {
    server: Server<'static>,
}

impl core::ops::Deref for TestServer {
    type Target = Server<'static>;

    fn deref(&self) -> &Self::Target {
        &self.server
    }
}

impl core::ops::DerefMut for TestServer {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.server
    }
}

impl TestServer {
    /// A server with `cfg` over freshly formatted tables.
    pub(crate) fn new(cfg: &Config) -> Self {
        // Leaked: the server borrows its region for its whole life, and one struct cannot own
        // both a buffer and a borrow of it. The tests' regions are a few kilobytes each, and the
        // process ends with the tests.
        let region = Box::leak(Box::new(TestRegion::new(cfg)));
        let tables = Tables::format(region.bytes(), cfg).unwrap();
        TestServer {
            server: Server::new(tables, cfg, super::predictable_entropy),
        }
    }

    /// [`Self::new`], minting sessions and proving grants under the tests' key ([`test_mac`]).
    pub(crate) fn keyed(cfg: &Config) -> Self {
        let mut s = Self::new(cfg);
        s.set_session_key(
            SessionKey::new(crate::ids::tests::GOOD_KEY).unwrap(),
            test_mac,
        );
        s
    }

    /// A server recovering for `cfg.recovery_clients`, and `n` clients (ids 100, 101, …)
    /// re-registered with it.
    pub(crate) fn recovering(cfg: &Config, n: u32) -> (Self, Vec<ClientId>) {
        let mut s = Self::new(cfg);
        let ids: Vec<ClientId> = (0..n).map(|i| ClientId::new(100 + i).unwrap()).collect();
        for c in &ids {
            s.reinit(c.get(), 0).unwrap();
        }
        (s, ids)
    }

    /// Registers a client at tick `now`.
    pub(crate) fn client(&mut self, now: u64) -> ClientId {
        self.client_init(2, 0, now).unwrap()
    }

    /// Re-registers client `raw` at tick `now` with the session the server holds for it
    /// ([`Session::NONE`] when it does not know it), as a client of version 2 asking for the
    /// default lease.
    pub(crate) fn reinit(&mut self, raw: u32, now: u64) -> Result<ClientId, Status> {
        let session = self.session(raw);
        self.client_reinit(raw, 2, 0, &session, now)
    }

    /// The session secret of registered client `raw` ([`Session::NONE`] when it is not
    /// registered).
    pub(crate) fn session(&self, raw: u32) -> Session {
        self.client_session(raw).map_or(Session::NONE, |(_, k)| k)
    }

    /// Runs one command from `client` and returns its result.
    pub(crate) fn run(&mut self, client: ClientId, cmd: Command, now: u64) -> CommandResult {
        run(self, client, cmd, now)
    }

    /// Runs the commands of one message from `client` with `flags`.
    pub(crate) fn run_all(
        &mut self,
        client: ClientId,
        flags: u32,
        cmds: &[Command],
        now: u64,
    ) -> Vec<CommandResult> {
        run_all(self, client, flags, cmds, now)
    }

    /// Sends one waiting command; `None` when it was parked.
    pub(crate) fn wait_for(
        &mut self,
        client: ClientId,
        cmd: Command,
        now: u64,
    ) -> Option<CommandResult> {
        let mut r = [CommandResult {
            status: Status::Success,
            word: 0,
            aux: 0,
            plain: false,
        }];
        match self
            .execute_message(client.get(), 0, &[cmd], &mut r, now)
            .unwrap()
        {
            Disposition::Replied => Some(r[0]),
            Disposition::Deferred => None,
        }
    }

    /// The replies of the parked requests decided so far.
    pub(crate) fn replies(&mut self) -> Vec<WaitReply> {
        let mut out = Vec::new();
        self.take_replies(|r| out.push(r));
        out
    }
}

pub(crate) fn lock(kind: LockKind, op: LockOp, id: LockId, expire_ms: u32) -> Command {
    Command::Lock(LockCommand {
        kind,
        op,
        lock: id.raw(),
        expire_ms,
        ticket: Ticket::default(),
        wait_ms: 0,
        partition_epoch: 0,
        flags: crate::proto::LockFlags::NONE,
    })
}

/// Client `raw` coming back at protocol `version` with `session`, asking for the default lease
/// (`client_reinit_from`, `client_join`).
fn back(raw: u32, version: u8, session: &Session) -> Rejoin<'_> {
    Rejoin {
        raw,
        version,
        lease_ms: 0,
        session,
    }
}

fn ticketed(kind: LockKind, op: LockOp, id: LockId, expire_ms: u32, ticket: Ticket) -> Command {
    Command::Lock(LockCommand {
        kind,
        op,
        lock: id.raw(),
        expire_ms,
        ticket,
        wait_ms: 0,
        partition_epoch: 0,
        flags: crate::proto::LockFlags::NONE,
    })
}

fn waiting(kind: LockKind, op: LockOp, id: LockId, expire_ms: u32, wait_ms: u32) -> Command {
    Command::Lock(LockCommand {
        kind,
        op,
        lock: id.raw(),
        expire_ms,
        ticket: Ticket::default(),
        wait_ms,
        partition_epoch: 0,
        flags: crate::proto::LockFlags::NONE,
    })
}

/// Runs one command and returns its result.
pub(crate) fn run(s: &mut TestServer, client: ClientId, cmd: Command, now: u64) -> CommandResult {
    let mut r = [CommandResult {
        status: Status::Success,
        word: 0,
        aux: 0,
        plain: false,
    }; 1];
    s.execute_message(client.get(), 0, &[cmd], &mut r, now)
        .unwrap();
    r[0]
}

fn run_all(
    s: &mut TestServer,
    client: ClientId,
    flags: u32,
    cmds: &[Command],
    now: u64,
) -> Vec<CommandResult> {
    let mut r = vec![
        CommandResult {
            status: Status::Success,
            word: 0,
            aux: 0,
            plain: false,
        };
        cmds.len()
    ];
    s.execute_message(client.get(), flags, cmds, &mut r, now)
        .unwrap();
    r
}

/// A stand-in MAC for the tests (the runtime's is HMAC-SHA-256): any keyed function tells a
/// message MACed under the key from one that was not.
pub(crate) fn test_mac(key: &SessionKey, parts: &[&[u8]]) -> [u8; 32] {
    let mut h = u64::from_le_bytes(key.as_bytes()[..8].try_into().unwrap());
    let mut out = [0u8; 32];
    for (i, chunk) in out.chunks_mut(8).enumerate() {
        for &b in parts.iter().flat_map(|p| p.iter()) {
            h = (h ^ u64::from(b))
                .wrapping_mul(0x0100_0000_01b3)
                .rotate_left(17);
        }
        h ^= i as u64;
        chunk.copy_from_slice(&h.to_le_bytes());
    }
    out
}
