//! File descriptors: how many a server needs, what it does when the process may not have them,
//! and the reserve descriptor that lets the control thread refuse a connection it has no room
//! for.
//!
//! Every connection the control thread accepts is a descriptor, so `RLIMIT_NOFILE` is a capacity
//! like `clients_max`, and like the others it is settled at start ([`apply`], called by
//! `ServerHandle::spawn` before the region is mapped, since the region is sized from
//! `clients_max`):
//!
//! | the process's limit covers the need            | action                                  |
//! |------------------------------------------------|-----------------------------------------|
//! | the soft limit                                 | [`FdAction::Enough`]: nothing changes     |
//! | the hard limit                                 | [`FdAction::RaiseSoft`] to the need       |
//! | neither, but the kernel lets us raise the hard | [`FdAction::RaiseHard`] (root, or `CAP_SYS_RESOURCE`) |
//! | nothing we can raise to                        | [`FdAction::Lower`]: serve what fits, warn |
//! | not even one client                            | refuse to start (`io::Error`)           |
//!
//! **Why lower rather than refuse.** A server that refuses to start over descriptors turns a
//! capacity it cannot reach into an outage: the operator who left the common 1,024 limit in
//! place (most distributions' default for a login shell) gets no lock service at all, where a
//! few hundred clients would have been served. Lowering keeps the promise that matters — a client
//! the server cannot serve gets an error (`ServerNoResource` from the client table, or a refused
//! connection), never a hang — and the warning at start says the limit, the figure
//! needed and what is served, so the operator can raise the limit and restart. A deployment that
//! would rather not start can compare [`FdBudget::clients_max`] with what it configured.
//!
//! The plan itself ([`plan`]) is a pure function of the limits and the needs, so every branch is
//! tested without touching the process; [`apply`] reads the limits, asks the kernel, and falls
//! back when it says no.
//!
//! This module owns no socket. It may change the process's `RLIMIT_NOFILE` (process-wide, and
//! only upwards) and `ServerConfig`'s capacities (only downwards), and nothing else.

use std::fs::File;
use std::io;
use std::time::{Duration, Instant};

use super::ServerConfig;

/// Descriptors a server holds besides its listeners and connections, summed from each owner's
/// worst case.
pub(crate) const FDS_FIXED: usize = 1 // the control thread's mio `Poll` (an epoll instance)
    + 1 // the control thread's mio `Waker` (an eventfd)
    + 1 // the reserve descriptor ([`FdReserve`]), spent to refuse a connection at EMFILE
    + 1 // a connection accepted past `connections_max`, open until `admit` drops it
    + 1 // one file open at a time during start: the shm region file, /dev/urandom, /proc/self/fd
    + 1 // a log file, if the embedding program logs to one it opens after us
    + FDS_RDMA
    + 8; // slack for what libraries open that we do not see (resolver files, a tracing writer)

/// The RDMA device context and its asynchronous-event and completion channels.
#[cfg(feature = "rdma")]
const FDS_RDMA: usize = 4;
#[cfg(not(feature = "rdma"))]
const FDS_RDMA: usize = 0;

/// Connections kept for connections that have not registered yet, per client served, when the
/// server must lower what it serves: one for every this-many clients. They are the clients
/// reconnecting after a network fault while their old connections are not yet noticed dead
/// (keepalive takes minutes), clients between `connect` and `ClientInit`, and probes. Without
/// them a server full of bound connections would refuse every reconnect.
const CLIENTS_PER_SPARE_CONNECTION: usize = 4;

/// `RLIMIT_NOFILE` as the kernel reports it, and how far the hard limit could go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FdLimits {
    /// The soft limit: what `open`/`accept` are held to now.
    pub soft: u64,
    /// The hard limit: how far an unprivileged process may raise the soft one.
    pub hard: u64,
    /// How far a privileged process may raise the hard limit (`/proc/sys/fs/nr_open`).
    pub nr_open: u64,
}

