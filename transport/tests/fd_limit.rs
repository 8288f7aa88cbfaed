//! A server at the common file-descriptor limit of 1,024 (soft and hard, and no privilege to
//! raise it) configured for 1,000 clients: it says at start what it can serve, serves exactly
//! that many TCP clients, and every client past that gets an error within a bounded time —
//! also once the process has no descriptor left at all — never a hang.
//!
//! The server runs in a child process (this test binary again, running the ignored child
//! test), because the limit is process-wide and the clients must not spend the server's
//! descriptors: they connect from the parent, as real clients would.

use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::thread;
use std::time::{Duration, Instant};

use dlock_core::{Config, LockKind, Mode, Status};
use dlock_transport::client::{Client, ClientConfig, Endpoint};
use dlock_transport::runtime::{FdAction, ServerConfig, ServerHandle, TcpConfig};

/// The limit under test: the common default soft (and often hard) `RLIMIT_NOFILE`.
const LIMIT: u64 = 1024;
/// Set in the child's environment; the child test does nothing without it.
const CHILD_ENV: &str = "DLOCK_FD_LIMIT_CHILD";
const CHILD_TEST: &str = "child_serves_a_tcp_server_under_a_pinned_fd_limit";
/// `CAP_SYS_RESOURCE` from linux/capability.h (libc does not export it): the capability that
/// lets a process raise its hard limits.
const CAP_SYS_RESOURCE: libc::c_ulong = 24;
/// The child exits on its own after this, whatever the parent does.
const CHILD_LIFETIME: Duration = Duration::from_secs(40);
/// Every step the parent waits for (a line from the child, a batch of clients) must finish
/// within this.
const STEP_TIMEOUT: Duration = Duration::from_secs(15);
/// How long the child lets the server settle before it takes every descriptor.
const SETTLE: Duration = Duration::from_millis(500);
/// A client's request timeout: a refusal must come well before it for the test to tell a
/// refusal from a hang that timed out.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(3);

fn set_nofile(soft: u64, hard: u64) -> std::io::Result<()> {
    let r = libc::rlimit {
        rlim_cur: soft,
        rlim_max: hard,
    };
    // SAFETY: setrlimit reads one `rlimit` through a pointer to a live local.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &r) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

fn nofile() -> (u64, u64) {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one `rlimit` through a pointer to a live local.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) }, 0);
    (r.rlim_cur, r.rlim_max)
}

/// Run by the test below in a child process whose `RLIMIT_NOFILE` is pinned at 1,024.
#[test]
#[ignore = "runs as the child of another test"]
fn child_serves_a_tcp_server_under_a_pinned_fd_limit() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    thread::spawn(|| {
        thread::sleep(CHILD_LIFETIME);
        std::process::exit(3);
    });
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .try_init();
    if set_nofile(LIMIT, LIMIT + 1).is_ok() {
        println!("FDSKIP the child could raise its hard limit: privileges were not dropped");
        return;
    }
    let core = Config {
        locks_max: 256,
        clients_max: 1000,
        objects_max: 16,
        // The parent registers every client from 127.0.0.1: one peer, which may fill the table.
        clients_per_peer_max: 1000,
        ..Config::default()
    };
    let mut cfg = ServerConfig::new(core);
    cfg.tcp = Some(TcpConfig::new("127.0.0.1:0".parse().unwrap()));
    // Longer than the parent's reads at EMFILE, so a connection closed within them was refused,
    // not accepted and later expired.
    cfg.handshake_timeout = Duration::from_secs(10);
    let server = ServerHandle::start(cfg).expect("the server starts, serving what fits");
    let b = server.fd_budget();
    println!(
        "FDPLAN {:?} {} {} {} {}",
        b.action, b.limit, b.needed, b.clients_max, b.connections_max
    );
    println!("FDADDR {}", server.tcp_addr().unwrap());
    std::io::stdout().flush().unwrap();
    let mut hoard = Vec::new();
    for line in std::io::stdin().lock().lines() {
        if line.unwrap() == "EXHAUST" {
            // Let the server close the connections the parent dropped first: descriptors it
            // frees after the hoarding would let the next connections in.
            thread::sleep(SETTLE);
            // Take every descriptor left, as a leak elsewhere in the process would.
            while let Ok(f) = std::fs::File::open("/dev/null") {
                hoard.push(f);
            }
            println!("FDEXHAUSTED {}", hoard.len());
            std::io::stdout().flush().unwrap();
        }
    }
    drop(hoard);
    server.stop();
}

