//! The workloads on Redis driven as Rust services usually drive it: redis-rs's async
//! `MultiplexedConnection`, every client a task of one current-thread tokio runtime. In
//! `async-mux` all the clients share one connection (a service clones one connection into its
//! handlers, the common way); in `async-own` each has its own (redis-rs 1.x's only async
//! connection is the multiplexed one, so that is one `MultiplexedConnection` per client). The
//! connection's own driver task runs on the same thread, so the whole client side is one thread.
//!
//! The commands, keys, tokens and Lua scripts are `redis_side`'s, sent with `redis::cmd` so the
//! bytes on the wire are the `threads` driving's (redis-rs's typed `incr` would send `INCRBY`).
//! Two settings differ from redis-rs's defaults, both to match that driving: Nagle is off (on by
//! default), and a reply may take `resp::REPLY_TIMEOUT` rather than 500 ms, which a loaded
//! 2-core machine can exceed in the hand-off's tail. The hand-off's retry sleeps with
//! `tokio::time::sleep`, whose timer rounds up to whole milliseconds: a pause of 1–2 ms where
//! `thread::sleep` pauses a little over 1 ms.
//!
//! The measurement is `run::measure`'s: every connection is made and every script loaded before
//! the clock starts; the tasks are spawned together and first run once all are (the runtime has
//! one thread, busy spawning until then), run until one shared deadline, and the window and the
//! server's CPU time close when the last one has finished.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use redis::aio::MultiplexedConnection;
use redis::io::tcp::TcpSettings;
use redis::{AsyncConnectionConfig, Cmd, IntoConnectionInfo, RedisResult, Value};
use tokio::task::JoinSet;

use crate::redis_side::{LOCK_ALL, Plan, UNLOCK, UNLOCK_ALL};
use crate::resp::REPLY_TIMEOUT;
use crate::run::{Cell, RETRY_SLEEP, Shared, Workload};
use crate::servers::Server;

/// What one task hands back: its latencies and how many operations it completed.
type TaskResult = Result<(Histogram<u64>, u64), String>;

/// The scripts' SHA1s, as `SCRIPT LOAD` answered them.
#[derive(Debug)]
struct Shas {
    unlock: String,
    lock_all: String,
    unlock_all: String,
}

struct AsyncClient {
    con: MultiplexedConnection,
    workload: Workload,
    me: usize,
    plan: Plan,
    shas: Arc<Shas>,
    shared: Arc<Shared>,
}

/// Runs `workload` with `clients` tasks for `duration` against `server`, all on one connection
/// (`shared_connection`, `async-mux`) or each on its own (`async-own`). Run `run` names the keys
/// apart from other runs'.
pub fn measure(
    server: &Server,
    workload: Workload,
    clients: usize,
    duration: Duration,
    run: u32,
    shared_connection: bool,
) -> Result<Cell, String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("tokio runtime: {e}"))?;
    rt.block_on(async {
        let shared = Arc::new(Shared::default());
        let cs = connect_all(
            server.addr,
            workload,
            clients,
            run,
            shared_connection,
            &shared,
        )
        .await
        .map_err(|e| format!("redis-rs setup: {e}"))?;
        let t0 = Instant::now();
        let (cpu0, mine0) = (server.cpu_s(), crate::run::process_cpu_s());
        let deadline = t0 + duration;
        let mut tasks = JoinSet::new();
        for c in cs {
            tasks.spawn(c.run(deadline));
        }
        let mut results = Vec::with_capacity(clients);
        while let Some(r) = tasks.join_next().await {
            results.push(r.unwrap_or_else(|_| Err("a client task panicked".into())));
        }
        let client_cpu_s = crate::run::process_cpu_s() - mine0;
        let (secs, server_cpu_s) = (t0.elapsed().as_secs_f64(), server.cpu_s() - cpu0);
        let mut hist = Histogram::<u64>::new(3).map_err(|e| e.to_string())?;
        let mut ops = 0;
        for r in results {
            let (h, n) = r?;
            hist.add(h).map_err(|e| e.to_string())?;
            ops += n;
        }
        Ok(Cell {
            ops,
            secs,
            hist,
            server_cpu_s,
            client_cpu_s,
            handoffs: shared.handoffs(),
        })
    })
}

/// The `clients` clients of run `run`, connected (one connection, or one each) and with the
/// scripts loaded.
async fn connect_all(
    addr: SocketAddr,
    workload: Workload,
    clients: usize,
    run: u32,
    shared_connection: bool,
    shared: &Arc<Shared>,
) -> RedisResult<Vec<AsyncClient>> {
    let info = format!("redis://{addr}/")
        .into_connection_info()?
        .set_tcp_settings(TcpSettings::default().set_nodelay(true));
    let client = redis::Client::open(info)?;
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(REPLY_TIMEOUT))
        .set_response_timeout(Some(REPLY_TIMEOUT));
    let first = client
        .get_multiplexed_async_connection_with_config(&config)
        .await?;
    let mut con = first.clone();
    let shas = Arc::new(Shas {
        unlock: script_load(&mut con, UNLOCK).await?,
        lock_all: script_load(&mut con, LOCK_ALL).await?,
        unlock_all: script_load(&mut con, UNLOCK_ALL).await?,
    });
    let mut cs = Vec::with_capacity(clients);
    for me in 0..clients {
        let con = match shared_connection || me == 0 {
            true => first.clone(),
            false => {
                client
                    .get_multiplexed_async_connection_with_config(&config)
                    .await?
            }
        };
        cs.push(AsyncClient {
            con,
            workload: workload.base(),
            me,
            plan: Plan::new(workload, run, me),
            shas: Arc::clone(&shas),
            shared: Arc::clone(shared),
        });
    }
    Ok(cs)
}