/// What a server will hold, besides its fixed descriptors (`FDS_FIXED`: epoll, eventfd, the
/// reserve, slack).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FdNeeds {
    /// Descriptors the process has open before the server starts (other servers, clients, the
    /// standard streams).
    pub open_now: usize,
    /// Listening sockets: the Unix socket, and the TCP one if configured.
    pub listeners: usize,
    /// Configured `Config::clients_max`.
    pub clients_max: u32,
    /// Configured `ServerConfig::connections_max`: the control thread never holds more
    /// connections than this (registered or not), so it bounds the sockets.
    pub connections_max: usize,
}

impl FdNeeds {
    /// Descriptors needed in all, with the ones already open.
    pub fn total(&self) -> u64 {
        (self.open_now + self.listeners + FDS_FIXED + self.connections_max) as u64
    }
}

/// What [`plan`] decided about the limit.
#[must_use]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum FdAction {
    /// The soft limit already covers the need.
    Enough,
    /// Raise the soft limit, within the hard limit.
    RaiseSoft,
    /// Raise the hard limit too (the kernel allows it only to a privileged process).
    RaiseHard,
    /// No limit we can reach covers the need: serve fewer clients and connections.
    Lower,
}

/// The server's descriptor plan: the limit it runs under and what it serves within it.
#[must_use]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FdBudget {
    /// What was done about the limit.
    pub action: FdAction,
    /// The soft `RLIMIT_NOFILE` the server runs under (after any raise).
    pub limit: u64,
    /// Descriptors the configured capacities need, counting those open before the start.
    pub needed: u64,
    /// Clients served: the configured `clients_max`, or fewer when lowered.
    pub clients_max: u32,
    /// Connections served: the configured `connections_max`, or fewer when lowered.
    pub connections_max: usize,
}

/// Even the highest reachable limit leaves no room for one client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FdShortfall {
    /// The highest limit the server could run under.
    pub limit: u64,
    /// Descriptors the configured capacities need.
    pub needed: u64,
}

/// Decides the limit and what is served. `may_raise_hard`: whether to plan on raising the hard
/// limit (up to `nr_open`); the server tries with it first and, when the kernel refuses, plans
/// again without.
pub fn plan(
    limits: FdLimits,
    needs: FdNeeds,
    may_raise_hard: bool,
) -> Result<FdBudget, FdShortfall> {
    let needed = needs.total();
    let budget = |action, limit| FdBudget {
        action,
        limit,
        needed,
        clients_max: needs.clients_max,
        connections_max: needs.connections_max,
    };
    if limits.soft >= needed {
        return Ok(budget(FdAction::Enough, limits.soft));
    }
    if limits.hard >= needed {
        return Ok(budget(FdAction::RaiseSoft, needed));
    }
    let ceiling = if may_raise_hard {
        limits.hard.max(limits.nr_open)
    } else {
        limits.hard
    };
    if ceiling >= needed {
        return Ok(budget(FdAction::RaiseHard, needed));
    }
    // What the ceiling leaves for connections once everything else has its descriptors.
    let others = (needs.open_now + needs.listeners + FDS_FIXED) as u64;
    let connections = usize::try_from(ceiling.saturating_sub(others)).unwrap_or(usize::MAX);
    let clients = clients_fitting(connections).min(needs.clients_max as usize);
    if clients == 0 {
        return Err(FdShortfall {
            limit: ceiling,
            needed,
        });
    }
    assert!(
        connections < needs.connections_max,
        "lowered only when short"
    );
    assert!(
        2 * clients <= connections,
        "every served client's two connections fit"
    );
    Ok(FdBudget {
        action: FdAction::Lower,
        limit: ceiling,
        needed,
        // `clients` is at most the configured u32.
        clients_max: clients as u32,
        connections_max: connections,
    })
}

/// The most clients whose two connections each (control and data) and spare connections
/// ([`CLIENTS_PER_SPARE_CONNECTION`]) fit in `connections`.
fn clients_fitting(connections: usize) -> usize {
    let per = |clients: usize| 2 * clients + clients.div_ceil(CLIENTS_PER_SPARE_CONNECTION);
    // At least 2 + 1/4 connections per client, so the answer is at most 4/9 of them (written
    // to not overflow); step down past the rounding up of the spares.
    let (per_group, group) = (
        2 * CLIENTS_PER_SPARE_CONNECTION + 1,
        CLIENTS_PER_SPARE_CONNECTION,
    );
    let mut clients = connections / per_group * group + connections % per_group * group / per_group;
    while clients > 0 && per(clients) > connections {
        clients -= 1;
    }
    clients
}

