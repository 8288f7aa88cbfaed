//! RDMA verbs transport (feature `rdma`): reliable-connected queue pairs to a dlock server.
//!
//! # What this module owns
//!
//! - Device discovery ([`probe`], [`available`]): the answer "no RDMA here" is a value
//!   ([`RdmaError::NoDevice`]) so callers fall back to TCP.
//! - The verbs objects of one endpoint — device context, protection domain, completion queue,
//!   queue pair — and their teardown order (private `verbs` module).
//! - Memory registration ([`RdmaDevice::register`] → [`RegisteredRegion`]): the server's object
//!   cells, and each endpoint's own fixed buffer pool.
//! - The out-of-band connection handshake ([`Endpoint`], a fixed 56-byte little-endian record,
//!   carried inside an [`AttachRecord`] over TCP) and the RESET → INIT → RTR → RTS transitions.
//! - Two-sided messages ([`RdmaClient::post_send`], [`RdmaClient::poll`],
//!   [`ServerConnection::serve`], and the never-waiting [`ServerConnection::try_serve`] and
//!   [`ServerConnection::try_send`] the server's poll loop uses) and one-sided object operations
//!   ([`RdmaClient::fetch_add`], [`RdmaClient::compare_swap`], [`RdmaClient::read`]).
//! - Event messages the server sends unasked ([`ServerConnection::event_room`],
//!   [`ServerConnection::send_event`]; [`Received::Event`] on the client) and their receive
//!   budget: [`EVENT_MESSAGES_INFLIGHT_MAX`] receive slots of the client's, whose use the
//!   client reports in the immediate data of its SENDs, or in an empty credit return with a
//!   budget of its own, [`CREDIT_RETURNS_INFLIGHT_MAX`] (credits; `client.rs`, `credit.rs`).
//!
//! # How it is wired
//!
//! - The runtime (`runtime/rdma.rs`): `ServerConfig::rdma` names a device; at start the server
//!   opens it and registers the region's object cells, or logs why not and serves TCP and shared
//!   memory only. The control thread answers attach records (checking the session through the
//!   data thread as for a TCP data connection), creates and connects each client's queue pair,
//!   and destroys retired ones; the data thread polls the queue pairs, runs their requests
//!   through the state machine and SENDs the replies, including parked `lock()` replies, and
//!   the client's events (revokes of its cached grants) as event messages while it has credit.
//! - The client (`client/rdma.rs`): `Endpoint::Rdma` uses a queue pair for data messages and
//!   one-sided verbs for `atomic64_*`, and falls back to TCP (with a warning, and
//!   `Client::transport()` saying `Tcp`) when the device does not open or the server has no RDMA.
//!   Event messages it receives go to the queue `Client::poll_events` reads, as over TCP.
//!
//! # What has run
//!
//! The machine this was built on has no RDMA device and no RDMA in its kernel, so only the build,
//! [`probe`] answering `NoDevice`, the fallback of server and client to TCP, the record parsing
//! and the refusals (forged session, malformed or short records, server without RDMA) ran, and
//! of the event path what needs no device: telling an event message from a reply
//! ([`Received`]), the client filing events beside replies (`client/rdma.rs`), the credit
//! bookkeeping and the slot budgets it keeps (`credit.rs`), and the server's choice of a
//! client's event path
//! (`dlock_core::server::route::event_path`). Every path through a real queue pair — requests,
//! replies, one-sided objects, and revokes as event messages with their credits — is covered
//! by `#[ignore]`d tests in `transport/tests/rdma.rs` (and `tests/rdma/events.rs`) that need
//! `DLOCK_RDMA_DEVICE` and have not yet been run on hardware.
//!
//! It never interprets what it carries: request and reply bytes are `dlock-core` data
//! messages, and the object cells are whatever the server's tables say they are. It does not
//! touch the region's layout either: the caller passes the mapping and the object-cell range.
//!
//! # How it maps onto the reference's URMA usage
//!
//! The reference (`dlock-reference.md` §5.2, §3) runs its data plane over URMA jetties:
//!
//! | reference (URMA) | here (verbs) |
//! |---|---|
//! | lock commands: `lock_cmd_msg` batches (≤ 1 KiB) by send/recv on a jetty | one data message (a request ≤ 2,000 B with its value blocks; a reply ≤ [`MESSAGE_MAX`] = 2,744 B with its value blocks and grant proofs) by SEND into a pre-posted RECV slot of the server's QP; the reply comes back the same way |
//! | object arena (102,400 × u64) registered as a segment with READ/WRITE/ATOMIC access; descriptor + token sent in the CLIENT_INIT reply | the object cells registered as one memory region; address, rkey and cell count travel in the server's [`Endpoint`] ([`ObjectTable`]) |
//! | FAA = `URMA_OPC_FADD` (returns old value) | `IBV_WR_ATOMIC_FETCH_AND_ADD` ([`RdmaClient::fetch_add`]) |
//! | CAS = `URMA_OPC_CAS` (success iff old == cmp) | `IBV_WR_ATOMIC_CMP_AND_SWP` ([`RdmaClient::compare_swap`], returns the observed value) |
//! | snapshot = 8-byte `URMA_OPC_READ` | 8-byte `IBV_WR_RDMA_READ` ([`RdmaClient::read`]) |
//! | post, then busy-poll own JFC ≤ 5 s, else `BAD_RESPONSE` | post, then busy-poll own CQ until [`RdmaConfig::op_timeout`] (5 s by default), else [`RdmaError::Timeout`] |
//!
//! One deliberate difference: the reference's token covers the whole segment it imports, and so
//! would an rkey for the whole region — any client could then rewrite lock words, client entries
//! and other clients' mailboxes behind the server's checks. [`RdmaServer`] therefore registers
//! only the object-cell range for remote access, with READ and atomics but not WRITE, and every
//! endpoint's own message buffers for local access only; the hardware checks every one-sided
//! access against the registration its rkey names, so a client's rkey reaches object cells and
//! nothing else. Lock words change only through messages the server executes.
//!
//! # Why ibverbs *and* ibverbs-sys
//!
//! `ibverbs` 0.9.2 lists devices safely, which [`probe`] uses. Its `ProtectionDomain`,
//! `QueuePair` and `MemoryRegion` keep their raw pointers private, it can only register memory it
//! allocates itself, and its `QueuePair` posts only SEND and RECV. The region must be registered
//! where it is mapped, and objects need READ and atomics, so the endpoint's objects are opened
//! through the same bindings (`ibverbs-sys`) in the private `verbs` module, mirroring ibverbs'
//! `PreparedQueuePair::handshake` step for step.

