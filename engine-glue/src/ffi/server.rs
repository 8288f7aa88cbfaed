//! `dlock_server_api.h`: the process's servers, by `server_id`.
//!
//! The registry is the reference's server manager: `dserver_lib_init(n)` allows `n` (1..=32)
//! servers at once, `server_start` hands out ids 1..=0xFFFFF round-robin. Each server is an
//! [`EmbeddedServer`]: its two threads run until `server_stop`.
//!
//! The counters (`get_server_debug_stats`) live on the server's data thread; they are read with
//! one `Stats` request over the server's Unix socket, which needs no client registration and so
//! takes no client slot. `clear_server_debug_stats` cannot reach into the data thread, so it
//! records the current values as a baseline that later reads subtract.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_uint};
use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use dlock_core::proto::{
    CONTROL_FRAME_MAX, CONTROL_HEADER_LEN, ControlHeader, ControlRequest, ControlRequestFrame,
    ControlResponse, MsgType, PROTO_VERSION, control_frame_len, decode_control_response,
    encode_control_request,
};
use dlock_core::server::Counter;
use dlock_core::{Config, Status};
use dlock_transport::client::Endpoint;
use dlock_transport::runtime::{IdleStrategy, ServerConfig, TcpConfig};

use super::cluster;
use super::tls::tls_config;
use super::types::{
    DLOCK_DEFAULT_PORT, DLOCK_SERVER_ID_MAX, MAX_NUM_SERVER, SERVER_PRIMARY, debug_stats,
    server_cfg,
};
use super::{FAILURE, guard, opt_str, read};
use crate::EmbeddedServer;

/// How long a counters read may take.
const STATS_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug)]
struct Running {
    server: EmbeddedServer,
    /// Counter values at the last `clear_server_debug_stats`.
    baseline: [u64; Counter::COUNT],
}

#[derive(Debug)]
struct Servers {
    /// `dserver_lib_init`'s limit.
    max: usize,
    /// The id to try next.
    next: c_int,
    running: HashMap<c_int, Running>,
}

impl Servers {
    /// The next free id in 1..=0xFFFFF, round-robin.
    fn take_id(&mut self) -> c_int {
        loop {
            let id = self.next;
            self.next = if id >= DLOCK_SERVER_ID_MAX { 1 } else { id + 1 };
            if !self.running.contains_key(&id) {
                return id;
            }
        }
    }
}

/// `None` until `dserver_lib_init`.
static SERVERS: Mutex<Option<Servers>> = Mutex::new(None);

/// The registry. A panic while it was held (only possible inside a server start) leaves the map
/// itself consistent, so poisoning is ignored.
fn servers() -> MutexGuard<'static, Option<Servers>> {
    SERVERS.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The endpoint of the one server running in this process, for `client_init(NULL)`:
/// `NotReady` when there is none, `Einval` when there are several (name one by address).
pub(super) fn embedded_endpoint() -> Result<Endpoint, Status> {
    let reg = servers();
    let running = reg.as_ref().map(|r| &r.running).ok_or(Status::NotReady)?;
    let mut it = running.values();
    match (it.next(), it.next()) {
        (Some(r), None) => Ok(r.server.endpoint()),
        (None, _) => Err(Status::NotReady),
        (Some(_), Some(_)) => Err(Status::Einval),
    }
}

/// Initialises the server library for at most `max_server_num` (1..=32) servers at once.
/// Returns 0, or -1 when already initialised or the number is out of range.
#[unsafe(no_mangle)]
pub extern "C" fn dserver_lib_init(max_server_num: c_uint) -> c_int {
    guard(|| {
        if !(1..=MAX_NUM_SERVER).contains(&(max_server_num as usize)) {
            return FAILURE;
        }
        let mut reg = servers();
        if reg.is_some() {
            return FAILURE;
        }
        *reg = Some(Servers {
            max: max_server_num as usize,
            next: 1,
            running: HashMap::new(),
        });
        Status::Success.code()
    })
}

