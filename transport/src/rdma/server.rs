//! The server end: the object cells registered once for the server's life, and one queue pair
//! per client connection that answers data messages.

use std::fmt;
use std::time::{Duration, Instant};

use dlock_core::table::Part;

use super::channel::Channel;
use super::credit::{EmptyMeans, EventCredit, SERVER_RECV_SLOTS};
use super::endpoint::{Endpoint, ObjectTable};
use super::registered::{RdmaDevice, RegisteredRegion};
use super::verbs::RemoteAccess;
use super::{CELL_BYTES, RdmaConfig, RdmaError};

/// A server's RDMA side: the opened device and the registration of its object cells.
///
/// Only the object cells are registered for remote access, not the whole region: an rkey is
/// checked by the device against its registration alone, so one covering the region would let
/// any connected client rewrite lock words and client entries behind the server's checks.
/// Commands arrive as messages on [`ServerConnection`]s and are executed by the server itself.
pub struct RdmaServer {
    // Field order is drop order: deregister before the device (PD) can go.
    objects: RegisteredRegion,
    cells: u32,
    device: RdmaDevice,
    op_timeout: Duration,
}

impl fmt::Debug for RdmaServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RdmaServer")
            .field("device", &self.device)
            .field("objects", &self.objects)
            .field("cells", &self.cells)
            .finish()
    }
}

/// Checks that `cells` is a non-empty, 8-byte-aligned range of whole cells inside the region
/// that starts at `region` and is `region_len` bytes long; returns its address and cell count.
fn object_range(
    region: *mut u8,
    region_len: usize,
    cells: Part,
) -> Result<(*mut u8, u32), RdmaError> {
    if region.is_null() {
        return Err(RdmaError::InvalidArgument("null region"));
    }
    let end = cells
        .offset
        .checked_add(cells.len)
        .ok_or(RdmaError::InvalidArgument("object cells overflow"))?;
    if cells.len == 0 || end > region_len {
        return Err(RdmaError::InvalidArgument(
            "object cells are not inside the region",
        ));
    }
    if !cells.len.is_multiple_of(CELL_BYTES)
        || !(region as usize + cells.offset).is_multiple_of(CELL_BYTES)
    {
        return Err(RdmaError::InvalidArgument(
            "object cells are not whole aligned u64s",
        ));
    }
    let count = u32::try_from(cells.len / CELL_BYTES)
        .map_err(|_| RdmaError::InvalidArgument("more than 2^32 object cells"))?;
    // `wrapping_add` keeps this free of unsafe; the range was checked to lie in the region.
    Ok((region.wrapping_add(cells.offset), count))
}

impl RdmaServer {
    /// Opens the device in `cfg` and registers the object cells `object_cells` (offset and
    /// length from `Layout::new(&cfg).object_cells`) of the region at `region`.
    ///
    /// Arguments are checked before the device is opened, so a bad range is
    /// [`RdmaError::InvalidArgument`] even on a host without RDMA.
    ///
    /// # Safety
    ///
    /// - `region..region + region_len` is one live mapping of this process (the server's
    ///   region), and it stays mapped, unmoved, for as long as the returned server lives.
    /// - The bytes in `object_cells` are accessed by the server only as `AtomicU64`s, because
    ///   connected clients change them at any moment without the CPU.
    pub unsafe fn new(
        cfg: &RdmaConfig,
        region: *mut u8,
        region_len: usize,
        object_cells: Part,
    ) -> Result<Self, RdmaError> {
        object_range(region, region_len, object_cells)?;
        let device = RdmaDevice::open(cfg)?;
        // SAFETY: the caller's contract is exactly `on_device`'s.
        unsafe { Self::on_device(&device, cfg.op_timeout, region, region_len, object_cells) }
    }

