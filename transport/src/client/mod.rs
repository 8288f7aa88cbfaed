//! The thin client: every operation of the reference's client API, in Rust types.
//!
//! A [`Client`] is one registered client instance, used by one thread at a time (as in the
//! reference, where an instance has no internal locking). It keeps the reference's local state
//! per lock ([`local::LocalLock`]: re-entrancy count, cached word, fair ticket, fencing token), so
//! re-entrant `trylock`/`unlock` answer locally where the reference does, and a new server can be
//! rebuilt from the clients after a failover ([`Client::update_all_locks`]).
//!
//! `lock()` waits on the server: the request is parked there and answered the moment the lock is
//! granted or the wait runs out — no polling loop, unlike the reference's 100 ms sleeps.
//!
//! Batches of up to 31 operations go in one message; [`Client::submit_trylock`],
//! [`Client::submit_unlock`] and [`Client::complete`] keep up to four such messages in flight,
//! so the client prepares the next batch while the server executes the one before.
//!
//! On the shared-memory transport the `umo_atomic64` operations are one-sided atomics on the
//! region's object cells, and over RDMA one-sided verbs (FAA, CAS, 8-byte READ) on the same
//! cells, as the reference does them with NIC atomics; over TCP they are data commands. After
//! start-up the data path (lock commands and object operations) allocates nothing: frames are
//! encoded into buffers the client owns.

mod awaited;
mod connection;
pub mod error;
pub mod link;
/// The client's record of one lock and its decisions: I/O-free, in `dlock-core`.
pub use dlock_core::client as local;
pub mod mux;
pub mod named;
mod pipeline;
#[cfg(feature = "rdma")]
mod rdma;
mod table;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use dlock_core::proto::{
    Batch, BatchEntry, CONTROL_FRAME_MAX, Command, CommandResult, ControlHeader, ControlRequest,
    ControlRequestFrame, ControlResponse, DATA_MESSAGE_MAX, DATA_RESPONSE_MAX, DataHeader,
    LockClaim, ObjectCommand, ObjectOp, PROOF_LEN, PROTO_VERSION, decode_control_response,
    decode_data_response, encode_data_request,
};
use dlock_core::server::Counter;
use dlock_core::{
    ClientId, FencingToken, GrantProof, LockId, LockKind, Mode, ObjectId, Session, Status,
};

pub use connection::Connection;
pub use error::{Error, ErrorKind};
use link::Link;
pub use link::{Endpoint, Transport};
pub use local::{Decision, LocalLock, LocalState, Request};
pub use mux::Mux;
pub use named::{Guard, GuardSet, Locks, NamedLock, OwnedGuard};
use pipeline::Pipeline;
use table::{Entry, LockTable};

use crate::sync::Ordering;

/// How long a synchronous request may take before the client gives up (the reference's 5 s).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Client settings: [`ClientConfig::new`] and the `with_*` methods, or field by field.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ClientConfig {
    /// Where the server is.
    pub endpoint: Endpoint,
    /// The lease to ask for (zero: the server's default), in whole milliseconds. The server
    /// grants at most its maximum ([`Client::lease`] says what it granted). Heartbeat well
    /// within it.
    pub lease: Duration,
    /// The synchronous request timeout.
    pub timeout: Duration,
    /// How long a wait for a reply over shared memory stays awake (polling, then backing off
    /// and yielding) before it sleeps. A sleeping waiter is woken by a futex, which costs tens of
    /// microseconds; a waiter that stays awake sees a lock handed over within microseconds but
    /// keeps a core busy meanwhile. Default zero: the 20 µs every wait polls first (enough for
    /// any reply that is not a parked `lock()`), then sleep.
    pub wait_awake: Duration,
    /// A data connection to share with other clients of this process (TCP and TLS
    /// endpoints); `None`: a connection of its own.
    pub mux: Option<Mux>,
}

impl ClientConfig {
    /// Defaults for `endpoint`: the server's lease, the reference's 5 s timeout.
    pub fn new(endpoint: Endpoint) -> Self {
        Self {
            endpoint,
            lease: Duration::ZERO,
            timeout: REQUEST_TIMEOUT,
            wait_awake: Duration::ZERO,
            mux: None,
        }
    }

    /// Shares `mux`'s data connection with the other clients given it (see [`Mux`]).
    pub fn with_mux(mut self, mux: Mux) -> Self {
        self.mux = Some(mux);
        self
    }

    /// Asks for `lease` (see [`ClientConfig::lease`]).
    pub fn with_lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// Gives up a synchronous request after `timeout`.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Stays awake `awake` waiting for a shared-memory reply (see [`ClientConfig::wait_awake`]).
    pub fn with_wait_awake(mut self, awake: Duration) -> Self {
        self.wait_awake = awake;
        self
    }

    /// The lease as the wire carries it: whole milliseconds, rounded up, at most `u32::MAX`.
    fn lease_ms(&self) -> u32 {
        u32::try_from(self.lease.as_micros().div_ceil(1_000)).unwrap_or(u32::MAX)
    }
}

/// A granted (or re-entered) lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use = "a grant's fencing token must go with every write the lock protects"]
pub struct Grant {
    /// `Success`, or `AlreadyLocked` for a re-entry.
    pub status: Status,
    /// The grant's fencing token: pass it with every write the lock protects.
    pub token: FencingToken,
    /// The lock word the server returned.
    pub word: u128,
}

/// What a compare-and-swap saw.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cas {
    /// Whether the swap happened.
    pub swapped: bool,
    /// The value found (the expected value when it swapped).
    pub observed: u64,
}

/// An asynchronous lock operation (`lock_request_async`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AsyncOp {
    /// Trylock in a mode for a lease (ms).
    Lock(Mode, u32),
    /// Unlock.
    Unlock,
    /// Extend the grant held in a mode (`Einval` when it is not held in that mode) by a lease
    /// (ms).
    Extend(Mode, u32),
    /// Lock in a mode for a lease (ms), waiting on the server up to the duration for it (a
    /// blocking `lock()` that holds no thread: see [`Client::lock_async`]).
    LockWait(Mode, u32, Duration),
}

/// A hasher for the client's own id maps: lock and object ids are distinct small integers the
/// server chose, so SipHash's protection against chosen keys buys nothing here and costs a
/// fifth of a batch's client-side time. A multiply spreads the id over the high bits the table
/// uses for its tags.
#[derive(Clone, Copy, Debug, Default)]
struct IdHasher(u64);

