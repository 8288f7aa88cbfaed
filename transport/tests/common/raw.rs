//! The wire protocol spoken by hand, for tests that must send what the client never would (a
//! guessed session, half a frame) or see exactly what the server answers. Each test file uses
//! a different subset, hence the allow.
#![allow(dead_code)]

use std::io::{Read, Write};

use dlock_core::Status;
use dlock_core::proto::{
    ControlHeader, ControlRequest, ControlRequestFrame, ControlResponse, InitReply, PROTO_VERSION,
    control_frame_len, decode_control_response, encode_control_request,
};

/// The bytes of one control request speaking for `word` (a client id, or 0 before registering).
pub fn control_frame(word: u32, body: ControlRequest<'_>) -> Vec<u8> {
    let header = ControlHeader {
        version: PROTO_VERSION,
        msg: body.msg_type(),
        message_id: 1,
        word,
    };
    let mut buf = vec![0u8; 4096];
    let n = encode_control_request(&ControlRequestFrame { header, body }, &mut buf)
        .expect("a frame the encoder takes");
    buf.truncate(n);
    buf
}

/// Reads one whole control frame off `s`; `None` if the stream ends (or times out) first.
pub fn read_control(s: &mut impl Read) -> Option<Vec<u8>> {
    let mut h = [0u8; 16];
    s.read_exact(&mut h).ok()?;
    let len = control_frame_len(&h).ok()?;
    let mut v = h.to_vec();
    v.resize(len, 0);
    s.read_exact(&mut v[16..]).ok()?;
    Some(v)
}

/// One control exchange on `s`: the reply frame, or `None` if the server closed instead.
pub fn control(
    s: &mut (impl Read + Write),
    word: u32,
    body: ControlRequest<'_>,
) -> Option<Vec<u8>> {
    s.write_all(&control_frame(word, body)).ok()?;
    read_control(s)
}

/// Registers on `s` asking for `lease_ms`: the server's reply, or the status it refused with.
pub fn register(s: &mut (impl Read + Write), lease_ms: u32) -> Result<InitReply, Status> {
    let init = ControlRequest::ClientInit {
        min_version: PROTO_VERSION,
        lease_ms,
    };
    let reply = control(s, 0, init).ok_or(Status::BadResponse)?;
    let reply = decode_control_response(&reply).map_err(|_| Status::BadResponse)?;
    match (reply.header.status(), reply.body) {
        (_, ControlResponse::Init(init)) => Ok(init),
        (Some(status), _) => Err(status),
        (None, _) => Err(Status::BadResponse),
    }
}