async fn script_load(con: &mut MultiplexedConnection, script: &str) -> RedisResult<String> {
    redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(script)
        .query_async(con)
        .await
}

impl AsyncClient {
    /// The client's task: operations until `deadline`, each timed.
    async fn run(mut self, deadline: Instant) -> TaskResult {
        let mut hist = Histogram::<u64>::new(3).map_err(|e| e.to_string())?;
        let mut ops = 0;
        while Instant::now() < deadline {
            let t = Instant::now();
            let done = self
                .op(deadline)
                .await
                .map_err(|e| format!("redis-rs {}: {e}", self.workload.name()))?;
            if done {
                let _ = hist.record(t.elapsed().as_nanos() as u64);
                ops += 1;
            }
        }
        Ok((hist, ops))
    }

    /// One operation, as `redis_side`'s `op_io` does it; false if a hand-off ran out of time.
    async fn op(&mut self, deadline: Instant) -> Result<bool, String> {
        match self.workload {
            Workload::Cycle | Workload::CycleAsync => {
                self.plan.next_token();
                expect_ok(self.set_nx(0).query_async(&mut self.con).await)?;
                expect_int(self.unlock(0).query_async(&mut self.con).await, 1)?;
            }
            Workload::Faa | Workload::FaaAsync => {
                let incr = redis::cmd("INCR").arg(&self.plan.keys[0]).take();
                expect_any_int(incr.query_async(&mut self.con).await)?;
            }
            Workload::Batch => self.batch().await?,
            Workload::BatchAon => {
                self.plan.next_token();
                let n = self.plan.keys.len() as i64;
                expect_int(self.script_all(true).query_async(&mut self.con).await, 1)?;
                expect_int(self.script_all(false).query_async(&mut self.con).await, n)?;
            }
            Workload::Handoff => {
                self.plan.next_token();
                // The retry loop: bounded by the deadline, one attempt per RETRY_SLEEP.
                loop {
                    if Instant::now() >= deadline {
                        return Ok(false);
                    }
                    match self.set_nx(0).query_async(&mut self.con).await {
                        Ok(Value::Okay) => break,
                        Ok(Value::Nil) => tokio::time::sleep(RETRY_SLEEP).await,
                        r => return Err(format!("SET NX answered {r:?}")),
                    }
                }
                self.shared.acquired(self.me);
                expect_int(self.unlock(0).query_async(&mut self.con).await, 1)?;
            }
        }
        Ok(true)
    }

    /// The 31 keys: a pipeline of `SET NX PX`, then one of compare-and-delete `EVALSHA`s.
    async fn batch(&mut self) -> Result<(), String> {
        self.plan.next_token();
        let keys = 0..self.plan.keys.len();
        let mut lock = redis::pipe();
        for k in keys.clone() {
            lock.add_command(self.set_nx(k));
        }
        let replies: RedisResult<Vec<Value>> = lock.query_async(&mut self.con).await;
        for r in replies.map_err(|e| e.to_string())? {
            expect_ok(Ok(r))?;
        }
        let mut unlock = redis::pipe();
        for k in keys {
            unlock.add_command(self.unlock(k));
        }
        let replies: RedisResult<Vec<i64>> = unlock.query_async(&mut self.con).await;
        match replies.map_err(|e| e.to_string())?.iter().all(|&n| n == 1) {
            true => Ok(()),
            false => Err("a compare-and-delete deleted nothing".into()),
        }
    }

    fn set_nx(&self, k: usize) -> Cmd {
        let p = &self.plan;
        redis::cmd("SET")
            .arg(&p.keys[k])
            .arg(&p.token)
            .arg("NX")
            .arg("PX")
            .arg(&p.expire)
            .take()
    }

    fn unlock(&self, k: usize) -> Cmd {
        let p = &self.plan;
        redis::cmd("EVALSHA")
            .arg(&self.shas.unlock)
            .arg(1)
            .arg(&p.keys[k])
            .arg(&p.token)
            .take()
    }

    /// The all-or-nothing script over every key: `LOCK_ALL` or `UNLOCK_ALL`.
    fn script_all(&self, lock: bool) -> Cmd {
        let p = &self.plan;
        let sha = match lock {
            true => &self.shas.lock_all,
            false => &self.shas.unlock_all,
        };
        let mut c = redis::cmd("EVALSHA");
        c.arg(sha).arg(p.keys.len());
        for key in &p.keys {
            c.arg(key);
        }
        c.arg(&p.token);
        if lock {
            c.arg(&p.expire);
        }
        c
    }
}

fn expect_ok(r: RedisResult<Value>) -> Result<(), String> {
    match r {
        Ok(Value::Okay) => Ok(()),
        r => Err(format!("expected OK, got {r:?}")),
    }
}

fn expect_int(r: RedisResult<i64>, want: i64) -> Result<(), String> {
    match r {
        Ok(n) if n == want => Ok(()),
        r => Err(format!("expected {want}, got {r:?}")),
    }
}

fn expect_any_int(r: RedisResult<i64>) -> Result<(), String> {
    r.map(drop).map_err(|e| format!("INCR: {e}"))
}
