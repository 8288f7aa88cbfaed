//! dlock's clients as futures: `clients` registered clients on one shared connection (`Mux`),
//! each running its operations as a task of a small executor on one thread
//! (`Client::lock_async`, `Client::atomic64_faa_async`). The connection's standby reader wakes a
//! task when its reply arrives; no client has a thread of its own. The measurement window and
//! the server's CPU time are taken as `run::measure` takes them.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Wake, Waker};
use std::thread::{self, Thread};
use std::time::{Duration, Instant};

use dlock_core::{Mode, Status};
use dlock_transport::client::{AsyncOp, Client, Mux};
use hdrhistogram::Histogram;

use crate::dlock_side::setup;
use crate::run::{Cell, EXPIRE_MS, Workload};
use crate::servers::Server;

/// What one task hands back: its latencies and how many operations it completed.
type TaskResult = Result<(Histogram<u64>, u64), String>;
type Task<'a> = Pin<Box<dyn Future<Output = TaskResult> + 'a>>;

/// Wakes task `k`: marks it and unparks the executor.
struct TaskWaker {
    woken: AtomicBool,
    executor: Thread,
}

impl Wake for TaskWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        // Release: the executor's Acquire swap sees everything the waker's thread did before
        // (the reply filed in the task's port).
        self.woken.store(true, Ordering::Release);
        self.executor.unpark();
    }
}

/// Runs `workload` (an async one) with `clients` futures for `duration` against `server`.
pub fn measure(
    server: &Server,
    workload: Workload,
    clients: usize,
    duration: Duration,
    run: u32,
    mux: &Mux,
) -> Result<Cell, String> {
    let mut setups = (0..clients)
        .map(|me| setup(server.addr, workload, run, me, Some(mux)))
        .collect::<Result<Vec<_>, String>>()?;
    let t0 = Instant::now();
    let (cpu0, mine0) = (server.cpu_s(), crate::run::process_cpu_s());
    let deadline = t0 + duration;
    let tasks: Vec<Task<'_>> = setups
        .iter_mut()
        .map(|(c, ids, object)| {
            let lock = ids.first().copied();
            let object = *object;
            Box::pin(async move {
                let mut hist = Histogram::<u64>::new(3).map_err(|e| e.to_string())?;
                let mut ops = 0u64;
                while Instant::now() < deadline {
                    let t = Instant::now();
                    one_op(c, workload, lock, object).await?;
                    let _ = hist.record(t.elapsed().as_nanos() as u64);
                    ops += 1;
                }
                Ok((hist, ops))
            }) as Task<'_>
        })
        .collect();
    let results = run_to_completion(tasks);
    let client_cpu_s = crate::run::process_cpu_s() - mine0;
    let (secs, server_cpu_s) = (t0.elapsed().as_secs_f64(), server.cpu_s() - cpu0);
    let mut hist = Histogram::<u64>::new(3).map_err(|e| e.to_string())?;
    let mut ops = 0;
    for r in results {
        let (h, n) = r?;
        hist.add(h).map_err(|e| e.to_string())?;
        ops += n;
    }
    for (c, _, _) in setups {
        let _ = c.deinit();
    }
    Ok(Cell {
        ops,
        secs,
        hist,
        server_cpu_s,
        client_cpu_s,
        handoffs: 0,
    })
}

/// One operation of `workload` by client `c`.
async fn one_op(
    c: &mut Client,
    workload: Workload,
    lock: Option<dlock_core::LockId>,
    object: Option<dlock_core::ObjectId>,
) -> Result<(), String> {
    let err = |s: Status| format!("dlock {}: {s}", workload.name());
    match workload {
        Workload::CycleAsync => {
            let id = lock.ok_or("no lock")?;
            // The grant's token would go with a write; the cycle has none to protect.
            let _grant = c
                .lock_async(id, AsyncOp::Lock(Mode::Exclusive, EXPIRE_MS))
                .await
                .map_err(|e| err(e.status()))?;
            let unlocked = c.lock_async(id, AsyncOp::Unlock).await;
            match unlocked.map_err(|e| err(e.status()))?.status {
                Status::Success => Ok(()),
                s => Err(err(s)),
            }
        }
        Workload::FaaAsync => {
            let id = object.ok_or("no object")?;
            let faa = c.atomic64_faa_async(id, 1).await;
            faa.map(drop).map_err(|e| err(e.status()))
        }
        w => Err(format!("{} has no async form", w.name())),
    }
}

/// The executor: polls each task when its waker was woken, parks when none was.
fn run_to_completion(mut tasks: Vec<Task<'_>>) -> Vec<TaskResult> {
    let wakers: Vec<Arc<TaskWaker>> = (0..tasks.len())
        .map(|_| {
            Arc::new(TaskWaker {
                woken: AtomicBool::new(true),
                executor: thread::current(),
            })
        })
        .collect();
    let as_wakers: Vec<Waker> = wakers.iter().map(|w| Waker::from(Arc::clone(w))).collect();
    let mut results: Vec<Option<TaskResult>> = (0..tasks.len()).map(|_| None).collect();
    let mut left = tasks.len();
    while left > 0 {
        let mut polled = false;
        for k in 0..tasks.len() {
            if results[k].is_some() || !wakers[k].woken.swap(false, Ordering::Acquire) {
                continue;
            }
            polled = true;
            let mut cx = Context::from_waker(&as_wakers[k]);
            if let Poll::Ready(r) = tasks[k].as_mut().poll(&mut cx) {
                results[k] = Some(r);
                left -= 1;
            }
        }
        if !polled {
            // A wake after the scan unparks at once; the timeout only bounds a lost one.
            thread::park_timeout(Duration::from_millis(10));
        }
    }
    results.into_iter().flatten().collect()
}
