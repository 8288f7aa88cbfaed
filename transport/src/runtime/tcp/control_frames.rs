//! Control frames over a TCP data connection: a multiplexing client's members register, beat
//! their hearts, name locks and read the counters over the connection they share (`tcp.rs`'s
//! module doc), under the core's rules for a stream (`dlock_core::server::control`,
//! `Server::control_on_stream`). This file frames them and moves their bytes.

use dlock_core::proto::{CONTROL_FRAME_MAX, DecodeError, control_frame_len};
use dlock_core::server::{Routing, Server, StreamControlled};

use super::{DataConn, DataConns, READ_BUF, write_buf};

// An empty write buffer always has room for the largest control reply: a control frame waiting
// for room waits only for the buffer to drain.
static_assertions::const_assert!(write_buf(1) >= CONTROL_FRAME_MAX);

impl DataConn {
    /// Grows the read buffer to hold a control frame of `len` bytes besides a read's worth of
    /// data messages (once: the first control frame that does not fit).
    fn fit_frame(&mut self, len: usize) {
        if self.rbuf.len() < len {
            let mut bigger = vec![0u8; CONTROL_FRAME_MAX.max(len) + READ_BUF].into_boxed_slice();
            bigger[..self.rlen].copy_from_slice(&self.rbuf[..self.rlen]);
            self.rbuf = bigger;
        }
    }
}

/// What became of a control frame at the front of a connection's unread bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub(super) enum Framed {
    /// Run and answered; it took this many bytes.
    Done(usize),
    /// Not whole yet: read more.
    Incomplete,
    /// Whole, but the write buffer has no room for its reply yet: write first.
    NoRoom,
    /// No control frame, or one the connection may not send: close it.
    Close,
}

impl DataConns<'_> {
    /// The control frame of a member at `c.rbuf[at..]`: framed, run under the core's rules for
    /// a stream (`Server::control_on_stream`), and answered in the write buffer; a registration
    /// it made routed as one over a control connection is.
    pub(super) fn control(
        &mut self,
        c: &mut DataConn,
        i: u32,
        at: usize,
        server: &mut Server<'_>,
        routing: &mut Routing<'_>,
        now: u64,
    ) -> Framed {
        let len = match control_frame_len(&c.rbuf[at..c.rlen]) {
            Ok(len) => len,
            Err(DecodeError::Truncated) => return Framed::Incomplete,
            Err(_) => return Framed::Close,
        };
        if at + len > c.rlen {
            c.fit_frame(len);
            return Framed::Incomplete;
        }
        if !c.make_room(CONTROL_FRAME_MAX) {
            return Framed::NoRoom;
        }
        let req = &c.rbuf[at..at + len];
        if super::super::data::is_stats_request(req) {
            self.shared.counters.copy_into(server);
        }
        let out = &mut c.wbuf[c.wend..c.wend + CONTROL_FRAME_MAX];
        let (n, registered, vacated) =
            match server.control_on_stream(routing, (i, c.generation), c.peer, req, out, now) {
                StreamControlled::Refused => return Framed::Close,
                StreamControlled::Replied {
                    len,
                    registered,
                    vacated,
                } => (len, registered, vacated),
            };
        c.reply_written(n);
        if let Some(r) = registered {
            super::super::data::registered(self.shared, routing, r);
            super::super::data::moved_to_stream(self.shared, r.client);
            c.fit_members(routing.members(i));
        }
        if let Some(old) = vacated {
            self.close(old as usize, server, routing, now);
        }
        Framed::Done(len)
    }
}