/// Stops every server and forgets the library's initialisation.
#[unsafe(no_mangle)]
pub extern "C" fn dserver_lib_deinit() {
    guard(|| {
        let taken = servers().take();
        // Stop outside the registry lock: joining threads takes a moment.
        for (_, r) in taken.into_iter().flat_map(|s| s.running) {
            r.server.shutdown();
        }
        0
    });
}

/// The first CPU of a cpuset string ("3", "2-5", "1,4"); `Ok(None)` for NULL or "".
///
/// # Safety
///
/// - `p` is NULL or a NUL-terminated string.
unsafe fn first_cpu(p: *const c_char) -> Result<Option<usize>, Status> {
    // SAFETY: forwarded from the caller.
    let Some(s) = (unsafe { opt_str(p, 256) })? else {
        return Ok(None);
    };
    let mut first = None;
    for item in s.split(',') {
        let (lo, hi) = item.trim().split_once('-').unwrap_or((item, item));
        let lo: usize = lo.trim().parse().map_err(|_| Status::Einval)?;
        let hi: usize = hi.trim().parse().map_err(|_| Status::Einval)?;
        if lo > hi {
            return Err(Status::Einval);
        }
        first.get_or_insert(lo);
    }
    Ok(first)
}

/// The TCP listener `cfg` asks for, if any, with its TLS settings.
///
/// # Safety
///
/// - `cfg.primary.server_ip_str` and the paths in `cfg.ssl` are NULL or NUL-terminated
///   strings.
/// - `cfg.ssl`'s callbacks meet the contract of [`tls_config`].
unsafe fn tcp(cfg: &server_cfg) -> Result<Option<TcpConfig>, Status> {
    // Checked even without a listener: a TLS setting that names no file is a mistake to
    // report, not to discover when a listener is added.
    // SAFETY: forwarded from the caller.
    let tls = unsafe { tls_config(&cfg.ssl) }?;
    // SAFETY: forwarded from the caller.
    let Some(ip) = (unsafe { opt_str(cfg.primary.server_ip_str, 64) })? else {
        return Ok(None);
    };
    let ip: IpAddr = ip.parse().map_err(|_| Status::Einval)?;
    let port = match cfg.primary.server_port {
        0 => DLOCK_DEFAULT_PORT,
        p if p < 0 => 0,
        p => u16::try_from(p).map_err(|_| Status::Einval)?,
    };
    let mut tcp = TcpConfig::new(SocketAddr::new(ip, port));
    tcp.tls = tls;
    tcp.insecure_plaintext = cfg.insecure_plaintext != 0;
    Ok(Some(tcp))
}

/// `value`, or `default` when it is 0.
fn or_default(value: c_uint, default: u32) -> u32 {
    if value == 0 { default } else { value }
}

