//! Fetching the cluster's map from one server: `GetMap` chunk by chunk, reassembled and decoded
//! (`docs/cluster.md`, "Wire"). Map bytes that fail to decode are refused, never half-used:
//! [`Map::decode`] leaves the cached map as it was.

use std::io;
use std::time::Instant;

use dlock_core::Status;
use dlock_core::cluster::{MAP_ENCODED_MAX, Map, Partitions};
use dlock_core::proto::{
    CONTROL_FRAME_MAX, ControlHeader, ControlRequest, ControlRequestFrame, ControlResponse,
    MsgType, PROTO_VERSION_CLUSTER_MIN, decode_control_response, encode_control_request,
};

use crate::client::Connection;

/// How often a fetch starts over because the map changed between its chunks before it gives
/// up: a map changes when servers join or leave, far less often than four round trips take.
const RESTARTS_MAX: usize = 4;

/// The version of the map `conn`'s server has: its first `GetMap` chunk's, without the rest.
/// `client` as for [`fetch_map`].
pub(super) fn map_version<C: Connection>(
    conn: &mut C,
    client: u32,
    deadline: Instant,
    message_id: &mut u16,
) -> io::Result<u64> {
    let mut reply = vec![0u8; CONTROL_FRAME_MAX];
    chunk_at(conn, client, 0, &mut reply, deadline, message_id).map(|(version, ..)| version)
}

/// Asks for the chunk at `offset`; its map version, the map's total length, and the chunk's
/// bytes (in `reply`, at the returned range).
fn chunk_at<C: Connection>(
    conn: &mut C,
    client: u32,
    offset: u32,
    reply: &mut [u8],
    deadline: Instant,
    message_id: &mut u16,
) -> io::Result<(u64, Option<u32>, std::ops::Range<usize>)> {
    let mut req = [0u8; 32];
    *message_id = message_id.wrapping_add(1);
    let header = ControlHeader {
        // Every cluster server speaks it, and `GetMap` has not changed since.
        version: PROTO_VERSION_CLUSTER_MIN,
        msg: MsgType::GetMap,
        message_id: *message_id,
        word: client,
    };
    let body = ControlRequest::GetMap { offset };
    let n = encode_control_request(&ControlRequestFrame { header, body }, &mut req)
        .map_err(|_| invalid("a GetMap request could not be encoded"))?;
    let m = conn.control(&req[..n], reply, Some(deadline))?;
    let frame =
        decode_control_response(&reply[..m]).map_err(|_| invalid("a GetMap reply is malformed"))?;
    if frame.header.msg != MsgType::GetMap || frame.header.message_id != *message_id {
        return Err(invalid("a GetMap reply answers another request"));
    }
    let chunk = match (frame.header.status(), frame.body) {
        (Some(Status::Success), ControlResponse::MapChunk(c)) => c,
        (Some(Status::Einval), _) => {
            return Err(invalid(
                "the server has no cluster map (a standalone server?)",
            ));
        }
        _ => return Err(invalid("a GetMap reply carries no map chunk")),
    };
    if chunk.offset != offset || chunk.total_len as usize > MAP_ENCODED_MAX {
        return Err(invalid("a GetMap reply is not the chunk asked for"));
    }
    // The chunk is the reply's tail: where it starts in `reply`.
    let start = m - chunk.chunk.len();
    Ok((chunk.version, chunk.next_offset(), start..m))
}

/// The map `conn`'s server has, read by `GetMap` chunks until `deadline`. `InvalidData` when
/// the server answers anything but a well-formed chunk, or the bytes do not decode.
///
/// `client` is the client the connection speaks for: 0 on a connection that registered no
/// one, the client's id on one it registered or joined over. A server closes a control
/// connection bound to a client when a frame names anyone else (`dlock_core::server::
/// ControlConn`), so a `GetMap` naming 0 there cost the connection, and the request after it
/// failed on the dead connection.
pub(super) fn fetch_map<C: Connection>(
    conn: &mut C,
    client: u32,
    deadline: Instant,
    message_id: &mut u16,
) -> io::Result<Box<Map>> {
    let mut reply = vec![0u8; CONTROL_FRAME_MAX];
    for _ in 0..RESTARTS_MAX {
        let mut bytes: Vec<u8> = Vec::new();
        let mut first = None;
        let mut offset = 0u32;
        loop {
            let (version, next, range) =
                chunk_at(conn, client, offset, &mut reply, deadline, message_id)?;
            match first {
                None => first = Some(version),
                // The map changed between chunks: its bytes do not go together.
                Some(v) if v != version => break,
                Some(_) => {}
            }
            bytes.extend_from_slice(&reply[range]);
            match next {
                Some(next) => offset = next,
                None => return decode(&bytes, first),
            }
        }
    }
    Err(io::Error::new(
        io::ErrorKind::TimedOut,
        "the cluster map kept changing while it was read",
    ))
}

fn decode(bytes: &[u8], version: Option<u64>) -> io::Result<Box<Map>> {
    let mut map = Box::new(Map::new(Partitions::DEFAULT));
    Map::decode(bytes, &mut map).map_err(|_| invalid("the cluster map's bytes do not decode"))?;
    // The version a reply names and the one the bytes carry are one and the same map's.
    if Some(map.version()) != version {
        return Err(invalid(
            "the cluster map's version is not the one its server named",
        ));
    }
    Ok(map)
}

fn invalid(what: &'static str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}
