//! The client: how a process reaches a dlock server and takes its locks.
//!
//! # Which API to start with
//!
//! - **The native API — [`Locks`], the typed lock handles ([`AtomicLock`], [`RwLock`],
//!   [`FairLock`]) and their guards ([`AtomicLockGuard`], [`RwLockReadGuard`],
//!   [`RwLockWriteGuard`], [`FairLockReadGuard`], [`FairLockWriteGuard`], [`GuardSet`]) — is the
//!   default.** Locks are named and typed by kind (asking an atomic lock for a read guard does
//!   not compile), every taking call has a blocking and an async form usable from any
//!   executor, a grant is a guard that unlocks when dropped (without waiting for the answer)
//!   and carries its fencing token, and a handle is shared by any number of threads and tasks.
//!   It cannot leave a lock held by forgetting an unlock, and a busy lock is an
//!   [`ErrorKind::WouldBlock`] rather than a status to look up. Start here for new code.
//! - **The reference-shaped [`Client`] is the port path**: the reference's client API call by
//!   call (`get_lock`, `trylock(id, mode, expire_ms)`, batches of up to 31, the
//!   `lock_request_async`/`lock_result_check` pair, `umo_atomic64` objects,
//!   `update_all_locks` after a failover), with raw ids and `&mut self`, as the C ABI
//!   (`dlock-engine-glue`) and code written against the reference need it. It is also where the
//!   native API does not reach yet: objects, pipelined batches ([`Client::submit_trylock`])
//!   and recovery. [`Locks::with_client`] lends a handle's client for those.
//!
//! - **Cached locks for an engine — [`CachedLocks`], [`CachedRwLock`] and their guards** keep
//!   an RW grant after its guards drop, hand the next compatible guard out locally with no
//!   message, and give the lock back (or downgrade it) themselves when the server revokes it
//!   for another client; the engine polls [`Revokes::try_recv`] to learn what to flush
//!   (`cached/mod.rs`; MANAGER-SPEC §5).
//! - **Over a cluster**, both run unchanged over a [`cluster::ClusterLink`] instead of a
//!   [`Link`]: [`Client::connect_cluster`], [`Locks::connect_cluster`]. The link reads the
//!   cluster's map from any server, routes each lock to its partition's owner, follows moves
//!   within the call's deadline and re-claims what moved (`docs/cluster.md`, "Client").
//!
//! Both take their durations the same way: the reference-shaped calls' `u32` milliseconds keep
//! the reference's names, and every [`Duration`] becomes milliseconds by the core's one rule
//! ([`dlock_core::time::duration_to_ms`]).
//!
//! Both return one error type, [`Error`]: the reference's [`Status`] ([`Error::status`], what
//! the C ABI returns), the call that failed, and the I/O error behind a transport failure as its
//! source.
//!
//! # The reference-shaped client
//!
//! A [`Client`] is one registered client instance, used by one thread at a time (as in the
//! reference, where an instance has no internal locking). It keeps the reference's local state
//! per lock ([`local::LocalLock`]: re-entrancy count, cached word, fair ticket, fencing token), so
//! re-entrant `trylock`/`unlock` answer locally where the reference does, and a new server can be
//! rebuilt from the clients after a failover ([`Client::update_all_locks`]). `lock()` waits on
//! the server: the request is parked there and answered the moment the lock is granted or the
//! wait runs out — no polling loop, unlike the reference's 100 ms sleeps.
//!
//! Its calls live in one file per job: registration, heartbeat, stats and leaving in
//! `control.rs`; lock references (`get_lock`, `release_lock`) in `refs.rs`; lock operations
//! and batches in `locks.rs`, pipelined batches in `pipeline.rs`; `umo_atomic64` objects in
//! `objects.rs`; futures and the asynchronous pair in `futures.rs`; re-claiming after a
//! failover in `recovery.rs`. This file keeps the [`Client`] itself, its construction and the
//! plumbing every call goes through: one control exchange (`Client::control`), one data send
//! (`Client::send`, now or deferred for a future), one data round trip (`Client::round_trip`,
//! a send and `receive`), and one check of a reply against what was sent (`Inbox::accept`).
//!
//! On the shared-memory transport the `umo_atomic64` operations are one-sided atomics on the
//! region's object cells, and over RDMA one-sided verbs (FAA, CAS, 8-byte READ) on the same
//! cells, as the reference does them with NIC atomics; over TCP they are data commands. After
//! start-up the data path (lock commands and object operations) allocates nothing: frames are
//! encoded into buffers the client owns, and a failure that is not a transport's is an
//! [`Error`] without a source, built without allocating.

