//! A real failover: a `dlock serve` process is killed with SIGKILL while 16 client processes
//! hold locks over TCP; a replacement started in recovery mode on the same address takes the
//! locks back from the clients. Checked: every client keeps its locks, nobody else got them
//! meanwhile, tokens after the failover are above every token before it, and service resumes.
//!
//! Both servers share a session key, so the clients' sessions and their grants' proofs minted
//! by the first are what the replacement takes them back by.
//!
//! The clients are this test binary run again (`child_holds_locks_across_a_failover`), talking
//! to the parent over their standard input and output.

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use dlock_core::{LockKind, Mode, Status};
use dlock_transport::client::{Client, ClientConfig, Endpoint};

const DLOCK: &str = env!("CARGO_BIN_EXE_dlock");
const CLIENTS: usize = 16;
const LOCKS_EACH: usize = 4;
const CHILD_ENV: &str = "DLOCK_FAILOVER_CHILD";

/// A process killed when the test ends, however it ends.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The session key file both servers are started with (the replacement refuses to recover
/// without one), written once per test process, mode 0600.
fn key_file() -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::temp_dir().join(format!("dlock-failover-key-{}", std::process::id()));
    if !path.exists() {
        let hex = "3c9a51e207bd6814f92e85c04b76d31fa8620d97ee355ac4812bf049b6137ddc";
        std::fs::write(&path, format!("{hex}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    path
}

fn serve(addr: SocketAddr, recovering: bool) -> Proc {
    let addr = addr.to_string();
    let key = key_file();
    let mut cmd = Command::new(DLOCK);
    cmd.args([
        "serve",
        "--bind",
        &addr,
        "--clients",
        "64",
        "--locks",
        "1024",
    ])
    .args(["--objects", "16", "--lease-ms", "5000"])
    .arg("--session-key-file")
    .arg(&key);
    if recovering {
        cmd.args(["--recovery-clients", &CLIENTS.to_string(), "--epoch", "2"]);
    }
    Proc(
        cmd.stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("dlock serve starts"),
    )
}

/// Waits until something listens on `addr`.
fn listening(addr: SocketAddr) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(addr).is_err() {
        assert!(Instant::now() < deadline, "nothing listens on {addr}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Registers with the server at `addr` once it listens.
fn connect(addr: SocketAddr) -> Result<Client, dlock_transport::client::Error> {
    listening(addr);
    Client::connect(ClientConfig::new(Endpoint::Tcp(addr)))
}

fn free_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

struct ChildClient {
    _proc: Proc,
    to: ChildStdin,
    from: std::io::Lines<BufReader<ChildStdout>>,
}

impl ChildClient {
    /// The next line that starts with `tag`, without the tag.
    fn expect(&mut self, tag: &str) -> String {
        for line in self.from.by_ref() {
            let line = line.expect("child output");
            if let Some(rest) = line.strip_prefix(tag) {
                return rest.trim().to_owned();
            }
        }
        panic!("child ended before {tag}");
    }
}

fn tokens(line: &str) -> Vec<u64> {
    line.split_whitespace()
        .map(|t| t.parse().unwrap())
        .collect()
}

#[test]
fn clients_keep_their_locks_when_the_server_is_killed_and_replaced() {
    let addr = free_addr();
    let first = serve(addr, false);
    drop(connect(addr).expect("the first server serves"));
    let mut children: Vec<ChildClient> = (0..CLIENTS)
        .map(|i| {
            let mut p = Command::new(std::env::current_exe().unwrap())
                .args(["--exact", "child_holds_locks_across_a_failover"])
                .args(["--ignored", "--nocapture"])
                .env(CHILD_ENV, format!("{i} {addr}"))
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .unwrap();
            let to = p.stdin.take().unwrap();
            let from = BufReader::new(p.stdout.take().unwrap()).lines();
            ChildClient {
                _proc: Proc(p),
                to,
                from,
            }
        })
        .collect();
    let mut before = Vec::new();
    for c in &mut children {
        before.extend(tokens(&c.expect("HELD")));
    }
    assert_eq!(before.len(), CLIENTS * LOCKS_EACH);

    // SIGKILL: no goodbye, no flush.
    drop(first);
    let _second = serve(addr, true);
    // While the clients re-sync, nobody else gets anything.
    let rival_refused = connect(addr).err();
    assert_eq!(
        rival_refused.map(Status::from),
        Some(Status::NotReady),
        "the replacement recovers first"
    );

    for c in &mut children {
        writeln!(c.to, "REINIT").unwrap();
    }
    for c in &mut children {
        assert_eq!(c.expect("RECLAIMED"), "ok");
    }
    for c in &mut children {
        writeln!(c.to, "CHECK").unwrap();
        assert_eq!(c.expect("STILL"), "ok");
    }
    // Service resumes: a new client registers, cannot take any re-claimed lock, and its own
    // grant's token is above every token of the first server.
    let mut rival = connect(addr).expect("serving after the last re-sync");
    assert!(!rival.server_recovering());
    for i in 0..CLIENTS {
        for k in 0..LOCKS_EACH {
            let id = rival
                .get_lock(LockKind::Atomic, format!("c{i}/l{k}").as_bytes())
                .unwrap();
            assert!(
                rival.trylock(id, Mode::Exclusive, 1_000).is_err(),
                "c{i}/l{k} was free after the failover"
            );
        }
    }
    let fresh = rival.get_lock(LockKind::Atomic, b"after").unwrap();
    let grant = rival.trylock(fresh, Mode::Exclusive, 1_000).unwrap();
    assert!(
        before.iter().all(|&t| grant.token.0 > t),
        "tokens went back"
    );
    for c in &mut children {
        writeln!(c.to, "EXIT").unwrap();
        assert_eq!(c.expect("BYE"), "ok");
    }
    let _ = std::fs::remove_file(key_file());
}

/// One client process: takes its locks, reports their tokens, re-syncs when told, and checks
/// it still holds them.
#[test]
#[ignore = "runs as a child of clients_keep_their_locks_when_the_server_is_killed_and_replaced"]
fn child_holds_locks_across_a_failover() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    let (me, addr) = spec.split_once(' ').unwrap();
    let addr: SocketAddr = addr.parse().unwrap();
    let mut c = connect(addr).expect("registers");
    let ids: Vec<_> = (0..LOCKS_EACH)
        .map(|k| {
            c.get_lock(LockKind::Atomic, format!("c{me}/l{k}").as_bytes())
                .unwrap()
        })
        .collect();
    let held: Vec<String> = ids
        .iter()
        .map(|&id| {
            let g = c.trylock(id, Mode::Exclusive, 600_000).unwrap();
            assert_eq!(g.status, Status::Success);
            g.token.0.to_string()
        })
        .collect();
    println!("HELD {}", held.join(" "));
    let mut lines = std::io::stdin().lock().lines();
    assert_eq!(lines.next().unwrap().unwrap(), "REINIT");
    // The replacement may still be binding: reinit retries as an engine's failover loop would.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match c.reinit() {
            Ok(true) => break,
            Ok(false) => panic!("the replacement was not recovering"),
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
            Err(s) => panic!("reinit: {s}"),
        }
    }
    c.update_all_locks().expect("claims");
    c.reinit_done().expect("done");
    println!("RECLAIMED ok");
    // The server serves once every client is done; then each lock must still be this one's: a
    // relock of each is re-entry, answered by the server with the lock kept.
    assert_eq!(lines.next().unwrap().unwrap(), "CHECK");
    for k in 0..LOCKS_EACH {
        let id = c
            .get_lock(LockKind::Atomic, format!("c{me}/l{k}").as_bytes())
            .unwrap();
        let g = c.trylock(id, Mode::Exclusive, 600_000).unwrap();
        assert_eq!(g.status, Status::AlreadyLocked, "c{me}/l{k} lost");
    }
    println!("STILL ok");
    assert_eq!(lines.next().unwrap().unwrap(), "EXIT");
    println!("BYE ok");
}