/// Plans the server's descriptors, raises `RLIMIT_NOFILE` as far as the plan says, and lowers
/// `cfg`'s capacities when it must. Called before the region is mapped (it is sized from
/// `clients_max`).
pub(crate) fn apply(cfg: &mut ServerConfig) -> io::Result<FdBudget> {
    let limits = current_limits()?;
    let needs = FdNeeds {
        open_now: open_now(limits.soft),
        listeners: 1 + usize::from(cfg.tcp.is_some()),
        clients_max: cfg.core.clients_max,
        connections_max: cfg.connections_max,
    };
    // First as if the hard limit could be raised: only the kernel knows whether we may.
    let mut budget = plan(limits, needs, true).map_err(|s| shortfall(s, needs))?;
    if budget.limit > limits.soft
        && set_limits(budget.limit, limits.hard.max(budget.limit)).is_err()
    {
        budget = plan(limits, needs, false).map_err(|s| shortfall(s, needs))?;
        if budget.limit > limits.soft && set_limits(budget.limit, limits.hard).is_err() {
            // Not even the soft limit moves (a sandbox): plan within what we have.
            let stuck = FdLimits {
                hard: limits.soft,
                ..limits
            };
            budget = plan(stuck, needs, false).map_err(|s| shortfall(s, needs))?;
        }
    }
    report(limits, budget);
    cfg.core.clients_max = budget.clients_max;
    // Clients past the table cannot re-register after a failover either.
    cfg.core.recovery_clients = cfg.core.recovery_clients.min(budget.clients_max);
    cfg.connections_max = budget.connections_max;
    Ok(budget)
}

fn shortfall(s: FdShortfall, needs: FdNeeds) -> io::Error {
    io::Error::other(format!(
        "RLIMIT_NOFILE {} cannot serve one client: {} clients need {} descriptors ({} already \
         open); raise the limit (ulimit -n, LimitNOFILE=) or lower clients_max",
        s.limit, needs.clients_max, s.needed, needs.open_now
    ))
}

fn report(before: FdLimits, b: FdBudget) {
    match b.action {
        FdAction::Enough => {
            tracing::debug!(limit = b.limit, needed = b.needed, "RLIMIT_NOFILE suffices")
        }
        FdAction::RaiseSoft | FdAction::RaiseHard => tracing::info!(
            from = before.soft,
            to = b.limit,
            hard = before.hard,
            "raised RLIMIT_NOFILE for the configured capacities"
        ),
        FdAction::Lower => tracing::warn!(
            limit = b.limit,
            needed = b.needed,
            clients_max = b.clients_max,
            connections_max = b.connections_max,
            "RLIMIT_NOFILE {} is below the {} descriptors the configured capacities need, and \
             cannot be raised: serving {} clients and {} connections; further clients are \
             refused (raise the limit, e.g. LimitNOFILE=, and restart to serve more)",
            b.limit,
            b.needed,
            b.clients_max,
            b.connections_max,
        ),
    }
}

fn current_limits() -> io::Result<FdLimits> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one `rlimit` through a pointer to a live local.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // The kernel's own default, for when /proc is not mounted.
    const NR_OPEN_DEFAULT: u64 = 1 << 20;
    let nr_open = std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(NR_OPEN_DEFAULT);
    Ok(FdLimits {
        soft: r.rlim_cur,
        hard: r.rlim_max,
        nr_open,
    })
}