mod awaited;
pub mod cached;
pub mod cluster;
mod config;
mod connection;
mod control;
pub mod error;
mod events;
mod futures;
mod id_map;
pub mod link;
/// The client's record of one lock and its decisions: I/O-free, in `dlock-core`.
pub use dlock_core::client as local;
mod locks;
pub mod mux;
pub mod named;
mod objects;
mod pipeline;
#[cfg(feature = "rdma")]
mod rdma;
mod recovery;
mod refs;
mod retained;
mod table;
mod wire;

use std::io;
use std::time::{Duration, Instant};

use dlock_core::manager::Trust;
use dlock_core::manager::value::{ValueBlock, ValueRead};
use dlock_core::proto::{
    CONTROL_FRAME_MAX, Command, CommandResult, ControlHeader, ControlRequest, ControlRequestFrame,
    ControlResponse, DATA_REQUEST_WITH_VALUES_MAX, DATA_RESPONSE_WITH_VALUES_MAX, DataHeader,
    PROOF_LEN, PROTO_VERSION, decode_control_response, decode_data_response, encode_data_request,
    finish_value_requests, put_value_request,
};
use dlock_core::time::{duration_to_ms, elapsed_ms};
use dlock_core::{ClientId, GrantProof, ObjectId, Session, Status};

pub use cached::{CachedLocks, CachedReadGuard, CachedRwLock, CachedWriteGuard, Revoked, Revokes};
pub use config::{ClientConfig, REQUEST_TIMEOUT};
pub use connection::Connection;
pub use control::read_server_stats;
use error::Op;
pub use error::{Error, ErrorKind};
use futures::Pending;
pub use futures::{AsyncOp, LockFuture};
pub use id_map::{IdHasher, IdMap};
use link::Link;
pub use link::{Endpoint, Transport};
pub use local::{Decision, LocalLock, LocalState, Request};
pub use locks::Grant;
pub use mux::Mux;
pub use named::{
    AtomicLock, AtomicLockGuard, FairLock, FairLockReadGuard, FairLockWriteGuard, GuardSet,
    LockOptions, Locks, RwLock, RwLockReadGuard, RwLockWriteGuard, SetEntry, SetMode,
};
pub use objects::Cas;
use pipeline::Pipeline;
pub use retained::{RetainedLock, list_retained, recovery_done};
use table::LockTable;

const BATCH: usize = dlock_core::config::BATCH_MAX;

/// One registered client instance, over a [`Link`] (shared memory, TCP, RDMA) unless given
/// another [`Connection`].
#[derive(Debug)]
pub struct Client<C: Connection = Link> {
    cfg: ClientConfig,
    link: C,
    id: ClientId,
    /// The registration's secret, shown to resume it with `reinit`.
    session: Session,
    version: u8,
    recovering: bool,
    /// The records still carry the ids of a server that failed: a reinit found a replacement
    /// recovering, and `update_all_locks` has not completed since. Until it has, every reinit
    /// asks for the re-claim again, even once the server serves.
    reclaim: bool,
    /// The epoch of the server this client registered with last: the epoch of the proofs it
    /// hands out with grants.
    epoch: u16,
    /// The lease the server granted at the last (re)registration.
    lease: Duration,
    /// The revoke timeout the server said at the last (re)registration (ms; 0: an older server
    /// said nothing, `InitReply::revoke_timeout_ms`).
    revoke_timeout_told_ms: u32,
    /// Re-claims that filed the records under a replacement's ids ([`Client::renumberings`]).
    renumberings: u64,
    /// When (ms on this client's clock) the last request the server answered was sent: the
    /// server saw us alive no earlier, so our registration lasts at least the lease from here.
    heard_ms: u64,
    /// How long the cached grants may be used locally after the last answered data request
    /// (`dlock_core::manager::trust`; [`Client::poll_events`] applies it).
    trust: Trust,
    message_id: u16,
    locks: LockTable,
    /// Objects this client got, with their cell index.
    objects: IdMap<ObjectId, u32>,
    /// The asynchronous operation outstanding (`lock_request_async`, a [`LockFuture`]).
    pending: Option<Pending>,
    /// Batches submitted and not yet completed.
    pipeline: Pipeline,
    start: Instant,
    ctrl_req: Vec<u8>,
    ctrl_reply: Vec<u8>,
    data_req: [u8; DATA_REQUEST_WITH_VALUES_MAX],
    /// The last data reply, and its results decoded once.
    inbox: Inbox,
}