impl std::hash::Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ b as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }

    fn write_u32(&mut self, v: u32) {
        self.0 = (self.0 ^ v as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

type IdMap<K, V> = HashMap<K, V, std::hash::BuildHasherDefault<IdHasher>>;

#[derive(Debug, Clone, Copy)]
struct Pending {
    lock: LockId,
    request: Request,
    /// The message id the reply must echo (control calls meanwhile move `Client::message_id`).
    message_id: u16,
    /// The link's ticket for the message.
    ticket: u64,
    started: Instant,
    /// How long the server may hold the request waiting for the lock.
    wait: Duration,
}

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
    /// When (ms on this client's clock) the last request the server answered was sent: the
    /// server saw us alive no earlier, so our registration lasts at least the lease from here.
    heard_ms: u64,
    message_id: u16,
    locks: LockTable,
    /// Objects this client got, with their cell index.
    objects: IdMap<ObjectId, u32>,
    pending: Option<Pending>,
    /// Batches submitted and not yet completed.
    pipeline: Pipeline,
    start: Instant,
    ctrl_req: Vec<u8>,
    ctrl_reply: Vec<u8>,
    data_req: [u8; DATA_MESSAGE_MAX],
    data_reply: [u8; DATA_RESPONSE_MAX],
    /// The results of the last data exchange, decoded once.
    replies: [CommandResult; dlock_core::config::BATCH_MAX],
    /// The proofs of the last data exchange's grants and tickets (zero where none).
    proofs: [[u8; PROOF_LEN]; dlock_core::config::BATCH_MAX],
}

/// A lock operation in flight as a future ([`Client::lock_async`]).
#[derive(Debug)]
#[must_use = "a future does nothing until polled"]
pub struct LockFuture<'c, C: Connection = Link> {
    client: &'c mut Client<C>,
    id: LockId,
    op: AsyncOp,
    started: bool,
}

impl<C: Connection> std::future::Future for LockFuture<'_, C> {
    type Output = Result<Grant, Status>;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        use std::task::Poll;
        // Unpin: it holds a reference and plain values.
        let this = self.get_mut();
        if !this.started {
            this.started = true;
            match this.client.start_async(this.id, this.op) {
                Err(s) => return Poll::Ready(Err(s)),
                Ok(Some(done)) => return Poll::Ready(done),
                Ok(None) => {}
            }
        }
        match this.client.check_pending(Some(cx.waker())) {
            Err(Status::AsyncAgain) => Poll::Pending,
            done => Poll::Ready(done),
        }
    }
}

/// Whether a reply with `status` shows the server holds this client's registration (so the
/// lease runs from the request's send). Not "who are you?", and not `NotReady`: a recovering
/// server answers that to every client, registered or not.
fn renews_lease(status: Status) -> bool {
    !matches!(
        status,
        Status::ClientNotInit | Status::ClientRemovedByServer | Status::NotReady
    )
}

/// A transport failure is the reference's `BAD_RESPONSE` (the caller reinits). The I/O error
/// is parked for the native API, which attaches it to its [`Error`] (see [`error`]).
fn io_status(e: std::io::Error) -> Status {
    tracing::debug!(error = %e, "transport failure");
    error::park_io_error(e);
    Status::BadResponse
}

impl Client<Link> {
    /// Registers a new client instance (`client_init`).
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
    pub fn connect(cfg: ClientConfig) -> Result<Client, Status> {
        let mut link = Link::connect(&cfg.endpoint).map_err(|e| {
            // Kept for `Client::open` and `Locks::connect`, which attach it to their error.
            tracing::debug!(error = %e, "cannot connect");
            error::park_io_error(e);
            Status::NotReady
        })?;
        link.set_wait_awake(cfg.wait_awake);
        link.set_mux(cfg.mux.clone());
        Client::over(link, cfg)
    }

    /// As [`Client::connect`], with the native [`Error`]: its status is the one `connect`
    /// returns, and when the server could not be reached (`NOT_READY`) or the connection failed
    /// (`BAD_RESPONSE`) the I/O error is its [`source`](std::error::Error::source) — for TLS,
    /// why ([`Error::tls_failure`]: a refused certificate, an untrusted server, a wrong name,
    /// TLS against plaintext).
    pub fn open(cfg: ClientConfig) -> Result<Client, Error> {
        let slot = error::IoSlot::arm();
        Client::connect(cfg).map_err(|s| slot.error(error::Op::Connect, s))
    }

    /// The data path this client uses: shared memory, TCP, or RDMA. An `Endpoint::Rdma`
    /// (feature `rdma`) client that found no usable device (or a server without RDMA) says `Tcp` here. `None`
    /// only after a failed [`Client::reinit`].
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
    pub fn over(link: C, cfg: ClientConfig) -> Result<Client<C>, Status> {
        let start = link.now();
        let mut c = Client {
            link,
            id: ClientId::new(1).expect("1 is a valid id"),
            session: Session::NONE,
            version: PROTO_VERSION,
            recovering: false,
            reclaim: false,
            epoch: 0,
            lease: Duration::ZERO,
            // Any start will do (message ids only match replies to requests); a random one keeps
            // two instances of one process from looking alike in a capture.
            message_id: getrandom::u32().unwrap_or(0) as u16,
            heard_ms: 0,
            locks: LockTable::default(),
            objects: IdMap::default(),
            pending: None,
            pipeline: Pipeline::new(),
            start,
            ctrl_req: vec![0; CONTROL_FRAME_MAX],
            ctrl_reply: vec![0; CONTROL_FRAME_MAX],
            data_req: [0; DATA_MESSAGE_MAX],
            data_reply: [0; DATA_RESPONSE_MAX],
            replies: [CommandResult {
                status: Status::Success,
                word: 0,
                aux: 0,
            }; dlock_core::config::BATCH_MAX],
            proofs: [[0; PROOF_LEN]; dlock_core::config::BATCH_MAX],
            cfg,
        };
        let lease_ms = c.cfg.lease_ms();
        c.register(
            0,
            ControlRequest::ClientInit {
                min_version: PROTO_VERSION,
                lease_ms,
            },
        )?;
        Ok(c)
    }

    fn register(&mut self, word: u32, body: ControlRequest<'_>) -> Result<(), Status> {
        let reply = self.control(word, body)?;
        let ControlResponse::Init(init) = reply else {
            return Err(Status::BadResponse);
        };
        self.session = init.session;
        self.id = ClientId::new(init.client).ok_or(Status::BadResponse)?;
        self.version = init.version;
        self.recovering = init.recovering;
        self.epoch = init.epoch;
        self.lease = Duration::from_millis(init.lease_ms.into());
        self.link
            .attach(init.client, init.slot, init.session)
            .map_err(io_status)
    }

    /// This instance's id.
    pub fn id(&self) -> ClientId {
        self.id
    }

    /// The lease the server granted at the last (re)registration: what this client asked for,
    /// or less when that was above the server's maximum. Heartbeat well within it.
    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// Whether the server said it was recovering at the last (re)registration.
    pub fn server_recovering(&self) -> bool {
        self.recovering
    }

    fn now_ms(&self) -> u64 {
        self.link
            .now()
            .saturating_duration_since(self.start)
            .as_millis() as u64
    }

    fn next_id(&mut self) -> u16 {
        self.message_id = self.message_id.wrapping_add(1);
        self.message_id
    }

