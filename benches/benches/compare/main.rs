//! dlock beside Redis on the same machine, in the same run: the same workloads through the real
//! `dlock serve` binary and a `redis-server` (persistence off), both on 127.0.0.1. Redis's
//! clients are driven three ways (`run::Driving`): a thread each with its own connection
//! (`threads`), and as Rust services drive Redis, tasks of one current-thread tokio runtime on
//! redis-rs's async connection, all sharing one (`async-mux`) or each with its own
//! (`async-own`). dlock's clients are threads (tasks of one executor thread in the `/async`
//! workloads) and share one data connection through the multiplexing client
//! (`--own-connections`: one each). Prints one table (throughput, dlock's ratio to each Redis
//! driving and to the strongest of them in that row, p50/p99 per operation, and each server's
//! CPU time per operation from `/proc/<pid>/stat`) and writes an SVG plot.
//!
//! Run: `cargo build --release -p dlock-cli && cargo bench -p dlock-benches
//! --bench compare` (add `-- quick` for a short run; `--idle park` lets dlock's data thread
//! sleep when idle, as Redis's event loop does; `--own-connections` gives each dlock client its
//! own data connection; `--redis threads,async-mux,async-own` chooses Redis's drivings, all three
//! by default; `--secs 2`, `--clients 1,16`, and workload names such as `hand-off` or
//! `lock+unlock/async` narrow a run). Needs `redis-server` on PATH (`apt-get install
//! redis-server`) and exits with a message, not an error, when it is missing. Installs nothing.
//!
//! The baseline is Redis itself: every figure is a ratio to Redis measured in the same run, and
//! the headline one is to the strongest Redis driving of each row.

mod dlock_async;
mod dlock_side;
mod floor;
mod plot;
mod redis_async;
mod redis_side;
mod resp;
mod run;
mod servers;
mod table;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use run::{Cell, Driving, RETRY_SLEEP, Shared, Workload};
use servers::Server;

/// Measurement time of each (workload, clients, server) cell; 7 workloads × 3 client counts × 2
/// servers made a full run about 2.5 minutes, a quick one about 30 s (measured on 2 vCPUs), before
/// the two async Redis drivings added as many cells again (`--redis` leaves them out).
const CELL_FULL: Duration = Duration::from_secs(3);
const CELL_QUICK: Duration = Duration::from_millis(500);
/// A smoke run's cell, when `cargo test --benches` (which passes no `--bench`) starts this: it
/// checks the benchmark works, at two small client counts, in a few seconds.
const CELL_SMOKE: Duration = Duration::from_millis(100);
/// The longest cell `--secs` accepts, so a run stays within minutes.
const CELL_MAX: Duration = Duration::from_secs(20);

/// One workload at one client count on both servers.
#[derive(Debug)]
pub struct Row {
    pub workload: Workload,
    pub clients: usize,
    pub dlock: Cell,
    /// Redis, once per driving asked for, in [`Driving::ALL`]'s order.
    pub redis: Vec<(Driving, Cell)>,
}

impl Row {
    /// Redis as `driving` drove it, if it was asked for.
    pub fn redis_as(&self, driving: Driving) -> Option<&Cell> {
        self.redis
            .iter()
            .find_map(|(d, c)| (*d == driving).then_some(c))
    }

    /// The Redis driving with the highest throughput in this row: the one the headline ratio is
    /// taken against.
    pub fn strongest(&self) -> Option<&(Driving, Cell)> {
        self.redis
            .iter()
            .max_by(|(_, a), (_, b)| a.ops_per_s().total_cmp(&b.ops_per_s()))
    }
}

