//! One connected queue pair and its fixed buffer pool: what a client and a server connection
//! share.
//!
//! # Buffer pool (allocated and registered once, at creation)
//!
//! One anonymous mapping, registered once:
//!
//! | bytes | what |
//! |---|---|
//! | `recv_slots` × [`SLOT_BYTES`] | receive slots, all posted at the handshake |
//! | `MESSAGES_INFLIGHT_MAX` × [`SLOT_BYTES`] | send slots |
//! | [`CELL_BYTES`] | scratch word: where READ and atomics put the remote value |
//!
//! # Who owns a slot
//!
//! A receive slot belongs to the device from `post_recv` until its completion is polled, then to
//! us until we post it again. A send slot belongs to the device from `post_send` until its
//! completion is polled. The scratch word belongs to the device while a one-sided operation is
//! pending. We make references only to slots we own, and only for the length of a `&mut self`
//! borrow, so nothing is reposted while a reference lives. If a work request may still be
//! outstanding when we give up on it (an error or a timeout), the channel is poisoned and never
//! touches that memory again; dropping it destroys the queue pair (flushing everything) before
//! the buffer is unmapped.
//!
//! A server connection posts a receive slot per request a client may have outstanding and one
//! for a credit return; a client posts one per reply, one per event message the server may send
//! it unasked, and one for the acknowledgement of its credit return (`credit.rs` counts them).
//!
//! # Empty messages and immediate data
//!
//! No `dlock-core` message is empty, so a zero-length SEND is the channel's own: a client's
//! credit return, and the server's acknowledgement of it. They are handled here and nowhere
//! else ([`Empties`]): an empty message is never queued with the others, and its receive slot
//! is reposted as soon as its completion is polled; an acknowledgement owed goes at the next
//! [`Channel::drain`] that finds a send slot free (every drain tries: send slots free
//! themselves as SENDs complete). So neither waits behind requests a server holds (`credit.rs`
//! says why that matters). The immediate value of the last SEND received with one is kept
//! ([`Channel::peer_imm`]): a client puts there how many event messages it has taken.
//!
//! # Completion queue depth
//!
//! `recv_slots` receives + `MESSAGES_INFLIGHT_MAX` sends + 1 one-sided operation: the most
//! completions that can be outstanding at once, so the CQ cannot overrun.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use ibverbs::ibv_wc;

use super::credit::{Empties, EmptyMeans, SEND_SLOTS, SendSlots};
use super::endpoint::{Endpoint, ObjectTable};
use super::post::{SendOp, Sge};
use super::registered::{OwnedBuffer, RdmaDevice};
use super::verbs::{Cq, Qp, RemoteAccess};
use super::{CELL_BYTES, MESSAGE_MAX, RdmaError, SLOT_BYTES};

/// Send slots: one per message in flight.
const SLOTS: usize = SEND_SLOTS;
/// Send queue: a SEND per send slot + the one READ or atomic a client has outstanding.
const SEND_WR_MAX: usize = SLOTS + 1;
/// The most receive slots a channel posts (a client's), which bounds the completion queue.
pub(crate) const RECV_SLOTS_MAX: usize = 16;
/// Completion queue, at most: every receive, every send, and the one one-sided operation.
const CQ_ENTRIES_MAX: usize = RECV_SLOTS_MAX + SEND_WR_MAX;

/// Work-request ids: the kind in the top byte, the slot or sequence number below.
const KIND_SHIFT: u32 = 56;
const KIND_RECV: u64 = 1;
const KIND_SEND: u64 = 2;
const KIND_ONE_SIDED: u64 = 3;
const INDEX_MASK: u64 = (1 << KIND_SHIFT) - 1;

fn wr_id(kind: u64, index: u64) -> u64 {
    kind << KIND_SHIFT | (index & INDEX_MASK)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Created, not yet handshaken: the queue pair is in RESET.
    Prepared,
    /// Ready to send (RTS).
    Connected,
    /// A work request failed or was abandoned; see the module doc.
    Poisoned,
}

