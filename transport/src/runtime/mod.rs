//! The server runtime: one region, two threads.
//!
//! The *data thread* owns the [`Server`] state machine and is the only thread that runs it: it
//! scans the shared-memory doorbells and executes mailbox requests, reads, executes and answers
//! the data messages of the TCP data connections it owns (`tcp.rs`), takes the control requests
//! the control thread read off sockets from a bounded queue, answers parked blocking requests as
//! they are decided, and ticks the clients' leases. The *control thread* accepts TCP and
//! Unix-socket connections, runs TLS handshakes, reads whole control frames, hands them over and
//! writes the replies back; once a TCP data connection's attach is accepted it hands the
//! connection itself to the data thread. Keeping the state machine on one thread means no lock
//! anywhere on the path of a request; the hand-off between the threads is lock-free queues and
//! one wake-up (an eventfd in the data thread's poll, `wake.rs`).
//!
//! ARCHITECTURE.md puts registration and lifecycle on the control thread. Here the control
//! thread does their I/O, TLS and framing — the expensive, blocking part — and the data thread
//! runs them between data batches: registration is rare, and one owner of the tables is simpler
//! to prove than two threads sharing them.
//!
//! With the `rdma` feature (and a device that opens), the data thread also polls each attached
//! client's RDMA queue pair and answers over it, while the control thread creates, connects and
//! destroys those queue pairs (`rdma.rs` says why the work is split that way).
//!
//! The data thread never allocates after start, never takes a lock, and bounds its work per turn
//! (each doorbell once, at most [`INBOX_BATCH`] queued jobs). When there is no work it follows the
//! configured [`IdleStrategy`], whose sleep is one `epoll_wait` covering sockets and doorbells.

mod cluster;
mod control;
mod data;
mod events;
mod exchange;
mod fds;
mod handshakes;
mod idle;
mod keys;
pub mod membership;
mod peer;
#[cfg(feature = "rdma")]
mod rdma;
mod recoverers;
mod stream;
mod tcp;
mod wake;

use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

pub use cluster::ClusterConfig;
use dlock_core::Config;
use dlock_core::server::Counter;
pub use dlock_core::server::Server;
pub use fds::{FdAction, FdBudget, FdLimits, FdNeeds, FdShortfall, plan as plan_fds};
pub use idle::IdleStrategy;
pub use keys::{hmac_sha256, read_session_key_file};
pub use recoverers::Recoverers;

use crate::region::Region;
use exchange::Exchange;

/// Queued jobs the data thread takes per turn before it looks at the doorbells again.
pub const INBOX_BATCH: usize = 64;
/// Servers one process may run at once (`MAX_NUM_SERVER`).
pub const SERVERS_MAX: usize = dlock_core::config::SERVERS_MAX;

static RUNNING: AtomicUsize = AtomicUsize::new(0);

/// TCP settings.
#[derive(Clone, Debug)]
pub struct TcpConfig {
    /// Address to listen on (IPv4 or IPv6); port 0 picks a free one.
    pub listen: SocketAddr,
    /// Keepalive: idle time before the first probe (reference: 60 s).
    pub keepalive_idle: Duration,
    /// Keepalive: time between probes (reference: 6 s).
    pub keepalive_interval: Duration,
    /// Keepalive: probes before the connection is declared dead (reference: 9).
    pub keepalive_probes: u32,
    /// TLS 1.3 with client certificates on every connection (control and data). Without it the
    /// server speaks plaintext, which it does only on a loopback address unless
    /// `insecure_plaintext` says otherwise.
    pub tls: Option<crate::tls::TlsConfig>,
    /// Serve plaintext on a non-loopback address: anyone who reaches the port can register, and
    /// names, sessions and values cross the network in clear. For a network trusted entirely.
    pub insecure_plaintext: bool,
}

impl TcpConfig {
    /// The reference's keepalive on `listen`.
    pub fn new(listen: SocketAddr) -> Self {
        Self {
            listen,
            keepalive_idle: Duration::from_secs(60),
            keepalive_interval: Duration::from_secs(6),
            keepalive_probes: 9,
            tls: None,
            insecure_plaintext: false,
        }
    }
}

