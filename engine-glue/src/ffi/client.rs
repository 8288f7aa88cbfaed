//! The client library and its instances, by `client_id`: `dclient_lib_init`, `client_init`,
//! `client_reinit`, `client_reinit_done`, `client_deinit`, `client_heartbeat` and the
//! per-instance counters.
//!
//! # Which server `client_init` reaches
//!
//! The reference's client reaches its server by IPv4 address. Here `server_ip` may be
//! - NULL or "": the one server running in this process (`server_start`), through shared
//!   memory. `DLOCK_NOT_READY` when none runs, `DLOCK_EINVAL` when several do (name one by
//!   address: each needs a TCP listener then).
//! - "ip" or "ip:port" (IPv4 or IPv6, `"[v6]:port"`): TCP; without a port, the `primary_port` of
//!   `dclient_lib_init` (21616 by default). With `ssl.ssl_enable` in `dclient_lib_init`'s
//!   settings, under TLS 1.3 with this library's certificate; the server's certificate must
//!   carry the IP address (the C API has no host name to check instead).
//!
//! # TLS
//!
//! The files are read, and the key password asked for, once per server IP address: at the
//! first `client_init` to it. A database engine registers one client per worker, and reading
//! (and with an encrypted key, decrypting) the key for each would call the application's
//! password callback hundreds of times. The result is kept until `dclient_lib_deinit`, so new
//! certificates take a library re-initialisation. Reads for a new address are serialised, so
//! the callbacks are never called from two threads at once.
//!
//! # One data connection per server
//!
//! The clients of this library that reach one server over TCP share one data connection (a
//! [`Mux`]): each registers over a control connection of its own, then joins the shared data
//! connection with its session. An engine with hundreds of workers thus holds hundreds of
//! control connections and one data connection per server, and the server reads and answers
//! many workers' requests per system call.
//!
//! # Registry
//!
//! A map from id to an `Arc<Mutex<Option<Slot>>>`: the map's lock is held only to look an id
//! up, so different clients run in parallel; the slot's lock serialises calls on one client.
//! The `Option` is emptied by `client_deinit`, so a call that looked the id up just before
//! finds the client gone instead of a dangling one.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_uint};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use dlock_core::server::{Counter, Stats};
use dlock_core::{LockId, Status};
use dlock_transport::client::{Client, ClientConfig, Endpoint, Mux, REQUEST_TIMEOUT};
use dlock_transport::tls::{ClientTls, TlsConfig};

use super::caching::Caching;
use super::server::embedded_endpoint;
use super::tls::tls_config;
use super::types::{
    DEBUG_STATS_MAX, DLOCK_DEFAULT_PORT, DLOCK_HEARTBEAT_TIMEOUT_MAX_S, client_cfg, debug_stats,
};
use super::{FAILURE, code, guard, opt_str, read};

/// Times `client_init` registers again when the server hands out an id another in-process
/// client (of another server) already has.
const ID_CLASH_ATTEMPTS: usize = 4;

/// One client instance and what the C API keeps beside it.
#[derive(Debug)]
pub(super) struct Slot {
    /// The Rust client.
    pub(super) client: Client,
    /// The error statuses this instance returned, under the server's counter names.
    stats: Stats,
    /// The lock of the outstanding `lock_request_async`, to report its word when it fails.
    pub(super) async_lock: Option<LockId>,
    /// Where it registered: `None` for the in-process server, else its TCP address.
    target: Option<SocketAddr>,
    /// Its cached locks, revoke notices and revoke callback.
    pub(super) cache: Caching,
}

type Shared = Arc<Mutex<Option<Slot>>>;

#[derive(Debug)]
struct Lib {
    /// Port for addresses given without one.
    port: u16,
    lease_ms: u32,
    timeout: Duration,
    /// `None`: plaintext TCP.
    tls: Option<Arc<TlsClients>>,
    clients: HashMap<c_int, Shared>,
    /// The shared data connection to each TCP server.
    muxes: HashMap<SocketAddr, Mux>,
}

/// The library's TLS settings and what was built from them, per server IP address.
#[derive(Debug)]
struct TlsClients {
    cfg: TlsConfig,
    /// Held while the files are read, so the password callback never runs twice at once.
    by_ip: Mutex<HashMap<IpAddr, ClientTls>>,
}

