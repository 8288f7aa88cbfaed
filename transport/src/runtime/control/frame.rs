//! What a connection's next bytes are: a control frame, a data attach or a queue-pair attach,
//! whole or not yet; and, for a control connection, what the core's rules
//! (`dlock_core::server::control`) make of the frame.

use dlock_core::proto::{
    ATTACH_LEN, ATTACH_MAGIC, Attach, CONTROL_FRAME_MAX, CONTROL_MAGIC, ControlHeader, DecodeError,
    MsgType, control_frame_len, peek_control_header, peek_magic,
};
use dlock_core::server::{ControlAdmission, ControlConn};

use super::{Conn, Role};
use crate::runtime::exchange::JobKind;
use crate::runtime::stream::Stream;

/// What a plaintext server answers a TLS client with before it closes the connection: words,
/// whose first byte no TLS record starts with, so a dlock client reports "server speaks
/// plaintext, client TLS" (`tls::TlsFailure::ServerSpeaksPlaintext`) rather than a reset, and a
/// person trying `openssl s_client` reads why.
const PLAINTEXT_ONLY: &[u8] = b"dlock: this server speaks plaintext TCP, not TLS\n";

/// Before connection `c`, whose first bytes are no dlock frame, is closed: if it is a TLS
/// ClientHello on a plaintext listener, tells the client (best effort).
pub(super) fn tell_tls_client(c: &mut Conn) {
    let hello = c.role == Role::Unknown && c.rlen > 0 && c.rbuf[0] == 0x16;
    if let (true, Stream::Tcp(s)) = (hello, &mut c.stream) {
        use std::io::Write;
        let _ = s.write_all(PLAINTEXT_ONLY);
    }
}

/// What the next bytes of a connection are ([`frame`]).
#[derive(Debug)]
pub(super) enum Next {
    /// A job for the data thread: its kind, the frame's length, and the buffer size its reply
    /// needs.
    Job(JobKind, usize, usize),
    /// A control frame answered here (`ControlAdmission::AnswerGone`): its header and length.
    AnswerGone(ControlHeader, usize),
    /// A `Drain`, answered here (`drain.rs`): its header and length.
    Drain(ControlHeader, usize),
}

/// The next frame of `c` and what becomes of it; `Ok(None)` while incomplete, `Err` when the
/// bytes cannot be a frame or the core's rules close the connection.
pub(super) fn frame(c: &mut Conn) -> Result<Option<Next>, ()> {
    let buf = &c.rbuf[..c.rlen];
    let Some(magic) = peek_magic(buf) else {
        return Ok(None);
    };
    match c.role {
        Role::Unknown if magic == CONTROL_MAGIC => c.role = Role::Control(ControlConn::Unbound),
        Role::Unknown if magic == ATTACH_MAGIC => {
            if buf.len() < ATTACH_LEN {
                return Ok(None);
            }
            let Attach {
                client, session, ..
            } = Attach::decode(buf).map_err(|_| ())?;
            c.role = Role::Attaching(client);
            let kind = JobKind::Attach { client, session };
            return Ok(Some(Next::Job(kind, ATTACH_LEN, ATTACH_LEN)));
        }
        #[cfg(feature = "rdma")]
        Role::Unknown if magic == crate::rdma::RDMA_ATTACH_MAGIC => {
            use crate::rdma::{AttachRecord, RDMA_ATTACH_LEN};
            if buf.len() < RDMA_ATTACH_LEN {
                return Ok(None);
            }
            // A malformed endpoint closes the connection, as any bytes no frame starts with.
            let record = AttachRecord::from_bytes(&buf[..RDMA_ATTACH_LEN]).map_err(|_| ())?;
            c.role = Role::Attaching(record.client);
            // The data thread checks the session as for a TCP attach and hands the record back
            // unchanged in the job's buffer; the control thread then connects the queue pair.
            let kind = JobKind::Attach {
                client: record.client,
                session: record.session,
            };
            return Ok(Some(Next::Job(kind, RDMA_ATTACH_LEN, RDMA_ATTACH_LEN)));
        }
        Role::Unknown | Role::Attaching(_) => return Err(()),
        Role::Control(_) => {}
    }
    let buf = &c.rbuf[..c.rlen];
    match c.role {
        Role::Control(conn) => {
            let len = match control_frame_len(buf) {
                Ok(len) => len,
                Err(DecodeError::Truncated) => return Ok(None),
                Err(_) => return Err(()),
            };
            if buf.len() < len {
                return Ok(None);
            }
            let (h, _) = peek_control_header(buf).map_err(|_| ())?;
            match conn.admit(h.msg, h.word) {
                ControlAdmission::Run if h.msg == MsgType::Drain => Ok(Some(Next::Drain(h, len))),
                ControlAdmission::Run => {
                    Ok(Some(Next::Job(JobKind::Control, len, CONTROL_FRAME_MAX)))
                }
                ControlAdmission::AnswerGone => Ok(Some(Next::AnswerGone(h, len))),
                ControlAdmission::Close => Err(()),
            }
        }
        Role::Unknown | Role::Attaching(_) => Err(()),
    }
}