mod attach;
mod channel;
mod client;
mod credit;
mod endpoint;
mod post;
mod registered;
mod server;
mod verbs;

use std::fmt;
use std::io;
use std::time::Duration;

use dlock_core::proto::{DATA_RESPONSE_WITH_VALUES_MAX, EVENTS_MAX};
use dlock_core::table::EVENT_RING_LEN;

pub use attach::{AttachRecord, RDMA_ATTACH_LEN, RDMA_ATTACH_MAGIC, RDMA_ATTACH_REPLY_LEN};
pub use client::{RdmaClient, Received};
pub use credit::CREDIT_RETURNS_INFLIGHT_MAX;
pub use endpoint::{ENDPOINT_LEN, Endpoint, ObjectTable};
pub use registered::{RdmaDevice, RegisteredRegion};
pub use server::{EventRoom, RdmaServer, ServerConnection};

/// The longest message either side sends: a `dlock-core` data response with its value and
/// proof trailers (2,744 bytes; requests are at most 2,000).
pub const MESSAGE_MAX: usize = DATA_RESPONSE_WITH_VALUES_MAX;

/// Bytes in one message buffer: the longest message rounded up to a cache line (2,752), so a
/// message never straddles a slot and slots stay cache-line aligned.
pub const SLOT_BYTES: usize = MESSAGE_MAX.next_multiple_of(64);

/// Messages a client may have sent without having taken their replies. Each side posts this
/// many receive buffers at the handshake, and a client refuses to send more, so a SEND never
/// arrives at a queue pair without a posted receive (which would stall it in RNR retries).
pub const MESSAGES_INFLIGHT_MAX: usize = 4;