#[derive(Debug)]
struct Args {
    cell: Duration,
    idle: String,
    clients: Vec<usize>,
    workloads: Vec<Workload>,
    /// dlock's clients share one data connection (`Mux`).
    mux: bool,
    /// How Redis's clients are driven, in [`Driving::ALL`]'s order.
    drivings: Vec<Driving>,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        cell: CELL_FULL,
        idle: "adaptive".into(),
        clients: vec![1, 16, 64],
        workloads: Vec::new(),
        mux: true,
        drivings: Driving::ALL.to_vec(),
    };
    let (mut bench, mut cell_given, mut clients_given) = (false, false, false);
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            // `cargo bench` passes `--bench` to every benchmark binary; `cargo test` does not.
            "--bench" => bench = true,
            "quick" => {
                args.cell = CELL_QUICK;
                cell_given = true;
            }
            "--secs" => {
                cell_given = true;
                let s: f64 = it.next().and_then(|v| v.parse().ok()).ok_or("--secs N")?;
                args.cell = Duration::from_secs_f64(s.clamp(0.1, CELL_MAX.as_secs_f64()));
            }
            "--own-connections" => args.mux = false,
            "--redis" => {
                let v = it.next().ok_or("--redis threads,async-mux,async-own")?;
                args.drivings = parse_drivings(&v)?;
            }
            "--idle" => args.idle = it.next().ok_or("--idle adaptive|park|spin")?,
            "--clients" => {
                clients_given = true;
                let v = it.next().ok_or("--clients 1,16,64")?;
                args.clients = v
                    .split(',')
                    .map(|n| n.parse::<usize>().ok().filter(|n| (1..=256).contains(n)))
                    .collect::<Option<_>>()
                    .ok_or("--clients takes counts from 1 to 256, e.g. 1,16,64")?;
            }
            name => match Workload::ALL.into_iter().find(|w| w.name() == name) {
                Some(w) => args.workloads.push(w),
                None => return Err(format!("unknown argument {name}")),
            },
        }
    }
    if !bench {
        println!("(a smoke run: started without --bench, as `cargo test --benches` does)");
        if !cell_given {
            args.cell = CELL_SMOKE;
        }
        if !clients_given {
            args.clients = vec![1, 4];
        }
    }
    if args.workloads.is_empty() {
        args.workloads = Workload::ALL.to_vec();
    }
    Ok(args)
}

/// `--redis`'s list: known names, at least one, kept in [`Driving::ALL`]'s order.
fn parse_drivings(list: &str) -> Result<Vec<Driving>, String> {
    let mut named = Vec::new();
    for name in list.split(',') {
        match Driving::ALL.into_iter().find(|d| d.name() == name) {
            Some(d) => named.push(d),
            None => {
                return Err(format!(
                    "--redis: unknown driving {name:?}; choose from threads,async-mux,async-own"
                ));
            }
        }
    }
    Ok(Driving::ALL
        .into_iter()
        .filter(|d| named.contains(d))
        .collect())
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("compare: {e}");
            return ExitCode::FAILURE;
        }
    };
    let Some(redis) = servers::on_path("redis-server") else {
        println!(
            "compare: redis-server is not on PATH, so there is nothing to compare with; \
             install it (e.g. `apt-get install redis-server`) and run this again. Skipped."
        );
        return ExitCode::SUCCESS;
    };
    let profile = servers::profile_dir().unwrap_or_else(std::env::temp_dir);
    let dlock = std::env::var_os("DLOCK_BIN").map_or_else(|| profile.join("dlock"), PathBuf::from);
    if !dlock.is_file() {
        println!(
            "compare: no dlock binary at {}; build it first with \
             `cargo build --release -p dlock-cli` (or point DLOCK_BIN at one). \
             Skipped.",
            dlock.display()
        );
        return ExitCode::SUCCESS;
    }
    let work = profile
        .parent()
        .map_or_else(std::env::temp_dir, |t| t.to_path_buf())
        .join("compare");
    if let Err(e) = std::fs::create_dir_all(&work) {
        eprintln!("compare: {}: {e}", work.display());
        return ExitCode::FAILURE;
    }
    match compare(&args, &redis, &dlock, &work) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("compare: {e}");
            ExitCode::FAILURE
        }
    }
}