    /// One control exchange; the reply body (errors as `Err(status)`).
    fn control(
        &mut self,
        word: u32,
        body: ControlRequest<'_>,
    ) -> Result<ControlResponse<'_>, Status> {
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
        .map_err(|_| Status::Einval)?;
        let sent_ms = self.now_ms();
        let deadline = Some(self.link.now() + self.cfg.timeout);
        let m = self
            .link
            .control(&self.ctrl_req[..n], &mut self.ctrl_reply, deadline)
            .map_err(io_status)?;
        let reply =
            decode_control_response(&self.ctrl_reply[..m]).map_err(|_| Status::BadResponse)?;
        if reply.header.message_id != message_id || reply.header.msg != header.msg {
            return Err(Status::BadResponse);
        }
        let status = reply.header.status();
        if status.is_some_and(renews_lease) {
            self.heard_ms = self.heard_ms.max(sent_ms);
        }
        match status {
            Some(Status::Success) => Ok(reply.body),
            Some(s) => Err(s),
            None => Err(Status::BadResponse),
        }
    }

    /// Re-registers with the same id over new connections after a network error or a server
    /// failover (`client_reinit`); keeps the local lock state. Returns whether to re-claim
    /// (then call [`Client::update_all_locks`] and [`Client::reinit_done`]): the server is
    /// recovering, or it was when this client re-registered before and the re-claim has not
    /// completed since (a reply lost, say). The server answers such a late re-claim with the
    /// ids of what it restored for this client, so none of it is forgotten; until then the
    /// records carry the failed server's ids, and `get_lock` answers `NotReady`.
    ///
    /// When it is, no grant is certain until `update_all_locks` has answered: the replacement
    /// may start serving without this client's claims (its recovery deadline passed, or it did
    /// not expect this client) and grant the locks to others; the claims are then refused and
    /// the records forgotten. Act on a lock again only once it has been re-claimed. A client
    /// that was silent for longer than its lease claims nothing when it re-registers with a
    /// replacement: the old server may have freed its grants before it died. (Resuming its
    /// registration with the recovering server it already re-claimed from, it keeps them: that
    /// server still holds what it restored, whatever a recovering server's `NotReady`s did to
    /// the client's own count of its lease.)
    pub fn reinit(&mut self) -> Result<bool, Status> {
        // Read before the registration below renews it. (`ClientLeaseLapse` puts back the bug
        // the simulator found, for the test that proves its seed still finds it.)
        let lapsed = self.lease_lapsed() && !dlock_core::mutated!(ClientLeaseLapse);
        self.link.reconnect().map_err(|_| Status::NotReady)?;
        self.pending = None;
        self.pipeline.clear();
        for e in self.locks.iter_mut() {
            e.busy = false;
        }
        let lease_ms = self.cfg.lease_ms();
        let session = self.session;
        self.register(
            self.id.get(),
            ControlRequest::ClientReinit {
                min_version: PROTO_VERSION,
                lease_ms,
                session,
            },
        )?;
        // A server that still knows this client hands its session back; a replacement that
        // took it back in recovery mints a new one. Only a replacement can lack our grants.
        let resumed = self.session == session;
        if self.recovering {
            self.reclaim = true;
            // Objects do not survive a failover; the caller re-creates and re-gets them.
            self.objects.clear();
            if lapsed && !resumed {
                // Silent longer than the lease: the old server may have freed our grants and
                // given them to others before it died. Claiming them would tell the new one we
                // held them all along; they are lost instead (the locks stay referenced).
                for e in self.locks.iter_mut() {
                    e.local = LocalLock::new(e.local.id, e.local.kind);
                }
            }
        }
        Ok(self.recovering || self.reclaim)
    }

    /// Tells the server this client finished re-syncing (`client_reinit_done`).
    pub fn reinit_done(&mut self) -> Result<(), Status> {
        self.control(self.id.get(), ControlRequest::ReinitDone)
            .map(drop)
    }

    /// Leaves (`client_deinit`): the server releases everything this client held. The client
    /// is gone whatever the answer, as in the reference; to keep it when the server refuses,
    /// use [`Client::try_deinit`].
    pub fn deinit(mut self) -> Result<(), Status> {
        self.try_deinit()
    }

    /// Leaves (`client_deinit`) if the server lets it: on success the server has released
    /// everything this client held, and so has the client (its records are cleared; further
    /// calls are refused by the server). A recovering server answers `NotReady` and keeps the
    /// client and its locks: so does this client, to call again once the server serves —
    /// dropping it instead would leave the server holding its locks until its lease ends.
    pub fn try_deinit(&mut self) -> Result<(), Status> {
        self.control(self.id.get(), ControlRequest::ClientDeinit)?;
        self.locks.drain();
        self.objects.clear();
        self.pending = None;
        self.pipeline.clear();
        Ok(())
    }

    /// Renews the lease.
    pub fn heartbeat(&mut self) -> Result<(), Status> {
        self.control(self.id.get(), ControlRequest::Heartbeat)
            .map(drop)
    }

    /// The server's counters.
    pub fn server_stats(&mut self) -> Result<Vec<(&'static str, u64)>, Status> {
        named_counters(self.control(self.id.get(), ControlRequest::Stats)?)
    }

    /// Creates or joins the lock `name` of `kind` (`get_lock`).
    pub fn get_lock(&mut self, kind: LockKind, name: &[u8]) -> Result<LockId, Status> {
        // A recovering server answers NotReady; records with a failed server's ids could be
        // confused with the ids of this one.
        if self.recovering || self.reclaim {
            return Err(Status::NotReady);
        }
        let reply = self.control(self.id.get(), ControlRequest::GetLock { kind, name })?;
        let ControlResponse::Lock { lock } = reply else {
            return Err(Status::BadResponse);
        };
        let id = LockId::from_raw(lock).ok_or(Status::BadResponse)?;
        self.track(id, kind, name);
        Ok(id)
    }

    fn track(&mut self, id: LockId, kind: LockKind, name: &[u8]) {
        self.locks.get_or_insert_with(id, || Entry {
            local: LocalLock::new(id, kind),
            name: name.into(),
            busy: false,
        });
    }

    /// `get_lock` for 1 to 31 names (`Einval` for none or more); each entry succeeds or fails
    /// on its own.
    pub fn batch_get_lock(
        &mut self,
        names: &[(LockKind, &[u8])],
    ) -> Result<Vec<Result<LockId, Status>>, Status> {
        batch_count(names.len())?;
        if self.recovering || self.reclaim {
            return Err(Status::NotReady);
        }
        let reply = self.control(
            self.id.get(),
            ControlRequest::BatchGetLock(Batch::from_slice(names)),
        )?;
        let ControlResponse::Entries(entries) = reply else {
            return Err(Status::BadResponse);
        };
        let got: Vec<BatchEntry> = entries.iter().collect();
        let mut out = Vec::with_capacity(got.len());
        for (e, &(kind, name)) in got.iter().zip(names) {
            out.push(match (e.status, LockId::from_raw(e.id)) {
                (Status::Success, Some(id)) => {
                    self.track(id, kind, name);
                    Ok(id)
                }
                (Status::Success, None) => Err(Status::BadResponse),
                (s, _) => Err(s),
            });
        }
        Ok(out)
    }

    /// Drops this client's reference to `id` (`release_lock`); refused while locked or ticketed,
    /// and (`Easync`) while an operation on it is in flight.
    pub fn release_lock(&mut self, id: LockId) -> Result<(), Status> {
        self.releasable(&id)?;
        self.control(
            self.id.get(),
            ControlRequest::ReleaseLock { lock: id.raw() },
        )?;
        self.locks.remove(id);
        Ok(())
    }

    /// Whether this client may drop its reference to `id`: it has one, the lock is neither held
    /// nor ticketed, and no operation on it is in flight (an asynchronous request or a pipelined
    /// batch: its reply must find the record).
    fn releasable(&self, id: &LockId) -> Result<(), Status> {
        let e = self.locks.get(*id).ok_or(Status::LockNotGet)?;
        e.local.releasable()?;
        if e.busy || self.pending.is_some_and(|p| p.lock == *id) {
            return Err(Status::Easync);
        }
        Ok(())
    }

    /// `release_lock` for 1 to 31 ids (`Einval` for none or more, as in the reference, even
    /// when no id could be released and nothing would be sent); each entry on its own.
    pub fn batch_release_lock(
        &mut self,
        ids: &[LockId],
    ) -> Result<Vec<Result<(), Status>>, Status> {
        batch_count(ids.len())?;
        let eligible: Vec<u32> = ids
            .iter()
            .filter(|id| self.releasable(id).is_ok())
            .map(|id| id.raw())
            .collect();
        let mut statuses: HashMap<u32, Status> = HashMap::new();
        if !eligible.is_empty() {
            let reply = self.control(
                self.id.get(),
                ControlRequest::BatchReleaseLock(Batch::from_slice(&eligible)),
            )?;
            let ControlResponse::Entries(entries) = reply else {
                return Err(Status::BadResponse);
            };
            for (e, raw) in entries.iter().zip(&eligible) {
                statuses.insert(*raw, e.status);
            }
        }
        Ok(ids
            .iter()
            .map(|id| match self.releasable(id) {
                Err(s) => Err(s),
                Ok(()) => match statuses
                    .get(&id.raw())
                    .copied()
                    .unwrap_or(Status::BadResponse)
                {
                    Status::Success => {
                        self.locks.remove(*id);
                        Ok(())
                    }
                    s => Err(s),
                },
            })
            .collect())
    }

    fn local(&mut self, id: LockId) -> Result<&mut LocalLock, Status> {
        if self.pending.is_some() || self.pipeline.len() > 0 {
            return Err(Status::Easync);
        }
        self.locks
            .get_mut(id)
            .map(|e| &mut e.local)
            .ok_or(Status::LockNotGet)
    }

    /// Sends `commands` as one data message and waits for the reply until `deadline`.
    fn exchange(
        &mut self,
        commands: &[Command],
        flags: u32,
        deadline: Option<Instant>,
    ) -> Result<usize, Status> {
        // Batches in flight have their replies queued ahead of this one's.
        if self.pipeline.len() > 0 {
            return Err(Status::Easync);
        }
        let sent_ms = self.now_ms();
        let (ticket, message_id) = self.send(commands, flags)?;
        let n = self.receive(ticket, message_id, commands, || deadline)?;
        self.heard(sent_ms);
        Ok(n)
    }

    /// The server answered a request sent at `sent_ms` (a reply that is not "who are you?").
    fn heard(&mut self, sent_ms: u64) {
        if self.replies.first().is_some_and(|r| renews_lease(r.status)) {
            self.heard_ms = self.heard_ms.max(sent_ms);
        }
    }

    /// Whether the server may have declared this client dead: nothing it answered was sent
    /// within the lease. Its grants may then have been given to others, so a replacement
    /// server must not be told of them ([`Client::reinit`]).
    fn lease_lapsed(&self) -> bool {
        self.now_ms() > self.heard_ms + self.lease.as_millis() as u64
    }

    /// Encodes and sends `commands` as one data message; returns the link's ticket and the
    /// message id the reply must echo.
    fn send(&mut self, commands: &[Command], flags: u32) -> Result<(u64, u16), Status> {
        self.send_with(commands, flags, false)
    }

    /// [`Client::send`]; `deferred`: for a caller that will not wait for the reply now (see
    /// [`Link::send_data_deferred`](link::Link::send_data_deferred)).
    fn send_with(
        &mut self,
        commands: &[Command],
        flags: u32,
        deferred: bool,
    ) -> Result<(u64, u16), Status> {
        let message_id = self.next_id();
        let header = DataHeader {
            version: self.version,
            count: 0,
            message_id,
            client: self.id.get(),
            flags,
        };
        let n = encode_data_request(&header, commands, &mut self.data_req)
            .map_err(|_| Status::Einval)?;
        let req = &self.data_req[..n];
        let sent = match deferred {
            true => self.link.send_data_deferred(req),
            false => self.link.send_data(req),
        };
        Ok((sent.map_err(io_status)?, message_id))
    }

    /// Waits until `deadline()` (asked only if the reply has not arrived yet) for the reply to
    /// the message sent as (`ticket`, `message_id`) with `commands`, checks that it answers
    /// them, and decodes the results into `replies`.
    fn receive(
        &mut self,
        ticket: u64,
        message_id: u16,
        commands: &[Command],
        deadline: impl Fn() -> Option<Instant>,
    ) -> Result<usize, Status> {
        let sent = Sent {
            ticket,
            message_id,
            count: commands.len(),
        };
        receive(
            &mut self.link,
            &mut self.data_reply,
            (&mut self.replies, &mut self.proofs),
            sent,
            |i| commands[i],
            deadline,
        )
    }

    /// Result `i` of the last data exchange (decoded once, by `exchange`).
    fn result(&self, i: usize) -> CommandResult {
        self.replies[i]
    }

    /// The proof of result `i` of the last data exchange, issued by this client's server.
    fn proof(&self, i: usize) -> GrantProof {
        GrantProof {
            epoch: self.epoch,
            mac: self.proofs[i],
        }
    }

    /// Runs one lock decision to its end: sends it (or not), applies the reply.
    fn run(
        &mut self,
        id: LockId,
        decision: Decision,
        wait: Option<Duration>,
    ) -> Result<Grant, Status> {
        let request = match decision {
            Decision::Answer(s) => return self.answered(id, s),
            Decision::Send(r) => r,
        };
        let deadline = self.link.now() + self.cfg.timeout + wait.unwrap_or_default();
        // Grants and leases are counted from the send: the server granted no earlier, so the
        // client never trusts a grant longer than the server keeps it (counted from the reply,
        // a delayed reply would stretch it past the server's expiry; the simulator's belief
        // check finds two holders that way).
        let now = self.now_ms();
        let sent = self.exchange(&[Command::Lock(request.command())], 0, Some(deadline));
        let (reply, proof) = match sent {
            Ok(_) => (self.result(0), self.proof(0)),
            Err(s) => return Err(s),
        };
        let local = &mut self.locks.get_mut(id).ok_or(Status::LockNotGet)?.local;
        let status = local.apply(&request, &reply, proof, now);
        grant(status, local)
    }

    fn answered(&self, id: LockId, s: Status) -> Result<Grant, Status> {
        let local = &self.locks.get(id).ok_or(Status::LockNotGet)?.local;
        grant(s, local)
    }

    /// Non-blocking lock in `mode` with a lease of `expire_ms` (`trylock`). A fair lock that
    /// queues returns `Err(Eagain)` holding a ticket: call again to retry with it.
    pub fn trylock(&mut self, id: LockId, mode: Mode, expire_ms: u32) -> Result<Grant, Status> {
        let d = self.local(id)?.trylock(mode, expire_ms, 0);
        self.run(id, d, None)
    }

    /// Lock, waiting on the server up to `wait` (`lock`): answered the moment it is granted, or
    /// `Err(Etimeout)` when the wait runs out.
    pub fn lock(
        &mut self,
        id: LockId,
        mode: Mode,
        expire_ms: u32,
        wait: Duration,
    ) -> Result<Grant, Status> {
        let wait_ms = wait.as_millis().clamp(1, u32::MAX as u128) as u32;
        let d = self.local(id)?.trylock(mode, expire_ms, wait_ms);
        self.run(id, d, Some(wait))
    }

    /// Unlock: `Ok(Success)` when released on the server, `Ok(AlreadyLocked)` when only a
    /// re-entry was counted down.
    pub fn unlock(&mut self, id: LockId) -> Result<Status, Status> {
        let d = self.local(id)?.unlock();
        self.run(id, d, None).map(|g| g.status)
    }

    /// Extends the grant held in `mode` to at least `expire_ms` from now (0 only validates
    /// the grant). `Einval` when `id` is not held in `mode` (or is an RW lock, which has no
    /// lease), as the reference answers `lock_extend` with the other mode's op.
    pub fn lock_extend(&mut self, id: LockId, mode: Mode, expire_ms: u32) -> Result<Grant, Status> {
        let d = self.local(id)?.extend(mode, expire_ms);
        self.run(id, d, None)
    }

    /// Trylocks up to 31 locks in one message. Per item unless `all_or_nothing`, in which case
    /// either every lock is granted or none stays held (entries undone report `Eagain`). A lock
    /// that needs the server for an earlier entry of the same batch is answered `Easync` for the
    /// later one: one operation per lock per message. `Err(Easync)` while pipelined batches are
    /// in flight ([`Client::submit_trylock`]).
    pub fn batch_trylock(
        &mut self,
        requests: &[(LockId, Mode, u32)],
        all_or_nothing: bool,
        out: &mut [Result<Grant, Status>],
    ) -> Result<(), Status> {
        self.batch(requests.len(), out, |c| {
            c.submit_trylock(requests, all_or_nothing)
        })
    }

    /// Unlocks up to 31 locks in one message (per item).
    pub fn batch_unlock(
        &mut self,
        ids: &[LockId],
        out: &mut [Result<Grant, Status>],
    ) -> Result<(), Status> {
        self.batch(ids.len(), out, |c| c.submit_unlock(ids))
    }

    /// Extends up to 31 grants, each held in the mode given, by its own lease (ms), in one
    /// message (per item; an entry not held in its mode is `Einval`, as in
    /// [`Client::lock_extend`]).
    pub fn batch_lock_extend(
        &mut self,
        requests: &[(LockId, Mode, u32)],
        out: &mut [Result<Grant, Status>],
    ) -> Result<(), Status> {
        self.batch(requests.len(), out, |c| {
            c.submit(
                requests.len(),
                0,
                |i| requests[i].0,
                |l, i| Ok(l.extend(requests[i].1, requests[i].2)),
            )
        })
    }

    /// Starts one lock operation without waiting for it (`lock_request_async`); at most one is
    /// outstanding per instance.
    pub fn lock_request_async(&mut self, id: LockId, op: AsyncOp) -> Result<(), Status> {
        match self.start_async(id, op)? {
            None => Ok(()),
            Some(Ok(_)) => Ok(()),
            Some(Err(s)) => Err(s),
        }
    }

    /// Starts `op` on `id`: `None` once it is sent (outstanding), `Some` with its result when it
    /// was answered locally (nothing to wait for).
    fn start_async(
        &mut self,
        id: LockId,
        op: AsyncOp,
    ) -> Result<Option<Result<Grant, Status>>, Status> {
        if self.pending.is_some() {
            return Err(Status::Easync);
        }
        let local = self.local(id)?;
        let mut wait = Duration::ZERO;
        let d = match op {
            AsyncOp::Lock(mode, expire) if expire != 0 => local.trylock(mode, expire, 0),
            AsyncOp::LockWait(mode, expire, w) if expire != 0 && !w.is_zero() => {
                wait = w;
                let wait_ms = w.as_millis().clamp(1, u32::MAX as u128) as u32;
                local.trylock(mode, expire, wait_ms)
            }
            AsyncOp::Lock(..) | AsyncOp::LockWait(..) => return Err(Status::Einval),
            AsyncOp::Unlock => local.unlock(),
            AsyncOp::Extend(mode, expire) => local.extend(mode, expire),
        };
        let request = match d {
            // Answered locally: nothing to wait for, the result is final now.
            Decision::Answer(s) => return Ok(Some(self.answered(id, s))),
            Decision::Send(request) => request,
        };
        // Taken before the send: the grant's lease is counted from it (see `run`).
        let started = self.link.now();
        let (ticket, message_id) = self.send_with(&[Command::Lock(request.command())], 0, true)?;
        self.pending = Some(Pending {
            lock: id,
            request,
            message_id,
            ticket,
            started,
            wait,
        });
        Ok(None)
    }

    /// Polls the outstanding asynchronous operation (`lock_result_check`): `Err(AsyncAgain)`
    /// until its reply arrives, `Err(Etimeout)` after the request timeout (and the wait of a
    /// [`AsyncOp::LockWait`]), `Err(NoAsync)` when nothing is outstanding.
    pub fn lock_result_check(&mut self) -> Result<Grant, Status> {
        self.check_pending(None)
    }

    /// [`Client::lock_result_check`], arranging for `waker` to be woken when the reply may have
    /// come (see [`Link::poll_recv_data`](link::Link::poll_recv_data)).
    fn check_pending(&mut self, waker: Option<&std::task::Waker>) -> Result<Grant, Status> {
        let p = self.pending.ok_or(Status::NoAsync)?;
        let now = self.link.now();
        let got = match waker {
            Some(w) => self.link.poll_recv_data(p.ticket, &mut self.data_reply, w),
            None => self
                .link
                .recv_data(p.ticket, &mut self.data_reply, Some(now)),
        };
        match got {
            Ok(Some(m)) => {
                self.pending = None;
                let reply =
                    decode_data_response(&self.data_reply[..m]).map_err(|_| Status::BadResponse)?;
                let r = reply.result(0);
                let sent = p.request.command();
                if reply.header().message_id != p.message_id
                    || reply.len() != 1
                    || r.op != sent.op as u8
                    || r.id != sent.lock
                {
                    return Err(Status::BadResponse);
                }
                let result = r.result;
                let proof = GrantProof {
                    epoch: self.epoch,
                    mac: reply.proof_mac(0),
                };
                // Counted from the send, as in `run`.
                let now_ms = p.started.saturating_duration_since(self.start).as_millis() as u64;
                if renews_lease(result.status) {
                    self.heard_ms = self.heard_ms.max(now_ms);
                }
                let e = self.locks.get_mut(p.lock).ok_or(Status::LockNotGet)?;
                let status = e.local.apply(&p.request, &result, proof, now_ms);
                grant(status, &e.local)
            }
            Ok(None) if now.duration_since(p.started) >= self.cfg.timeout + p.wait => {
                self.pending = None;
                Err(Status::Etimeout)
            }
            Ok(None) => Err(Status::AsyncAgain),
            Err(e) => {
                self.pending = None;
                Err(io_status(e))
            }
        }
    }

    /// One lock operation as a future: sends it at the first poll and resolves with its
    /// result, holding no thread meanwhile. Over a shared connection ([`Mux`]) the connection's
    /// reader wakes the task when the reply arrives (or the connection is lost); on other data
    /// paths the future asks to be polled again at once (shared memory answers within
    /// microseconds). Usable from any executor; nothing here needs a runtime. Put a timeout
    /// around it with your executor's timer if the server may never answer.
    ///
    /// Dropping the future before it resolves leaves the operation outstanding, as
    /// [`Client::lock_request_async`] does: [`Client::lock_result_check`] finishes it.
    ///
    /// ```
    /// # use dlock_core::Config;
    /// # use dlock_transport::runtime::{ServerConfig, ServerHandle, TcpConfig};
    /// # let mut cfg = ServerConfig::new(Config {
    /// #     locks_max: 64, clients_max: 8, objects_max: 4, ..Config::default()
    /// # });
    /// # cfg.tcp = Some(TcpConfig::new("127.0.0.1:0".parse()?));
    /// # let server = ServerHandle::start(cfg)?;
    /// # let addr = server.tcp_addr().unwrap();
    /// use std::time::Duration;
    /// use dlock_core::{LockKind, Mode, Status};
    /// use dlock_transport::client::{AsyncOp, Client, ClientConfig, Endpoint, Mux};
    ///
    /// let endpoint = Endpoint::Tcp(addr);
    /// let mux = Mux::new(&endpoint)?;
    /// let mut c = Client::connect(ClientConfig::new(endpoint).with_mux(mux))?;
    /// let id = c.get_lock(LockKind::Atomic, b"orders/rg-3")?;
    /// // Any executor will do; this one is a few lines of std.
    /// let take = c.lock_async(id, AsyncOp::LockWait(Mode::Exclusive, 5_000, Duration::from_secs(1)));
    /// assert_eq!(block_on(take)?.status, Status::Success);
    /// assert_eq!(block_on(c.lock_async(id, AsyncOp::Unlock))?.status, Status::Success);
    /// # fn block_on<F: std::future::Future>(f: F) -> F::Output {
    /// #     struct Unpark(std::thread::Thread);
    /// #     impl std::task::Wake for Unpark {
    /// #         fn wake(self: std::sync::Arc<Self>) { self.0.unpark() }
    /// #     }
    /// #     let waker = std::sync::Arc::new(Unpark(std::thread::current())).into();
    /// #     let mut cx = std::task::Context::from_waker(&waker);
    /// #     let mut f = std::pin::pin!(f);
    /// #     loop {
    /// #         match f.as_mut().poll(&mut cx) {
    /// #             std::task::Poll::Ready(v) => return v,
    /// #             std::task::Poll::Pending => std::thread::park(),
    /// #         }
    /// #     }
    /// # }
    /// # server.stop();
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn lock_async(&mut self, id: LockId, op: AsyncOp) -> LockFuture<'_, C> {
        LockFuture {
            client: self,
            id,
            op,
            started: false,
        }
    }

    /// After a failover (`reinit` said the server recovers): re-claims every lock this client
    /// knows, in batches of 31, each grant or ticket with the proof the failed server gave it,
    /// and takes the new ids the server gives them. A lock whose claim the server refuses (or
    /// whose record is in a state no claim can describe) is forgotten: the server does not
    /// hold it for this client (as a `Fail` would say). On an error every record keeps its old
    /// id (claims the server already took are filed under the new ids only once all are
    /// answered); call again after the next `reinit` — the server takes a repeated claim as a
    /// no-op, and even after its recovery ended it answers a repeated claim of what it restored
    /// with the lock's id. A server this client did not re-register into while it recovered
    /// refuses the call whole (`Einval`, the reference's -1): nothing is claimed and every
    /// record kept, since that server holds them under the ids they have.
    pub fn update_all_locks(&mut self) -> Result<(), Status> {
        let now = self.now_ms();
        // Every record leaves the table and comes back under its new id: the new server numbers
        // its locks afresh, so renaming in place could file one record over another not yet
        // renamed.
        let mut records = self.locks.drain().into_iter();
        // Re-claimed records, with their old ids: filed under the new ids only once every chunk
        // is answered, so an error can put every record back under the id it had.
        let mut done: Vec<(Entry, LockId)> = Vec::new();
        loop {
            let chunk: Vec<(Entry, local::Claim)> = records
                .by_ref()
                .filter_map(|e| {
                    let claim = e.local.claim(now);
                    if claim.is_none() {
                        tracing::warn!(lock = %e.local.id, "lock record inconsistent; not re-claimed");
                    }
                    Some((e, claim?))
                })
                .take(dlock_core::config::BATCH_MAX)
                .collect();
            if chunk.is_empty() {
                break;
            }
            let claims: Vec<LockClaim<'_>> = chunk
                .iter()
                .map(|(e, c)| LockClaim {
                    kind: e.local.kind,
                    held: c.held,
                    name: &e.name,
                    old_lock: e.local.id.raw(),
                    word: e.local.word,
                    ticket: c.ticket,
                    remaining_ms: c.remaining_ms,
                    age_ms: c.age_ms,
                    token: c.token,
                    proof: c.proof,
                })
                .collect();
            let body = ControlRequest::BatchUpdateLocks(Batch::from_slice(&claims));
            let answered = match self.control(self.id.get(), body) {
                Ok(ControlResponse::Entries(e)) if e.len() == chunk.len() => {
                    Ok(e.iter().collect::<Vec<BatchEntry>>())
                }
                Ok(_) => Err(Status::BadResponse),
                Err(s) => Err(s),
            };
            drop(claims);
            let entries = match answered {
                Ok(entries) => entries,
                Err(s) => {
                    self.restore(done, chunk.into_iter().map(|(e, _)| e).chain(records));
                    return Err(s);
                }
            };
            for ((mut e, _), answer) in chunk.into_iter().zip(entries) {
                if let (Status::Success, Some(new)) = (answer.status, LockId::from_raw(answer.id)) {
                    let old = e.local.id;
                    e.local.id = new;
                    done.push((e, old));
                }
            }
        }
        for (e, _) in done {
            if let Some(other) = self.locks.insert(e) {
                tracing::warn!(lock = %other.local.id, name = ?other.name, "two locks re-claimed under one id");
            }
        }
        self.recovering = false;
        self.reclaim = false;
        Ok(())
    }

    /// After a failed re-claim: puts every record back under the id it had when
    /// `update_all_locks` started (`done`: re-claimed ones, with that id), so that none is lost
    /// to an id the new server reused.
    fn restore(&mut self, done: Vec<(Entry, LockId)>, rest: impl Iterator<Item = Entry>) {
        let back = done.into_iter().map(|(mut e, old)| {
            e.local.id = old;
            e
        });
        for e in back.chain(rest) {
            self.locks.insert(e);
        }
    }

    /// The lock ids this client holds references to, with their local state.
    pub fn locks(&self) -> impl Iterator<Item = (&LockId, &LocalLock)> {
        self.locks.iter().map(|e| (&e.local.id, &e.local))
    }

    /// This client's record of lock `id`, if it holds a reference to it: one indexed lookup,
    /// where [`Client::locks`] scans them all.
    pub fn local_lock(&self, id: LockId) -> Option<&LocalLock> {
        self.locks.get(id).map(|e| &e.local)
    }

    /// Creates the object `name` with `init` and a lease in seconds (`umo_atomic64_create`).
    pub fn atomic64_create(
        &mut self,
        name: &[u8],
        init: u64,
        lease_s: u32,
    ) -> Result<ObjectId, Status> {
        match self.control(
            self.id.get(),
            ControlRequest::ObjectCreate {
                name,
                init,
                lease_s,
            },
        )? {
            ControlResponse::Object { object } => {
                ObjectId::from_raw(object).ok_or(Status::BadResponse)
            }
            _ => Err(Status::BadResponse),
        }
    }

    /// Takes a reference to object `name` (`umo_atomic64_get`).
    pub fn atomic64_get(&mut self, name: &[u8], lease_s: u32) -> Result<ObjectId, Status> {
        match self.control(self.id.get(), ControlRequest::ObjectGet { name, lease_s })? {
            ControlResponse::ObjectRef { object, cell } => {
                let id = ObjectId::from_raw(object).ok_or(Status::BadResponse)?;
                if self
                    .link
                    .object_cells()
                    .is_some_and(|c| cell as usize >= c.len())
                {
                    return Err(Status::BadResponse);
                }
                self.objects.insert(id, cell);
                Ok(id)
            }
            _ => Err(Status::BadResponse),
        }
    }

    /// Drops the reference (`umo_atomic64_release`).
    pub fn atomic64_release(&mut self, id: ObjectId) -> Result<(), Status> {
        self.objects.get(&id).ok_or(Status::ObjectNotGet)?;
        self.control(
            self.id.get(),
            ControlRequest::ObjectRelease { object: id.raw() },
        )?;
        self.objects.remove(&id);
        Ok(())
    }

    /// Destroys the object (`umo_atomic64_destroy`; owner only, deferred while referenced).
    pub fn atomic64_destroy(&mut self, id: ObjectId) -> Result<(), Status> {
        self.control(
            self.id.get(),
            ControlRequest::ObjectDestroy { object: id.raw() },
        )?;
        self.objects.remove(&id);
        Ok(())
    }

    fn object_op(
        &mut self,
        id: ObjectId,
        op: ObjectOp,
        a: u64,
        b: u64,
    ) -> Result<CommandResult, Status> {
        let cell = *self.objects.get(&id).ok_or(Status::ObjectNotGet)?;
        #[cfg(feature = "rdma")]
        if let Some(qp) = self.link.rdma_objects() {
            return rdma::object_op(qp, cell, op, a, b);
        }
        if let Some(cells) = self.link.object_cells() {
            // One-sided, as the reference's NIC atomics: AcqRel/Acquire for the same reasons the
            // server's message path uses them (the cell may publish a client's own memory).
            let c = &cells[cell as usize];
            return Ok(match op {
                ObjectOp::Faa => ok(c.fetch_add(a, Ordering::AcqRel)),
                ObjectOp::Cas => {
                    match c.compare_exchange(a, b, Ordering::AcqRel, Ordering::Acquire) {
                        Ok(v) => ok(v),
                        Err(v) => CommandResult {
                            status: Status::ObjectCasFailed,
                            word: 0,
                            aux: v,
                        },
                    }
                }
                ObjectOp::Snapshot => ok(c.load(Ordering::Acquire)),
            });
        }
        let cmd = Command::Object(ObjectCommand {
            op,
            object: id.raw(),
            a,
            b,
        });
        let deadline = Some(self.link.now() + self.cfg.timeout);
        self.exchange(&[cmd], 0, deadline)?;
        Ok(self.result(0))
    }

    /// Fetch-and-add: returns the value before the add (`umo_atomic64_faa`). Global
    /// transaction ids are this on one object (`dlock-engine-glue`'s `TxnIdAllocator` leases
    /// ranges of them so most ids need no round trip at all).
    ///
    /// ```
    /// # use dlock_core::Config;
    /// # use dlock_transport::runtime::{ServerConfig, ServerHandle};
    /// # let server = ServerHandle::start(ServerConfig::new(Config {
    /// #     locks_max: 64, clients_max: 4, objects_max: 4, ..Config::default()
    /// # }))?;
    /// use dlock_transport::client::{Client, ClientConfig, Endpoint};
    ///
    /// let mut client = Client::connect(ClientConfig::new(Endpoint::embedded(&server)))?;
    /// client.atomic64_create(b"xid", 100, 60)?; // initial value, lease in seconds
    /// let xid = client.atomic64_get(b"xid", 60)?;
    /// assert_eq!(client.atomic64_faa(xid, 1)?, 100);
    /// assert_eq!(client.atomic64_faa(xid, 1)?, 101);
    /// # client.deinit()?;
    /// # server.stop();
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn atomic64_faa(&mut self, id: ObjectId, add: u64) -> Result<u64, Status> {
        let r = self.object_op(id, ObjectOp::Faa, add, 0)?;
        r.status.ok().map(|()| r.aux)
    }

    /// Compare-and-swap; unlike the reference, the value found is returned too.
    pub fn atomic64_cas(&mut self, id: ObjectId, expected: u64, new: u64) -> Result<Cas, Status> {
        cas_outcome(self.object_op(id, ObjectOp::Cas, expected, new)?)
    }

    /// Reads the current value (`umo_atomic64_get_snapshot`).
    pub fn atomic64_snapshot(&mut self, id: ObjectId) -> Result<u64, Status> {
        let r = self.object_op(id, ObjectOp::Snapshot, 0, 0)?;
        r.status.ok().map(|()| r.aux)
    }

    /// [`Client::atomic64_faa`] as a future (see [`Client::lock_async`] for how it is woken):
    /// many clients' id allocations progress on one thread. Over shared memory or RDMA the
    /// add is one-sided and the future is ready at its first poll.
    pub async fn atomic64_faa_async(&mut self, id: ObjectId, add: u64) -> Result<u64, Status> {
        let r = self.object_op_async(id, ObjectOp::Faa, add, 0).await?;
        r.status.ok().map(|()| r.aux)
    }

    /// [`Client::atomic64_cas`] as a future.
    pub async fn atomic64_cas_async(
        &mut self,
        id: ObjectId,
        expected: u64,
        new: u64,
    ) -> Result<Cas, Status> {
        cas_outcome(
            self.object_op_async(id, ObjectOp::Cas, expected, new)
                .await?,
        )
    }

    /// One object command, its reply awaited without holding the thread.
    async fn object_op_async(
        &mut self,
        id: ObjectId,
        op: ObjectOp,
        a: u64,
        b: u64,
    ) -> Result<CommandResult, Status> {
        if self.link.object_cells().is_some() {
            return self.object_op(id, op, a, b);
        }
        #[cfg(feature = "rdma")]
        if self.link.rdma_objects().is_some() {
            return self.object_op(id, op, a, b);
        }
        if !self.objects.contains_key(&id) {
            return Err(Status::ObjectNotGet);
        }
        let cmd = Command::Object(ObjectCommand {
            op,
            object: id.raw(),
            a,
            b,
        });
        let started = self.link.now();
        let (ticket, message_id) = self.send_with(&[cmd], 0, true)?;
        let timeout = self.cfg.timeout;
        std::future::poll_fn(|cx| {
            match self
                .link
                .poll_recv_data(ticket, &mut self.data_reply, cx.waker())
            {
                Ok(Some(n)) => {
                    std::task::Poll::Ready(object_reply(&self.data_reply[..n], message_id, &cmd))
                }
                Ok(None) if self.link.now().saturating_duration_since(started) >= timeout => {
                    std::task::Poll::Ready(Err(Status::Etimeout))
                }
                Ok(None) => std::task::Poll::Pending,
                Err(e) => std::task::Poll::Ready(Err(io_status(e))),
            }
        })
        .await
    }
}