    /// As [`Self::new`], on a device that is already open (clients in the same process must
    /// use their own queue pairs, but may share the device).
    ///
    /// # Safety
    ///
    /// As for [`Self::new`].
    pub unsafe fn on_device(
        device: &RdmaDevice,
        op_timeout: Duration,
        region: *mut u8,
        region_len: usize,
        object_cells: Part,
    ) -> Result<Self, RdmaError> {
        let (base, cells) = object_range(region, region_len, object_cells)?;
        // SAFETY: `base..base + object_cells.len` lies inside the caller's mapping (checked
        // above), which stays mapped and unmoved while `self`, and so the registration, lives;
        // the caller accesses those bytes only atomically, which tolerates remote changes.
        // Without remote WRITE: the queue pairs refuse WRITEs too, and clients change cells
        // only with atomics, which a plain WRITE racing them could tear.
        let objects = unsafe { device.register_read_atomic(base, object_cells.len) }?;
        Ok(Self {
            objects,
            cells,
            device: device.clone(),
            op_timeout,
        })
    }

    /// What clients need for one-sided object operations.
    pub fn object_table(&self) -> ObjectTable {
        ObjectTable {
            addr: self.objects.addr(),
            rkey: self.objects.rkey(),
            cells: self.cells,
        }
    }

    /// The opened device.
    pub fn device(&self) -> &RdmaDevice {
        &self.device
    }

    /// Prepares a queue pair for one new client; connect it with
    /// [`ServerConnection::handshake`].
    pub fn accept(&self) -> Result<ServerConnection, RdmaError> {
        Ok(ServerConnection {
            // One receive slot per message a client may have awaiting a reply, and one for its
            // credit return (`credit.rs`).
            channel: Channel::new(&self.device, SERVER_RECV_SLOTS, EmptyMeans::CreditReturn)?,
            objects: self.object_table(),
            op_timeout: self.op_timeout,
            events: EventCredit::default(),
        })
    }
}

/// The server end of one client's queue pair.
///
/// Dropping the [`RdmaServer`] first is allowed: the connection keeps the device open, and the
/// client's one-sided operations then fail with a remote access error.
pub struct ServerConnection {
    channel: Channel,
    objects: ObjectTable,
    op_timeout: Duration,
    events: EventCredit,
}

/// Whether an event message may go to a client now ([`ServerConnection::event_room`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub enum EventRoom {
    /// It may: the client has a receive slot for it and a send slot is free.
    Ready,
    /// Every send slot awaits its completion: try again on a later turn (microseconds).
    Busy,
    /// The client has not said it took the event messages it was sent: wait until it does
    /// ([`ServerConnection::take_unblocked`]).
    NoCredit,
}

impl fmt::Debug for ServerConnection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServerConnection")
            .field("endpoint", &self.endpoint())
            .finish()
    }
}

impl ServerConnection {
    /// This side's endpoint record, carrying the object table, to send to the client.
    pub fn endpoint(&self) -> Endpoint {
        self.channel.endpoint(Some(self.objects))
    }

    /// Connects to the client's endpoint, posting every receive slot first. The client may
    /// READ and do atomics on the object cells; it may not WRITE.
    pub fn handshake(&mut self, client: &Endpoint) -> Result<(), RdmaError> {
        self.channel.handshake(client, RemoteAccess::ReadAtomic)
    }

    /// Waits until `deadline` for one request; if one came, `handler` gets it and a response
    /// buffer of [`super::MESSAGE_MAX`] bytes and returns the response length, which is sent
    /// back (0: nothing, as for [`Self::try_serve`]). Returns whether a request was served.
    pub fn serve<F>(&mut self, deadline: Instant, handler: F) -> Result<bool, RdmaError>
    where
        F: FnOnce(&[u8], &mut [u8]) -> usize,
    {
        if !self.channel.wait_message(deadline)? {
            return Ok(false);
        }
        // Waiting for a send slot gets the full operation timeout even when the request came
        // at the very end of `deadline`: the request is already taken. The slot found answers
        // it (a credit return never comes this far: the channel's drain reposts its slot and
        // owes its acknowledgement).
        self.channel
            .respond(Instant::now() + self.op_timeout, handler)
    }

