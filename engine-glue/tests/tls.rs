//! TLS through the C ABI (`struct ssl_cfg` in `server_cfg` and `client_cfg`), driven the way a
//! C engine would, through the `extern "C"` functions: a TLS server and a TLS client lock and
//! unlock; a plaintext client is refused with a code, not left waiting; settings that cannot
//! work are `DLOCK_EINVAL`; an encrypted key is opened through the password callback, whose
//! buffer the erase callback then sees.
//!
//! The certificates come from transport's test helper (a fresh CA and keys per test, in a
//! temporary directory). The server and client registries are process-wide, so the tests take
//! turns on `SERIAL` and each leaves both libraries de-initialised, even when it fails.

#[path = "../../transport/tests/common/certs.rs"]
mod certs;

use std::ffi::{CString, c_char, c_int, c_void};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use certs::{Ca, Leaf, TempDir, encrypt_key};
use dlock_engine_glue::dlock_core::Status;
use dlock_engine_glue::dlock_core::server::Counter;
use dlock_engine_glue::ffi::types::*;
use dlock_engine_glue::ffi::{client, locks, ops, server};

static SERIAL: Mutex<()> = Mutex::new(());

/// Holds `SERIAL` and de-initialises both libraries when dropped, so that a failed test does
/// not leave the next one with "already initialised".
struct Libs {
    _serial: MutexGuard<'static, ()>,
}

impl Libs {
    fn init(servers_max: u32) -> Libs {
        let guard = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
        assert_eq!(server::dserver_lib_init(servers_max), 0);
        Libs { _serial: guard }
    }
}

impl Drop for Libs {
    fn drop(&mut self) {
        client::dclient_lib_deinit();
        server::dserver_lib_deinit();
    }
}

/// A CA, a server certificate for 127.0.0.1 and a client certificate, as C strings.
struct Pki {
    dir: TempDir,
    ca_path: CString,
    server: Leaf,
    client: Leaf,
}

impl Pki {
    fn new(tag: &str) -> Pki {
        let dir = TempDir::new(tag);
        let ca = Ca::new(&dir, "ca");
        let server = ca.server(&dir, "server");
        let client = ca.client(&dir, "client", "engine-1");
        Pki {
            ca_path: c_path(&ca.cert),
            dir,
            server,
            client,
        }
    }
}

fn c_path(p: &Path) -> CString {
    CString::new(p.as_os_str().as_encoded_bytes()).unwrap()
}

/// Paths that `ssl_cfg` points into; kept alive as long as the `ssl_cfg` is used.
struct Paths {
    cert: CString,
    key: CString,
}

impl Paths {
    fn of(leaf: &Leaf) -> Paths {
        Paths {
            cert: c_path(&leaf.cert),
            key: c_path(&leaf.key),
        }
    }

    fn ssl(&self, ca: &CString) -> ssl_cfg {
        ssl_cfg {
            ssl_enable: 1,
            ca_path: ca.as_ptr(),
            cert_path: self.cert.as_ptr(),
            prkey_path: self.key.as_ptr(),
            ..ssl_cfg::DISABLED
        }
    }
}

fn server_cfg_on_loopback(ssl: ssl_cfg) -> server_cfg {
    server_cfg {
        r#type: SERVER_PRIMARY,
        log_level: 0,
        sleep_mode_enable: 1,
        primary: primary_cfg {
            num_of_replica: 0,
            recovery_client_num: 0,
            ctrl_cpuset: std::ptr::null(),
            cmd_cpuset: std::ptr::null(),
            server_ip_str: c"127.0.0.1".as_ptr(),
            server_port: -1,
            replica_port: 0,
            replica_enable: 0,
        },
        locks_max: 64,
        clients_max: 8,
        objects_max: 4,
        client_lease_ms: 0,
        client_lease_max_ms: 0,
        epoch: 0,
        shm_name: std::ptr::null(),
        ssl,
        insecure_plaintext: 0,
        session_key_file: std::ptr::null(),
        insecure_recovery: 0,
        recoverer_local: 0,
        cluster: cluster_cfg::STANDALONE,
    }
}

