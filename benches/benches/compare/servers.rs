//! The two servers under comparison, each a child process on 127.0.0.1: started on a free port,
//! waited for, its CPU time read from `/proc/<pid>/stat`, and stopped by pid (SIGTERM, then
//! SIGKILL if it has not exited within [`STOP_WAIT`]). Dropping a [`Server`] stops it, so a
//! failing run leaves no server behind.

use std::fs::File;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use dlock_transport::client::{Client, ClientConfig, Endpoint};

use crate::resp::{Redis, Reply};

/// How long a server may take to answer its first request.
const START_WAIT: Duration = Duration::from_secs(10);
/// How long a server may take to exit after SIGTERM before it is killed.
const STOP_WAIT: Duration = Duration::from_secs(5);
/// Attempts at starting a server: a free port found by binding port 0 may be taken by another
/// process before the server binds it.
const START_ATTEMPTS_MAX: u32 = 3;

/// A running server process.
#[derive(Debug)]
pub struct Server {
    name: &'static str,
    child: Child,
    pub addr: SocketAddr,
}

impl Server {
    /// The process id, for `/proc` and for `kill`.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// CPU seconds the process has used so far (user + system), from `/proc/<pid>/stat`.
    pub fn cpu_s(&self) -> f64 {
        let stat =
            std::fs::read_to_string(format!("/proc/{}/stat", self.pid())).unwrap_or_default();
        // Fields after the command name, which is in parentheses and may hold spaces: the state
        // is field 3, utime field 14 and stime field 15 (proc(5)).
        let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
        let fields: Vec<&str> = after.split_whitespace().collect();
        let ticks = |i: usize| {
            fields
                .get(i)
                .and_then(|f| f.parse::<u64>().ok())
                .unwrap_or(0)
        };
        // SAFETY: sysconf only reads a configuration value.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
        (ticks(11) + ticks(12)) as f64 / hz
    }

    /// Stops the server: SIGTERM, up to [`STOP_WAIT`] for it to exit, then SIGKILL.
    pub fn stop(mut self) {
        self.stop_by_pid();
    }

    fn stop_by_pid(&mut self) {
        if matches!(self.child.try_wait(), Ok(Some(_))) {
            return;
        }
        let pid = self.pid() as libc::pid_t;
        // SAFETY: kill only sends a signal; `pid` is our own child, not yet reaped (try_wait
        // above found it running), so the id cannot have been reused.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let deadline = Instant::now() + STOP_WAIT;
        while Instant::now() < deadline {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                println!("stopped {} (pid {pid})", self.name);
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        eprintln!("{} (pid {pid}) ignored SIGTERM; killing it", self.name);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop_by_pid();
    }
}

/// `name` in one of `PATH`'s directories.
pub fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// Where cargo put this build's binaries (`target/release`): this benchmark runs from its
/// `deps/` directory.
pub fn profile_dir() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    Some(exe.parent()?.parent()?.to_path_buf())
}

/// Starts `redis-server` on 127.0.0.1 with persistence off (no RDB snapshots, no AOF).
pub fn start_redis(redis: &Path, work: &Path) -> Result<Server, String> {
    start("redis-server", work, |port| {
        let mut c = Command::new(redis);
        c.args(["--bind", "127.0.0.1", "--port", &port.to_string()])
            .args(["--save", "", "--appendonly", "no"])
            .args(["--protected-mode", "yes", "--daemonize", "no"])
            .arg("--dir")
            .arg(work);
        c
    })
    .and_then(|s| wait_ready(s, redis_ready))
}

/// Starts `dlock serve` on 127.0.0.1 with the data thread's idle strategy `idle`.
pub fn start_dlock(dlock: &Path, work: &Path, idle: &str) -> Result<Server, String> {
    let socket = work.join("dlock-compare.sock");
    start("dlock serve", work, |port| {
        let mut c = Command::new(dlock);
        c.args([
            "serve",
            "--bind",
            &format!("127.0.0.1:{port}"),
            "--idle",
            idle,
        ])
        .arg("--unix-socket")
        .arg(&socket)
        .env("RUST_LOG", "warn");
        c
    })
    .and_then(|s| wait_ready(s, dlock_ready))
}

/// Spawns `command(port)` on a free port, its output to `work/<name>.log`; retries on a port
/// taken in between.
fn start(
    name: &'static str,
    work: &Path,
    command: impl Fn(u16) -> Command,
) -> Result<Server, String> {
    let log = work.join(format!("{}.log", name.replace(' ', "-")));
    let mut last = String::new();
    for _ in 0..START_ATTEMPTS_MAX {
        let port = free_port().map_err(|e| format!("no free port: {e}"))?;
        let out = File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
        let err = out.try_clone().map_err(|e| e.to_string())?;
        let child = command(port)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| format!("cannot run {name}: {e}"))?;
        let mut server = Server {
            name,
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
        };
        // A server that cannot bind exits at once; one that can is given the whole START_WAIT.
        std::thread::sleep(Duration::from_millis(100));
        match server.child.try_wait() {
            Ok(None) => return Ok(server),
            Ok(Some(status)) => last = format!("{name} exited ({status}); see {}", log.display()),
            Err(e) => last = e.to_string(),
        }
        server.stop_by_pid();
    }
    Err(last)
}

fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Polls `ready(addr)` every 20 ms until it holds or [`START_WAIT`] runs out.
fn wait_ready(server: Server, ready: impl Fn(SocketAddr) -> bool) -> Result<Server, String> {
    let deadline = Instant::now() + START_WAIT;
    while Instant::now() < deadline {
        if ready(server.addr) {
            return Ok(server);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Err(format!(
        "{} did not answer on {} within {START_WAIT:?}",
        server.name, server.addr
    ))
}

fn redis_ready(addr: SocketAddr) -> bool {
    Redis::connect(addr)
        .and_then(|mut r| r.call(&[b"PING"]))
        .is_ok_and(|r| r == Reply::Simple("PONG".into()))
}

fn dlock_ready(addr: SocketAddr) -> bool {
    let mut cfg = ClientConfig::new(Endpoint::Tcp(addr));
    cfg.timeout = Duration::from_millis(500);
    Client::connect(cfg).is_ok_and(|c| c.deinit().is_ok())
}
