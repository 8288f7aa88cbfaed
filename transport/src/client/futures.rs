//! Lock and object operations that do not hold the calling thread: the reference's
//! asynchronous pair (`lock_request_async`, then `lock_result_check` until it is answered) and
//! futures over the same machinery ([`Client::lock_async`], [`Client::atomic64_faa_async`],
//! [`Client::atomic64_cas_async`]).
//!
//! A request is sent with [`Client::send`] deferred (a shared connection sends it with the next
//! burst) and its reply read with the connection's `poll_recv_data`, which wakes the task when
//! the reply may have come, then checked by the same [`Inbox::accept`](super::Inbox::accept) as
//! every other reply. At most one operation is outstanding per client (`pending`), as in the
//! reference.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use dlock_core::proto::{Command, CommandResult, ObjectCommand, ObjectOp};
use dlock_core::{LockId, Mode, ObjectId, Status};

use super::link::Link;
use super::locks::{grant, wait_ms};
use super::objects::{cas_outcome, value};
use super::{Cas, Client, Connection, Decision, Dispatch, Error, Grant, Op, Request, Sent};

/// An asynchronous lock operation (`lock_request_async`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AsyncOp {
    /// Trylock in a mode for a lease (ms).
    Lock(Mode, u32),
    /// Unlock.
    Unlock,
    /// Extend the grant held in a mode (`Einval` when it is not held in that mode) by a lease
    /// (ms).
    Extend(Mode, u32),
    /// Lock in a mode for a lease (ms), waiting on the server up to the duration for it (a
    /// blocking `lock()` that holds no thread: see [`Client::lock_async`]).
    LockWait(Mode, u32, Duration),
}

impl AsyncOp {
    /// The client call this operation is, for its errors: a refusal of a lock is "busy", of an
    /// unlock or an extend "not held".
    fn op(self) -> Op {
        match self {
            AsyncOp::Lock(..) => Op::TryLock,
            AsyncOp::LockWait(..) => Op::Lock,
            AsyncOp::Unlock => Op::Unlock,
            AsyncOp::Extend(..) => Op::Extend,
        }
    }
}

/// How a check of an outstanding reply waits for it.
#[derive(Clone, Copy, Debug)]
enum Await<'w> {
    /// Only looks: the reference's `lock_result_check`.
    Look,
    /// Looks, and arranges for the waker to be woken when the reply may have come: a future.
    Wake(&'w Waker),
    /// Waits until the reply comes or the operation's time is up.
    Block,
}

/// The asynchronous lock operation outstanding.
#[derive(Debug, Clone, Copy)]
pub(super) struct Pending {
    pub(super) lock: LockId,
    op: Op,
    request: Request,
    sent: Sent,
    /// Taken before the send: the grant's lease is counted from it (see `locks.rs`'s `run`).
    started: Instant,
    /// How long the server may hold the request waiting for the lock.
    wait: Duration,
}

/// A lock operation in flight as a future ([`Client::lock_async`]).
#[derive(Debug)]
#[must_use = "a future does nothing until polled"]
pub struct LockFuture<'c, C: Connection = Link> {
    client: &'c mut Client<C>,
    id: LockId,
    op: AsyncOp,
    started: bool,
}

impl<C: Connection> Future for LockFuture<'_, C> {
    type Output = Result<Grant, Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // Unpin: it holds a reference and plain values.
        let this = self.get_mut();
        if !this.started {
            this.started = true;
            match this.client.start_async(this.id, this.op) {
                Err(e) => return Poll::Ready(Err(e)),
                Ok(Some(done)) => return Poll::Ready(done),
                Ok(None) => {}
            }
        }
        this.client.poll_async(cx.waker())
    }
}