/// The Rust settings for a C `server_cfg`; `Einval` for anything we cannot honour.
///
/// # Safety
///
/// - The string pointers in `cfg` are NULL or NUL-terminated strings.
/// - `cfg.ssl`'s callbacks meet the contract of [`tls_config`].
unsafe fn settings(cfg: &server_cfg) -> Result<ServerConfig, Status> {
    let p = &cfg.primary;
    if cfg.r#type != SERVER_PRIMARY || p.num_of_replica != 0 || p.replica_enable != 0 {
        return Err(Status::Einval);
    }
    let d = Config::DEFAULT;
    let core = Config {
        locks_max: or_default(cfg.locks_max, d.locks_max),
        clients_max: or_default(cfg.clients_max, d.clients_max),
        objects_max: or_default(cfg.objects_max, d.objects_max),
        client_lease_ms: or_default(cfg.client_lease_ms, d.client_lease_ms),
        client_lease_max_ms: or_default(cfg.client_lease_max_ms, d.client_lease_max_ms),
        recovery_clients: p.recovery_client_num,
        epoch: u16::try_from(or_default(cfg.epoch, d.epoch.into())).map_err(|_| Status::Einval)?,
        recovery_deadline_ms: d.recovery_deadline_ms,
        clients_per_peer_max: d.clients_per_peer_max,
        // The C configuration has no cached-grant settings yet: the defaults.
        timing: d.timing,
    };
    core.validate()?;
    let mut s = ServerConfig::new(core);
    s.idle = if cfg.sleep_mode_enable != 0 {
        IdleStrategy::Park
    } else {
        IdleStrategy::Adaptive
    };
    // SAFETY: the string pointers are NULL or NUL-terminated and the callbacks valid
    // (forwarded from the caller).
    unsafe {
        s.tcp = tcp(cfg)?;
        s.pin = (first_cpu(p.ctrl_cpuset)?, first_cpu(p.cmd_cpuset)?);
        s.shm_name = opt_str(cfg.shm_name, 255)?.map(str::to_owned);
        if let Some(path) = opt_str(cfg.session_key_file, 4096)? {
            let key = dlock_transport::runtime::read_session_key_file(path.as_ref());
            s.session_key = Some(key.map_err(|e| {
                tracing::error!(error = %e, "server_start: session key refused");
                Status::Einval
            })?);
        }
    }
    // Without a key and without this, the runtime refuses a recovering server (`Einval`).
    s.insecure_recovery = cfg.insecure_recovery != 0;
    s.recoverers.local = cfg.recoverer_local != 0;
    Ok(s)
}

/// What a failed start returns: the reference's -1 for an address that cannot be bound,
/// `DLOCK_EINVAL` for settings the runtime refused (`InvalidInput`: plaintext on a network
/// address, no cipher suite, cluster settings etcd's cluster refused; `InvalidData`: a TLS
/// file that is not the PEM expected, a key that does not match its certificate or cannot be
/// decrypted), `DLOCK_NOT_READY` for a cluster member whose etcd did not answer or whose map
/// did not come in time (`TimedOut`), `DLOCK_SERVER_NO_RESOURCE` otherwise (memory, threads,
/// the process-wide limit of 32 servers).
fn start_error(e: &io::Error) -> c_int {
    use io::ErrorKind as K;
    match e.kind() {
        K::InvalidInput | K::InvalidData => Status::Einval.code(),
        K::TimedOut => Status::NotReady.code(),
        K::AddrInUse | K::AddrNotAvailable | K::PermissionDenied => FAILURE,
        _ => Status::ServerNoResource.code(),
    }
}