/// Starts the child with its limit pinned: soft = hard = 1,024, and (when we are root) no
/// `CAP_SYS_RESOURCE` to raise the hard limit with.
fn spawn_child() -> Child {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", CHILD_TEST, "--ignored", "--nocapture"])
        .env(CHILD_ENV, "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped());
    // SAFETY: the closure runs between fork and exec and calls only async-signal-safe system
    // calls (setrlimit, geteuid, prctl, setgroups, setgid, setuid) on locals; it allocates
    // nothing (`last_os_error` builds an error from errno without allocating).
    unsafe {
        cmd.pre_exec(|| {
            let r = libc::rlimit {
                rlim_cur: LIMIT,
                rlim_max: LIMIT,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &r) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::geteuid() != 0 {
                return Ok(()); // unprivileged: the hard limit cannot go back up
            }
            // Root keeps its capabilities across exec only as far as the bounding set allows:
            // without CAP_SYS_RESOURCE there, the child cannot raise the hard limit.
            let dropped = libc::prctl(libc::PR_CAPBSET_DROP, CAP_SYS_RESOURCE, 0, 0, 0) == 0;
            if !dropped {
                // Else become nobody; the child checks it really cannot raise the limit.
                const NOBODY: u32 = 65534;
                if libc::setgroups(0, std::ptr::null()) != 0
                    || libc::setgid(NOBODY) != 0
                    || libc::setuid(NOBODY) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    cmd.spawn().expect("the child starts")
}

/// The child's stdout, line by line, from a thread, so that every wait has a timeout.
fn lines_of(child: &mut Child) -> Receiver<String> {
    let out = child.stdout.take().unwrap();
    let (tx, rx) = channel();
    thread::spawn(move || {
        for line in BufReader::new(out).lines() {
            let Ok(line) = line else { return };
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    rx
}

/// The next line from the child that starts with `FD`, or a failure after [`STEP_TIMEOUT`].
fn next_fd_line(lines: &Receiver<String>, child: &mut Child) -> String {
    let deadline = Instant::now() + STEP_TIMEOUT;
    loop {
        match lines.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(l) if l.starts_with("FD") => return l,
            Ok(_) => {}
            Err(RecvTimeoutError::Timeout) => {
                let _ = child.kill();
                panic!("the child said nothing within {STEP_TIMEOUT:?}");
            }
            Err(RecvTimeoutError::Disconnected) => {
                let status = child.wait();
                panic!("the child exited early: {status:?}");
            }
        }
    }
}

/// Runs `f` on a thread and fails the test (killing the child) if it takes longer than
/// `limit`: a blocked client is exactly the bug under test.
fn bounded<T: Send + 'static>(
    what: &str,
    limit: Duration,
    child: &mut Child,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = channel();
    thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(limit) {
        Ok(v) => v,
        Err(_) => {
            let _ = child.kill();
            panic!("{what} did not finish within {limit:?}: a client hangs");
        }
    }
}

fn tcp_client(addr: SocketAddr) -> Result<Client, dlock_transport::client::Error> {
    let mut cfg = ClientConfig::new(Endpoint::Tcp(addr));
    cfg.timeout = CLIENT_TIMEOUT;
    Client::connect(cfg)
}

#[test]
fn a_server_at_fd_limit_1024_serves_what_it_plans_and_refuses_the_rest_with_an_error() {
    // The parent holds two sockets per served client; give it room (its own limit, not the
    // child's).
    let (_, hard) = nofile();
    let _ = set_nofile(hard.max(4096), hard.max(4096)).or_else(|_| set_nofile(hard, hard));
    let started = Instant::now();
    let mut child = spawn_child();
    let lines = lines_of(&mut child);

    let plan = next_fd_line(&lines, &mut child);
    if let Some(why) = plan.strip_prefix("FDSKIP ") {
        println!("skipped: {why}");
        let _ = child.wait();
        return;
    }
    let f: Vec<&str> = plan.split_whitespace().collect();
    assert_eq!(f.len(), 6, "{plan}");
    let (limit, needed): (u64, u64) = (f[2].parse().unwrap(), f[3].parse().unwrap());
    let (clients, connections): (usize, usize) = (f[4].parse().unwrap(), f[5].parse().unwrap());
    println!(
        "plan at limit {limit}: needed {needed}, serves {clients} clients, {connections} connections"
    );
    assert_eq!(f[1], format!("{:?}", FdAction::Lower), "{plan}");
    assert_eq!(limit, LIMIT, "the pinned limit was not raised");
    assert!(
        needed > LIMIT,
        "1,000 clients need more than {LIMIT}: {plan}"
    );
    assert!(
        (400..1000).contains(&clients),
        "a 1,024 limit serves a few hundred clients: {plan}"
    );
    assert!(2 * clients < connections && connections < LIMIT as usize);
    let (soft, _) = nofile();
    assert!(
        soft as usize > 2 * clients + 64,
        "the parent's own limit {soft} is too low to hold {clients} clients"
    );
    let addr: SocketAddr = next_fd_line(&lines, &mut child)
        .strip_prefix("FDADDR ")
        .expect("the address follows the plan")
        .parse()
        .unwrap();

    // Every client the plan promises registers and attaches, and the data path works.
    let served = bounded("the served clients", STEP_TIMEOUT, &mut child, move || {
        let mut served = Vec::with_capacity(clients);
        for k in 0..clients {
            match tcp_client(addr) {
                Ok(c) => served.push(c),
                Err(s) => return Err(format!("client {k} of {clients}: {s}")),
            }
        }
        let last = served.last_mut().unwrap();
        let id = last
            .get_lock(LockKind::Atomic, b"fd-limit")
            .map_err(|s| s.to_string())?;
        let _ = last
            .trylock(id, Mode::Exclusive, 10_000)
            .map_err(|s| s.to_string())?;
        Ok(served)
    })
    .unwrap_or_else(|e| panic!("{e}"));

    // The next ones are told no, well before their request timeout.
    for k in 0..3 {
        let t = Instant::now();
        let refused = bounded(
            "a client past the plan",
            STEP_TIMEOUT,
            &mut child,
            move || tcp_client(addr).map(|_| ()),
        );
        assert_eq!(
            refused.map_err(Status::from),
            Err(Status::ServerNoResource),
            "extra client {k}"
        );
        assert!(
            t.elapsed() < CLIENT_TIMEOUT,
            "refused only after {:?}",
            t.elapsed()
        );
    }

    // Out of descriptors altogether: the server cannot even accept, and still the peer learns
    // at once that its connection is gone.
    child
        .stdin
        .as_mut()
        .unwrap()
        .write_all(b"EXHAUST\n")
        .unwrap();
    child.stdin.as_mut().unwrap().flush().unwrap();
    let exhausted = next_fd_line(&lines, &mut child);
    assert!(exhausted.starts_with("FDEXHAUSTED "), "{exhausted}");
    for k in 0..3 {
        let closed = bounded(
            "a connection at EMFILE",
            STEP_TIMEOUT,
            &mut child,
            move || {
                let mut s = TcpStream::connect(addr).unwrap();
                s.set_read_timeout(Some(CLIENT_TIMEOUT)).unwrap();
                let t = Instant::now();
                let mut b = [0u8; 8];
                match s.read(&mut b) {
                    Ok(0) => Ok("closed"),
                    Ok(_) => Err("bytes from a server that should have closed".to_string()),
                    Err(e) if e.kind() == ErrorKind::ConnectionReset => Ok("reset"),
                    Err(e) => Err(format!("{e} after {:?}", t.elapsed())),
                }
            },
        );
        match closed {
            Ok(how) => println!("connection {k} at EMFILE: {how}"),
            Err(e) => panic!("connection {k} at EMFILE was left waiting: {e}"),
        }
    }
    let t = Instant::now();
    let refused = bounded("a client at EMFILE", STEP_TIMEOUT, &mut child, move || {
        tcp_client(addr).map(|_| ())
    });
    assert!(refused.is_err(), "registered with no descriptor left");
    assert!(
        t.elapsed() < CLIENT_TIMEOUT,
        "refused only after {:?}",
        t.elapsed()
    );

    drop(served);
    drop(child.stdin.take());
    let deadline = Instant::now() + STEP_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the child did not stop");
        }
        thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "the child failed: {status}");
    println!("done in {:?}", started.elapsed());
}