/// A CAS result as the API reports it: swapped or not, with the value found.
fn cas_outcome(r: CommandResult) -> Result<Cas, Status> {
    match r.status {
        Status::Success | Status::ObjectCasFailed => Ok(Cas {
            swapped: r.status == Status::Success,
            observed: r.aux,
        }),
        s => Err(s),
    }
}

/// The result in `reply` if it answers `cmd`, sent as `message_id`, alone in its message.
fn object_reply(reply: &[u8], message_id: u16, cmd: &Command) -> Result<CommandResult, Status> {
    let reply = decode_data_response(reply).map_err(|_| Status::BadResponse)?;
    let r = reply.result(0);
    if reply.header().message_id != message_id
        || reply.len() != 1
        || r.kind != cmd.kind_code()
        || r.op != cmd.op_code()
        || r.id != cmd.id()
    {
        return Err(Status::BadResponse);
    }
    Ok(r.result)
}

/// A batch call's entry count, as the reference checks it: 1 to 31 entries, `Einval`
/// otherwise (also where every entry would have been answered without the server).
#[inline]
pub(super) fn batch_count(n: usize) -> Result<(), Status> {
    match n {
        1..=dlock_core::config::BATCH_MAX => Ok(()),
        _ => Err(Status::Einval),
    }
}