fn client_cfg_with(ssl: ssl_cfg) -> client_cfg {
    client_cfg {
        log_level: 0,
        primary_port: 0,
        lease_ms: 0,
        // Short, so that a refused connection cannot look like a hang in this test.
        timeout_ms: 2_000,
        ssl,
    }
}

/// Starts a server and returns its id and "127.0.0.1:port".
fn start(cfg: &server_cfg) -> (c_int, CString) {
    let (mut sid, mut port) = (0, 0);
    // SAFETY: pointers to live locals; `cfg`'s strings outlive the call.
    unsafe {
        assert_eq!(server::server_start(cfg, &mut sid), 0, "server_start");
        assert_eq!(server::server_tcp_port(sid, &mut port), 0);
    }
    (sid, CString::new(format!("127.0.0.1:{port}")).unwrap())
}

/// Registers a client at `addr`, takes an exclusive atomic lock and gives it back.
fn lock_and_unlock(addr: &CString) {
    let (mut cid, mut lock_id) = (0, 0);
    let name = b"tls/row-group-1";
    let desc = lock_desc {
        p_desc: name.as_ptr().cast(),
        len: name.len() as u32,
        lock_type: DLOCK_ATOMIC,
        lease_time: 0,
    };
    let mut st = lock_state::from_word(0);
    // SAFETY: pointers to live locals of the right types.
    unsafe {
        assert_eq!(
            client::client_init(&mut cid, addr.as_ptr()),
            0,
            "client_init"
        );
        assert_eq!(locks::get_lock(cid, &desc, &mut lock_id), 0);
        let req = lock_request {
            lock_id,
            lock_op: LOCK_EXCLUSIVE,
            expire_time: 5,
        };
        assert_eq!(ops::trylock(cid, &req, (&raw mut st).cast()), 0);
        assert_eq!(st.atomic.client_id, cid, "the grant is ours");
        assert_eq!(ops::unlock(cid, lock_id, (&raw mut st).cast()), 0);
        assert_eq!(client::client_deinit(cid), 0);
    }
}

fn server_counter(sid: c_int, index: usize) -> u64 {
    let mut ds = debug_stats {
        stats: [0; DEBUG_STATS_MAX],
    };
    // SAFETY: a pointer to a live local.
    assert_eq!(unsafe { server::get_server_debug_stats(sid, &mut ds) }, 0);
    ds.stats[index]
}

/// `DEBUG_STATS_TLS_NOT_TLS` in the header (checked against `Counter` by tests/c_abi.rs).
const DEBUG_STATS_TLS_NOT_TLS: usize = Counter::TlsNotTls as usize;

#[test]
fn tls_client_locks_and_unlocks_on_a_tls_server() {
    let _libs = Libs::init(1);
    let pki = Pki::new("cabi-lock");
    let (server_paths, client_paths) = (Paths::of(&pki.server), Paths::of(&pki.client));
    let (sid, addr) = start(&server_cfg_on_loopback(server_paths.ssl(&pki.ca_path)));
    let ccfg = client_cfg_with(client_paths.ssl(&pki.ca_path));
    // SAFETY: a pointer to a live local whose strings outlive the library (dropped in order).
    assert_eq!(unsafe { client::dclient_lib_init(&ccfg) }, 0);
    lock_and_unlock(&addr);
    // A second client reuses what the first one read.
    lock_and_unlock(&addr);
    assert_eq!(server::server_stop(sid), 0);
}

#[test]
fn plaintext_client_is_refused_by_a_tls_server_with_a_code() {
    let _libs = Libs::init(1);
    let pki = Pki::new("cabi-plain");
    let server_paths = Paths::of(&pki.server);
    let (sid, addr) = start(&server_cfg_on_loopback(server_paths.ssl(&pki.ca_path)));
    let ccfg = client_cfg_with(ssl_cfg::DISABLED);
    let mut cid = 0;
    // SAFETY: pointers to live locals.
    unsafe {
        assert_eq!(client::dclient_lib_init(&ccfg), 0);
        let began = Instant::now();
        let r = client::client_init(&mut cid, addr.as_ptr());
        // The TCP connection is made; the registration exchange is what fails.
        assert_eq!(r, Status::BadResponse.code(), "client_init returned {r:#x}");
        assert!(began.elapsed() < Duration::from_secs(10), "no hang");
    }
    assert!(server_counter(sid, DEBUG_STATS_TLS_NOT_TLS) >= 1);
    assert_eq!(server::server_stop(sid), 0);
}