pub(crate) struct Channel {
    // Field order is drop order: the QP goes first (destroying it flushes every posted work
    // request), so the device is done with the buffer before the buffer is unmapped.
    qp: Qp,
    cq: Arc<Cq>,
    buf: OwnedBuffer,
    psn: u32,
    state: State,
    /// Receive slots posted at the handshake (and reposted as taken).
    recv_slots: usize,
    /// Received messages not yet taken, `(slot, len)` in arrival order; at most `recv_slots`.
    /// Never an empty one (the channel's own: [`Self::empties`]).
    ready: VecDeque<(usize, usize)>,
    /// The empty messages owed and awaited (module doc).
    empties: Empties,
    /// The immediate value of the last SEND that came with one (0 before any).
    peer_imm: u32,
    /// Send slots whose SEND has not completed yet.
    send_busy: SendSlots,
    /// The pending one-sided operation: its sequence number and opcode name.
    pending: Option<(u64, &'static str)>,
    seq: u64,
}

impl Channel {
    /// A queue pair in RESET with `recv_slots` (1..=[`RECV_SLOTS_MAX`]) receive slots and
    /// [`SLOTS`] send slots, its buffers registered; an empty message it receives `means` what
    /// its side takes it for.
    pub(crate) fn new(
        device: &RdmaDevice,
        recv_slots: usize,
        means: EmptyMeans,
    ) -> Result<Self, RdmaError> {
        if !(1..=RECV_SLOTS_MAX).contains(&recv_slots) {
            return Err(RdmaError::InvalidArgument("receive slots out of range"));
        }
        let cq = Cq::create(&device.pd.ctx, recv_slots + SEND_WR_MAX)?;
        let qp = Qp::create(&device.pd, &cq, SEND_WR_MAX, recv_slots)?;
        let bytes = scratch_offset(recv_slots) + CELL_BYTES;
        let buf = device.register_anonymous(bytes)?;
        debug_assert!(buf.len() >= bytes);
        // A PSN that differs per connection, so that stray packets of an earlier connection
        // that reused this QP number do not fit into the new sequence; it needs no secrecy.
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let psn = (nanos ^ qp.qp_num().wrapping_mul(0x9e37_79b9)) & 0x00ff_ffff;
        Ok(Self {
            qp,
            cq,
            buf,
            psn,
            state: State::Prepared,
            recv_slots,
            ready: VecDeque::with_capacity(recv_slots),
            empties: Empties::new(means),
            peer_imm: 0,
            send_busy: SendSlots::default(),
            pending: None,
            seq: 0,
        })
    }

    pub(crate) fn endpoint(&self, objects: Option<ObjectTable>) -> Endpoint {
        let ctx = self.qp.context();
        Endpoint {
            qp_num: self.qp.qp_num(),
            lid: ctx.lid,
            gid: ctx.gid.map(|(_, gid)| gid),
            psn: self.psn,
            mtu: ctx.mtu,
            objects,
        }
    }

    pub(crate) fn atomics(&self) -> bool {
        self.qp.context().atomics
    }

    /// Connects to `remote`: INIT, post every receive slot, RTR, RTS.
    pub(crate) fn handshake(
        &mut self,
        remote: &Endpoint,
        access: RemoteAccess,
    ) -> Result<(), RdmaError> {
        if self.state != State::Prepared {
            return Err(RdmaError::InvalidArgument("handshake was done already"));
        }
        // A failed step leaves the QP half-configured, possibly with receives posted.
        self.state = State::Poisoned;
        self.qp.to_init(access)?;
        for slot in 0..self.recv_slots {
            self.post_recv(slot)?;
        }
        self.qp.to_rts(self.psn, remote)?;
        self.state = State::Connected;
        Ok(())
    }