/// Starts a server and writes its id (1..=0xFFFFF) to `*server_id`.
///
/// Returns 0; `DLOCK_EINVAL` for NULL pointers, settings out of range, TLS settings that
/// cannot be used (a missing file, not the PEM expected, a key password refused or wrong, a
/// non-NULL `cert_verify_cb`), plaintext on a non-loopback address without
/// `insecure_plaintext`, a `session_key_file` that cannot be read or holds a key of obviously
/// low entropy, or `primary.recovery_client_num > 0` with neither a `session_key_file` nor
/// `insecure_recovery` (the reference recovers without a key), `cluster` fields set in a
/// library built without the `cluster` feature, or cluster fields out of range or refused by
/// the cluster; -1 before `dserver_lib_init` or when the TCP address cannot be bound;
/// `DLOCK_NOT_READY` when a cluster member's etcd did not answer in time;
/// `DLOCK_SERVER_NO_RESOURCE` when `dserver_lib_init`'s limit is reached or resources run out.
///
/// With `cluster.etcd_endpoints` set (feature `cluster`), the server joins that cluster
/// (`EmbeddedServer::start_cluster`), and this returns once it serves a map that gives it its
/// partitions.
///
/// With `ssl.ssl_enable` the key is read (and `prkey_pwd_cb`, then `erase_prkey_cb`, called)
/// once, on the calling thread, before this returns; they are never called afterwards.
///
/// # Safety
///
/// - `cfg` is NULL or points to a `server_cfg` whose string fields are NULL or NUL-terminated.
/// - `cfg.ssl.prkey_pwd_cb` and `cfg.ssl.erase_prkey_cb` are NULL or functions of their C
///   types; the first writes at most `size` bytes to `buf`, the second only within
///   `buf[..size]`.
/// - `server_id` is NULL or valid for writing an `int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn server_start(cfg: *const server_cfg, server_id: *mut c_int) -> c_int {
    guard(|| {
        // SAFETY: `cfg` is NULL or a readable `server_cfg` (caller's contract).
        let cfg = match unsafe { read(cfg) } {
            Ok(c) => c,
            Err(s) => return s.code(),
        };
        if server_id.is_null() {
            return Status::Einval.code();
        }
        // SAFETY: the strings in `cfg` are NULL or NUL-terminated and its callbacks valid
        // (caller's contract); the callbacks are used only before `server_start` returns.
        let settings = match unsafe { settings(&cfg) } {
            Ok(s) => s,
            Err(s) => return s.code(),
        };
        // SAFETY: as above.
        let role = match unsafe { cluster::role(&cfg.cluster) } {
            Ok(r) => r,
            Err(s) => return s.code(),
        };
        match servers().as_ref() {
            None => return FAILURE,
            Some(reg) if reg.running.len() >= reg.max => {
                return Status::ServerNoResource.code();
            }
            Some(_) => {}
        }
        // Started outside the registry's lock: a cluster member waits for etcd and its map
        // (seconds), which must not hold up every other call that looks a server up.
        let server = match role.start(settings) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!("server_start: {e}");
                return start_error(&e);
            }
        };
        let mut reg = servers();
        let Some(reg) = reg.as_mut().filter(|r| r.running.len() < r.max) else {
            // Deinitialised, or filled by other starts meanwhile.
            drop(reg);
            server.shutdown();
            return Status::ServerNoResource.code();
        };
        let id = reg.take_id();
        reg.running.insert(
            id,
            Running {
                server,
                baseline: [0; Counter::COUNT],
            },
        );
        // SAFETY: not NULL (checked above) and writable by the caller's contract.
        unsafe { server_id.write_unaligned(id) };
        Status::Success.code()
    })
}

/// Stops server `server_id` and releases its region. Returns 0, or -1 for an unknown id.
/// Clients still registered with it get `DLOCK_BAD_RESPONSE` (or a 5 s timeout) afterwards.
#[unsafe(no_mangle)]
pub extern "C" fn server_stop(server_id: c_int) -> c_int {
    guard(|| {
        let taken = servers()
            .as_mut()
            .and_then(|r| r.running.remove(&server_id));
        match taken {
            Some(r) => {
                r.server.shutdown();
                Status::Success.code()
            }
            None => FAILURE,
        }
    })
}

/// The Unix socket and baseline of a running server.
fn lookup(server_id: c_int) -> Option<(PathBuf, [u64; Counter::COUNT])> {
    let reg = servers();
    let r = reg.as_ref()?.running.get(&server_id)?;
    Some((r.server.handle().unix_socket().to_path_buf(), r.baseline))
}

/// Reads a server's counters with one `Stats` request on its Unix socket.
fn read_counters(unix_socket: &Path) -> io::Result<[u64; Counter::COUNT]> {
    let bad = |what: &str| io::Error::new(io::ErrorKind::InvalidData, what.to_owned());
    let header = ControlHeader {
        version: PROTO_VERSION,
        msg: MsgType::Stats,
        message_id: 1,
        word: 0,
    };
    let mut buf = vec![0u8; CONTROL_FRAME_MAX];
    let frame = ControlRequestFrame {
        header,
        body: ControlRequest::Stats,
    };
    let n = encode_control_request(&frame, &mut buf).map_err(|_| bad("encode"))?;
    let mut s = UnixStream::connect(unix_socket)?;
    s.set_read_timeout(Some(STATS_TIMEOUT))?;
    s.set_write_timeout(Some(STATS_TIMEOUT))?;
    s.write_all(&buf[..n])?;
    s.read_exact(&mut buf[..CONTROL_HEADER_LEN])?;
    let len = control_frame_len(&buf[..CONTROL_HEADER_LEN]).map_err(|_| bad("header"))?;
    if len > buf.len() {
        return Err(bad("length"));
    }
    s.read_exact(&mut buf[CONTROL_HEADER_LEN..len])?;
    let reply = decode_control_response(&buf[..len]).map_err(|_| bad("decode"))?;
    let (Some(Status::Success), ControlResponse::Counters(c)) = (reply.header.status(), reply.body)
    else {
        return Err(bad("not counters"));
    };
    let mut out = [0; Counter::COUNT];
    for (o, v) in out.iter_mut().zip(c.iter()) {
        *o = v;
    }
    Ok(out)
}