impl TlsClients {
    /// The TLS endpoint for `addr`, reading the files on the first use of its IP address.
    /// `Einval` when they cannot be used (not the PEM expected, key password refused).
    fn endpoint(&self, addr: SocketAddr) -> Result<Endpoint, Status> {
        // A panic while reading leaves the map as it was: poisoning is ignored.
        let mut by_ip = self.by_ip.lock().unwrap_or_else(PoisonError::into_inner);
        let tls = match by_ip.get(&addr.ip()) {
            Some(tls) => tls.clone(),
            None => {
                let tls = ClientTls::new(&self.cfg, addr).map_err(|e| {
                    tracing::warn!("client_init: TLS settings for {addr}: {e}");
                    Status::Einval
                })?;
                by_ip.insert(addr.ip(), tls.clone());
                tls
            }
        };
        Ok(Endpoint::Tls { addr, tls })
    }
}

/// `None` until `dclient_lib_init`.
static LIB: Mutex<Option<Lib>> = Mutex::new(None);

/// The library state. The map is only inserted into and removed from under this lock, so a
/// panic elsewhere cannot leave it half-changed: poisoning is ignored.
fn lib() -> MutexGuard<'static, Option<Lib>> {
    LIB.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Counts an error code under the counter `Stats::count_status` files it under.
fn count(stats: &mut Stats, c: c_int) {
    if let Ok(c) = u16::try_from(c)
        && let Some(s) = Status::from_code(c)
    {
        stats.count_status(s);
    }
}

/// What a call returns before `dclient_lib_init` and for a client id it does not know (never
/// registered, or deinitialised), as the reference's call of the same name does. Its
/// control-plane calls, which go over its TCP connection, return -1 for both, except that
/// `client_reinit` and `client_heartbeat` return `DLOCK_EINVAL` and `client_reinit_done` and
/// `update_all_locks` `DLOCK_CLIENT_NOT_INIT` for an unknown id; its lock, object and counter
/// calls return `DLOCK_CLIENTMGR_NOT_INIT` and `DLOCK_CLIENT_NOT_INIT`.
#[derive(Clone, Copy, Debug)]
pub(super) struct Refusals {
    not_init: c_int,
    unknown: c_int,
}

impl Refusals {
    /// A control-plane call: -1 for both.
    pub(super) const CONTROL: Refusals = Refusals {
        not_init: FAILURE,
        unknown: FAILURE,
    };
    /// A lock, object or counter call: the two status codes.
    pub(super) const DATA: Refusals = Refusals {
        not_init: Status::ClientMgrNotInit.code(),
        unknown: Status::ClientNotInit.code(),
    };

    /// A control-plane call that answers an unknown id with `unknown`.
    pub(super) const fn control_unknown(unknown: Status) -> Refusals {
        Refusals {
            not_init: FAILURE,
            unknown: unknown.code(),
        }
    }
}

/// Runs `f` on client `client_id` with the client locked; returns its code. Before
/// `dclient_lib_init` and for an id not registered, what `refuse` says; `DLOCK_EINVAL` for a
/// client a panic left untrusted.
pub(super) fn with_client(
    client_id: c_int,
    refuse: Refusals,
    f: impl FnOnce(&mut Slot) -> c_int,
) -> c_int {
    let shared = {
        let lib = lib();
        let Some(lib) = lib.as_ref() else {
            return refuse.not_init;
        };
        match lib.clients.get(&client_id) {
            Some(s) => Arc::clone(s),
            None => return refuse.unknown,
        }
    };
    // A poisoned slot: an earlier call panicked half-way through the client's state.
    let Ok(mut guard) = shared.lock() else {
        return Status::Einval.code();
    };
    let Some(slot) = guard.as_mut() else {
        return refuse.unknown;
    };
    // The cache's ids from before a failover that renumbered locks name other locks now: every
    // call starts from ids the cache has followed (one comparison when nothing changed), so no
    // entry point can forget to. A failover within the call is followed where the cache reads
    // its events.
    slot.cache.follow_renumbering(&mut slot.client);
    let c = f(slot);
    count(&mut slot.stats, c);
    c
}