/// The oldest server version a standalone client registers with: 7 adds only the server's
/// revoke timeout to the registration's reply, which a version-6 server leaves zero (the client
/// then trusts its cached grants for its own [`ClientConfig::revoke_timeout`], else the lease,
/// as before).
const SERVER_VERSION_MIN: u8 = 6;

/// A client moves between threads (one at a time uses it).
const _: () = {
    const fn is_send<T: Send>() {}
    is_send::<Client>();
};

/// Whether a reply with `status` shows the server holds this client's registration (so the
/// lease runs from the request's send). Not "who are you?", and not `NotReady`: a recovering
/// server answers that to every client, registered or not.
fn renews_lease(status: Status) -> bool {
    !matches!(
        status,
        Status::ClientNotInit | Status::ClientRemovedByServer | Status::NotReady
    )
}

impl Client<Link> {
    /// Registers a new client instance (`client_init`). A server that cannot be reached is the
    /// reference's `NOT_READY`, a connection that fails after that `BAD_RESPONSE`; either way
    /// the I/O error is the [`Error`]'s [`source`](std::error::Error::source) — for TLS, why
    /// ([`Error::tls_failure`]: a refused certificate, an untrusted server, a wrong name, TLS
    /// against plaintext).
    ///
    /// ```
    /// # use dlock_core::Config;
    /// # use dlock_transport::runtime::{ServerConfig, ServerHandle};
    /// # let server = ServerHandle::start(ServerConfig::new(Config {
    /// #     locks_max: 64, clients_max: 4, objects_max: 4, ..Config::default()
    /// # }))?;
    /// use dlock_core::{LockKind, Mode, Status};
    /// use dlock_transport::client::{Client, ClientConfig, Endpoint};
    ///
    /// let mut client = Client::connect(ClientConfig::new(Endpoint::embedded(&server)))?;
    /// let id = client.get_lock(LockKind::Atomic, b"orders/rg-17")?;
    /// let grant = client.trylock(id, Mode::Exclusive, 5_000)?; // lease in ms, as the reference
    /// assert_eq!(grant.status, Status::Success);
    /// client.unlock(id)?;
    /// client.deinit()?;
    /// # server.stop();
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn connect(cfg: ClientConfig) -> Result<Client, Error> {
        let link = match &cfg.mux {
            Some(mux) => Link::connect_shared(&cfg.endpoint, mux.clone(), cfg.timeout),
            None => Link::connect_within(&cfg.endpoint, cfg.timeout),
        };
        let mut link = link.map_err(|e| Op::Connect.io_as(Status::NotReady, e))?;
        link.set_wait_awake(cfg.wait_awake);
        Client::over(link, cfg)
    }

    /// The data path this client uses: shared memory, TCP, or RDMA. An `Endpoint::Rdma`
    /// (feature `rdma`) client that found no usable device (or a server without RDMA) says
    /// `Tcp` here. `None` only after a failed [`Client::reinit`].
    pub fn transport(&self) -> Option<Transport> {
        self.link.transport()
    }

    /// Drops the data path while keeping the registration and the control connection, as if the
    /// data connection or queue pair had died: data operations fail until [`Client::reinit`].
    /// For fault-injection tests.
    #[doc(hidden)]
    pub fn drop_data_path(&mut self) {
        self.link.drop_data_path();
    }
}