    /// Whether a request waits to be served (after draining the completion queue once if
    /// none did); never waits. The poll loop asks before it serves one, to send the client's
    /// waiting events first (`runtime/rdma.rs`).
    pub fn has_request(&mut self) -> Result<bool, RdmaError> {
        self.channel.poll_message()
    }

    /// The poll loop's serve: never waits. Drains the completion queue once; if a request is
    /// waiting and a send slot is free, `handler` gets it and a reply buffer of
    /// [`super::MESSAGE_MAX`] bytes and returns the reply's length, or 0 to send nothing now (a
    /// parked request, answered later with [`Self::try_send`]). Returns whether a request was
    /// taken. Allocates nothing and makes no system call on providers that poll in user space.
    ///
    /// An error (a completion with an error status, a failed post) means the queue pair is
    /// unusable: drop the connection, as for a closed socket.
    pub fn try_serve<F>(&mut self, handler: F) -> Result<bool, RdmaError>
    where
        F: FnOnce(&[u8], &mut [u8]) -> usize,
    {
        self.channel.try_respond(handler)
    }

    /// SENDs `msg` (a parked request's reply) without waiting; `Ok(false)` when every send slot
    /// still awaits its completion, so the caller keeps the message for its next turn.
    pub fn try_send(&mut self, msg: &[u8]) -> Result<bool, RdmaError> {
        self.channel.try_send(msg)
    }

    /// Whether an event message may be sent now; never waits. Ask before taking the events out
    /// of wherever they wait, so that events with no room stay there.
    pub fn event_room(&mut self) -> Result<EventRoom, RdmaError> {
        self.channel.check_connected()?;
        // A credit return or a request carrying one may have come meanwhile.
        self.channel.drain()?;
        Ok(self.event_room_as_drained())
    }

    /// [`Self::event_room`] as of the last drain of the completion queue. A drain can only add
    /// credit and free send slots, so `Ready` there stays true until the next send.
    fn event_room_as_drained(&mut self) -> EventRoom {
        if !self.events.has_room(self.channel.peer_imm()) {
            self.events.blocked = true;
            return EventRoom::NoCredit;
        }
        if self.channel.has_free_send_slot() {
            EventRoom::Ready
        } else {
            EventRoom::Busy
        }
    }

    /// SENDs event message `msg` if [`Self::event_room`] said `Ready` since the last send;
    /// `Ok(false)` (and nothing sent) otherwise. It does not drain the completion queue again:
    /// `event_room` just did, for this message.
    pub fn send_event(&mut self, msg: &[u8]) -> Result<bool, RdmaError> {
        if self.event_room_as_drained() != EventRoom::Ready {
            return Ok(false);
        }
        let sent = self.channel.try_send(msg)?;
        if sent {
            self.events.sent = self.events.sent.wrapping_add(1);
        }
        Ok(sent)
    }

    /// True once after the client, which had no credit when [`Self::event_room`] last said so,
    /// has returned some (with a message the poll loop took): the events it was kept from can
    /// go now.
    pub fn take_unblocked(&mut self) -> bool {
        let unblocked = self.events.blocked && self.events.has_room(self.channel.peer_imm());
        if unblocked {
            self.events.blocked = false;
        }
        unblocked
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn object_cells_must_lie_inside_the_region_as_aligned_u64s() {
        let mut backing = [0u64; 64];
        let base = backing.as_mut_ptr().cast::<u8>();
        let len = size_of_val(&backing);
        let part = |offset, len| Part { offset, len };
        assert!(object_range(base, len, part(64, 256)).is_ok());
        assert_eq!(object_range(base, len, part(64, 256)).unwrap().1, 32);
        for bad in [
            part(0, 0),
            part(8, len),
            part(4, 64),
            part(8, 12),
            part(usize::MAX, 8),
        ] {
            assert!(
                matches!(
                    object_range(base, len, bad),
                    Err(RdmaError::InvalidArgument(_))
                ),
                "{bad:?} was accepted"
            );
        }
        assert!(object_range(std::ptr::null_mut(), len, part(0, 8)).is_err());
    }
}