fn set_limits(soft: u64, hard: u64) -> io::Result<()> {
    let r = libc::rlimit {
        rlim_cur: soft,
        rlim_max: hard,
    };
    // SAFETY: setrlimit reads one `rlimit` through a pointer to a live local.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &r) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Descriptors open in this process: the entries of `/proc/self/fd` (less the one reading it),
/// or, without /proc, every descriptor below `soft` that `fcntl` says is open.
fn open_now(soft: u64) -> usize {
    if let Ok(dir) = std::fs::read_dir("/proc/self/fd") {
        return dir.count().saturating_sub(1);
    }
    // A few thousand cheap syscalls, once per start; capped so an unlimited soft limit does
    // not make it millions.
    const PROBE_MAX: u64 = 1 << 16;
    (0..soft.min(PROBE_MAX) as libc::c_int)
        // SAFETY: F_GETFD only reads the descriptor's flags; a closed one fails with EBADF.
        .filter(|&fd| unsafe { libc::fcntl(fd, libc::F_GETFD) } != -1)
        .count()
}

/// Whether `e` says the process (EMFILE) or the system (ENFILE) is out of descriptors.
pub(super) fn out_of_fds(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE))
}

/// How often a run of refusals is logged.
const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(1);

/// One descriptor held in reserve so that, out of descriptors, the control thread can still
/// accept a pending connection and close it at once. Without it `accept` fails with EMFILE, the
/// connection stays in the listen backlog, and since the listener is edge-triggered nothing
/// wakes the thread for it again: the peer waits with no answer. With it the peer sees its
/// connection closed — an error it can act on. (The trick is libev's and nginx's.)
#[derive(Debug)]
pub(super) struct FdReserve {
    file: Option<File>,
    /// Connections refused for want of a descriptor, in all.
    refused: u64,
    /// `refused` when the last log line was written, and when.
    logged: (u64, Option<Instant>),
}

impl FdReserve {
    pub(super) fn new() -> io::Result<Self> {
        Ok(Self {
            file: Some(File::open("/dev/null")?),
            refused: 0,
            logged: (0, None),
        })
    }

    /// After an accept failed for want of descriptors: frees the reserve, accepts one pending
    /// connection with `accept_and_close` (which drops what it accepted), and takes the reserve
    /// back. True if a connection was refused, so the accept loop should go on draining the
    /// backlog; false if there was none, or no descriptor could be had (the reserve is retried
    /// at the next refusal).
    pub(super) fn refuse(
        &mut self,
        now: Instant,
        accept_and_close: impl FnOnce() -> io::Result<()>,
    ) -> bool {
        let Some(reserve) = self.file.take() else {
            self.file = File::open("/dev/null").ok();
            return false;
        };
        drop(reserve);
        let refused = accept_and_close().is_ok();
        self.file = File::open("/dev/null").ok();
        if refused {
            self.refused += 1;
            let due = self
                .logged
                .1
                .is_none_or(|at| now.duration_since(at) >= REFUSAL_LOG_INTERVAL);
            if due {
                tracing::warn!(
                    refused = self.refused - self.logged.0,
                    refused_total = self.refused,
                    "out of file descriptors: refused connections by closing them \
                     (raise RLIMIT_NOFILE or lower clients_max / connections_max)"
                );
                self.logged = (self.refused, Some(now));
            }
        }
        refused
    }