impl<C: Connection> Client<C> {
    /// Registers a new client instance over `link`, a connection of the caller's own (a test's
    /// or a simulator's; [`Client::connect`] opens a [`Link`]). `cfg`'s endpoint is not used.
    pub fn over(link: C, cfg: ClientConfig) -> Result<Client<C>, Error> {
        // The registration's header names the newest version the client speaks (the body the
        // oldest): the configured cap, if lower (`ClientConfig::version_max`).
        let version = cfg.version_max.min(PROTO_VERSION);
        if version < SERVER_VERSION_MIN {
            return Err(Op::Connect.err(Status::Einval));
        }
        let start = link.now();
        let mut c = Client {
            link,
            id: ClientId::new(1).expect("1 is a valid id"),
            session: Session::NONE,
            version,
            recovering: false,
            reclaim: false,
            epoch: 0,
            lease: Duration::ZERO,
            revoke_timeout_told_ms: 0,
            renumberings: 0,
            // Any start will do (message ids only match replies to requests); a random one keeps
            // two instances of one process from looking alike in a capture.
            message_id: getrandom::u32().unwrap_or(0) as u16,
            heard_ms: 0,
            trust: Trust::new(),
            locks: LockTable::default(),
            objects: IdMap::default(),
            pending: None,
            pipeline: Pipeline::new(),
            start,
            ctrl_req: vec![0; CONTROL_FRAME_MAX],
            ctrl_reply: vec![0; CONTROL_FRAME_MAX],
            data_req: [0; DATA_REQUEST_WITH_VALUES_MAX],
            inbox: Inbox::new(),
            cfg,
        };
        let lease_ms = c.cfg.lease_ms();
        let init = ControlRequest::ClientInit {
            min_version: SERVER_VERSION_MIN,
            lease_ms,
        };
        c.register(Op::Connect, 0, init)?;
        Ok(c)
    }

    /// This instance's id.
    pub fn id(&self) -> ClientId {
        self.id
    }

    /// The protocol version the server and this client agreed on at the last
    /// (re)registration: the newest both speak, at most [`ClientConfig::version_max`].
    pub fn version(&self) -> u8 {
        self.version
    }

    /// The lease the server granted at the last (re)registration: what this client asked for,
    /// or less when that was above the server's maximum. Heartbeat well within it.
    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// The connection this client runs over (a cluster client's
    /// [`ClusterLink`](cluster::ClusterLink): its map version, the servers it joined).
    pub fn connection(&self) -> &C {
        &self.link
    }

    /// Whether the server said it was recovering at the last (re)registration.
    pub fn server_recovering(&self) -> bool {
        self.recovering
    }

    /// Now, on the clock of this client's connection (what its deadlines are measured with).
    pub(crate) fn now(&self) -> Instant {
        self.link.now()
    }

    /// Now as a tick of this client's clock (whole milliseconds since it started): the clock
    /// its leases and the trust in its cached grants are counted on, which the cached clients
    /// time their revokes by too.
    pub fn now_ms(&self) -> u64 {
        self.tick(self.link.now())
    }

    /// `at` as a tick of this client's clock: rounded down, so a grant counted from a send's
    /// tick began no later than it did (`dlock_core::time::elapsed_ms`).
    fn tick(&self, at: Instant) -> u64 {
        elapsed_ms(at.saturating_duration_since(self.start))
    }

    fn next_id(&mut self) -> u16 {
        self.message_id = self.message_id.wrapping_add(1);
        self.message_id
    }