    pub(crate) fn check_connected(&self) -> Result<(), RdmaError> {
        match self.state {
            State::Connected => Ok(()),
            State::Prepared => Err(RdmaError::NotConnected),
            State::Poisoned => Err(RdmaError::Poisoned),
        }
    }

    /// The immediate value of the last SEND received with one (0 before any).
    pub(crate) fn peer_imm(&self) -> u32 {
        self.peer_imm
    }

    /// Where send slot `send` starts in `buf`: after every receive slot.
    fn send_offset(&self, send: usize) -> usize {
        (self.recv_slots + send) * SLOT_BYTES
    }

    fn slot_sge(&self, offset: usize, len: usize) -> Sge {
        Sge {
            addr: self.buf.base().as_ptr() as u64 + offset as u64,
            len: len as u32,
            lkey: self.buf.lkey(),
        }
    }

    /// Posts receive slot `slot` (which we own).
    fn post_recv(&mut self, slot: usize) -> Result<(), RdmaError> {
        // Posting only `MESSAGE_MAX` bytes makes the device refuse a longer message (a local
        // length error), which ends the connection instead of letting a peer overrun a slot.
        let sge = self.slot_sge(slot * SLOT_BYTES, MESSAGE_MAX);
        // SAFETY: the slot lies in `buf`, registered with local write on this QP's PD; `buf`
        // outlives the QP (field order); we own the slot and hand it to the device here, and
        // touch it again only after its completion is polled (`take_message`).
        unsafe { self.qp.post_recv(wr_id(KIND_RECV, slot as u64), sge) }
    }

    /// Polls the completion queue once and records what completed; then sends the
    /// acknowledgements owed that free send slots allow.
    pub(crate) fn drain(&mut self) -> Result<(), RdmaError> {
        let mut wcs = [ibv_wc::default(); CQ_ENTRIES_MAX];
        let n = self
            .cq
            .poll(&mut wcs)
            .inspect_err(|_| self.state = State::Poisoned)?;
        let mut first_error = None;
        for wc in &wcs[..n] {
            let (kind, index) = (wc.wr_id() >> KIND_SHIFT, wc.wr_id() & INDEX_MASK);
            if let Some((status, vendor_err)) = wc.error() {
                self.state = State::Poisoned;
                let op = match kind {
                    KIND_RECV => "IBV_WC_RECV",
                    KIND_SEND => SEND,
                    _ => self.pending.map_or("one-sided", |(_, name)| name),
                };
                first_error.get_or_insert(RdmaError::Completion {
                    op,
                    status,
                    vendor_err,
                });
                continue;
            }
            match kind {
                KIND_RECV => {
                    // Completions come in the order the peer sent, so the last one is the
                    // newest value (the verbs API delivers it in network byte order).
                    if let Some(imm) = wc.imm_data() {
                        self.peer_imm = u32::from_be(imm);
                    }
                    if wc.len() == 0 {
                        // The channel's own (module doc): its slot goes back at once.
                        self.empties.received();
                        self.repost(index as usize)?;
                    } else {
                        self.ready.push_back((index as usize, wc.len()));
                    }
                }
                KIND_SEND => self.send_busy.completed(index as usize),
                // A completion for an older sequence number would belong to an abandoned
                // operation, but abandoning poisons the channel, so only the pending one comes.
                KIND_ONE_SIDED if self.pending.is_some_and(|(seq, _)| seq == index) => {
                    self.pending = None;
                }
                _ => debug_assert!(false, "unexpected wr_id {:#x}", wc.wr_id()),
            }
        }
        if let Some(e) = first_error {
            return Err(e);
        }
        self.send_owed()
    }

    /// Sends the acknowledgements owed while a send slot is free; the rest go at a later
    /// drain (send slots free themselves as SENDs complete).
    fn send_owed(&mut self) -> Result<(), RdmaError> {
        while let Some(send) = self.send_busy.free()
            && self.empties.take_owed()
        {
            self.post_send_slot(send, 0, None)?;
        }
        Ok(())
    }