/// Everything a server is started with.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Capacities, lease, epoch, recovery.
    pub core: Config,
    /// What the data thread does when there is no work.
    pub idle: IdleStrategy,
    /// Serve TCP clients.
    pub tcp: Option<TcpConfig>,
    /// Serve local clients' control channel on this Unix socket (their data goes through the
    /// region's mailboxes). `None` picks a path under the temp directory.
    pub unix_socket: Option<PathBuf>,
    /// Back the region with `/dev/shm/<name>` so clients in other processes can map it;
    /// `None` keeps it anonymous (clients in this process only).
    pub shm_name: Option<String>,
    /// Open the shared-memory region file and the Unix socket to the server's group (mode
    /// `0660`) instead of its user only (`0600`, the default). Every process of that group can
    /// then act as any local client: mapping the region shows every mailbox and session secret.
    pub group_access: bool,
    /// The secret this server shares with the server that may replace it after a failure:
    /// sessions are minted under it, and a recovering server takes back a client it does not
    /// know only if its session was minted under the same key. Without one, a recovering server
    /// (`Config::recovery_clients > 0`) would take any re-registration at its word, so it
    /// refuses to start unless `insecure_recovery` says so.
    pub session_key: Option<dlock_core::SessionKey>,
    /// Recover (`Config::recovery_clients > 0`) without a session key: whoever reaches the
    /// server first while it recovers can re-register as any client id and claim its locks, and
    /// the genuine client is then refused. For a network trusted entirely, as
    /// `TcpConfig::insecure_plaintext` is.
    pub insecure_recovery: bool,
    /// Pin the control and data threads to these CPUs.
    pub pin: (Option<usize>, Option<usize>),
    /// Ask for transparent huge pages on the region.
    pub huge_pages: bool,
    /// Most open connections (reference: 4 × clients).
    ///
    /// `clients_max` and this are also file-descriptor capacities. At start the server raises
    /// `RLIMIT_NOFILE` to what they need; when even the hard limit is too low it *lowers* both
    /// to what fits and logs a warning with the figures, rather than refusing to start: a
    /// smaller lock service beats none, and the clients past it get an error, not a hang
    /// ([`ServerHandle::fd_budget`] says what is served; `runtime/fds.rs` gives the sums).
    pub connections_max: usize,
    /// A connection that has not registered (or attached) within this is closed.
    pub handshake_timeout: Duration,
    /// On any connection, registered or not: a frame whose first bytes arrived must be complete
    /// within this, and a reply must be taken off the socket within this; else the connection is
    /// closed. A peer cannot hold a connection (and its buffers) by sending half a frame or by
    /// never reading.
    pub frame_timeout: Duration,
    /// Serve the partitions a cluster's map gives this server (`None`: a standalone server).
    /// A cluster server needs the cluster's `session_key`: any server of the cluster must be
    /// able to verify a client's session and a grant's proof.
    pub cluster: Option<ClusterConfig>,
    /// Who may release dead clients' retained locks (`recovery_done`) and list them: nobody
    /// by default ([`Recoverers`]).
    pub recoverers: Recoverers,
    /// Serve data messages and one-sided object operations over RDMA on this device. At start
    /// the device is opened and the object cells registered; if that fails (no device, no
    /// kernel support, port down) the server logs why and serves TCP and shared memory only.
    #[cfg(feature = "rdma")]
    pub rdma: Option<crate::rdma::RdmaConfig>,
}

impl ServerConfig {
    /// Defaults for these capacities: adaptive idling, no TCP, anonymous region.
    pub fn new(core: Config) -> Self {
        Self {
            connections_max: 4 * core.clients_max as usize,
            core,
            idle: IdleStrategy::Adaptive,
            tcp: None,
            unix_socket: None,
            shm_name: None,
            group_access: false,
            session_key: None,
            insecure_recovery: false,
            pin: (None, None),
            huge_pages: false,
            handshake_timeout: Duration::from_secs(5),
            frame_timeout: Duration::from_secs(5),
            cluster: None,
            recoverers: Recoverers::default(),
            #[cfg(feature = "rdma")]
            rdma: None,
        }
    }
}