#[test]
fn client_with_a_certificate_from_another_ca_is_refused_with_a_code() {
    let _libs = Libs::init(1);
    let pki = Pki::new("cabi-foreign");
    let other_ca = Ca::new(&pki.dir, "other-ca");
    let foreign = other_ca.client(&pki.dir, "foreign", "intruder");
    let (server_paths, client_paths) = (Paths::of(&pki.server), Paths::of(&foreign));
    let (sid, addr) = start(&server_cfg_on_loopback(server_paths.ssl(&pki.ca_path)));
    // The client trusts the server (same CA file); the server does not trust the client.
    let ccfg = client_cfg_with(client_paths.ssl(&pki.ca_path));
    let mut cid = 0;
    // SAFETY: pointers to live locals.
    unsafe {
        assert_eq!(client::dclient_lib_init(&ccfg), 0);
        let r = client::client_init(&mut cid, addr.as_ptr());
        assert_eq!(r, Status::NotReady.code(), "client_init returned {r:#x}");
    }
    assert!(server_counter(sid, Counter::TlsUnknownCa as usize) >= 1);
    assert_eq!(server::server_stop(sid), 0);
}

unsafe extern "C" fn verify_anything(_cert: *mut c_void, _crl_path: *const c_char) -> c_int {
    0
}

#[test]
fn tls_settings_that_cannot_work_are_einval() {
    let _libs = Libs::init(1);
    let pki = Pki::new("cabi-einval");
    let paths = Paths::of(&pki.server);
    let einval = Status::Einval.code();
    let mut sid = 0;
    let ok = paths.ssl(&pki.ca_path);
    // The key where the certificate should be: files that exist but hold the wrong thing.
    let key_as_cert = Paths {
        cert: paths.key.clone(),
        key: paths.key.clone(),
    };
    let broken = [
        (
            "no key",
            ssl_cfg {
                prkey_path: std::ptr::null(),
                ..ok
            },
        ),
        (
            "no CA",
            ssl_cfg {
                ca_path: c"".as_ptr(),
                ..ok
            },
        ),
        (
            "no certificate",
            ssl_cfg {
                cert_path: std::ptr::null(),
                ..ok
            },
        ),
        (
            "a certificate that does not exist",
            ssl_cfg {
                cert_path: c"/nonexistent/dlock/server.crt".as_ptr(),
                ..ok
            },
        ),
        (
            "a CRL that does not exist",
            ssl_cfg {
                crl_path: c"/nonexistent/dlock/ca.crl".as_ptr(),
                ..ok
            },
        ),
        ("a key as the certificate", key_as_cert.ssl(&pki.ca_path)),
        (
            "a verification callback dlock would never call",
            ssl_cfg {
                cert_verify_cb: Some(verify_anything),
                ..ok
            },
        ),
    ];
    for (what, ssl) in broken {
        // SAFETY: pointers to live locals; every string outlives the calls.
        unsafe {
            let cfg = server_cfg_on_loopback(ssl);
            assert_eq!(
                server::server_start(&cfg, &mut sid),
                einval,
                "server: {what}"
            );
            // The client reads its files at client_init: only their existence is checked
            // here.
            if ssl.cert_path != key_as_cert.cert.as_ptr() {
                let ccfg = client_cfg_with(ssl);
                assert_eq!(client::dclient_lib_init(&ccfg), einval, "client: {what}");
            }
        }
    }
}

const PASSWORD: &[u8] = b"correct horse battery staple";
/// 0: the right password, 1: a wrong one, 2: refuse (return -1).
static PASSWORD_MODE: AtomicU8 = AtomicU8::new(0);
static PASSWORD_CALLS: AtomicUsize = AtomicUsize::new(0);
static ERASE_CALLS: AtomicUsize = AtomicUsize::new(0);
/// The erase callback was handed the buffer with the password in it, of the full size.
static ERASE_SAW_PASSWORD: AtomicBool = AtomicBool::new(false);