const fn ok(aux: u64) -> CommandResult {
    CommandResult {
        status: Status::Success,
        word: 0,
        aux,
    }
}

/// A status and the lock's record, as the API's `Result<Grant, Status>`.
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

/// Waits until `deadline()` (asked only if the reply has not arrived yet) for the reply to
/// `sent`, whose command `i` was `command(i)`; checks that the reply answers those commands and
/// decodes the results into `replies`. Takes the client's parts rather than the client, so a
/// caller can describe the commands from its own records without copying them out first.
fn receive<C: Connection>(
    link: &mut C,
    buf: &mut [u8; DATA_RESPONSE_MAX],
    (replies, proofs): (
        &mut [CommandResult; dlock_core::config::BATCH_MAX],
        &mut [[u8; PROOF_LEN]; dlock_core::config::BATCH_MAX],
    ),
    sent: Sent,
    command: impl Fn(usize) -> Command,
    deadline: impl Fn() -> Option<Instant>,
) -> Result<usize, Status> {
    let mut asked = None;
    let mut deadline = || *asked.get_or_insert_with(&deadline);
    let arrived = link.try_recv_data(sent.ticket, buf).map_err(io_status)?;
    let mut m = match arrived {
        Some(m) => m,
        None => link
            .recv_data(sent.ticket, buf, deadline())
            .map_err(io_status)?
            // No reply in time: the reference's `BAD_RESPONSE` (the caller reinits).
            .ok_or(Status::BadResponse)?,
    };
    // A reply to an earlier request this client gave up on (a timeout over TCP) may still come
    // first: skip it rather than let every later exchange read the one before it.
    let reply = loop {
        let reply = decode_data_response(&buf[..m]).map_err(|_| Status::BadResponse)?;
        if reply.header().message_id == sent.message_id {
            break reply;
        }
        m = link
            .recv_data(sent.ticket, buf, deadline())
            .map_err(io_status)?
            .ok_or(Status::BadResponse)?;
    };
    if reply.len() != sent.count {
        return Err(Status::BadResponse);
    }
    for (i, (slot, proof)) in replies.iter_mut().zip(proofs.iter_mut()).enumerate() {
        if i == sent.count {
            break;
        }
        let (r, c) = (reply.result(i), command(i));
        if r.kind != c.kind_code() || r.op != c.op_code() || r.id != c.id() {
            return Err(Status::BadResponse);
        }
        *slot = r.result;
        *proof = reply.proof_mac(i);
    }
    Ok(reply.len())
}