/// Initialises the client library. Returns 0; `DLOCK_EINVAL` for NULL, a port outside
/// 1024..=65535 (<= 0 means 21616) or TLS settings that name no file or carry a
/// `cert_verify_cb`; -1 when already initialised.
///
/// # Safety
///
/// - `cfg` is NULL or points to a readable `struct client_cfg` whose path fields are NULL or
///   NUL-terminated strings.
/// - `cfg.ssl.prkey_pwd_cb` and `cfg.ssl.erase_prkey_cb` are NULL or functions of their C
///   types that stay callable, from any thread, until `dclient_lib_deinit`; the first writes
///   at most `size` bytes to `buf`, the second only within `buf[..size]`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dclient_lib_init(cfg: *const client_cfg) -> c_int {
    guard(|| {
        // SAFETY: NULL or readable (caller's contract).
        let cfg = match unsafe { read(cfg) } {
            Ok(c) => c,
            Err(s) => return s.code(),
        };
        let port = match cfg.primary_port {
            p if p <= 0 => DLOCK_DEFAULT_PORT,
            p @ 1024..=65535 => p as u16,
            _ => return Status::Einval.code(),
        };
        let timeout = match cfg.timeout_ms {
            0 => REQUEST_TIMEOUT,
            ms => Duration::from_millis(ms.into()),
        };
        // SAFETY: the paths are NULL or NUL-terminated and the callbacks valid until
        // `dclient_lib_deinit`, which drops this configuration (caller's contract).
        let tls = match unsafe { tls_config(&cfg.ssl) } {
            Ok(t) => t,
            Err(s) => return s.code(),
        };
        let mut lib = lib();
        if lib.is_some() {
            return FAILURE;
        }
        *lib = Some(Lib {
            port,
            lease_ms: cfg.lease_ms,
            timeout,
            tls: tls.map(|cfg| {
                Arc::new(TlsClients {
                    cfg,
                    by_ip: Mutex::new(HashMap::new()),
                })
            }),
            clients: HashMap::new(),
            muxes: HashMap::new(),
        });
        Status::Success.code()
    })
}

/// Deregisters every client instance (best effort) and forgets the initialisation.
#[unsafe(no_mangle)]
pub extern "C" fn dclient_lib_deinit() {
    guard(|| {
        let taken = lib().take();
        for (_, shared) in taken.into_iter().flat_map(|l| l.clients) {
            let slot = shared.lock().unwrap_or_else(PoisonError::into_inner).take();
            if let Some(slot) = slot {
                let _ = slot.client.deinit();
            }
        }
        0
    });
}

/// The TCP address in `ip` (`None` for NULL or "").
///
/// # Safety
///
/// - `ip` is NULL or a NUL-terminated string.
unsafe fn target(ip: *const c_char, port: u16) -> Result<Option<SocketAddr>, Status> {
    // SAFETY: forwarded from the caller.
    let Some(s) = (unsafe { opt_str(ip, 64) })? else {
        return Ok(None);
    };
    if let Ok(addr) = s.parse::<SocketAddr>() {
        return Ok(Some(addr));
    }
    let ip: IpAddr = s.parse().map_err(|_| Status::Einval)?;
    Ok(Some(SocketAddr::new(ip, port)))
}

/// Registers a new client instance with a server and writes its id (1..=0x7FFFFFFF).
///
/// `server_ip`: NULL or "" for the server in this process, else "ip" or "ip:port" (TCP, under
/// TLS when the library was initialised with it; see the module docs).
/// Returns 0; -1 before `dclient_lib_init` and for an address that does not parse (as the
/// reference); `DLOCK_EINVAL` (NULL `p_client_id`, several in-process servers, TLS files that
/// cannot be used); `DLOCK_NOT_READY` (no server,
/// refused, recovering, or a failed TLS handshake: the server refused this client's
/// certificate or this client the server's); `DLOCK_SERVER_NO_RESOURCE`;
/// `DLOCK_PROTO_VERSION_NEGOTIATION_FAIL`; `DLOCK_BAD_RESPONSE` (also a plaintext client that
/// reached a TLS server).
///
/// # Safety
///
/// - `p_client_id` is NULL or valid for writing an `int`.
/// - `server_ip` is NULL or a NUL-terminated string.
/// - The TLS callbacks given to `dclient_lib_init` are still callable (its contract).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn client_init(p_client_id: *mut c_int, server_ip: *const c_char) -> c_int {
    guard(|| {
        if p_client_id.is_null() {
            return Status::Einval.code();
        }
        let Some((port, lease_ms, timeout, tls)) = lib()
            .as_ref()
            .map(|l| (l.port, l.lease_ms, l.timeout, l.tls.clone()))
        else {
            return FAILURE;
        };
        // SAFETY: NULL or NUL-terminated (caller's contract).
        let Ok(target) = (unsafe { target(server_ip, port) }) else {
            return FAILURE;
        };
        let endpoint = match (target, tls) {
            (Some(addr), Some(tls)) => tls.endpoint(addr),
            (Some(addr), None) => Ok(Endpoint::Tcp(addr)),
            (None, _) => embedded_endpoint(),
        };
        let endpoint = match endpoint {
            Ok(e) => e,
            Err(s) => return s.code(),
        };
        let mut cfg = ClientConfig::new(endpoint);
        cfg.lease = Duration::from_millis(lease_ms.into());
        cfg.timeout = timeout;
        if let Some(addr) = target {
            let mut lib = lib();
            let Some(l) = lib.as_mut() else {
                return FAILURE;
            };
            cfg.mux = match l.muxes.get(&addr) {
                Some(mux) => Some(mux.clone()),
                None => match Mux::new(&cfg.endpoint) {
                    Ok(mux) => Some(l.muxes.entry(addr).or_insert(mux).clone()),
                    Err(_) => None,
                },
            };
        }
        for _ in 0..ID_CLASH_ATTEMPTS {
            let client = match Client::connect(cfg.clone()) {
                Ok(c) => c,
                Err(e) => return e.status().code(),
            };
            let id = client.id().get() as c_int;
            let mut lib = lib();
            let Some(l) = lib.as_mut() else {
                drop(lib);
                let _ = client.deinit();
                return FAILURE;
            };
            if l.clients.contains_key(&id) {
                drop(lib);
                let _ = client.deinit();
                continue;
            }
            let slot = Slot {
                client,
                stats: Stats::default(),
                async_lock: None,
                target,
                cache: Caching::new(),
            };
            l.clients.insert(id, Arc::new(Mutex::new(Some(slot))));
            // SAFETY: not NULL (checked above) and writable by the caller's contract.
            unsafe { p_client_id.write_unaligned(id) };
            return Status::Success.code();
        }
        Status::ServerNoResource.code()
    })
}