/// Event messages the server may have sent a client beyond what the client has told it it
/// took. A client posts this many receive slots besides its [`MESSAGES_INFLIGHT_MAX`] for
/// replies, so an event never lands in a slot a reply needs (which would stall the reply in RNR
/// retries behind it).
///
/// Why two: the server keeps a client's events in its event ring in the region until it can
/// send them, at most [`EVENT_RING_LEN`] (64) and then one overflow entry, and one message
/// carries up to [`EVENTS_MAX`] (62) of them; two messages hold all of that. More slots would
/// only move events the ring already buffers into the client's memory; fewer would split a full
/// ring over a credit round trip. Credits (module doc of `client.rs`) come back with every
/// message the client sends, and in an empty SEND of their own when it has taken this many
/// without telling.
pub const EVENT_MESSAGES_INFLIGHT_MAX: usize = (EVENT_RING_LEN + 1).div_ceil(EVENTS_MAX);

static_assertions::const_assert_eq!(EVENT_MESSAGES_INFLIGHT_MAX, 2);
static_assertions::const_assert!(credit::CLIENT_RECV_SLOTS <= channel::RECV_SLOTS_MAX);
static_assertions::const_assert!(credit::SERVER_RECV_SLOTS <= channel::RECV_SLOTS_MAX);

/// Bytes in one object cell (an `AtomicU64`); RDMA atomics act on exactly 8 aligned bytes.
pub const CELL_BYTES: usize = 8;

static_assertions::const_assert!(MESSAGE_MAX <= SLOT_BYTES);
static_assertions::const_assert!(SLOT_BYTES.is_multiple_of(64));

/// How to open a device and how long to wait for a completion.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RdmaConfig {
    /// Kernel device name, as `ibv_devices` prints it (`mlx5_0`, `rxe0`, …).
    pub device: String,
    /// Physical port, counted from 1.
    pub port_num: u8,
    /// GID table index for the routing header. `None` uses no GID on InfiniBand and index 0 on
    /// Ethernet (RoCE), where a GID is required.
    pub gid_index: Option<u8>,
    /// How long one operation may wait for its completion (the reference's 5 s JFC poll).
    pub op_timeout: Duration,
}

impl RdmaConfig {
    /// Port 1, default GID choice, 5 s operation timeout.
    pub fn new(device: &str) -> Self {
        Self {
            device: device.to_owned(),
            port_num: 1,
            gid_index: None,
            op_timeout: Duration::from_secs(5),
        }
    }
}

/// What [`probe`] can tell about a device without opening it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Kernel device name (what [`RdmaConfig::device`] takes).
    pub name: String,
    /// Node GUID, if the device reports one.
    pub guid: Option<u64>,
    /// Stable kernel index, if the kernel reports one.
    pub index: Option<i32>,
}