fn compare(args: &Args, redis: &Path, dlock: &Path, work: &Path) -> Result<(), String> {
    let redis_server = servers::start_redis(redis, work)?;
    let dlock_server = servers::start_dlock(dlock, work, &args.idle)?;
    let redis_version = std::process::Command::new(redis)
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    print_header(args, &redis_server, &redis_version, &dlock_server, dlock);
    let mut rows = Vec::new();
    // Every cell names its keys apart from every other's.
    let mut run_no = 0u32;
    for &workload in &args.workloads {
        for &clients in &args.clients {
            let servers = (&dlock_server, &redis_server);
            let row = measure_row(workload, clients, args, &mut run_no, servers)?;
            let redis: Vec<String> = row
                .redis
                .iter()
                .map(|(d, c)| format!("{} {:.0}", d.name(), c.ops_per_s()))
                .collect();
            println!(
                "  {:<17} {clients:>3} clients: dlock {:.0} ops/s; redis {} ops/s",
                workload.name(),
                row.dlock.ops_per_s(),
                redis.join(", ")
            );
            rows.push(row);
        }
    }
    dlock_server.stop();
    redis_server.stop();
    table::print(&rows, &args.drivings);
    print_floor(&rows, args.cell);
    let svg = work.join("compare.svg");
    let title = format!(
        "dlock (TCP{}, --idle {}) vs Redis {}, 127.0.0.1, {} CPUs, {:.1} s per point",
        if args.mux { ", shared connection" } else { "" },
        args.idle,
        redis_version
            .split_whitespace()
            .find_map(|w| w.strip_prefix("v="))
            .unwrap_or("?"),
        cpus(),
        args.cell.as_secs_f64()
    );
    plot::write(&svg, &rows, &args.clients, &title)?;
    println!("plot: {}", svg.display());
    Ok(())
}

/// The floor of a thread per client (`floor.rs`) at each client count of the table with more
/// client threads than processors, and the most it allows each such row against redis-rs
/// async-mux, whose two threads (its runtime's and the server's) are measured in the same row.
/// CPU time per operation is compared, not throughput: on a shared machine the throughput of a
/// half-second cell swings with other work, CPU per operation far less. Measured after both
/// servers stopped, with nothing else of this run going on.
fn print_floor(rows: &[Row], cell: Duration) {
    let cpus = cpus();
    let mut counts: Vec<usize> = rows
        .iter()
        .filter(|r| r.workload.round_trips().is_some() && r.clients > cpus)
        .map(|r| r.clients)
        .collect();
    counts.sort_unstable();
    counts.dedup();
    for clients in counts {
        let f = floor::measure(clients, cpus, cell);
        println!(
            "floor of a thread per client at {clients} threads on {cpus} CPUs (no socket, no \
             server): a bare switch {:.2} µs of CPU, a futex sleep and wake-up {:.2} µs",
            f.switch_us, f.futex_us
        );
        for r in rows.iter().filter(|r| r.clients == clients) {
            let (Some(trips), Some(redis)) =
                (r.workload.round_trips(), r.redis_as(Driving::AsyncMux))
            else {
                continue;
            };
            print_floor_row(r, trips, redis, &f, cpus);
        }
    }
}

/// One row's CPU per operation on both sides and the most the floor `f` allows it.
fn print_floor_row(r: &Row, trips: u32, redis: &Cell, f: &floor::Floor, cpus: usize) {
    let server = r.dlock.cpu_us_per_op();
    let (rc, rs) = (redis.client_cpu_us_per_op(), redis.cpu_us_per_op());
    let bare = f64::from(trips) * f.switch_us + server;
    let slept = f64::from(trips) * f.futex_us + server;
    println!(
        "  {:<12} CPU per op: dlock client {:.1} + server {server:.1} µs, {:.0} ops/s; \
         async-mux client {rc:.1} + server {rs:.1} µs, {:.0} ops/s ({:.2}×)",
        r.workload.name(),
        r.dlock.client_cpu_us_per_op(),
        r.dlock.ops_per_s(),
        redis.ops_per_s(),
        r.dlock.ops_per_s() / redis.ops_per_s(),
    );
    // With the processors the limit, throughputs stand as CPU per operation does; on idle
    // processors async-mux runs at the pace of its busier thread, and the threads per client
    // spread over every processor.
    println!(
        "  {:<12} at the floor ({trips} × {:.2} µs switching or {trips} × {:.2} sleeping, + \
         server) at least {bare:.1} µs per op ({slept:.1} sleeping): at most {:.2}× async-mux \
         ({:.2}× sleeping) with the processors the limit, {:.2}× ({:.2}×) on {cpus} idle ones",
        "",
        f.switch_us,
        f.futex_us,
        (rc + rs) / bare,
        (rc + rs) / slept,
        cpus as f64 * rc.max(rs) / bare,
        cpus as f64 * rc.max(rs) / slept,
    );
}

