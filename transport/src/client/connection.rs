//! The one trait a [`Client`](super::Client) drives: how it reaches its server and what time it
//! is.
//!
//! Everything the client decides — which request a call turns into, how a reply changes its
//! record of a lock, what a batch or a pipeline has in flight, when a lease runs out — is in
//! [`dlock_core::client`] and in the client module; everything it does to a socket, a mailbox
//! or a queue pair is behind this trait. [`Link`] implements it over shared memory, TCP (its
//! own connection or a [`Mux`](super::Mux)) and RDMA; a test or a simulator implements it over
//! whatever it likes, with a clock of its own, and runs the real client's code unchanged.

use std::fmt::Debug;
use std::io;
use std::task::Waker;
use std::time::Instant;

use dlock_core::Session;

use super::link::Link;
use crate::sync::AtomicU64;

/// A client's way to its server: control round trips, data messages sent and their replies
/// received (matched by ticket), and the clock every deadline and lease is read from.
pub trait Connection: Debug {
    /// Opens fresh connections to the same server (`client_reinit`): what was in flight is
    /// gone.
    fn reconnect(&mut self) -> io::Result<()>;

    /// Sends a control frame and reads the reply frame into `reply`; its length.
    fn control(
        &mut self,
        req: &[u8],
        reply: &mut [u8],
        deadline: Option<Instant>,
    ) -> io::Result<usize>;

    /// Binds the data path after a registration that gave `client` its `slot` and `session`.
    fn attach(&mut self, client: u32, slot: u32, session: Session) -> io::Result<()>;

    /// How many data messages may await their replies at once.
    fn depth(&self) -> usize;

    /// Sends a data message; returns the ticket its reply is received under.
    fn send_data(&mut self, req: &[u8]) -> io::Result<u64>;

    /// [`Connection::send_data`] for a caller that does not wait for the reply now (a future):
    /// a transport may hold it for a moment to send it with others.
    fn send_data_deferred(&mut self, req: &[u8]) -> io::Result<u64> {
        self.send_data(req)
    }

    /// The reply to `ticket` if it is already there, without waiting or reading the clock.
    fn try_recv_data(&mut self, ticket: u64, reply: &mut [u8]) -> io::Result<Option<usize>>;

    /// Waits until `deadline` (`None`: forever; a past one: just look) for the reply to
    /// `ticket`; `Ok(None)` if it has not come.
    fn recv_data(
        &mut self,
        ticket: u64,
        reply: &mut [u8],
        deadline: Option<Instant>,
    ) -> io::Result<Option<usize>>;

    /// The reply to `ticket` if it has arrived; otherwise `waker` is woken when it may have.
    /// By default: a look, and a wake at once (the executor polls again).
    fn poll_recv_data(
        &mut self,
        ticket: u64,
        reply: &mut [u8],
        waker: &Waker,
    ) -> io::Result<Option<usize>> {
        let got = self.try_recv_data(ticket, reply)?;
        if got.is_none() {
            waker.wake_by_ref();
        }
        Ok(got)
    }

    /// Hands every event the server sent unasked and the client has not seen to `sink`,
    /// without waiting. By default there are none (a connection that carries no events).
    fn poll_events(&mut self, sink: &mut dyn FnMut(dlock_core::proto::Event)) -> io::Result<()> {
        let _ = sink;
        Ok(())
    }

    /// Whether the server's unasked events — revokes above all — reach the client through
    /// [`Connection::poll_events`]. A client may hold cached grants only over a connection
    /// that does: one whose revokes it never read would keep a grant the server lapsed and
    /// gave another ([`Client::set_cacheable`](super::Client::set_cacheable) refuses). By
    /// default none are carried, as `poll_events` hands none.
    fn carries_events(&self) -> bool {
        false
    }

    /// Whether events are read where the server writes them (a shared-memory client's event
    /// ring in the region) rather than carried on a channel: then a revoke is seen at the
    /// client's next look, however long ago its last request was answered, and the trust
    /// bound of `dlock_core::manager::trust` is not needed. By default they are carried.
    fn events_in_place(&self) -> bool {
        false
    }

    /// The object cells, when the client may change them one-sided (shared memory).
    fn object_cells(&self) -> Option<&[AtomicU64]> {
        None
    }

    /// The queue pair, when object operations can be one-sided RDMA atomics on it.
    #[cfg(feature = "rdma")]
    fn rdma_objects(&mut self) -> Option<&mut crate::rdma::RdmaClient> {
        None
    }

    /// Now, on the clock every deadline and lease of the client is measured with.
    fn now(&self) -> Instant {
        Instant::now()
    }
}

impl Connection for Link {
    fn reconnect(&mut self) -> io::Result<()> {
        Link::reconnect(self)
    }

    fn control(
        &mut self,
        req: &[u8],
        reply: &mut [u8],
        deadline: Option<Instant>,
    ) -> io::Result<usize> {
        Link::control(self, req, reply, deadline)
    }

    fn attach(&mut self, client: u32, slot: u32, session: Session) -> io::Result<()> {
        Link::attach(self, client, slot, session)
    }

    fn depth(&self) -> usize {
        Link::depth(self)
    }

    fn send_data(&mut self, req: &[u8]) -> io::Result<u64> {
        Link::send_data(self, req)
    }

    fn send_data_deferred(&mut self, req: &[u8]) -> io::Result<u64> {
        Link::send_data_deferred(self, req)
    }

    fn try_recv_data(&mut self, ticket: u64, reply: &mut [u8]) -> io::Result<Option<usize>> {
        Link::try_recv_data(self, ticket, reply)
    }

    fn recv_data(
        &mut self,
        ticket: u64,
        reply: &mut [u8],
        deadline: Option<Instant>,
    ) -> io::Result<Option<usize>> {
        Link::recv_data(self, ticket, reply, deadline)
    }

    fn poll_recv_data(
        &mut self,
        ticket: u64,
        reply: &mut [u8],
        waker: &Waker,
    ) -> io::Result<Option<usize>> {
        Link::poll_recv_data(self, ticket, reply, waker)
    }

    fn poll_events(&mut self, sink: &mut dyn FnMut(dlock_core::proto::Event)) -> io::Result<()> {
        Link::poll_events(self, sink)
    }

    fn carries_events(&self) -> bool {
        true
    }

    fn events_in_place(&self) -> bool {
        Link::transport(self) == Some(super::Transport::SharedMemory)
    }

    fn object_cells(&self) -> Option<&[AtomicU64]> {
        Link::object_cells(self)
    }

    #[cfg(feature = "rdma")]
    fn rdma_objects(&mut self) -> Option<&mut crate::rdma::RdmaClient> {
        Link::rdma_objects(self)
    }
}
