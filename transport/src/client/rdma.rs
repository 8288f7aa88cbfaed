//! The client's RDMA data path (feature `rdma`): attaching a queue pair after registration, data
//! messages over it, and the `umo_atomic64` operations as one-sided verbs on the server's object
//! cells.
//!
//! Falling back is the rule, not the exception: when the device does not open (no device, no
//! kernel support, port down), when the server has no RDMA, or when the queue pair does not
//! connect, the client logs why (`tracing` warning) and uses a TCP data connection instead;
//! [`super::Client::transport`] tells which one it got. Only a refused session fails the
//! attach, exactly as a refused TCP attach does.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use crossbeam_utils::Backoff;
use dlock_core::proto::{CommandResult, ObjectOp};
use dlock_core::{Session, Status};

use crate::rdma::{
    AttachRecord, ENDPOINT_LEN, Endpoint as QpEndpoint, RdmaClient, RdmaConfig, RdmaError,
};

/// How long the attach exchange may take on the TCP side (as for a TCP data attach).
const ATTACH_TIMEOUT: Duration = Duration::from_secs(5);

/// Opens `cfg`'s device, trades endpoints with the server at `addr` and connects the queue pair.
/// `Ok(None)`: RDMA is not to be had (logged); use TCP. `Err`: the server refused the session.
pub(super) fn attach(
    addr: SocketAddr,
    cfg: &RdmaConfig,
    client: u32,
    session: Session,
) -> io::Result<Option<RdmaClient>> {
    let mut qp = match RdmaClient::connect(cfg) {
        Ok(qp) => qp,
        Err(e) => {
            tracing::warn!(
                device = %cfg.device,
                error = %e,
                "RDMA unavailable; using TCP for data messages"
            );
            return Ok(None);
        }
    };
    let server = match exchange(addr, client, session, qp.endpoint()) {
        Ok(Some(server)) => server,
        Ok(None) => return Ok(None),
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => return Err(e),
        Err(e) => {
            tracing::warn!(%addr, error = %e, "RDMA attach failed; using TCP for data messages");
            return Ok(None);
        }
    };
    if let Err(e) = qp.handshake(&server) {
        tracing::warn!(
            device = %cfg.device,
            error = %e,
            "RDMA queue pair did not connect; using TCP for data messages"
        );
        return Ok(None);
    }
    tracing::info!(device = %cfg.device, client, "RDMA data path connected");
    Ok(Some(qp))
}

/// The attach exchange over TCP (`rdma/attach.rs` has the format): the server's endpoint,
/// `Ok(None)` if the server has no RDMA for us, `PermissionDenied` if it refused the session.
fn exchange(
    addr: SocketAddr,
    client: u32,
    session: Session,
    endpoint: QpEndpoint,
) -> io::Result<Option<QpEndpoint>> {
    let mut s = TcpStream::connect(addr)?;
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(ATTACH_TIMEOUT))?;
    let record = AttachRecord {
        client,
        session,
        endpoint,
    };
    s.write_all(&record.to_bytes())?;
    let mut status = [0u8; 4];
    if let Err(e) = s.read_exact(&mut status) {
        // A server built without RDMA closes on the unknown magic.
        tracing::warn!(%addr, error = %e, "server does not speak RDMA; using TCP for data messages");
        return Ok(None);
    }
    let code = u32::from_le_bytes(status);
    if code == Status::ClientNotInit as u32 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            "RDMA data channel refused: unknown client or wrong session",
        ));
    }
    if code != Status::Success as u32 {
        let why = u16::try_from(code)
            .ok()
            .and_then(Status::from_code)
            .map_or("an unknown status", Status::name);
        tracing::warn!(%addr, status = why, "server offers no RDMA; using TCP for data messages");
        return Ok(None);
    }
    let mut record = [0u8; ENDPOINT_LEN];
    s.read_exact(&mut record)?;
    let server = QpEndpoint::from_bytes(&record).map_err(invalid)?;
    if server.objects.is_none() {
        return Err(invalid(RdmaError::BadEndpoint(
            "the server advertised no object table",
        )));
    }
    Ok(Some(server))
}

fn invalid(e: RdmaError) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

/// Sends a data message (1..=1,008 bytes) on the queue pair.
pub(super) fn send(qp: &mut RdmaClient, req: &[u8]) -> io::Result<()> {
    qp.post_send(req).map_err(io::Error::other)
}

/// Takes the next reply, waiting until `deadline` (`None`: forever; passed: one look). Busy-polls
/// the completion queue with backoff (spin, then yield): a reply lands in memory without any
/// interrupt that could wake a sleeping thread.
pub(super) fn recv(
    qp: &mut RdmaClient,
    reply: &mut [u8],
    deadline: Option<Instant>,
) -> io::Result<Option<usize>> {
    let backoff = Backoff::new();
    loop {
        if let Some(n) = qp.poll(reply).map_err(io::Error::other)? {
            return Ok(Some(n));
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Ok(None);
        }
        backoff.snooze();
    }
}

/// One object operation as a one-sided verb on cell `cell` of the server's object table: FAA,
/// CAS (which returns the value it found, so success is `found == expected`) or an 8-byte READ.
/// A failed verb is the caller's transport failure.
pub(super) fn object_op(
    qp: &mut RdmaClient,
    cell: u32,
    op: ObjectOp,
    a: u64,
    b: u64,
) -> io::Result<CommandResult> {
    let done = match op {
        ObjectOp::Faa => qp.fetch_add(cell, a).map(super::objects::ok),
        ObjectOp::Cas => qp.compare_swap(cell, a, b).map(|found| {
            if found == a {
                super::objects::ok(found)
            } else {
                CommandResult {
                    status: Status::ObjectCasFailed,
                    word: 0,
                    aux: found,
                }
            }
        }),
        ObjectOp::Snapshot => qp.read(cell).map(super::objects::ok),
    };
    done.map_err(|e| {
        tracing::debug!(error = %e, cell, "one-sided object operation failed");
        io::Error::other(e)
    })
}
