//! The workloads on Redis, as a lock service is usually built on it: a lock is `SET key token NX
//! PX 5000`, an unlock a Lua compare-and-delete sent with `EVALSHA` after `SCRIPT LOAD`. This
//! module owns what every driving of Redis sends (the scripts and each client's [`Plan`]) and
//! drives it itself a thread per client, each with its own blocking connection (`threads`).

use std::io;
use std::net::SocketAddr;
use std::time::Instant;

use crate::resp::{Redis, Reply, bad};
use crate::run::{BATCH_KEYS, EXPIRE_MS, RETRY_SLEEP, Shared, Worker, Workload};

/// Deletes `KEYS[1]` only if it still holds this client's token.
pub const UNLOCK: &str =
    "if redis.call('get',KEYS[1])==ARGV[1] then return redis.call('del',KEYS[1]) else return 0 end";

/// Sets every key to the token with a lease of `ARGV[2]` ms, or none if any is held: 1 or 0.
pub const LOCK_ALL: &str = "for i=1,#KEYS do if redis.call('exists',KEYS[i])==1 then return 0 end end \
     for i=1,#KEYS do redis.call('set',KEYS[i],ARGV[1],'PX',ARGV[2]) end return 1";

/// Deletes every key that still holds the token: how many.
pub const UNLOCK_ALL: &str = "local n=0 for i=1,#KEYS do if redis.call('get',KEYS[i])==ARGV[1] then \
     n=n+redis.call('del',KEYS[i]) end end return n";

/// What one client works on and sends, however it is driven: its keys, the token of its current
/// acquisition and the lease.
#[derive(Debug)]
pub struct Plan {
    pub keys: Vec<Vec<u8>>,
    /// This client's token for the current acquisition (client and sequence number).
    pub token: Vec<u8>,
    /// The lease in ms, `PX`'s argument.
    pub expire: Vec<u8>,
    me: usize,
    seq: u64,
}

impl Plan {
    /// Client `me` of run `run` (which names its keys apart from other runs') for `workload`.
    pub fn new(workload: Workload, run: u32, me: usize) -> Plan {
        let keys = match workload.base() {
            Workload::Cycle | Workload::CycleAsync => vec![format!("r{run}-c{me}")],
            Workload::Faa | Workload::FaaAsync => vec![format!("r{run}-xid")],
            Workload::Batch | Workload::BatchAon => (0..BATCH_KEYS)
                .map(|k| format!("r{run}-c{me}-k{k}"))
                .collect(),
            Workload::Handoff => vec![format!("r{run}-hot")],
        };
        Plan {
            keys: keys.into_iter().map(String::into_bytes).collect(),
            token: Vec::with_capacity(32),
            expire: EXPIRE_MS.to_string().into_bytes(),
            me,
            seq: 0,
        }
    }

    /// A new token, for the next acquisition.
    pub fn next_token(&mut self) {
        use std::io::Write;
        self.seq += 1;
        self.token.clear();
        // Formatting into a Vec cannot fail.
        let _ = write!(self.token, "c{}-{}", self.me, self.seq);
    }
}

struct RedisWorker<'s> {
    r: Redis,
    workload: Workload,
    me: usize,
    shared: &'s Shared,
    plan: Plan,
    unlock: Vec<u8>,
    lock_all: Vec<u8>,
    unlock_all: Vec<u8>,
}

/// Client `me` of run `run` for `workload`, a thread with its own connection.
pub fn worker<'s>(
    addr: SocketAddr,
    workload: Workload,
    run: u32,
    me: usize,
    shared: &'s Shared,
) -> Result<Box<dyn Worker + 's>, String> {
    let workload = workload.base();
    let setup = || -> io::Result<RedisWorker<'s>> {
        let mut r = Redis::connect(addr)?;
        let unlock = r.script_load(UNLOCK)?.into_bytes();
        let lock_all = r.script_load(LOCK_ALL)?.into_bytes();
        let unlock_all = r.script_load(UNLOCK_ALL)?.into_bytes();
        Ok(RedisWorker {
            r,
            workload,
            me,
            shared,
            plan: Plan::new(workload, run, me),
            unlock,
            lock_all,
            unlock_all,
        })
    };
    match setup() {
        Ok(w) => Ok(Box::new(w)),
        Err(e) => Err(format!("redis setup: {e}")),
    }
}