/// Copies server `server_id`'s counters (since the last clear) into `*stats`, indexed by
/// `enum debug_stats_code`. Returns 0; -1 for an unknown id or when the server does not
/// answer; `DLOCK_EINVAL` for NULL `stats`.
///
/// # Safety
///
/// - `stats` is NULL or valid for writing a `struct debug_stats`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn get_server_debug_stats(
    server_id: c_int,
    stats: *mut debug_stats,
) -> c_int {
    guard(|| {
        if stats.is_null() {
            return Status::Einval.code();
        }
        let Some((socket, baseline)) = lookup(server_id) else {
            return FAILURE;
        };
        let Ok(now) = read_counters(&socket) else {
            return FAILURE;
        };
        let mut out = debug_stats {
            stats: [0; Counter::COUNT],
        };
        for ((o, n), b) in out.stats.iter_mut().zip(now).zip(baseline) {
            *o = n.saturating_sub(b);
        }
        // SAFETY: not NULL (checked above) and writable by the caller's contract.
        unsafe { stats.write_unaligned(out) };
        Status::Success.code()
    })
}

/// Zeroes server `server_id`'s counters as `get_server_debug_stats` reports them. Returns 0,
/// or -1 for an unknown id or when the server does not answer.
#[unsafe(no_mangle)]
pub extern "C" fn clear_server_debug_stats(server_id: c_int) -> c_int {
    guard(|| {
        let Some((socket, _)) = lookup(server_id) else {
            return FAILURE;
        };
        let Ok(now) = read_counters(&socket) else {
            return FAILURE;
        };
        match servers()
            .as_mut()
            .and_then(|r| r.running.get_mut(&server_id))
        {
            Some(r) => {
                r.baseline = now;
                Status::Success.code()
            }
            None => FAILURE,
        }
    })
}

/// Writes the TCP port server `server_id` listens on (useful after asking for any free port
/// with `server_port < 0`). Returns 0; -1 for an unknown id or a server without TCP;
/// `DLOCK_EINVAL` for NULL `port`.
///
/// # Safety
///
/// - `port` is NULL or valid for writing an `int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn server_tcp_port(server_id: c_int, port: *mut c_int) -> c_int {
    guard(|| {
        if port.is_null() {
            return Status::Einval.code();
        }
        let addr = servers()
            .as_ref()
            .and_then(|r| r.running.get(&server_id))
            .and_then(|r| r.server.tcp_addr());
        let Some(addr) = addr else {
            return FAILURE;
        };
        // SAFETY: not NULL (checked above) and writable by the caller's contract.
        unsafe { port.write_unaligned(c_int::from(addr.port())) };
        Status::Success.code()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpusets_pin_to_their_first_cpu() {
        // SAFETY: NUL-terminated literals (or NULL).
        unsafe {
            assert_eq!(first_cpu(std::ptr::null()), Ok(None));
            assert_eq!(first_cpu(c"".as_ptr()), Ok(None));
            assert_eq!(first_cpu(c"3".as_ptr()), Ok(Some(3)));
            assert_eq!(first_cpu(c"2-5,9".as_ptr()), Ok(Some(2)));
            assert_eq!(first_cpu(c"5-2".as_ptr()), Err(Status::Einval));
            assert_eq!(first_cpu(c"x".as_ptr()), Err(Status::Einval));
        }
    }
}