/// Re-registers client `client_id` with the same id over new connections, keeping its lock
/// state (after a network error or a server restart). `server_ip` must be NULL, "" or the
/// address the client registered with: a client cannot move to another server here.
///
/// Returns 0 (then, if the server is recovering, call `update_all_locks` and
/// `client_reinit_done`); -1 before `dclient_lib_init` and for an address that does not parse;
/// `DLOCK_EINVAL` (unknown id, another address); `DLOCK_NOT_READY`;
/// `DLOCK_CLIENT_REMOVED_BY_SERVER`; `DLOCK_SERVER_NO_RESOURCE`.
///
/// # Safety
///
/// - `server_ip` is NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn client_reinit(client_id: c_int, server_ip: *const c_char) -> c_int {
    guard(|| {
        let port = lib().as_ref().map_or(DLOCK_DEFAULT_PORT, |l| l.port);
        with_client(
            client_id,
            Refusals::control_unknown(Status::Einval),
            |slot| {
                // SAFETY: NULL or NUL-terminated (caller's contract).
                let Ok(asked) = (unsafe { target(server_ip, port) }) else {
                    return FAILURE;
                };
                if asked.is_some() && asked != slot.target {
                    return Status::Einval.code();
                }
                slot.async_lock = None;
                code(slot.client.reinit().map(drop))
            },
        )
    })
}

/// Drops the data path of client `client_id` and keeps its registration and control
/// connection, as if its data connection had died: data calls fail (`DLOCK_BAD_RESPONSE`)
/// until `client_reinit`. For fault-injection tests (a Rust function, not part of the C API).
/// Returns 0, or the refusal of an unknown client.
#[doc(hidden)]
pub fn drop_data_path(client_id: c_int) -> c_int {
    with_client(client_id, Refusals::DATA, |slot| {
        slot.client.drop_data_path();
        Status::Success.code()
    })
}

/// Tells the server client `client_id` finished re-syncing its locks after `client_reinit`.
/// -1 before `dclient_lib_init`, `DLOCK_CLIENT_NOT_INIT` for an unknown id, and -1 (as the
/// reference) without a `client_reinit` since the last call.
#[unsafe(no_mangle)]
pub extern "C" fn client_reinit_done(client_id: c_int) -> c_int {
    guard(|| {
        with_client(
            client_id,
            Refusals::control_unknown(Status::ClientNotInit),
            |slot| match slot.client.reinit_done() {
                // The server's refusal of a client that is not re-initialising.
                Err(e) if e == Status::Einval => FAILURE,
                r => code(r),
            },
        )
    })
}