/// What is compared with what: the machine, both servers, and how each side's clients are driven.
fn print_header(args: &Args, redis: &Server, version: &str, dlock: &Server, bin: &Path) {
    println!("machine: {} CPUs, {}", cpus(), cpu_model());
    println!("redis:   {version}");
    println!(
        "         pid {} on {}, --save '' --appendonly no",
        redis.pid(),
        redis.addr
    );
    for d in &args.drivings {
        println!("         {:<9} = {}", d.name(), d.describe());
    }
    println!("dlock:   {} (built {})", bin.display(), built(bin));
    println!(
        "         pid {} on {}, serve --idle {}; clients {}",
        dlock.pid(),
        dlock.addr,
        args.idle,
        if args.mux {
            "share one data connection (Mux)"
        } else {
            "each on its own connections"
        }
    );
    println!(
        "{:.1} s per cell; Redis lock = SET NX PX {}, unlock = EVALSHA compare-and-delete; \
         hand-off retry sleep {} ms",
        args.cell.as_secs_f64(),
        run::EXPIRE_MS,
        RETRY_SLEEP.as_millis()
    );
}

/// `workload` at `clients` clients on dlock, then on Redis once per driving asked for.
fn measure_row(
    workload: Workload,
    clients: usize,
    args: &Args,
    run_no: &mut u32,
    (dlock, redis): (&Server, &Server),
) -> Result<Row, String> {
    *run_no += 1;
    let dlock = measure_dlock(workload, clients, args.cell, *run_no, dlock, args.mux)?;
    let mut cells = Vec::with_capacity(args.drivings.len());
    for &driving in &args.drivings {
        *run_no += 1;
        let run = *run_no;
        let cell = match driving {
            Driving::Threads => {
                let shared = Shared::default();
                run::measure(redis, clients, args.cell, &shared, |i, s| {
                    redis_side::worker(redis.addr, workload, run, i, s)
                })?
            }
            Driving::AsyncMux => {
                redis_async::measure(redis, workload, clients, args.cell, run, true)?
            }
            Driving::AsyncOwn => {
                redis_async::measure(redis, workload, clients, args.cell, run, false)?
            }
        };
        cells.push((driving, cell));
    }
    Ok(Row {
        workload,
        clients,
        dlock,
        redis: cells,
    })
}

fn measure_dlock(
    workload: Workload,
    clients: usize,
    cell: Duration,
    run_no: u32,
    dlock: &Server,
    mux: bool,
) -> Result<Cell, String> {
    let shared = Shared::default();
    let mux = match mux {
        true => Some(
            dlock_transport::client::Mux::new(&dlock_transport::client::Endpoint::Tcp(dlock.addr))
                .map_err(|e| format!("dlock mux: {e}"))?,
        ),
        false => None,
    };
    match (workload.is_async(), &mux) {
        (true, Some(mux)) => dlock_async::measure(dlock, workload, clients, cell, run_no, mux),
        (true, None) => Err(format!(
            "{} needs the shared connection (leave out --own-connections)",
            workload.name()
        )),
        (false, _) => run::measure(dlock, clients, cell, &shared, |i, s| {
            dlock_side::worker(dlock.addr, workload, run_no, i, s, mux.as_ref())
        }),
    }
}

fn cpus() -> usize {
    std::thread::available_parallelism().map_or(0, |n| n.get())
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|m| m.trim_start_matches([' ', '\t', ':']).to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into())
}

/// How long ago `path` was built, so a stale `dlock` binary shows.
fn built(path: &Path) -> String {
    std::fs::metadata(path)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.elapsed().ok())
        .map_or("at an unknown time".into(), |d| {
            format!("{} s ago", d.as_secs())
        })
}
