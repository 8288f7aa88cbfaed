//! The recoverer's calls: `recovery_done(dead)` releases the locks a dead client retains once
//! its work is replayed, and `list_retained` pages through what dead clients retain
//! (`dlock_core::manager::retain`). Both need the recoverer role, which the server gives a
//! connection by its configuration (`runtime::Recoverers`: a TLS certificate name, a plaintext
//! address, local clients), never by anything the client sends; without it the server answers
//! `Einval` and counts the refusal (`recovery_done_refused`).
//!
//! The free functions need no registration (as `read_server_stats`): a recovery tool connects,
//! asks and leaves. [`Client::recovery_done`] and [`Client::list_retained`] ask over a
//! registered client's control connection, for an engine whose own node is the recoverer.

use std::time::{Duration, Instant};

use dlock_core::proto::{
    CONTROL_FRAME_MAX, ControlHeader, ControlRequest, ControlRequestFrame, ControlResponse,
    ListRetained, PROTO_VERSION, decode_control_response, encode_control_request,
};
use dlock_core::{LockKind, Mode, Status};

use super::error::Op;
use super::link::{Endpoint, Link};
use super::{Client, Connection, Error};

/// One lock a dead client retains.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RetainedLock {
    /// The dead client.
    pub client: u32,
    /// The lock's id on the server.
    pub lock: u32,
    /// The lock's kind.
    pub kind: LockKind,
    /// The mode it retains.
    pub mode: Mode,
    /// The lock's name.
    pub name: Vec<u8>,
}

/// What one reply said, copied out of its frame.
enum Answer {
    Released(u32),
    Page(Vec<RetainedLock>, u64),
}

/// Reads a reply to `op`: its body, or its status as the error.
fn answer(op: Op, body: Result<ControlResponse<'_>, Error>) -> Result<Answer, Error> {
    match body? {
        ControlResponse::Released { locks } => Ok(Answer::Released(locks)),
        ControlResponse::Retained(page) => Ok(Answer::Page(
            page.entries
                .iter()
                .map(|e| RetainedLock {
                    client: e.client,
                    lock: e.lock,
                    kind: e.kind,
                    mode: e.mode,
                    name: e.name.to_vec(),
                })
                .collect(),
            page.next,
        )),
        _ => Err(op.err(Status::BadResponse)),
    }
}

/// One request `body` for `op` on `link`, without a registration.
fn exchange(
    link: &mut Link,
    op: Op,
    body: ControlRequest<'_>,
    timeout: Duration,
) -> Result<Answer, Error> {
    let header = ControlHeader {
        version: PROTO_VERSION,
        msg: body.msg_type(),
        message_id: 1,
        word: 0,
    };
    let mut req = [0u8; 64];
    let frame = ControlRequestFrame { header, body };
    let n = encode_control_request(&frame, &mut req).map_err(|_| op.err(Status::Einval))?;
    let mut reply = vec![0u8; CONTROL_FRAME_MAX];
    let m = link
        .control(&req[..n], &mut reply, Some(Instant::now() + timeout))
        .map_err(|e| op.io(e))?;
    let reply = decode_control_response(&reply[..m]).map_err(|_| op.err(Status::BadResponse))?;
    let body = match reply.header.status() {
        Some(Status::Success) => Ok(reply.body),
        Some(s) => Err(op.err(s)),
        None => Err(op.err(Status::BadResponse)),
    };
    answer(op, body)
}

/// Pages through every retained lock, asking with `ask` (cursor → answer).
fn all_pages(
    op: Op,
    mut ask: impl FnMut(u64) -> Result<Answer, Error>,
) -> Result<Vec<RetainedLock>, Error> {
    let (mut all, mut cursor) = (Vec::new(), 0);
    loop {
        match ask(cursor)? {
            Answer::Page(page, next) => {
                all.extend(page);
                if next == 0 {
                    return Ok(all);
                }
                cursor = next;
            }
            Answer::Released(_) => return Err(op.err(Status::BadResponse)),
        }
    }
}

/// Releases the locks dead client `dead` retains, on the server at `endpoint`, without
/// registering; returns how many were released. `Einval` without the recoverer role (and for
/// a live client), `ClientNotInit` for an id no client has.
pub fn recovery_done(endpoint: &Endpoint, dead: u32, timeout: Duration) -> Result<u32, Error> {
    let op = Op::RecoveryDone;
    let mut link = Link::connect(endpoint).map_err(|e| op.io(e))?;
    match exchange(
        &mut link,
        op,
        ControlRequest::RecoveryDone { dead },
        timeout,
    )? {
        Answer::Released(n) => Ok(n),
        Answer::Page(..) => Err(op.err(Status::BadResponse)),
    }
}

/// Every lock dead clients retain (of `client` only, unless 0) on the server at `endpoint`,
/// without registering. `Einval` without the recoverer role.
pub fn list_retained(
    endpoint: &Endpoint,
    client: u32,
    timeout: Duration,
) -> Result<Vec<RetainedLock>, Error> {
    let op = Op::ListRetained;
    let mut link = Link::connect(endpoint).map_err(|e| op.io(e))?;
    all_pages(op, |cursor| {
        let q = ListRetained { client, cursor };
        exchange(&mut link, op, ControlRequest::ListRetained(q), timeout)
    })
}

impl<C: Connection> Client<C> {
    /// [`recovery_done`] over this client's control connection: this node replayed dead client
    /// `dead`'s work. Needs the recoverer role on this client's connection.
    pub fn recovery_done(&mut self, dead: u32) -> Result<u32, Error> {
        let op = Op::RecoveryDone;
        let body = self.control(op, self.id.get(), ControlRequest::RecoveryDone { dead });
        match answer(op, body)? {
            Answer::Released(n) => Ok(n),
            Answer::Page(..) => Err(op.err(Status::BadResponse)),
        }
    }

    /// [`list_retained`] over this client's control connection.
    pub fn list_retained(&mut self, client: u32) -> Result<Vec<RetainedLock>, Error> {
        let op = Op::ListRetained;
        let id = self.id.get();
        all_pages(op, |cursor| {
            let q = ListRetained { client, cursor };
            answer(op, self.control(op, id, ControlRequest::ListRetained(q)))
        })
    }
}