    /// One control exchange for `op`; the reply body (a refusal as the error).
    fn control(
        &mut self,
        op: Op,
        word: u32,
        body: ControlRequest<'_>,
    ) -> Result<ControlResponse<'_>, Error> {
        let message_id = self.next_id();
        let header = ControlHeader {
            version: self.version,
            msg: body.msg_type(),
            message_id,
            word,
        };
        let n = dlock_core::proto::encode_control_request(
            &ControlRequestFrame { header, body },
            &mut self.ctrl_req,
        )
        .map_err(|_| op.err(Status::Einval))?;
        let sent_ms = self.now_ms();
        let deadline = Some(self.link.now() + self.cfg.timeout);
        let m = self
            .link
            .control(&self.ctrl_req[..n], &mut self.ctrl_reply, deadline)
            .map_err(|e| op.io(e))?;
        let reply = decode_control_response(&self.ctrl_reply[..m])
            .map_err(|_| op.err(Status::BadResponse))?;
        if reply.header.message_id != message_id || reply.header.msg != header.msg {
            return Err(op.err(Status::BadResponse));
        }
        let status = reply.header.status();
        if status.is_some_and(renews_lease) {
            self.heard_ms = self.heard_ms.max(sent_ms);
        }
        match status {
            Some(Status::Success) => Ok(reply.body),
            Some(s) => Err(op.err(s)),
            None => Err(op.err(Status::BadResponse)),
        }
    }

    /// Encodes `commands` as one data message and sends it: `Dispatch::Now`, or deferred for a
    /// caller that will not wait for the reply now (see
    /// [`Link::send_data_deferred`](link::Link::send_data_deferred)). `blocks` is empty or has
    /// one entry per command: the value block command `i` writes (an exclusive unlock flagged
    /// `VALUE_BLOCK`, [`Request::value_block`]), sent in the request's value trailer. Returns
    /// what the reply must match.
    fn send(
        &mut self,
        op: Op,
        commands: &[Command],
        blocks: &[Option<ValueBlock>],
        flags: u32,
        dispatch: Dispatch,
    ) -> Result<Sent, Error> {
        let message_id = self.next_id();
        let header = DataHeader {
            version: self.version,
            count: 0,
            message_id,
            client: self.id.get(),
            flags,
        };
        let mut n = encode_data_request(&header, commands, &mut self.data_req)
            .map_err(|_| op.err(Status::Einval))?;
        let mut first = true;
        for (i, block) in blocks.iter().enumerate() {
            if let Some(block) = block {
                put_value_request(&mut self.data_req, commands.len(), i, block, first)
                    .map_err(|_| op.err(Status::Einval))?;
                first = false;
            }
        }
        if !first {
            n = finish_value_requests(&mut self.data_req, commands.len())
                .map_err(|_| op.err(Status::Einval))?;
        }
        let req = &self.data_req[..n];
        let ticket = match dispatch {
            Dispatch::Now => self.link.send_data(req),
            Dispatch::Deferred => self.link.send_data_deferred(req),
        }
        .map_err(|e| op.io(e))?;
        Ok(Sent {
            ticket,
            message_id,
            count: commands.len(),
        })
    }

    /// Sends `commands` as one data message and waits for the reply until `deadline`; the
    /// results are in [`Client::inbox`]. Returns when (ms on this client's clock) the message
    /// was sent: the server answered no earlier, so grants and leases are counted from there.
    /// Every synchronous data call goes through here.
    fn round_trip(
        &mut self,
        op: Op,
        commands: &[Command],
        blocks: &[Option<ValueBlock>],
        flags: u32,
        deadline: Instant,
    ) -> Result<u64, Error> {
        // Batches in flight have their replies queued ahead of this one's.
        if self.pipeline.len() > 0 {
            return Err(op.err(Status::Easync));
        }
        let sent_ms = self.now_ms();
        let sent = self.send(op, commands, blocks, flags, Dispatch::Now)?;
        let command = |i: usize| commands[i];
        receive(
            &mut self.link,
            &mut self.inbox,
            op,
            sent,
            command,
            None,
            || Some(deadline),
        )?;
        self.heard(sent_ms);
        Ok(sent_ms)
    }

    /// The server answered a data request sent at `sent_ms`: every revoke it sent before it
    /// read the request has arrived (the data path is in order), and, for a reply that is not
    /// "who are you?", the lease runs from `sent_ms`.
    fn heard(&mut self, sent_ms: u64) {
        self.trust.answered(sent_ms);
        if renews_lease(self.inbox.results[0].status) {
            self.heard_ms = self.heard_ms.max(sent_ms);
        }
    }

    /// Whether the server may have declared this client dead: nothing it answered was sent
    /// within the lease. Its grants may then have been given to others, so a replacement
    /// server must not be told of them ([`Client::reinit`]).
    fn lease_lapsed(&self) -> bool {
        self.now_ms() > self.heard_ms + u64::from(duration_to_ms(self.lease))
    }

    /// The proof of result `i` of the last data exchange, issued by this client's server.
    fn proof(&self, i: usize) -> GrantProof {
        GrantProof {
            epoch: u32::from(self.epoch),
            mac: self.inbox.proofs[i],
        }
    }

    /// The value block result `i` of the last data exchange returned (its command asked for
    /// it and was granted).
    fn value(&self, i: usize) -> Option<ValueRead> {
        self.inbox.values[i]
    }
}

/// When a data message leaves ([`Client::send`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Dispatch {
    /// At once: the caller waits for the reply, or keeps the server busy meanwhile (a pipeline).
    Now,
    /// When the transport likes (a shared connection sends it with the next burst): the caller
    /// is a future that will be polled for the reply.
    Deferred,
}

