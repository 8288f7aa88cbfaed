//! `Drain` (`dlock drain`): an operator asks a cluster server to give every partition it owns
//! away. The control thread answers it itself rather than hand it to the data thread: only this
//! thread knows who the peer is, and the request is for the membership (which answers at once,
//! `runtime::membership`), never for the state machine.
//!
//! Who may ask: a drain stops nothing by itself (the partitions' new owners serve them after
//! the clients' re-claims) but it moves a whole server's load and pauses its partitions for a
//! moment, so it is an administrator's, not any client's. It is answered `Success` only to a
//! peer that already holds as much power over the server:
//!
//! | the connection | trusted | why |
//! |---|---|---|
//! | Unix socket | yes | owner-only (0600): whoever connects can map the region and act as any local client, or signal the server (SIGUSR1 drains too) |
//! | TLS with a verified client certificate | yes | the operator's CA vouched for the peer, as for every client of a TLS server |
//! | plaintext TCP from a loopback address | yes | someone on the server's host (as `kill -USR1`) |
//! | plaintext TCP from elsewhere | no: `Einval` | anyone on the network can open a connection; a plaintext server authenticates nobody |
//!
//! A standalone server answers `Einval`: it has no cluster to give partitions to.

use dlock_core::Status;
use dlock_core::proto::{ControlHeader, ControlResponse, EncodeError, encode_control_response};

use super::Conn;
use crate::runtime::Shared;
use crate::runtime::stream::Stream;

/// Asks the membership to drain this server if `c`'s peer may (module doc); the status to
/// answer with.
pub(super) fn answer(shared: &Shared, c: &Conn) -> Status {
    let Some(cluster) = &shared.cluster else {
        return Status::Einval;
    };
    if !trusted(c) {
        tracing::warn!(peer = ?c.ip, "drain refused: not a local or TLS-authenticated peer");
        return Status::Einval;
    }
    tracing::info!(peer = ?c.ip, "drain asked: the coordinator moves this server's partitions away");
    cluster.membership.drain();
    Status::Success
}

/// Whether `c`'s peer is trusted with the server's administration (module doc).
fn trusted(c: &Conn) -> bool {
    match &c.stream {
        Stream::Unix(_) => true,
        Stream::Tls(_, tls) => tls.peer_key_info().is_some(),
        Stream::Tcp(_) => c.ip.is_some_and(|ip| ip.to_canonical().is_loopback()),
    }
}

/// Writes into `out` the answer to the drain with header `header`: `status`, an empty body.
pub(super) fn reply(
    header: &ControlHeader,
    status: Status,
    out: &mut [u8],
) -> Result<usize, EncodeError> {
    let reply = ControlHeader {
        word: status as u32,
        ..*header
    };
    encode_control_response(&reply, &ControlResponse::Empty, out)
}