fn grant(status: Status, local: &LocalLock) -> Result<Grant, Status> {
    match status {
        Status::Success | Status::Done | Status::AlreadyLocked => Ok(Grant {
            status: if status == Status::Done {
                Status::Success
            } else {
                status
            },
            token: local.token,
            word: local.word,
        }),
        s => Err(s),
    }
}

/// A client moves between threads (one at a time uses it).
const _: () = {
    const fn is_send<T: Send>() {}
    is_send::<Client>();
};

/// Reads a server's counters without registering: one `Stats` request on a connection of its
/// own, which the server answers without a client-table entry, so it works while the table is
/// full (`dlock stat`). Over TLS only an authenticated peer gets this far.
///
/// A connection that fails is `BAD_RESPONSE` with the I/O error as the [`Error`]'s source, for
/// TLS saying why ([`Error::tls_failure`]).
pub fn read_server_stats(
    endpoint: &Endpoint,
    timeout: Duration,
) -> Result<Vec<(&'static str, u64)>, Error> {
    let slot = error::IoSlot::arm();
    stats_of(endpoint, timeout).map_err(|s| slot.error(error::Op::Stats, s))
}

fn stats_of(endpoint: &Endpoint, timeout: Duration) -> Result<Vec<(&'static str, u64)>, Status> {
    let mut link = Link::connect(endpoint).map_err(io_status)?;
    let header = ControlHeader {
        version: PROTO_VERSION,
        msg: dlock_core::proto::MsgType::Stats,
        message_id: 1,
        word: 0,
    };
    let mut req = [0u8; dlock_core::proto::CONTROL_HEADER_LEN];
    let n = dlock_core::proto::encode_control_request(
        &ControlRequestFrame {
            header,
            body: ControlRequest::Stats,
        },
        &mut req,
    )
    .map_err(|_| Status::Einval)?;
    let mut reply = vec![0u8; CONTROL_FRAME_MAX];
    let m = link
        .control(&req[..n], &mut reply, Some(Instant::now() + timeout))
        .map_err(io_status)?;
    let reply = decode_control_response(&reply[..m]).map_err(|_| Status::BadResponse)?;
    match reply.header.status() {
        Some(Status::Success) => named_counters(reply.body),
        Some(s) => Err(s),
        None => Err(Status::BadResponse),
    }
}

/// A `Stats` reply's counters with their names.
fn named_counters(reply: ControlResponse<'_>) -> Result<Vec<(&'static str, u64)>, Status> {
    match reply {
        ControlResponse::Counters(c) => Ok(Counter::ALL
            .iter()
            .zip(c.iter())
            .map(|(k, v)| (k.name(), v))
            .collect()),
        _ => Err(Status::BadResponse),
    }
}