/// # Safety
///
/// - `buf` is writable for `size` bytes.
unsafe extern "C" fn give_password(buf: *mut c_char, size: c_int) -> c_int {
    // Relaxed: the counters and flags are read by the same test thread after the call returns.
    PASSWORD_CALLS.fetch_add(1, Ordering::Relaxed);
    let password: &[u8] = match PASSWORD_MODE.load(Ordering::Relaxed) {
        0 => PASSWORD,
        1 => b"wrong",
        _ => return -1,
    };
    assert!(password.len() <= size as usize);
    // SAFETY: `buf` has room for `size` bytes, more than the password (checked above).
    unsafe { std::ptr::copy_nonoverlapping(password.as_ptr(), buf.cast(), password.len()) };
    password.len() as c_int
}

/// # Safety
///
/// - `buf` is writable for `size` bytes.
unsafe extern "C" fn erase_password(buf: *mut c_char, size: c_int) {
    // Relaxed: see `give_password`.
    ERASE_CALLS.fetch_add(1, Ordering::Relaxed);
    // SAFETY: `buf` is readable and writable for `size` bytes (the callback's contract).
    let buf = unsafe { std::slice::from_raw_parts_mut(buf.cast::<u8>(), size as usize) };
    if buf.len() == 1024 && buf.starts_with(PASSWORD) {
        ERASE_SAW_PASSWORD.store(true, Ordering::Relaxed);
    }
    buf.fill(0xA5);
}

#[test]
fn encrypted_key_opens_through_the_password_callback_and_is_erased() {
    let _libs = Libs::init(1);
    let pki = Pki::new("cabi-encrypted");
    let password = std::str::from_utf8(PASSWORD).unwrap();
    let server_key = encrypt_key(&pki.dir, &pki.server.key, password);
    let client_key = encrypt_key(&pki.dir, &pki.client.key, password);
    let server_paths = Paths {
        cert: c_path(&pki.server.cert),
        key: c_path(&server_key),
    };
    let client_paths = Paths {
        cert: c_path(&pki.client.cert),
        key: c_path(&client_key),
    };
    let with_callbacks = |p: &Paths| ssl_cfg {
        prkey_pwd_cb: Some(give_password),
        erase_prkey_cb: Some(erase_password),
        ..p.ssl(&pki.ca_path)
    };
    let mut sid = 0;
    let calls = || PASSWORD_CALLS.load(Ordering::Relaxed);

    // Without a callback, with a refusing one and with a wrong password: no server.
    let no_callback = server_cfg_on_loopback(server_paths.ssl(&pki.ca_path));
    PASSWORD_MODE.store(2, Ordering::Relaxed);
    let cfg = server_cfg_on_loopback(with_callbacks(&server_paths));
    // SAFETY: pointers to live locals; every string outlives the calls.
    unsafe {
        assert_eq!(
            server::server_start(&no_callback, &mut sid),
            Status::Einval.code()
        );
        assert_eq!(server::server_start(&cfg, &mut sid), Status::Einval.code());
        PASSWORD_MODE.store(1, Ordering::Relaxed);
        assert_eq!(server::server_start(&cfg, &mut sid), Status::Einval.code());
    }
    assert_eq!(calls(), 2);
    assert_eq!(
        ERASE_CALLS.load(Ordering::Relaxed),
        2,
        "erased even on failure"
    );

    PASSWORD_MODE.store(0, Ordering::Relaxed);
    let (sid, addr) = start(&cfg);
    assert_eq!(calls(), 3, "asked once per start");
    assert_eq!(ERASE_CALLS.load(Ordering::Relaxed), 3);
    assert!(ERASE_SAW_PASSWORD.swap(false, Ordering::Relaxed));

    let ccfg = client_cfg_with(with_callbacks(&client_paths));
    // SAFETY: a pointer to a live local; the callbacks are functions that live forever.
    assert_eq!(unsafe { client::dclient_lib_init(&ccfg) }, 0);
    assert_eq!(
        calls(),
        3,
        "the client reads its key at its first client_init"
    );
    lock_and_unlock(&addr);
    lock_and_unlock(&addr);
    assert_eq!(calls(), 4, "once per server address, not per client");
    assert!(ERASE_SAW_PASSWORD.load(Ordering::Relaxed));
    assert_eq!(server::server_stop(sid), 0);
}