impl ServerConfig {
    /// The permission bits of the region file and the Unix socket.
    pub fn file_mode(&self) -> u32 {
        if self.group_access { 0o660 } else { 0o600 }
    }
}

/// What both threads share.
#[derive(Debug)]
pub(crate) struct Shared {
    /// The RDMA device and the registration of the region's object cells, when RDMA is on.
    /// Declared before `region` so that it is dropped (deregistered) before the region is
    /// unmapped: the device must never be left holding pages of a dead mapping.
    #[cfg(feature = "rdma")]
    pub(crate) rdma: Option<rdma::RdmaSide>,
    pub(crate) region: Region,
    pub(crate) exchange: Exchange,
    /// The eventfd in the data thread's poll: the one thing that wakes it from its idle wait.
    pub(crate) data_waker: mio::Waker,
    /// Counters the control thread keeps (connections closed, evicted, refused); the data
    /// thread copies them into the server's stats when it answers a `Stats` request.
    pub(crate) counters: TransportCounters,
    pub(crate) stop: AtomicBool,
    /// The instant the data thread's tick counts from (`now_ms` 0).
    pub(crate) started: std::time::Instant,
    /// The cluster thread's queues, on a cluster server.
    pub(crate) cluster: Option<cluster::ClusterExchange>,
}

/// The server counters that the transport, not the state machine, counts
/// ([`Counter::is_transport`]), indexed like [`Counter::ALL`] (the others stay zero here): they
/// do not sit in one block, since counters added later go at the end.
#[derive(Debug)]
pub(crate) struct TransportCounters([std::sync::atomic::AtomicU64; Counter::COUNT]);

impl Default for TransportCounters {
    fn default() -> Self {
        Self(std::array::from_fn(|_| {
            std::sync::atomic::AtomicU64::new(0)
        }))
    }
}