impl<C: Connection> Client<C> {
    /// Starts one lock operation without waiting for it (`lock_request_async`); at most one is
    /// outstanding per instance.
    pub fn lock_request_async(&mut self, id: LockId, op: AsyncOp) -> Result<(), Error> {
        match self.start_async(id, op)? {
            None | Some(Ok(_)) => Ok(()),
            Some(Err(e)) => Err(e),
        }
    }

    /// Starts `op` on `id`: `None` once it is sent (outstanding), `Some` with its result when it
    /// was answered locally (nothing to wait for).
    fn start_async(
        &mut self,
        id: LockId,
        async_op: AsyncOp,
    ) -> Result<Option<Result<Grant, Error>>, Error> {
        let op = async_op.op();
        if self.pending.is_some() || self.pipeline.len() > 0 {
            return Err(op.err(Status::Easync));
        }
        let local = &mut self
            .locks
            .get_mut(id)
            .ok_or_else(|| op.err(Status::LockNotGet))?
            .local;
        let mut wait = Duration::ZERO;
        let d = match async_op {
            AsyncOp::Lock(mode, expire) if expire != 0 => local.trylock(mode, expire, 0),
            AsyncOp::LockWait(mode, expire, w) if expire != 0 && !w.is_zero() => {
                wait = w;
                local.trylock(mode, expire, wait_ms(w))
            }
            AsyncOp::Lock(..) | AsyncOp::LockWait(..) => return Err(op.err(Status::Einval)),
            AsyncOp::Unlock => local.unlock(),
            AsyncOp::Extend(mode, expire) => local.extend(mode, expire),
        };
        let request = match d {
            // Answered locally: nothing to wait for, the result is final now.
            Decision::Answer(s) => return Ok(Some(self.answered(op, id, s))),
            Decision::Send(request) => request,
        };
        let started = self.link.now();
        let cmd = [Command::Lock(request.command())];
        let sent = self.send(op, &cmd, &[request.value_block()], 0, Dispatch::Deferred)?;
        self.pending = Some(Pending {
            lock: id,
            op,
            request,
            sent,
            started,
            wait,
        });
        Ok(None)
    }

    /// Polls the outstanding asynchronous operation (`lock_result_check`): `Err(AsyncAgain)`
    /// until its reply arrives, `Err(Etimeout)` after the request timeout (and the wait of a
    /// [`AsyncOp::LockWait`]), `Err(NoAsync)` when nothing is outstanding.
    pub fn lock_result_check(&mut self) -> Result<Grant, Error> {
        self.check_pending(Await::Look)
    }

    /// The outstanding asynchronous operation's result, waiting for it as long as it may take
    /// (the request timeout and the operation's wait, counted from its send): for a caller that
    /// gave a future up and must finish its operation before the client can be used again (the
    /// native API's handles). `Err(NoAsync)` when nothing is outstanding.
    pub(crate) fn finish_async(&mut self) -> Result<Grant, Error> {
        loop {
            match self.check_pending(Await::Block) {
                // A connection's wait may end a moment before its deadline: wait again.
                Err(e) if e.status() == Status::AsyncAgain => {}
                done => return done,
            }
        }
    }

    /// The outstanding asynchronous operation's result once its reply has come; pending until
    /// then, with `waker` woken when it may have (see [`Link::poll_recv_data`]).
    pub(crate) fn poll_async(&mut self, waker: &Waker) -> Poll<Result<Grant, Error>> {
        match self.check_pending(Await::Wake(waker)) {
            Err(e) if e.status() == Status::AsyncAgain => Poll::Pending,
            done => Poll::Ready(done),
        }
    }

    /// Whether an asynchronous operation is outstanding.
    pub(crate) fn has_pending(&self) -> bool {
        self.pending.is_some()
    }