/// Deregisters client `client_id`: the server releases everything it held. The id is gone
/// even when the exchange fails (then `DLOCK_BAD_RESPONSE`), except that a recovering server's
/// `DLOCK_NOT_READY` keeps it: that server keeps the client and its locks, so the id stays
/// usable to call `client_deinit` again once it serves (the reference forgets the id here
/// while its server keeps the locks until the client's connection is found dead). -1 before
/// `dclient_lib_init` and for an unknown id, as the reference.
#[unsafe(no_mangle)]
pub extern "C" fn client_deinit(client_id: c_int) -> c_int {
    guard(|| {
        let refuse = Refusals::CONTROL;
        let shared = match lib().as_ref() {
            None => return refuse.not_init,
            Some(l) => l.clients.get(&client_id).cloned(),
        };
        let Some(shared) = shared else {
            return refuse.unknown;
        };
        // Even a client a panic left untrusted is told to leave.
        let mut guard = shared.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(slot) = guard.as_mut() else {
            return refuse.unknown;
        };
        let r = slot.client.try_deinit();
        if r.as_ref().is_err_and(|e| *e == Status::NotReady) {
            return Status::NotReady.code();
        }
        guard.take();
        drop(guard);
        if let Some(l) = lib().as_mut() {
            // Only this entry: a client registered since under the same id is another one.
            if l.clients
                .get(&client_id)
                .is_some_and(|s| Arc::ptr_eq(s, &shared))
            {
                l.clients.remove(&client_id);
            }
        }
        code(r)
    })
}

/// Renews client `client_id`'s lease. `timeout` (1..=300 s) is checked as in the reference;
/// the exchange itself is bounded by the library's request timeout.
/// Returns 0; -1 before `dclient_lib_init`; `DLOCK_EINVAL` (timeout out of range, unknown
/// id); `DLOCK_BAD_RESPONSE`; `DLOCK_NOT_READY`.
#[unsafe(no_mangle)]
pub extern "C" fn client_heartbeat(client_id: c_int, timeout: c_uint) -> c_int {
    guard(|| {
        with_client(
            client_id,
            Refusals::control_unknown(Status::Einval),
            |slot| {
                if !(1..=DLOCK_HEARTBEAT_TIMEOUT_MAX_S).contains(&timeout) {
                    return Status::Einval.code();
                }
                code(slot.client.heartbeat())
            },
        )
    })
}

/// Copies client `client_id`'s counters into `*stats`: the error statuses its calls returned,
/// under the same `enum debug_stats_code` indices as the server's (the server-only counters
/// stay 0). Returns 0, `DLOCK_EINVAL` for NULL, `DLOCK_CLIENT_NOT_INIT`.
///
/// # Safety
///
/// - `stats` is NULL or valid for writing a `struct debug_stats`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn get_client_debug_stats(
    client_id: c_int,
    stats: *mut debug_stats,
) -> c_int {
    guard(|| {
        if stats.is_null() {
            return Status::Einval.code();
        }
        with_client(client_id, Refusals::DATA, |slot| {
            let out = debug_stats {
                stats: slot.stats.0,
            };
            // SAFETY: not NULL (checked above) and writable by the caller's contract.
            unsafe { stats.write_unaligned(out) };
            Status::Success.code()
        })
    })
}

/// Zeroes client `client_id`'s counters.
#[unsafe(no_mangle)]
pub extern "C" fn clear_client_debug_stats(client_id: c_int) -> c_int {
    guard(|| {
        with_client(client_id, Refusals::DATA, |slot| {
            slot.stats = Stats::default();
            Status::Success.code()
        })
    })
}

const _: () = assert!(DEBUG_STATS_MAX == Counter::COUNT);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_parse_with_or_without_a_port() {
        // SAFETY: NUL-terminated literals (or NULL).
        unsafe {
            assert_eq!(target(std::ptr::null(), 1), Ok(None));
            assert_eq!(target(c"".as_ptr(), 1), Ok(None));
            assert_eq!(
                target(c"10.0.0.1".as_ptr(), 21616),
                Ok(Some("10.0.0.1:21616".parse().unwrap()))
            );
            assert_eq!(
                target(c"[::1]:7".as_ptr(), 21616),
                Ok(Some("[::1]:7".parse().unwrap()))
            );
            assert_eq!(target(c"db-host".as_ptr(), 1), Err(Status::Einval));
        }
    }

    #[test]
    fn error_codes_are_counted_and_successes_are_not() {
        let mut s = Stats::default();
        count(&mut s, 0);
        count(&mut s, -1);
        count(&mut s, Status::Fail.code());
        count(&mut s, Status::Einval.code());
        assert_eq!(s.get(Counter::Fail), 1);
        assert_eq!(s.get(Counter::Einval), 1);
        assert_eq!(s.0.iter().sum::<u64>(), 2);
    }
}