    /// Connections refused for want of a descriptor since start.
    #[cfg(test)]
    pub(super) fn refused(&self) -> u64 {
        self.refused
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The common default: soft and hard 1,024, /proc's default ceiling.
    const LIMITS_1024: FdLimits = FdLimits {
        soft: 1024,
        hard: 1024,
        nr_open: 1 << 20,
    };

    /// The default capacities: 1,000 clients, four connections each, TCP and Unix listeners.
    fn needs_1000() -> FdNeeds {
        FdNeeds {
            open_now: 4,
            listeners: 2,
            clients_max: 1000,
            connections_max: 4000,
        }
    }

    #[test]
    fn enough_when_the_soft_limit_covers_the_need() {
        let needs = FdNeeds {
            clients_max: 100,
            connections_max: 400,
            ..needs_1000()
        };
        let b = plan(LIMITS_1024, needs, true).unwrap();
        assert_eq!(b.action, FdAction::Enough);
        assert_eq!(
            (b.limit, b.clients_max, b.connections_max),
            (1024, 100, 400)
        );
        assert_eq!(b.needed, (4 + 2 + FDS_FIXED + 400) as u64);
    }

    #[test]
    fn raises_the_soft_limit_to_the_need_within_the_hard_one() {
        let limits = FdLimits {
            hard: 65_536,
            ..LIMITS_1024
        };
        let b = plan(limits, needs_1000(), false).unwrap();
        assert_eq!(b.action, FdAction::RaiseSoft);
        assert_eq!(b.limit, (4 + 2 + FDS_FIXED + 4000) as u64);
        assert_eq!((b.clients_max, b.connections_max), (1000, 4000));
    }

    #[test]
    fn raises_the_hard_limit_when_allowed_and_the_kernel_ceiling_covers_it() {
        let b = plan(LIMITS_1024, needs_1000(), true).unwrap();
        assert_eq!(b.action, FdAction::RaiseHard);
        assert_eq!(b.limit, b.needed);
        assert_eq!((b.clients_max, b.connections_max), (1000, 4000));
    }

    #[test]
    fn lowers_clients_and_connections_to_what_the_hard_limit_leaves() {
        let b = plan(LIMITS_1024, needs_1000(), false).unwrap();
        assert_eq!(b.action, FdAction::Lower);
        assert_eq!(b.limit, 1024);
        let connections = 1024 - 4 - 2 - FDS_FIXED;
        assert_eq!(b.connections_max, connections);
        // Two connections per client and one spare per four clients, and no more clients.
        let c = b.clients_max as usize;
        assert!(2 * c + c.div_ceil(4) <= connections);
        assert!(2 * (c + 1) + (c + 1).div_ceil(4) > connections);
        // RDMA builds set a few descriptors more aside (the device and its event channel).
        let quoted = if cfg!(feature = "rdma") { 444 } else { 446 };
        assert_eq!(c, quoted, "the figure the docs quote for a 1,024 limit");
    }

    #[test]
    fn lowers_up_to_the_kernel_ceiling_when_even_that_is_short() {
        let limits = FdLimits {
            nr_open: 2048,
            ..LIMITS_1024
        };
        let b = plan(limits, needs_1000(), true).unwrap();
        assert_eq!((b.action, b.limit), (FdAction::Lower, 2048));
        assert_eq!(b.connections_max, 2048 - 4 - 2 - FDS_FIXED);
    }

    #[test]
    fn lowering_keeps_a_client_count_that_already_fits() {
        // Only the connection cap is short: 300 clients fit in what is left.
        let needs = FdNeeds {
            clients_max: 300,
            connections_max: 1200,
            ..needs_1000()
        };
        let b = plan(LIMITS_1024, needs, false).unwrap();
        assert_eq!(b.action, FdAction::Lower);
        assert_eq!(b.clients_max, 300);
        assert!(b.connections_max < 1200);
    }

    #[test]
    fn refuses_when_not_one_client_fits() {
        // Two connections' worth left after everything else: one client needs three.
        let tight = (4 + 2 + FDS_FIXED + 2) as u64;
        let limits = FdLimits {
            soft: tight,
            hard: tight,
            nr_open: tight,
        };
        let err = plan(limits, needs_1000(), true).unwrap_err();
        assert_eq!(err.limit, tight);
        let one_more = FdLimits {
            hard: tight + 1,
            ..limits
        };
        assert_eq!(plan(one_more, needs_1000(), false).unwrap().clients_max, 1);
        assert_eq!(err.needed, needs_1000().total());
    }

    #[test]
    fn clients_fitting_is_the_largest_count_that_fits() {
        for connections in 0..2000 {
            let c = clients_fitting(connections);
            let per = |c: usize| 2 * c + c.div_ceil(CLIENTS_PER_SPARE_CONNECTION);
            assert!(per(c) <= connections, "{c} clients in {connections}");
            assert!(
                per(c + 1) > connections,
                "{} clients in {connections}",
                c + 1
            );
        }
    }

    #[test]
    fn the_reserve_refuses_one_connection_and_is_taken_back() {
        let mut reserve = FdReserve::new().unwrap();
        let now = Instant::now();
        assert!(reserve.refuse(now, || Ok(())));
        assert!(reserve.file.is_some(), "the reserve is held again");
        assert!(!reserve.refuse(now, || Err(io::ErrorKind::WouldBlock.into())));
        assert_eq!(reserve.refused(), 1);
    }
}
