//! The workloads on dlock: `dlock_transport`'s blocking client over TCP, one client per
//! thread; the clients share one data connection through a `Mux` (the default), or each opens
//! its own (`--own-connections`).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use dlock_core::{LockId, LockKind, Mode, ObjectId, Status};
use dlock_transport::client::{Client, ClientConfig, Endpoint, Grant, Mux};

use crate::run::{BATCH_KEYS, EXPIRE_MS, Shared, Worker, Workload};

/// The longest single server-side wait of the hand-off workload; a wait cut short by it is
/// simply asked for again.
const WAIT_MAX: Duration = Duration::from_millis(500);

/// A client's lease: longer than a measurement, so no client needs to heartbeat during one.
const LEASE_MS: u32 = 30_000;

struct DlockWorker<'s> {
    c: Client,
    workload: Workload,
    me: usize,
    shared: &'s Shared,
    ids: Vec<LockId>,
    reqs: Vec<(LockId, Mode, u32)>,
    out: Vec<Result<Grant, Status>>,
    object: Option<ObjectId>,
}

/// Client `me` of run `run` (which names its keys apart from other runs') for `workload`.
pub fn worker<'s>(
    addr: SocketAddr,
    workload: Workload,
    run: u32,
    me: usize,
    shared: &'s Shared,
    mux: Option<&Mux>,
) -> Result<Box<dyn Worker + 's>, String> {
    let (c, ids, object) = setup(addr, workload, run, me, mux)?;
    let reqs = ids
        .iter()
        .map(|&id| (id, Mode::Exclusive, EXPIRE_MS))
        .collect();
    let out = vec![Err(Status::Einval); ids.len()];
    Ok(Box::new(DlockWorker {
        c,
        workload,
        me,
        shared,
        ids,
        reqs,
        out,
        object,
    }))
}

/// A registered client `me` of run `run` with what `workload` works on: its locks, or the
/// shared counter.
pub fn setup(
    addr: SocketAddr,
    workload: Workload,
    run: u32,
    me: usize,
    mux: Option<&Mux>,
) -> Result<(Client, Vec<LockId>, Option<ObjectId>), String> {
    let mut cfg = ClientConfig::new(Endpoint::Tcp(addr));
    cfg.lease = std::time::Duration::from_millis(LEASE_MS.into());
    cfg.mux = mux.cloned();
    let mut c = Client::connect(cfg).map_err(|s| format!("dlock connect: {s}"))?;
    let err = |s: Status| format!("dlock setup: {s}");
    let mut ids = Vec::new();
    let mut object = None;
    match workload.base() {
        Workload::Cycle => {
            ids.push(
                c.get_lock(LockKind::Atomic, format!("r{run}-c{me}").as_bytes())
                    .map_err(|e| err(e.status()))?,
            );
        }
        Workload::Batch | Workload::BatchAon => {
            let names: Vec<String> = (0..BATCH_KEYS)
                .map(|k| format!("r{run}-c{me}-k{k}"))
                .collect();
            let req: Vec<(LockKind, &[u8])> = names
                .iter()
                .map(|n| (LockKind::Atomic, n.as_bytes()))
                .collect();
            for id in c.batch_get_lock(&req).map_err(|e| err(e.status()))? {
                ids.push(id.map_err(err)?);
            }
        }
        Workload::Handoff => {
            // A read-write lock, whose exclusive waiters queue on the server.
            ids.push(
                c.get_lock(LockKind::Rw, format!("r{run}-hot").as_bytes())
                    .map_err(|e| err(e.status()))?,
            );
        }
        Workload::Faa => {
            let name = format!("r{run}-xid");
            // Every client tries to create it; all but the first find it exists.
            let _ = c.atomic64_create(name.as_bytes(), 0, 3_600);
            object = Some(
                c.atomic64_get(name.as_bytes(), 3_600)
                    .map_err(|e| err(e.status()))?,
            );
        }
        Workload::CycleAsync | Workload::FaaAsync => {
            return Err("base() maps the async workloads to their own".into());
        }
    }
    Ok((c, ids, object))
}

impl Worker for DlockWorker<'_> {
    fn op(&mut self, deadline: Instant) -> Result<bool, String> {
        let err = |s: Status| format!("dlock {}: {s}", self.workload.name());
        match self.workload {
            Workload::Cycle => {
                // The grant's token would go with a write; the cycle has none to protect.
                let _grant = self
                    .c
                    .trylock(self.ids[0], Mode::Exclusive, EXPIRE_MS)
                    .map_err(|e| err(e.status()))?;
                released(self.c.unlock(self.ids[0])).map_err(err)?;
            }
            Workload::Faa => {
                let id = self.object.ok_or("no object")?;
                self.c.atomic64_faa(id, 1).map_err(|e| err(e.status()))?;
            }
            Workload::Batch | Workload::BatchAon => {
                let aon = self.workload == Workload::BatchAon;
                self.c
                    .batch_trylock(&self.reqs, aon, &mut self.out)
                    .map_err(|e| err(e.status()))?;
                all_granted(&self.out).map_err(err)?;
                self.c
                    .batch_unlock(&self.ids, &mut self.out)
                    .map_err(|e| err(e.status()))?;
                all_granted(&self.out).map_err(err)?;
            }
            Workload::CycleAsync | Workload::FaaAsync => {
                return Err("an async workload runs in dlock_async, not on a thread".into());
            }
            Workload::Handoff => {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Ok(false);
                }
                match self
                    .c
                    .lock(self.ids[0], Mode::Exclusive, EXPIRE_MS, left.min(WAIT_MAX))
                {
                    Ok(_) => {
                        self.shared.acquired(self.me);
                        released(self.c.unlock(self.ids[0])).map_err(err)?;
                    }
                    Err(e) if e == Status::Etimeout => return Ok(false),
                    Err(e) => return Err(err(e.status())),
                }
            }
        }
        Ok(true)
    }

    fn finish(self: Box<Self>) {
        let _ = self.c.deinit();
    }
}

/// An unlock that released the lock on the server: a counted-down re-entry would mean this
/// benchmark locked twice.
fn released(r: Result<Status, dlock_transport::client::Error>) -> Result<(), Status> {
    match r? {
        Status::Success => Ok(()),
        s => Err(s),
    }
}

fn all_granted(out: &[Result<Grant, Status>]) -> Result<(), Status> {
    match out.iter().find_map(|r| r.as_ref().err()) {
        Some(&s) => Err(s),
        None => Ok(()),
    }
}