    /// [`Client::lock_result_check`], looking, arranging for a waker to be woken when the reply
    /// may have come (see [`Link::poll_recv_data`]), or waiting for it.
    fn check_pending(&mut self, how: Await<'_>) -> Result<Grant, Error> {
        let p = self
            .pending
            .ok_or_else(|| Op::LockResultCheck.err(Status::NoAsync))?;
        let command = |_| Command::Lock(p.request.command());
        let timeout = self.cfg.timeout + p.wait;
        let result = match self.poll_reply(p.op, p.sent, command, p.started, timeout, how) {
            Poll::Pending => return Err(p.op.err(Status::AsyncAgain)),
            Poll::Ready(r) => r,
        };
        self.pending = None;
        let reply = result?;
        let (proof, value) = (self.proof(0), self.value(0));
        // Counted from the send, as in `run`.
        let now_ms = self.tick(p.started);
        let e = self
            .locks
            .get_mut(p.lock)
            .ok_or_else(|| p.op.err(Status::LockNotGet))?;
        let status = e.local.apply(&p.request, &reply, proof, value, now_ms);
        grant(status, &e.local).map_err(|s| p.op.err(s))
    }

    /// The reply to `sent` (one command, `command(0)`), sent at `started`: ready with its result
    /// once it has arrived (the lease is then renewed from `started`), or with `Etimeout` after
    /// `timeout`; pending otherwise. `how` says whether to look, to arrange a wake-up, or to
    /// wait until `started + timeout`.
    fn poll_reply(
        &mut self,
        op: Op,
        sent: Sent,
        command: impl Fn(usize) -> Command,
        started: Instant,
        timeout: Duration,
        how: Await<'_>,
    ) -> Poll<Result<CommandResult, Error>> {
        let buf = &mut self.inbox.buf;
        let got = match how {
            Await::Wake(w) => self.link.poll_recv_data(sent.ticket, buf, w),
            Await::Look => {
                let now = self.link.now();
                self.link.recv_data(sent.ticket, buf, Some(now))
            }
            Await::Block => self
                .link
                .recv_data(sent.ticket, buf, Some(started + timeout)),
        };
        let now = self.link.now();
        let len = match got {
            Ok(Some(len)) => len,
            Ok(None) if now.saturating_duration_since(started) >= timeout => {
                return Poll::Ready(Err(op.err(Status::Etimeout)));
            }
            Ok(None) => return Poll::Pending,
            Err(e) => return Poll::Ready(Err(op.io(e))),
        };
        // The connection matched the reply to its ticket: one that echoes another message id
        // is not an answer to this one.
        if self.inbox.accept(len, &sent, command) != Ok(Some(1)) {
            return Poll::Ready(Err(op.err(Status::BadResponse)));
        }
        let result = self.inbox.results[0];
        let sent_ms = self.tick(started);
        self.heard(sent_ms);
        Poll::Ready(Ok(result))
    }

