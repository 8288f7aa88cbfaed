//! Programs written in the reference's style against the drop-in C++ headers
//! (`include/ub/umdk/ulock/dlock/`), run against a running server.
//!
//! - `tests/cpp/`: its primary server example and its two client examples, extended with
//!   checks, compiled with `-std=c++17 -Wall -Werror` against the drop-in headers alone and
//!   linked against the static library of this very build. The server program serves TCP on a
//!   free loopback port; both clients run against it; the server's counters, read in the
//!   reference's layout, must show what the clients did.
//! - A server asked for plaintext on a network address is refused (`DLOCK_EINVAL`).
//! - The reference's TLS callback shapes open encrypted keys on both ends (through the Rust
//!   entry points the headers call).
//!
//! The C++ compiler is `$CXX`, or `c++`.

#[path = "../../transport/tests/common/certs.rs"]
mod certs;
#[path = "common/cpp.rs"]
mod cpp;

use std::collections::BTreeMap;
use std::ffi::{CString, c_char, c_int, c_void};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;

use cpp::{PROGRAM_TIMEOUT, finish, program};
use dlock_engine_glue::dlock_core::Status;
use dlock_engine_glue::ffi::compat::stats::REF_COUNTER_NAMES;
use dlock_engine_glue::ffi::compat::types as compat;
use dlock_engine_glue::ffi::types as native;