    /// SENDs an empty credit return with `imm` (the event messages taken) if a send slot is
    /// free as of the last drain; it is then awaited until acknowledged
    /// ([`Self::credit_returns_inflight`]). `Ok(false)`, and nothing sent, when every send slot
    /// is busy: the caller tries again at its next poll (send slots free themselves as SENDs
    /// complete), so the poll that asks never waits. Only the client's poll calls it, right
    /// after [`Self::poll_message`] checked the connection and drained the completion queue
    /// (unless a message was already waiting): neither is done again here, on the spin path.
    pub(crate) fn try_return_credit(&mut self, imm: u32) -> Result<bool, RdmaError> {
        let Some(send) = self.send_busy.free() else {
            return Ok(false);
        };
        self.post_send_slot(send, 0, Some(imm))?;
        self.empties.returned();
        Ok(true)
    }

    /// Credit returns sent and not yet acknowledged.
    pub(crate) fn credit_returns_inflight(&self) -> usize {
        self.empties.returning()
    }

    /// Whether a received message is waiting (after draining the CQ once).
    pub(crate) fn poll_message(&mut self) -> Result<bool, RdmaError> {
        self.check_connected()?;
        if self.ready.is_empty() {
            self.drain()?;
        }
        Ok(!self.ready.is_empty())
    }

    /// Busy-polls until a received message is waiting or `deadline` passes.
    pub(crate) fn wait_message(&mut self, deadline: Instant) -> Result<bool, RdmaError> {
        loop {
            if self.poll_message()? {
                return Ok(true);
            }
            if Instant::now() >= deadline {
                return Ok(false);
            }
            std::hint::spin_loop();
        }
    }

    /// Busy-polls until a send slot is free; returns it.
    pub(crate) fn wait_send_slot(&mut self, deadline: Instant) -> Result<usize, RdmaError> {
        loop {
            self.check_connected()?;
            if let Some(slot) = self.send_busy.free() {
                return Ok(slot);
            }
            self.drain()?;
            if Instant::now() >= deadline {
                return Err(RdmaError::Timeout { op: SEND });
            }
            std::hint::spin_loop();
        }
    }

    /// Lets `fill` write a message of at most [`MESSAGE_MAX`] bytes into a free send slot,
    /// waiting until `deadline` for one, and SENDs it with `imm` as its immediate value if
    /// given: a client's request. A client's credit return goes with
    /// [`Self::try_return_credit`], and a server answers what it received with
    /// [`Self::try_respond`].
    pub(crate) fn send_with<F>(
        &mut self,
        deadline: Instant,
        imm: Option<u32>,
        fill: F,
    ) -> Result<(), RdmaError>
    where
        F: FnOnce(&mut [u8]) -> usize,
    {
        let send = self.wait_send_slot(deadline)?;
        // SAFETY: send slot `send` is not busy, so no posted work request names it; it lies in
        // `buf` after every receive slot, and nothing else refers to it during this borrow.
        let out = unsafe {
            std::slice::from_raw_parts_mut(
                self.buf.base().as_ptr().add(self.send_offset(send)),
                MESSAGE_MAX,
            )
        };
        let len = fill(out);
        self.post_send_slot(send, len, imm)
    }

    /// A send slot no posted work request names, without waiting: drains the completion queue
    /// once if every slot is busy. `None` when all are still busy.
    fn free_send_slot(&mut self) -> Result<Option<usize>, RdmaError> {
        if let Some(slot) = self.send_busy.free() {
            return Ok(Some(slot));
        }
        self.drain()?;
        Ok(self.send_busy.free())
    }

    /// Whether a send slot is free, as of the last drain of the completion queue.
    pub(crate) fn has_free_send_slot(&self) -> bool {
        self.send_busy.free().is_some()
    }

