//! The hand-off between the control (I/O) thread and the data thread: two bounded lock-free
//! queues of jobs, each carrying its own buffer, so nothing is copied or allocated per message
//! on the data thread; and a third queue on which attached TCP data connections move to the
//! data thread for good (it reads and writes them itself from then on: no hand-off per data
//! message).

use std::io;
use std::sync::atomic::AtomicUsize;

use crossbeam_queue::ArrayQueue;
use dlock_core::Session;

use super::ServerConfig;
use super::stream::Stream;

/// What a job asks for, or (on the way back) what its reply is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum JobKind {
    /// A control frame; its reply is a control frame (or `Registered`, or `Close`).
    Control,
    /// Reply to `Control`: a control frame that registered `client` (a successful init or
    /// reinit), which binds the connection to it.
    Registered { client: u32 },
    /// A TCP data connection asks to be bound to `client` (proving it knows the session).
    Attach { client: u32, session: Session },
    /// Reply to `Attach`: bound or refused.
    Attached { ok: bool },
    /// A connection bound to `client` went away.
    Disconnected { client: u32 },
    /// Data thread → control thread: `client` is no longer registered (it deinitialised, its
    /// lease ran out, or it was evicted); close every connection bound to it.
    ClientGone { client: u32 },
    /// Data thread → control thread: `client` registered over a stream connection, its control
    /// path from now on; close any control connection bound to it (one per client).
    MovedToStream { client: u32 },
    /// The request was malformed beyond a reply: close the connection.
    Close,
    /// The request needs no reply (a parked data request, a disconnect notice); the buffer
    /// comes back for reuse.
    Nothing,
}

/// One request or reply in flight.
#[derive(Debug)]
pub(crate) struct Job {
    /// The connection (slot index in the low 32 bits, its generation in the high 32).
    pub(crate) conn: u64,
    pub(crate) kind: JobKind,
    /// Bytes used in `buf`.
    pub(crate) len: usize,
    /// The frame; the control thread sizes it for the largest reply.
    pub(crate) buf: Vec<u8>,
    /// Who sent a control frame, for the per-peer cap on registrations (`runtime/peer.rs`).
    pub(crate) peer: dlock_core::Peer,
    /// Whether its sender is a recoverer (`runtime/recoverers.rs`).
    pub(crate) role: dlock_core::manager::retain::Role,
}

/// A TCP data connection whose attach the data thread accepted, on its way to the data thread.
#[derive(Debug)]
pub(crate) struct Handover {
    pub(crate) stream: Stream,
    /// The client it is bound to.
    pub(crate) client: u32,
    /// Bytes the control thread read past the attach header (data messages sent at once).
    pub(crate) early: Vec<u8>,
    /// Bytes of the attach status the socket did not take yet.
    pub(crate) unsent: Vec<u8>,
    /// Who the peer is, for the per-peer cap on registrations made over the connection.
    pub(crate) peer: dlock_core::Peer,
}

/// The queues and the control thread's waker.
#[derive(Debug)]
pub(crate) struct Exchange {
    /// Control thread → data thread.
    pub(crate) inbox: ArrayQueue<Job>,
    /// Data thread → control thread.
    pub(crate) outbox: ArrayQueue<Job>,
    /// Control thread → data thread: attached data connections.
    pub(crate) handover: ArrayQueue<Handover>,
    /// Data connections the data thread holds (handed over and not closed yet): they count
    /// toward `connections_max`, which the control thread enforces.
    pub(crate) data_conns: AtomicUsize,
    waker: std::sync::OnceLock<mio::Waker>,
}

impl Exchange {
    pub(crate) fn new(cfg: &ServerConfig) -> io::Result<Self> {
        // Every connection the control thread holds has at most one request in flight, plus one
        // disconnect notice, one gone-client notice and one moved-to-a-stream notice per client:
        // the queues never fill.
        let cap = cfg.connections_max + 3 * cfg.core.clients_max as usize + 16;
        Ok(Self {
            inbox: ArrayQueue::new(cap),
            outbox: ArrayQueue::new(cap),
            // Each connection is handed over at most once, and counts toward the cap until the
            // data thread closes it.
            handover: ArrayQueue::new(cfg.connections_max.max(1)),
            data_conns: AtomicUsize::new(0),
            waker: std::sync::OnceLock::new(),
        })
    }

    /// The control thread installs its waker once its poll exists.
    pub(crate) fn set_waker(&self, waker: mio::Waker) {
        let _ = self.waker.set(waker);
    }

    /// Data thread: a reply is queued; wake the control thread.
    pub(crate) fn wake_control(&self) {
        if let Some(w) = self.waker.get()
            && let Err(e) = w.wake()
        {
            tracing::warn!(error = %e, "cannot wake the control thread");
        }
    }
}
