//! The comparison as one Markdown table, a row per (workload, clients): dlock's throughput, each
//! Redis driving's, dlock's ratio to each and to the strongest Redis of the row (the headline
//! ratio), then p50/p99 latency and server CPU per operation, dlock's first and then each
//! driving's. The columns follow the drivings asked for (`--redis`).

use crate::Row;
use crate::run::{Cell, Driving, Workload};

/// Prints `rows`, measured with `drivings`, and the hand-off shares under them.
pub fn print(rows: &[Row], drivings: &[Driving]) {
    println!();
    println!("{}", header(drivings));
    // Right-aligned: clients, dlock ops/s, the strongest ratio, dlock's latency and CPU, and per
    // driving its ops/s, ratio, latency and CPU.
    println!("|---|{}", "--:|".repeat(5 + 4 * drivings.len()));
    for r in rows {
        println!("{}", line(r, drivings));
    }
    for r in rows.iter().filter(|r| r.workload == Workload::Handoff) {
        let share = |c: &Cell| 100.0 * c.handoffs as f64 / c.ops.max(1) as f64;
        let redis: Vec<String> = r
            .redis
            .iter()
            .map(|(d, c)| format!("{} {:.0}%", d.name(), share(c)))
            .collect();
        println!(
            "hand-off, {} clients: the lock changed hands on {:.0}% of dlock's acquisitions; \
             of Redis's: {}",
            r.clients,
            share(&r.dlock),
            redis.join(", ")
        );
    }
    println!(
        "(ops: one lock+unlock, FAA/INCR, 31-key lock+unlock, or acquisition+release; latency \
         per op; CPU: the server process's user+system time over the measurement / ops; \
         dlock/strongest: against the Redis driving with the most ops/s in that row, named)"
    );
}

fn header(drivings: &[Driving]) -> String {
    let each =
        |f: &dyn Fn(&str) -> String| -> String { drivings.iter().map(|d| f(d.name())).collect() };
    format!(
        "| workload | clients | dlock ops/s |{}{} dlock/strongest | dlock p50 / p99 µs |{} \
         dlock CPU µs/op |{}",
        each(&|d| format!(" redis {d} ops/s |")),
        each(&|d| format!(" dlock/{d} |")),
        each(&|d| format!(" {d} p50 / p99 µs |")),
        each(&|d| format!(" {d} CPU µs/op |")),
    )
}

fn line(r: &Row, drivings: &[Driving]) -> String {
    // A driving asked for is in every row; "-" would mark one that is not.
    let each = |f: &dyn Fn(&Cell) -> String| -> String {
        drivings
            .iter()
            .map(|&d| {
                r.redis_as(d)
                    .map_or(" - |".into(), |c| format!(" {} |", f(c)))
            })
            .collect()
    };
    let ratio = |c: &Cell| r.dlock.ops_per_s() / c.ops_per_s().max(f64::MIN_POSITIVE);
    let strongest = r.strongest().map_or("-".into(), |(d, c)| {
        format!("{:.2} ({})", ratio(c), d.name())
    });
    let latency = |c: &Cell| format!("{:.1} / {:.1}", c.p_us(0.5), c.p_us(0.99));
    format!(
        "| {} | {} | {:.0} |{}{} {strongest} | {} |{} {:.1} |{}",
        r.workload.name(),
        r.clients,
        r.dlock.ops_per_s(),
        each(&|c| format!("{:.0}", c.ops_per_s())),
        each(&|c| format!("{:.2}", ratio(c))),
        latency(&r.dlock),
        each(&latency),
        r.dlock.cpu_us_per_op(),
        each(&|c| format!("{:.1}", c.cpu_us_per_op())),
    )
}