    /// SENDs the first `len` bytes (0 for the channel's own empty message) of send slot
    /// `send`, which the caller just filled, with `imm` as its immediate value if given.
    fn post_send_slot(
        &mut self,
        send: usize,
        len: usize,
        imm: Option<u32>,
    ) -> Result<(), RdmaError> {
        if len > MESSAGE_MAX {
            return Err(RdmaError::InvalidArgument(
                "message longer than MESSAGE_MAX",
            ));
        }
        let sge = self.slot_sge(self.send_offset(send), len);
        // SAFETY: the slot lies in registered `buf`, which outlives the QP; it is marked busy
        // below and not written again until its completion clears the mark (`drain`).
        unsafe {
            self.qp
                .post_send(wr_id(KIND_SEND, send as u64), sge, SendOp::Send { imm })
                .inspect_err(|_| self.state = State::Poisoned)?;
        }
        self.send_busy.posted(send);
        Ok(())
    }

    /// The poll loop's way to answer: never waits. If a request has arrived *and* a send slot is
    /// free, `fill` gets the request and the send slot and returns the reply's length, or 0 for
    /// "no reply now" (a parked request); the receive slot is reposted either way. Returns
    /// whether a message was taken; one that finds every send slot busy stays queued for the
    /// next call, so nothing is lost and nothing blocks.
    pub(crate) fn try_respond<F>(&mut self, fill: F) -> Result<bool, RdmaError>
    where
        F: FnOnce(&[u8], &mut [u8]) -> usize,
    {
        if !self.poll_message()? {
            return Ok(false);
        }
        let Some(send) = self.free_send_slot()? else {
            return Ok(false);
        };
        self.respond_from(send, fill)
    }

    /// [`Self::try_respond`] to a message already waiting, given until `deadline` for a send
    /// slot: a server's blocking serve, which waited for the message itself.
    pub(crate) fn respond<F>(&mut self, deadline: Instant, fill: F) -> Result<bool, RdmaError>
    where
        F: FnOnce(&[u8], &mut [u8]) -> usize,
    {
        let send = self.wait_send_slot(deadline)?;
        self.respond_from(send, fill)
    }

    /// Answers the oldest received message from send slot `send`, which the caller just found
    /// free (no posted work request names it): the two above, each with the slot it found.
    fn respond_from<F>(&mut self, send: usize, fill: F) -> Result<bool, RdmaError>
    where
        F: FnOnce(&[u8], &mut [u8]) -> usize,
    {
        let Some((slot, len)) = self.ready.pop_front() else {
            return Ok(false);
        };
        let base = self.buf.base().as_ptr();
        // SAFETY: popped from `ready`, so the receive completed and we own the slot until the
        // repost below, after the last use of `req`; `len` came from the completion and is at
        // most the posted `MESSAGE_MAX`. Receive and send slots are disjoint ranges of `buf`.
        let req = unsafe { std::slice::from_raw_parts(base.add(slot * SLOT_BYTES), len) };
        // SAFETY: send slot `send` is not busy, so no posted work request names it; it lies in
        // `buf` after every receive slot, disjoint from `req`.
        let out = unsafe {
            std::slice::from_raw_parts_mut(base.add(self.send_offset(send)), MESSAGE_MAX)
        };
        let n = fill(req, out);
        self.repost(slot)?;
        if n > 0 {
            self.post_send_slot(send, n, None)?;
        }
        Ok(true)
    }

    /// SENDs `msg` (1..=[`MESSAGE_MAX`] bytes) without waiting: `Ok(false)` when every send slot
    /// is still busy, so the caller can keep the message and try again on its next turn.
    pub(crate) fn try_send(&mut self, msg: &[u8]) -> Result<bool, RdmaError> {
        self.check_connected()?;
        if msg.is_empty() || msg.len() > MESSAGE_MAX {
            return Err(RdmaError::InvalidArgument(
                "message must be 1..=MESSAGE_MAX bytes",
            ));
        }
        let Some(send) = self.free_send_slot()? else {
            return Ok(false);
        };
        // SAFETY: send slot `send` is not busy, so no posted work request names it, and it lies
        // in `buf` after every receive slot; nothing else refers to it during this borrow.
        let out = unsafe {
            std::slice::from_raw_parts_mut(
                self.buf.base().as_ptr().add(self.send_offset(send)),
                MESSAGE_MAX,
            )
        };
        out[..msg.len()].copy_from_slice(msg);
        self.post_send_slot(send, msg.len(), None)?;
        Ok(true)
    }