    /// One lock operation as a future: sends it at the first poll and resolves with its
    /// result, holding no thread meanwhile. Over a shared connection ([`Mux`](super::Mux))
    /// whoever reads the connection wakes the task when the reply arrives (or the connection is
    /// lost): a blocked caller, or the connection's standby reader thread; on
    /// other data paths the future asks to be polled again at once (shared memory answers within
    /// microseconds). Usable from any executor; nothing here needs a runtime. Put a timeout
    /// around it with your executor's timer if the server may never answer.
    ///
    /// Dropping the future before it resolves leaves the operation outstanding, as
    /// [`Client::lock_request_async`] does: [`Client::lock_result_check`] finishes it.
    ///
    /// ```
    /// # use dlock_core::Config;
    /// # use dlock_transport::runtime::{ServerConfig, ServerHandle, TcpConfig};
    /// # let mut cfg = ServerConfig::new(Config {
    /// #     locks_max: 64, clients_max: 8, objects_max: 4, ..Config::default()
    /// # });
    /// # cfg.tcp = Some(TcpConfig::new("127.0.0.1:0".parse()?));
    /// # let server = ServerHandle::start(cfg)?;
    /// # let addr = server.tcp_addr().unwrap();
    /// use std::time::Duration;
    /// use dlock_core::{LockKind, Mode, Status};
    /// use dlock_transport::client::{AsyncOp, Client, ClientConfig, Endpoint, Mux};
    ///
    /// let endpoint = Endpoint::Tcp(addr);
    /// let mux = Mux::new(&endpoint)?;
    /// let mut c = Client::connect(ClientConfig::new(endpoint).with_mux(mux))?;
    /// let id = c.get_lock(LockKind::Atomic, b"orders/rg-3")?;
    /// // Any executor will do; this one is a few lines of std.
    /// let take = c.lock_async(id, AsyncOp::LockWait(Mode::Exclusive, 5_000, Duration::from_secs(1)));
    /// assert_eq!(block_on(take)?.status, Status::Success);
    /// assert_eq!(block_on(c.lock_async(id, AsyncOp::Unlock))?.status, Status::Success);
    /// # fn block_on<F: std::future::Future>(f: F) -> F::Output {
    /// #     struct Unpark(std::thread::Thread);
    /// #     impl std::task::Wake for Unpark {
    /// #         fn wake(self: std::sync::Arc<Self>) { self.0.unpark() }
    /// #     }
    /// #     let waker = std::sync::Arc::new(Unpark(std::thread::current())).into();
    /// #     let mut cx = std::task::Context::from_waker(&waker);
    /// #     let mut f = std::pin::pin!(f);
    /// #     loop {
    /// #         match f.as_mut().poll(&mut cx) {
    /// #             std::task::Poll::Ready(v) => return v,
    /// #             std::task::Poll::Pending => std::thread::park(),
    /// #         }
    /// #     }
    /// # }
    /// # server.stop();
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn lock_async(&mut self, id: LockId, op: AsyncOp) -> LockFuture<'_, C> {
        LockFuture {
            client: self,
            id,
            op,
            started: false,
        }
    }

    /// [`Client::atomic64_faa`] as a future (see [`Client::lock_async`] for how it is woken):
    /// many clients' id allocations progress on one thread. Over shared memory or RDMA the
    /// add is one-sided and the future is ready at its first poll.
    pub async fn atomic64_faa_async(&mut self, id: ObjectId, add: u64) -> Result<u64, Error> {
        let op = Op::Faa;
        value(
            op,
            self.object_op_async(op, id, ObjectOp::Faa, add, 0).await?,
        )
    }

    /// [`Client::atomic64_cas`] as a future.
    pub async fn atomic64_cas_async(
        &mut self,
        id: ObjectId,
        expected: u64,
        new: u64,
    ) -> Result<Cas, Error> {
        let op = Op::Cas;
        let r = self.object_op_async(op, id, ObjectOp::Cas, expected, new);
        cas_outcome(op, r.await?)
    }

    /// One object command, its reply awaited without holding the thread.
    async fn object_op_async(
        &mut self,
        op: Op,
        id: ObjectId,
        kind: ObjectOp,
        a: u64,
        b: u64,
    ) -> Result<CommandResult, Error> {
        if self.link.object_cells().is_some() {
            return self.object_op(op, id, kind, a, b);
        }
        #[cfg(feature = "rdma")]
        if self.link.rdma_objects().is_some() {
            return self.object_op(op, id, kind, a, b);
        }
        if !self.objects.contains_key(&id) {
            return Err(op.err(Status::ObjectNotGet));
        }
        let cmd = Command::Object(ObjectCommand {
            op: kind,
            object: id.raw(),
            a,
            b,
            // A standalone server's (the cluster client names the partition's epoch).
            partition_epoch: 0,
        });
        let started = self.link.now();
        let sent = self.send(op, &[cmd], &[], 0, Dispatch::Deferred)?;
        let timeout = self.cfg.timeout;
        std::future::poll_fn(|cx| {
            self.poll_reply(op, sent, |_| cmd, started, timeout, Await::Wake(cx.waker()))
        })
        .await
    }
}