/// Why an RDMA operation failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RdmaError {
    /// No RDMA device, or no RDMA support in the kernel: use TCP.
    NoDevice,
    /// Devices exist but none has this name.
    DeviceNotFound {
        /// The name asked for.
        name: String,
    },
    /// The port is not ACTIVE or ARMED (cable, subnet manager, or link down).
    PortNotActive {
        /// The port asked for.
        port_num: u8,
        /// `ibv_port_state` as the device reported it.
        state: u32,
    },
    /// The device cannot do remote atomics (`atomic_cap == IBV_ATOMIC_NONE`).
    NoAtomics,
    /// A verb returned an error.
    Verb {
        /// The failing verb, with the target state for `ibv_modify_qp`.
        verb: &'static str,
        /// The errno it reported (for `ibv_poll_cq`, its negated return value).
        errno: i32,
    },
    /// A work request completed with an error status.
    Completion {
        /// The work request's opcode (`IBV_WR_SEND`, `IBV_WR_ATOMIC_FETCH_AND_ADD`, …).
        op: &'static str,
        /// `ibv_wc_status`.
        status: u32,
        /// The vendor's error syndrome.
        vendor_err: u32,
    },
    /// No completion before the deadline.
    Timeout {
        /// What was being waited for.
        op: &'static str,
    },
    /// A previous operation failed or timed out with a work request still posted; the queue
    /// pair may be in the error state and its buffers may still be written, so the endpoint
    /// must be dropped and connected again.
    Poisoned,
    /// An operation that needs a connected queue pair ran before [`RdmaClient::handshake`].
    NotConnected,
    /// The peer's endpoint record is malformed.
    BadEndpoint(&'static str),
    /// A caller-supplied argument is out of range.
    InvalidArgument(&'static str),
    /// All [`MESSAGES_INFLIGHT_MAX`] messages are awaiting replies.
    Busy,
}

impl fmt::Display for RdmaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoDevice => f.write_str("no RDMA device (or no RDMA support in the kernel)"),
            Self::DeviceNotFound { name } => write!(f, "no RDMA device named {name:?}"),
            Self::PortNotActive { port_num, state } => {
                write!(f, "RDMA port {port_num} is not active (state {state})")
            }
            Self::NoAtomics => f.write_str("the RDMA device does not support remote atomics"),
            Self::Verb { verb, errno } => {
                write!(f, "{verb} failed: {}", io::Error::from_raw_os_error(*errno))
            }
            Self::Completion {
                op,
                status,
                vendor_err,
            } => write!(
                f,
                "{op} completed with status {status} ({}), vendor error {vendor_err:#x}",
                verbs::wc_status_str(*status)
            ),
            Self::Timeout { op } => write!(f, "no completion for {op} before the deadline"),
            Self::Poisoned => f.write_str("the RDMA endpoint failed earlier and must reconnect"),
            Self::NotConnected => f.write_str("the RDMA endpoint has not done its handshake"),
            Self::BadEndpoint(why) => write!(f, "bad RDMA endpoint record: {why}"),
            Self::InvalidArgument(why) => write!(f, "invalid argument: {why}"),
            Self::Busy => f.write_str("every RDMA message slot awaits a reply"),
        }
    }
}

impl std::error::Error for RdmaError {}

/// Lists the RDMA devices of this host.
///
/// Without RDMA support `ibv_get_device_list` fails with `ENOSYS` rather than returning an
/// empty list; both, and a missing sysfs class (`ENOENT`/`ENODEV`), are
/// [`RdmaError::NoDevice`]. Any other failure (for example `EPERM`) names the verb, because it
/// means RDMA exists but cannot be used by this process.
pub fn probe() -> Result<Vec<DeviceInfo>, RdmaError> {
    let list = ibverbs::devices().map_err(|e| device_list_error(&e))?;
    let devices: Vec<DeviceInfo> = list
        .iter()
        .map(|d| DeviceInfo {
            name: d
                .name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            guid: d.guid().ok().map(u64::from),
            index: d.index().ok(),
        })
        .collect();
    if devices.is_empty() {
        return Err(RdmaError::NoDevice);
    }
    Ok(devices)
}

/// Whether this host has at least one RDMA device (`probe().is_ok()`): the choice between the
/// RDMA and the TCP data path.
pub fn available() -> bool {
    probe().is_ok()
}

/// Maps a failed `ibv_get_device_list` to "no RDMA" or to a verb error.
fn device_list_error(e: &io::Error) -> RdmaError {
    const NO_RDMA: [i32; 3] = [libc::ENOSYS, libc::ENOENT, libc::ENODEV];
    match e.raw_os_error() {
        Some(errno) if NO_RDMA.contains(&errno) => RdmaError::NoDevice,
        _ if e.kind() == io::ErrorKind::Unsupported => RdmaError::NoDevice,
        Some(errno) => RdmaError::Verb {
            verb: "ibv_get_device_list",
            errno,
        },
        None => RdmaError::NoDevice,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_kernel_support_means_no_device() {
        for errno in [libc::ENOSYS, libc::ENOENT, libc::ENODEV] {
            let e = io::Error::from_raw_os_error(errno);
            assert_eq!(device_list_error(&e), RdmaError::NoDevice);
        }
    }

    #[test]
    fn permission_denied_names_the_verb() {
        let e = io::Error::from_raw_os_error(libc::EPERM);
        assert_eq!(
            device_list_error(&e),
            RdmaError::Verb {
                verb: "ibv_get_device_list",
                errno: libc::EPERM
            }
        );
    }

    #[test]
    fn errors_print_the_failing_verb() {
        let e = RdmaError::Verb {
            verb: "ibv_post_send",
            errno: libc::ENOMEM,
        };
        assert!(e.to_string().starts_with("ibv_post_send failed"));
    }
}