impl TransportCounters {
    /// Adds one to `c` (a counter the transport does not keep is ignored).
    pub(crate) fn bump(&self, c: Counter) {
        if c.is_transport() {
            // Relaxed: a statistic; nothing is published through it.
            self.0[c as usize].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Sets `c`, a level the transport keeps (the cluster thread's view of its membership).
    pub(crate) fn set(&self, c: Counter, value: u64) {
        if c.is_transport() {
            // Relaxed: a statistic; nothing is published through it.
            self.0[c as usize].store(value, Ordering::Relaxed);
        }
    }

    /// Copies every counter kept here into the server's stats.
    pub(crate) fn copy_into(&self, server: &mut Server<'_>) {
        for c in Counter::ALL.into_iter().filter(|c| c.is_transport()) {
            server.set_counter(c, self.0[c as usize].load(Ordering::Relaxed));
        }
    }
}

/// A running server. Dropping it stops the server.
#[derive(Debug)]
pub struct ServerHandle {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    tcp_addr: Option<SocketAddr>,
    unix_socket: PathBuf,
    fd_budget: FdBudget,
}

impl ServerHandle {
    /// Starts a server: maps the region, binds the listeners, spawns the two threads.
    ///
    /// ```
    /// use dlock_core::Config;
    /// use dlock_transport::runtime::{ServerConfig, ServerHandle, TcpConfig};
    ///
    /// let mut cfg = ServerConfig::new(Config::default()); // 51,200 locks, 1,000 clients
    /// // Loopback, so plaintext is allowed; any other address needs `TcpConfig::tls`.
    /// cfg.tcp = Some(TcpConfig::new("127.0.0.1:0".parse()?));
    /// let server = ServerHandle::start(cfg)?;
    /// println!("serving on {:?}", server.tcp_addr());
    /// server.stop();
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn start(cfg: ServerConfig) -> io::Result<ServerHandle> {
        cfg.core.validate().map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                cfg.core.invalid_field().unwrap_or("config"),
            )
        })?;
        if let Some(tcp) = &cfg.tcp
            && tcp.tls.is_none()
            && !tcp.listen.ip().is_loopback()
            && !tcp.insecure_plaintext
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "refusing to serve plaintext TCP on {}: configure TLS (TcpConfig::tls), bind \
                     a loopback address, or set insecure_plaintext for a network trusted entirely",
                    tcp.listen
                ),
            ));
        }
        if cfg.cluster.is_some() && cfg.session_key.is_none() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a cluster server needs the cluster's session key (ServerConfig::session_key): \
                 every server must verify the sessions and grant proofs of the others",
            ));
        }
        if cfg.core.recovery_clients > 0 && cfg.session_key.is_none() {
            if !cfg.insecure_recovery {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "refusing to recover {} clients without a session key: anyone who \
                         reaches the server while it recovers could re-register as any client \
                         and take its locks; give the failed server's session key \
                         (ServerConfig::session_key), or set insecure_recovery for a network \
                         trusted entirely",
                        cfg.core.recovery_clients
                    ),
                ));
            }
            tracing::warn!(
                recovery_clients = cfg.core.recovery_clients,
                "recovering without a session key (insecure_recovery): re-registrations and \
                 claims are taken at their word"
            );
        }
        let clients = cfg.core.clients_max as usize;
        let connections_min = 2 * clients + clients.div_ceil(4);
        if cfg.connections_max < connections_min {
            // Registered clients could then hold every connection, and nobody could register
            // or read the counters any more.
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "connections_max {} leaves no room: {clients} clients need 2 connections each \
                     plus a quarter spare for newcomers, at least {connections_min}",
                    cfg.connections_max
                ),
            ));
        }
        getrandom::fill(&mut [0u8; 16]).map_err(|e| {
            io::Error::other(format!("no entropy for session secrets from the OS: {e}"))
        })?;
        if RUNNING.fetch_add(1, Ordering::AcqRel) >= SERVERS_MAX {
            RUNNING.fetch_sub(1, Ordering::AcqRel);
            return Err(io::Error::other("32 servers already run in this process"));
        }
        let started = Self::spawn(cfg);
        if started.is_err() {
            RUNNING.fetch_sub(1, Ordering::AcqRel);
        }
        started
    }

    fn spawn(mut cfg: ServerConfig) -> io::Result<ServerHandle> {
        // Before the region: it is sized from `clients_max`, which the plan may lower.
        let fd_budget = fds::apply(&mut cfg)?;
        let region = match &cfg.shm_name {
            Some(name) => Region::create_shared(&cfg.core, name, cfg.file_mode())?,
            None => Region::anonymous(&cfg.core)?,
        };
        if cfg.huge_pages && !region.advise_huge_pages() {
            tracing::info!(
                "transparent huge pages not available for the region; using normal pages"
            );
        }
        let listeners = control::Listeners::bind(&cfg)?;
        let tcp_addr = listeners.tcp_addr();
        let unix_socket = listeners.unix_path().to_path_buf();
        let exchange = Exchange::new(&cfg)?;
        // The data thread's poll: made here so that its waker can be shared before it starts.
        let data_poll = mio::Poll::new()?;
        let data_waker = mio::Waker::new(data_poll.registry(), tcp::WAKER)?;
        // Last before `Shared` is built, so no early return can drop the region while it is
        // registered (locals drop in reverse order: `rdma` before `region`).
        #[cfg(feature = "rdma")]
        let rdma = rdma::start(&cfg, &region);
        let shared = Arc::new(Shared {
            #[cfg(feature = "rdma")]
            rdma,
            region,
            exchange,
            data_waker,
            counters: TransportCounters::default(),
            stop: AtomicBool::new(false),
            started: std::time::Instant::now(),
            cluster: cfg.cluster.as_ref().map(cluster::ClusterExchange::new),
        });
        let (ready_tx, ready_rx) = std::sync::mpsc::sync_channel(1);
        let data = {
            let shared = Arc::clone(&shared);
            let cfg = cfg.clone();
            std::thread::Builder::new()
                .name("dlock-data".into())
                .spawn(move || data::run(&shared, &cfg, data_poll, ready_tx))?
        };
        // The control thread starts once the data thread has carved the tables.
        ready_rx
            .recv()
            .map_err(|_| io::Error::other("data thread failed to start"))??;
        let bridge = {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name("dlock-wake".into())
                .spawn(move || wake::bridge(&shared))?
        };
        let control = {
            let shared = Arc::clone(&shared);
            let cfg = cfg.clone();
            std::thread::Builder::new()
                .name("dlock-control".into())
                .spawn(move || control::run(&shared, &cfg, listeners))?
        };
        let mut threads = vec![data, control, bridge];
        if shared.cluster.is_some() {
            let shared = Arc::clone(&shared);
            threads.push(
                std::thread::Builder::new()
                    .name("dlock-cluster".into())
                    .spawn(move || cluster::run(&shared))?,
            );
        }
        tracing::info!(tcp = ?tcp_addr, unix = %unix_socket.display(), "dlock server started");
        Ok(ServerHandle {
            shared,
            threads,
            tcp_addr,
            unix_socket,
            fd_budget,
        })
    }

    /// The file-descriptor plan the server started with: the `RLIMIT_NOFILE` it runs under and
    /// the clients and connections it serves (fewer than configured when the limit could not
    /// be raised far enough).
    pub fn fd_budget(&self) -> FdBudget {
        self.fd_budget
    }

    /// The TCP address actually bound (port 0 resolved).
    pub fn tcp_addr(&self) -> Option<SocketAddr> {
        self.tcp_addr
    }

    /// Whether the RDMA data path serves: false when none was configured, or when the device did
    /// not open (the log says why) and the server serves TCP and shared memory only.
    #[cfg(feature = "rdma")]
    pub fn rdma_enabled(&self) -> bool {
        self.shared.rdma.is_some()
    }

    /// The Unix socket local clients connect their control channel to.
    pub fn unix_socket(&self) -> &std::path::Path {
        &self.unix_socket
    }

    /// The region (clients in this process map nothing: they use it directly).
    pub fn region(&self) -> &Region {
        &self.shared.region
    }

    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Stops both threads and waits for them.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        self.shared.wake_data_now();
        self.shared.region.shm_header().ring_bell();
        self.shared.exchange.wake_control();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.unix_socket);
    }
}