    /// Copies the oldest received message into `out`, reposts its slot, and returns its length
    /// with the outcome of the repost: an error there (the channel is then poisoned) comes
    /// after the message was taken, and must not lose it.
    pub(crate) fn take_message(
        &mut self,
        out: &mut [u8],
    ) -> Result<(usize, Result<(), RdmaError>), RdmaError> {
        let &(slot, len) = self
            .ready
            .front()
            .ok_or(RdmaError::InvalidArgument("no message waiting"))?;
        if out.len() < len {
            return Err(RdmaError::InvalidArgument(
                "buffer shorter than the message",
            ));
        }
        self.ready.pop_front();
        // SAFETY: popped from `ready`, so we own the slot until the repost below; `len` is at
        // most the posted `MESSAGE_MAX`.
        let msg = unsafe {
            std::slice::from_raw_parts(self.buf.base().as_ptr().add(slot * SLOT_BYTES), len)
        };
        out[..len].copy_from_slice(msg);
        Ok((len, self.repost(slot)))
    }

    /// Gives receive slot `slot` back to the device.
    pub(crate) fn repost(&mut self, slot: usize) -> Result<(), RdmaError> {
        self.post_recv(slot)
            .inspect_err(|_| self.state = State::Poisoned)
    }

    /// Posts one READ or atomic into the scratch word and busy-polls for its completion.
    pub(crate) fn one_sided(&mut self, op: SendOp, deadline: Instant) -> Result<u64, RdmaError> {
        self.check_connected()?;
        debug_assert!(
            self.pending.is_none(),
            "a pending operation poisons the channel"
        );
        self.seq = (self.seq + 1) & INDEX_MASK;
        let scratch = scratch_offset(self.recv_slots);
        let sge = self.slot_sge(scratch, CELL_BYTES);
        // SAFETY: the scratch word lies in registered `buf` (local write), which outlives the
        // QP; no other work request names it (one one-sided operation at a time, enforced by
        // `&mut self` and by poisoning on abandon), and we read it only after its completion.
        unsafe {
            self.qp
                .post_send(wr_id(KIND_ONE_SIDED, self.seq), sge, op)?
        };
        self.pending = Some((self.seq, op.name()));
        while self.pending.is_some() {
            self.drain()?;
            if self.pending.is_some() && Instant::now() >= deadline {
                // The device may still write the scratch word: never reuse it.
                self.state = State::Poisoned;
                return Err(RdmaError::Timeout { op: op.name() });
            }
            std::hint::spin_loop();
        }
        // SAFETY: the completion was polled, so the device is done with the scratch word; it is
        // 8-byte aligned (the mapping is page-aligned and the offset a multiple of 8). Volatile,
        // because the compiler did not see the device's write.
        let value =
            unsafe { std::ptr::read_volatile(self.buf.base().as_ptr().add(scratch).cast::<u64>()) };
        Ok(value)
    }
}

/// The SEND opcode's name, which completion errors and timeouts report.
const SEND: &str = "IBV_WR_SEND";

/// Where the scratch word lies in a buffer with `recv_slots` receive slots: after every slot.
const fn scratch_offset(recv_slots: usize) -> usize {
    (recv_slots + SLOTS) * SLOT_BYTES
}

// Slots are whole cache lines, so the scratch word after them is 8-byte aligned.
static_assertions::const_assert!(SLOT_BYTES.is_multiple_of(CELL_BYTES));
static_assertions::const_assert!(RECV_SLOTS_MAX + SLOTS < 1 << 16);