/// A data message on its way: what its reply must match.
#[derive(Clone, Copy, Debug)]
struct Sent {
    /// The link's ticket for it.
    ticket: u64,
    /// The message id the reply must echo.
    message_id: u16,
    /// Commands it carried.
    count: usize,
}

/// The last data reply as it came, and its results decoded once.
#[derive(Debug)]
struct Inbox {
    buf: [u8; DATA_RESPONSE_WITH_VALUES_MAX],
    results: [CommandResult; BATCH],
    /// The proofs of its grants and tickets (zero where none).
    proofs: [[u8; PROOF_LEN]; BATCH],
    /// The value blocks its grants returned (`None` where not asked or not granted).
    values: [Option<ValueRead>; BATCH],
}

impl Inbox {
    fn new() -> Inbox {
        Inbox {
            buf: [0; DATA_RESPONSE_WITH_VALUES_MAX],
            results: [CommandResult::status(Status::Success); BATCH],
            proofs: [[0; PROOF_LEN]; BATCH],
            values: [None; BATCH],
        }
    }

    /// Checks the reply in `buf[..len]` against `sent`, whose command `i` was `command(i)`, and
    /// decodes its results: `Ok(None)` when it answers another message (a late reply to one
    /// given up on), `BadResponse` when it does not answer these commands. The one place a
    /// client reads a data reply.
    fn accept(
        &mut self,
        len: usize,
        sent: &Sent,
        command: impl Fn(usize) -> Command,
    ) -> Result<Option<usize>, Status> {
        let reply = decode_data_response(&self.buf[..len]).map_err(|_| Status::BadResponse)?;
        if reply.header().message_id != sent.message_id {
            return Ok(None);
        }
        if reply.len() != sent.count {
            return Err(Status::BadResponse);
        }
        for i in 0..sent.count {
            let (r, c) = (reply.result(i), command(i));
            if r.kind != c.kind_code() || r.op != c.op_code() || r.id != c.id() {
                return Err(Status::BadResponse);
            }
            self.results[i] = r.result;
            self.proofs[i] = reply.proof_mac(i);
            self.values[i] = reply.value(i);
        }
        Ok(Some(sent.count))
    }
}

/// Waits until `deadline()` (asked only if the reply has not arrived yet) for the reply to
/// `sent`, whose command `i` was `command(i)`, and accepts it into `inbox`; `arrived` is the
/// length of the reply already in `inbox` when the caller polled for it. Takes the client's
/// parts rather than the client, so a caller can describe the commands from its own records
/// without copying them out first (a pipelined batch).
fn receive<C: Connection>(
    link: &mut C,
    inbox: &mut Inbox,
    op: Op,
    sent: Sent,
    command: impl Fn(usize) -> Command,
    arrived: Option<usize>,
    deadline: impl Fn() -> Option<Instant>,
) -> Result<usize, Error> {
    let mut asked = None;
    let mut deadline = || *asked.get_or_insert_with(&deadline);
    let mut arrived = match arrived {
        Some(len) => Some(len),
        None => link
            .try_recv_data(sent.ticket, &mut inbox.buf)
            .map_err(|e| op.io(e))?,
    };
    loop {
        let len = match arrived {
            Some(len) => len,
            None => link
                .recv_data(sent.ticket, &mut inbox.buf, deadline())
                .map_err(|e| op.io(e))?
                // No reply in time: the reference's `BAD_RESPONSE` (the caller reinits).
                .ok_or_else(|| op.io(io::ErrorKind::TimedOut.into()))?,
        };
        // A reply to an earlier request this client gave up on (a timeout over TCP) may still
        // come first: skip it rather than let every later exchange read the one before it.
        match inbox.accept(len, &sent, &command) {
            Ok(Some(n)) => return Ok(n),
            Ok(None) => arrived = None,
            Err(s) => return Err(op.err(s)),
        }
    }
}

/// A batch call's entry count, as the reference checks it: 1 to 31 entries, `Einval`
/// otherwise (also where every entry would have been answered without the server).
#[inline]
fn batch_count(op: Op, n: usize) -> Result<(), Error> {
    match n {
        1..=BATCH => Ok(()),
        _ => Err(op.err(Status::Einval)),
    }
}