impl RedisWorker<'_> {
    fn push_set_nx(&mut self, k: usize) {
        let p = &self.plan;
        let (key, token, px) = (&p.keys[k], &p.token, &p.expire);
        self.r.push(&[b"SET", key, token, b"NX", b"PX", px]);
    }

    fn push_unlock(&mut self, k: usize) {
        let (sha, key, token) = (&self.unlock, &self.plan.keys[k], &self.plan.token);
        self.r.push(&[b"EVALSHA", sha, b"1", key, token]);
    }

    /// One round trip of the all-or-nothing script over every key: `LOCK_ALL` (which must
    /// answer 1) or `UNLOCK_ALL` (which must delete all of them).
    fn script_all(&mut self, lock: bool) -> io::Result<()> {
        let sha = if lock {
            &self.lock_all
        } else {
            &self.unlock_all
        };
        let p = &self.plan;
        let n = p.keys.len().to_string();
        let mut args: Vec<&[u8]> = vec![b"EVALSHA", sha, n.as_bytes()];
        args.extend(p.keys.iter().map(Vec::as_slice));
        args.push(&p.token);
        if lock {
            args.push(&p.expire);
        }
        let want = if lock { 1 } else { p.keys.len() as i64 };
        self.r.push(&args);
        self.r.flush()?;
        expect(self.r.read()?, &Reply::Int(want))
    }

    fn op_io(&mut self, deadline: Instant) -> io::Result<bool> {
        let ok = Reply::Simple("OK".into());
        // `worker` stored the base workload: these clients are threads either way.
        match self.workload {
            Workload::Cycle | Workload::CycleAsync => {
                self.plan.next_token();
                self.push_set_nx(0);
                self.r.flush()?;
                expect(self.r.read()?, &ok)?;
                self.push_unlock(0);
                self.r.flush()?;
                expect(self.r.read()?, &Reply::Int(1))?;
            }
            Workload::Faa | Workload::FaaAsync => {
                match self.r.call(&[b"INCR", &self.plan.keys[0]])? {
                    Reply::Int(_) => {}
                    r => return Err(bad(&format!("INCR answered {r:?}"))),
                }
            }
            Workload::Batch => {
                self.plan.next_token();
                for k in 0..self.plan.keys.len() {
                    self.push_set_nx(k);
                }
                self.r.flush()?;
                for _ in 0..self.plan.keys.len() {
                    expect(self.r.read()?, &ok)?;
                }
                for k in 0..self.plan.keys.len() {
                    self.push_unlock(k);
                }
                self.r.flush()?;
                for _ in 0..self.plan.keys.len() {
                    expect(self.r.read()?, &Reply::Int(1))?;
                }
            }
            Workload::BatchAon => {
                self.plan.next_token();
                self.script_all(true)?;
                self.script_all(false)?;
            }
            Workload::Handoff => {
                self.plan.next_token();
                // The retry loop: bounded by the deadline, one attempt per RETRY_SLEEP.
                loop {
                    if Instant::now() >= deadline {
                        return Ok(false);
                    }
                    self.push_set_nx(0);
                    self.r.flush()?;
                    match self.r.read()? {
                        r if r == ok => break,
                        Reply::Bulk(None) => std::thread::sleep(RETRY_SLEEP),
                        r => return Err(bad(&format!("SET NX answered {r:?}"))),
                    }
                }
                self.shared.acquired(self.me);
                self.push_unlock(0);
                self.r.flush()?;
                expect(self.r.read()?, &Reply::Int(1))?;
            }
        }
        Ok(true)
    }
}

impl Worker for RedisWorker<'_> {
    fn op(&mut self, deadline: Instant) -> Result<bool, String> {
        self.op_io(deadline)
            .map_err(|e| format!("redis {}: {e}", self.workload.name()))
    }

    fn finish(self: Box<Self>) {}
}

fn expect(got: Reply, want: &Reply) -> io::Result<()> {
    if &got == want {
        Ok(())
    } else {
        Err(bad(&format!("expected {want:?}, got {got:?}")))
    }
}