/// Runs a client program against the server at `port` and returns its output; it must pass.
fn run_client(name: &'static str, port: u16) -> String {
    let child = Command::new(program(name))
        .args(["-i", "127.0.0.1", "-p", &port.to_string()])
        // URMA settings a reference deployment passes: accepted, ignored.
        .args(["-d", "udma0", "-e", "10.0.0.7", "-m", "1"])
        .args(["-c", "4", "-l", "100", "-g", "3"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let (code, out) = finish(child, name);
    assert!(
        code == 0 && out.contains("checks passed"),
        "{name} exited {code}:\n{out}"
    );
    out
}

/// The C++ server program, started on a free loopback port.
struct Server {
    child: Child,
    port: u16,
    /// The rest of its output, read by a thread.
    lines: mpsc::Receiver<String>,
}

impl Server {
    fn start() -> Server {
        let mut child = Command::new(program("primary_test"))
            .args([
                "-i",
                "127.0.0.1",
                "-p",
                "-1",
                "-d",
                "udma0",
                "-m",
                "1",
                "-g",
                "4",
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let (tx, lines) = mpsc::channel();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        std::thread::spawn(move || {
            for line in stdout.lines() {
                if tx.send(line.unwrap()).is_err() {
                    return;
                }
            }
        });
        let port = loop {
            let line = lines
                .recv_timeout(PROGRAM_TIMEOUT)
                .expect("primary_test says where it listens");
            if let Some(p) = line.split("port: ").nth(1) {
                break p.trim().parse().unwrap();
            }
            assert!(!line.contains("failed"), "primary_test: {line}");
        };
        Server { child, port, lines }
    }

    /// Closes its standard input, so that it reports its counters and stops; returns the
    /// reference counters it printed, by name.
    fn stop(mut self) -> BTreeMap<&'static str, u64> {
        drop(self.child.stdin.take());
        let (code, _) = finish(self.child, "primary_test");
        let out: Vec<String> = self.lines.iter().collect();
        assert!(
            code == 0 && out.iter().any(|l| l == "checks passed"),
            "primary_test exited {code}:\n{}",
            out.join("\n")
        );
        out.iter()
            .filter_map(|l| l.strip_prefix("stat "))
            .map(|l| {
                let (i, v) = l.split_once(' ').unwrap();
                (
                    REF_COUNTER_NAMES[i.parse::<usize>().unwrap()],
                    v.parse().unwrap(),
                )
            })
            .collect()
    }
}

#[test]
fn reference_style_programs_run_against_a_running_server() {
    let server = Server::start();
    let locks = run_client("client_test", server.port);
    assert!(locks.contains("batch and state checks done"), "{locks}");
    let objects = run_client("client_test_object", server.port);
    assert!(objects.contains("shared counter: 400"), "{objects}");
    let stats = server.stop();
    assert_eq!(stats.len(), REF_COUNTER_NAMES.len(), "all 45 printed");
    // client_test queued once on a fair lock and was refused an atomic lock once;
    // client_test_object missed two CASes in each of its 4 threads.
    assert_eq!(stats["EAGAIN"], 1, "{stats:?}");
    assert_eq!(stats["FAIL"], 1, "{stats:?}");
    assert_eq!(stats["OBJECT_CAS_FAILED"], 8, "{stats:?}");
    assert_eq!(stats["NOT_READY"], 0, "{stats:?}");
}

#[test]
fn plaintext_server_on_a_network_address_is_refused() {
    let child = Command::new(program("primary_test"))
        .args(["-i", "0.0.0.0", "-p", "-1", "-d", "udma0"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let (code, out) = finish(child, "primary_test");
    assert_ne!(code, 0, "{out}");
    let einval = format!("server start failed! ret: {}", Status::Einval.code());
    assert!(out.contains(&einval), "{out}");
}

// ---------------------------------------------------------------------------------------------
// TLS with the reference's callback shapes (the only test here using the process-wide server
// and client libraries, in this process)

const PASSWORD: &str = "correct horse battery staple";
/// The application's own buffer the password callback hands out, NUL-terminated as the
/// reference wants it.
static PASSWORD_BUF: Mutex<[u8; 64]> = Mutex::new([0; 64]);
static PASSWORD_CALLS: AtomicUsize = AtomicUsize::new(0);
/// Erase calls that got the buffer the password callback handed out, with the password in it.
static ERASED_RIGHT_BUFFER: AtomicUsize = AtomicUsize::new(0);

/// The reference's shape: hands out a pointer to the application's buffer and the length.
///
/// # Safety
///
/// - `pwd` and `len` are writable.
unsafe extern "C" fn give_password(pwd: *mut *mut c_char, len: *mut c_int) {
    // Relaxed: counters read by the test thread after the calls returned.
    PASSWORD_CALLS.fetch_add(1, Ordering::Relaxed);
    let mut buf = PASSWORD_BUF.lock().unwrap();
    buf[..PASSWORD.len()].copy_from_slice(PASSWORD.as_bytes());
    buf[PASSWORD.len()] = 0;
    // SAFETY: out-pointers from dlock; the static buffer outlives every use of the pointer.
    unsafe {
        *pwd = buf.as_mut_ptr().cast();
        *len = PASSWORD.len() as c_int;
    }
}

/// The reference's shape: wipes the buffer the password callback handed out.
///
/// # Safety
///
/// - `pwd` is the pointer `give_password` handed out, `len` its length.
unsafe extern "C" fn erase_password(pwd: *mut c_void, len: c_int) {
    let mut buf = PASSWORD_BUF.lock().unwrap();
    if pwd == buf.as_mut_ptr().cast() && buf[..len as usize] == *PASSWORD.as_bytes() {
        // Relaxed: see `give_password`.
        ERASED_RIGHT_BUFFER.fetch_add(1, Ordering::Relaxed);
    }
    buf.fill(0);
}

fn c_path(p: &Path) -> CString {
    CString::new(p.as_os_str().as_encoded_bytes()).unwrap()
}

#[test]
fn reference_tls_callbacks_open_encrypted_keys_on_both_ends() {
    use dlock_engine_glue::ffi::compat::config::{
        dlock_compat_dclient_lib_init, dlock_compat_server_start,
    };
    use dlock_engine_glue::ffi::compat::ops::{dlock_compat_trylock, dlock_compat_unlock};
    use dlock_engine_glue::ffi::{client, locks, server};

    let dir = certs::TempDir::new("compat-tls");
    let ca = certs::Ca::new(&dir, "ca");
    let (server_leaf, client_leaf) = (ca.server(&dir, "server"), ca.client(&dir, "client", "e1"));
    let ca_path = c_path(&ca.cert);
    let paths = |leaf: &certs::Leaf| {
        (
            c_path(&leaf.cert),
            c_path(&certs::encrypt_key(&dir, &leaf.key, PASSWORD)),
        )
    };
    let (server_cert, server_key) = paths(&server_leaf);
    let (client_cert, client_key) = paths(&client_leaf);
    let ssl = |cert: &CString, key: &CString| compat::ssl_cfg {
        ssl_enable: 1,
        ca_path: ca_path.as_ptr(),
        crl_path: std::ptr::null(),
        cert_path: cert.as_ptr(),
        prkey_path: key.as_ptr(),
        cert_verify_cb: None,
        prkey_pwd_cb: Some(give_password),
        erase_prkey_cb: Some(erase_password),
    };
    let scfg = compat::server_cfg {
        r#type: native::SERVER_PRIMARY,
        dev_name: std::ptr::null(),
        eid: compat::dlock_eid_t { raw: [0; 16] },
        log_level: 0,
        sleep_mode_enable: 0,
        role: compat::server_role {
            primary: native::primary_cfg {
                num_of_replica: 0,
                recovery_client_num: 0,
                ctrl_cpuset: std::ptr::null(),
                cmd_cpuset: std::ptr::null(),
                server_ip_str: c"127.0.0.1".as_ptr(),
                server_port: -1,
                replica_port: 0,
                replica_enable: 0,
            },
        },
        ssl: ssl(&server_cert, &server_key),
        tp_mode: 0,
        ub_token_disable: 0,
    };
    let ext = compat::server_cfg_ext {
        locks_max: 16,
        clients_max: 4,
        objects_max: 4,
        ..Default::default()
    };
    let ccfg = compat::client_cfg {
        dev_name: std::ptr::null(),
        eid: compat::dlock_eid_t { raw: [0; 16] },
        log_level: 0,
        primary_port: 0,
        ssl: ssl(&client_cert, &client_key),
        tp_mode: 0,
        ub_token_disable: 0,
    };
    let cext = compat::client_cfg_ext {
        lease_ms: 0,
        timeout_ms: 2_000,
    };
    let name = b"tls/compat";
    let desc = native::lock_desc {
        p_desc: name.as_ptr().cast(),
        len: name.len() as u32,
        lock_type: native::DLOCK_ATOMIC,
        lease_time: 0,
    };
    let (mut sid, mut port, mut cid, mut lock_id) = (0, 0, 0, 0);
    // SAFETY: pointers to live locals; every string outlives the libraries (de-initialised
    // below); the callbacks are functions that live forever.
    unsafe {
        assert_eq!(server::dserver_lib_init(1), 0);
        assert_eq!(dlock_compat_server_start(&scfg, &ext, &mut sid), 0);
        assert_eq!(server::server_tcp_port(sid, &mut port), 0);
        assert_eq!(
            PASSWORD_CALLS.load(Ordering::Relaxed),
            1,
            "the server's key"
        );
        assert_eq!(ERASED_RIGHT_BUFFER.load(Ordering::Relaxed), 1);

        assert_eq!(dlock_compat_dclient_lib_init(&ccfg, &cext), 0);
        let addr = CString::new(format!("127.0.0.1:{port}")).unwrap();
        assert_eq!(client::client_init(&mut cid, addr.as_ptr()), 0);
        assert_eq!(
            PASSWORD_CALLS.load(Ordering::Relaxed),
            2,
            "the client's key"
        );
        assert_eq!(ERASED_RIGHT_BUFFER.load(Ordering::Relaxed), 2);

        assert_eq!(locks::get_lock(cid, &desc, &mut lock_id), 0);
        let req = native::lock_request {
            lock_id,
            lock_op: native::LOCK_EXCLUSIVE,
            expire_time: 5,
        };
        let mut st = compat::atomic_state::default();
        assert_eq!(dlock_compat_trylock(cid, &req, (&raw mut st).cast()), 0);
        assert_eq!(
            st.client_id, cid,
            "the grant is ours, in the reference's layout"
        );
        assert_eq!(dlock_compat_unlock(cid, lock_id, (&raw mut st).cast()), 0);
        assert_eq!(client::client_deinit(cid), 0);
        client::dclient_lib_deinit();
        assert_eq!(server::server_stop(sid), 0);
        server::dserver_lib_deinit();
    }
}
