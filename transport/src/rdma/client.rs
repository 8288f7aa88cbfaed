//! The client end of one RDMA connection: data messages by SEND/RECV, object operations by
//! one-sided READ and atomics on the server's object cells.

use std::fmt;
use std::time::{Duration, Instant};

use super::channel::Channel;
use super::endpoint::{Endpoint, ObjectTable};
use super::post::SendOp;
use super::registered::RdmaDevice;
use super::verbs::RemoteAccess;
use super::{CELL_BYTES, MESSAGES_INFLIGHT_MAX, RdmaConfig, RdmaError};

/// A client queue pair with its own registered buffers.
///
/// Made by [`RdmaClient::connect`] (queue pair in RESET), connected by exchanging
/// [`RdmaClient::endpoint`] with the server's [`super::ServerConnection::endpoint`] out of band
/// and calling [`RdmaClient::handshake`] on both sides.
///
/// Every operation busy-polls its own completion queue, as the reference does, until the
/// configured operation timeout; an abandoned one-sided operation poisons the client
/// ([`RdmaError::Poisoned`]) because the device may still write its buffer.
pub struct RdmaClient {
    channel: Channel,
    device: RdmaDevice,
    op_timeout: Duration,
    /// The server's object cells, from its endpoint.
    objects: Option<ObjectTable>,
    /// Messages sent whose replies have not been taken.
    inflight: usize,
}

impl fmt::Debug for RdmaClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RdmaClient")
            .field("device", &self.device.name())
            .field("endpoint", &self.channel.endpoint(None))
            .field("objects", &self.objects)
            .field("inflight", &self.inflight)
            .finish()
    }
}

impl RdmaClient {
    /// Opens the device in `cfg` and prepares a queue pair; the connection is made by
    /// [`Self::handshake`].
    pub fn connect(cfg: &RdmaConfig) -> Result<Self, RdmaError> {
        Self::connect_on(&RdmaDevice::open(cfg)?, cfg.op_timeout)
    }

    /// As [`Self::connect`], on a device that is already open (several clients of one process
    /// can share it).
    pub fn connect_on(device: &RdmaDevice, op_timeout: Duration) -> Result<Self, RdmaError> {
        Ok(Self {
            channel: Channel::new(device)?,
            device: device.clone(),
            op_timeout,
            objects: None,
            inflight: 0,
        })
    }

    /// This side's endpoint record, to send to the server.
    pub fn endpoint(&self) -> Endpoint {
        self.channel.endpoint(None)
    }

    /// Connects to the server's endpoint (posting every receive slot first) and remembers its
    /// object table. The client grants the server no access to its memory.
    pub fn handshake(&mut self, server: &Endpoint) -> Result<(), RdmaError> {
        self.channel.handshake(server, RemoteAccess::None)?;
        self.objects = server.objects;
        Ok(())
    }

    /// Whether the device executes remote atomics; without them object operations must go to
    /// the server as data messages.
    pub fn supports_atomics(&self) -> bool {
        self.channel.atomics()
    }

    /// The server's object table, once connected.
    pub fn object_table(&self) -> Option<ObjectTable> {
        self.objects
    }

    fn deadline(&self) -> Instant {
        Instant::now() + self.op_timeout
    }

    /// Copies `msg` (1..=[`super::MESSAGE_MAX`] bytes) into a registered send slot and SENDs
    /// it. [`RdmaError::Busy`] when [`MESSAGES_INFLIGHT_MAX`] replies are outstanding.
    pub fn post_send(&mut self, msg: &[u8]) -> Result<(), RdmaError> {
        if self.inflight >= MESSAGES_INFLIGHT_MAX {
            return Err(RdmaError::Busy);
        }
        if msg.is_empty() || msg.len() > super::MESSAGE_MAX {
            return Err(RdmaError::InvalidArgument("message must be 1..=1008 bytes"));
        }
        self.channel.send_with(self.deadline(), false, |_, out| {
            out[..msg.len()].copy_from_slice(msg);
            msg.len()
        })?;
        self.inflight += 1;
        Ok(())
    }

    /// Takes the next reply if one has arrived: copies it into `out`, reposts its receive slot,
    /// and returns its length. Never blocks.
    pub fn poll(&mut self, out: &mut [u8]) -> Result<Option<usize>, RdmaError> {
        if !self.channel.poll_message()? {
            return Ok(None);
        }
        let len = self.channel.take_message(out)?;
        // A server-initiated message (a future "please release" notice) also lands here; it
        // answers nothing, hence saturating.
        self.inflight = self.inflight.saturating_sub(1);
        Ok(Some(len))
    }

    /// Busy-polls for the next reply until the operation timeout.
    pub fn wait(&mut self, out: &mut [u8]) -> Result<usize, RdmaError> {
        if !self.channel.wait_message(self.deadline())? {
            return Err(RdmaError::Timeout { op: "IBV_WC_RECV" });
        }
        self.poll(out)?
            .ok_or(RdmaError::Timeout { op: "IBV_WC_RECV" })
    }

    /// Sends `msg` and waits for its reply (the synchronous request the reference makes).
    pub fn call(&mut self, msg: &[u8], out: &mut [u8]) -> Result<usize, RdmaError> {
        self.post_send(msg)?;
        self.wait(out)
    }

    /// The remote address of object cell `cell`, checked against the server's table.
    fn cell(&self, cell: u32) -> Result<(u64, u32), RdmaError> {
        self.channel.check_connected()?;
        let t = self.objects.ok_or(RdmaError::InvalidArgument(
            "the server advertised no object table",
        ))?;
        if cell >= t.cells {
            return Err(RdmaError::InvalidArgument("object cell index out of range"));
        }
        // The endpoint decoder checked that the table does not wrap, so this cannot overflow.
        Ok((t.addr + u64::from(cell) * CELL_BYTES as u64, t.rkey))
    }

    fn atomic(&mut self, op: SendOp) -> Result<u64, RdmaError> {
        if !self.channel.atomics() {
            return Err(RdmaError::NoAtomics);
        }
        self.channel.one_sided(op, self.deadline())
    }

    /// Atomically adds `add` (wrapping) to object cell `cell`; returns the value before.
    pub fn fetch_add(&mut self, cell: u32, add: u64) -> Result<u64, RdmaError> {
        let (remote_addr, rkey) = self.cell(cell)?;
        self.atomic(SendOp::FetchAdd {
            remote_addr,
            rkey,
            add,
        })
    }

    /// Atomically stores `new` in object cell `cell` if it holds `expected`; returns the value
    /// observed, so the swap happened exactly when the result equals `expected`.
    pub fn compare_swap(&mut self, cell: u32, expected: u64, new: u64) -> Result<u64, RdmaError> {
        let (remote_addr, rkey) = self.cell(cell)?;
        self.atomic(SendOp::CompareSwap {
            remote_addr,
            rkey,
            expected,
            new,
        })
    }

    /// Reads object cell `cell` with an 8-byte RDMA READ (the reference's snapshot). An aligned
    /// 8-byte read is not torn by a concurrent atomic on the devices dlock targets, but the IB
    /// specification does not promise it; `compare_swap(cell, 0, 0)` is the strictly atomic
    /// alternative.
    pub fn read(&mut self, cell: u32) -> Result<u64, RdmaError> {
        let (remote_addr, rkey) = self.cell(cell)?;
        self.channel
            .one_sided(SendOp::Read { remote_addr, rkey }, self.deadline())
    }
}