impl Drop for ServerHandle {
    fn drop(&mut self) {
        if !self.threads.is_empty() {
            self.shutdown();
        }
        RUNNING.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The server's [`Entropy`](dlock_core::server::Entropy): the operating system's CSPRNG
/// (`getrandom(2)` on Linux). Client ids and session secrets come from here, so nothing a
/// client sees predicts another client's.
///
/// The source is checked once when a server starts ([`ServerHandle::start`] fails if it does not
/// answer); after that a failure means the OS lost its CSPRNG, and serving on with predictable
/// secrets would be worse than stopping, so it panics.
pub fn os_entropy(out: &mut [u8]) {
    if let Err(e) = getrandom::fill(out) {
        panic!("the operating system's CSPRNG failed: {e}");
    }
}

/// Pins the calling thread to `cpu`, logging (not failing) when the OS refuses.
fn pin(cpu: Option<usize>) {
    let Some(cpu) = cpu else { return };
    // SAFETY: a zeroed cpu_set_t is the empty set; CPU_SET writes inside it (cpu is bounded by
    // the set's size below); sched_setaffinity reads `size_of` bytes of it.
    let ok = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if cpu >= 8 * std::mem::size_of::<libc::cpu_set_t>() {
            false
        } else {
            libc::CPU_SET(cpu, &mut set);
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0
        }
    };
    if !ok {
        tracing::warn!(cpu, "could not pin thread");
    }
}
