//! What comes back from the data thread: replies written out, a registration binding its
//! connection (and closing the client's older one), an accepted data attach handed over to the
//! data thread, a refused one closed, and a gone client's connections marked as such.

use std::time::Instant;

use dlock_core::Peer;
use dlock_core::manager::retain::Role as RecoveryRole;
use dlock_core::server::{ControlConn, Counter};

use super::{Control, Role, SPARE_MAX};
use crate::runtime::exchange::{Handover, Job, JobKind};

impl Control<'_> {
    /// Takes every job the data thread sent back: replies, registrations, checked attaches,
    /// closes, and notices of gone clients.
    pub(super) fn drain_outbox(&mut self) {
        while let Some(job) = self.shared.exchange.outbox.pop() {
            if let JobKind::ClientGone { client } = job.kind {
                self.client_gone(client);
                continue;
            }
            if let JobKind::MovedToStream { client } = job.kind {
                // No connection of ours is the newest: the stream is.
                self.close_others(usize::MAX, client);
                continue;
            }
            let i = (job.conn & 0xFFFF_FFFF) as usize;
            let generation = (job.conn >> 32) as u32;
            let Some(c) = self
                .conns
                .get_mut(i)
                .and_then(Option::as_mut)
                .filter(|c| c.generation == generation)
            else {
                // The connection is gone. If this reply registered a client, nobody will hear
                // it: the connection's loss is that client's loss, as if it had been bound.
                if let JobKind::Registered { client } = job.kind {
                    let _ = self.submit(Job {
                        conn: job.conn,
                        kind: JobKind::Disconnected { client },
                        len: 0,
                        buf: Vec::new(),
                        peer: Peer::EXEMPT,
                        role: RecoveryRole::Client,
                    });
                }
                continue;
            };
            if std::mem::take(&mut c.in_flight) {
                self.in_flight -= 1;
            }
            match job.kind {
                JobKind::Control => c.wbuf.extend_from_slice(&job.buf[..job.len]),
                JobKind::Registered { client } => {
                    c.wbuf.extend_from_slice(&job.buf[..job.len]);
                    c.role = Role::Control(ControlConn::Bound(client));
                    c.gone = None;
                    self.close_others(i, client);
                }
                JobKind::Attached { ok } => {
                    self.attached(i, ok, job);
                    continue;
                }
                JobKind::Close => {
                    self.close(i);
                    continue;
                }
                JobKind::Nothing
                | JobKind::Attach { .. }
                | JobKind::Disconnected { .. }
                | JobKind::ClientGone { .. }
                | JobKind::MovedToStream { .. } => {}
            }
            if self.spare.len() < SPARE_MAX && !job.buf.is_empty() {
                self.spare.push(job.buf);
            }
            self.flush(i);
            // Read on: the socket is edge-triggered, and bytes may have waited while a whole
            // frame sat in the buffer.
            self.on_readable(i);
        }
    }

    /// The data thread checked the session of connection `i`'s attach (`ok`), whose record
    /// `job` brings back. An RDMA attach is answered (with the queue pair connected if the
    /// session was good) and closed: the queue pairs carry the rest. A TCP data attach is
    /// answered with its status, then handed over to the data thread or closed.
    fn attached(&mut self, i: usize, ok: bool, job: Job) {
        let Some(c) = self.conns.get_mut(i).and_then(Option::as_mut) else {
            return;
        };
        let Role::Attaching(client) = c.role else {
            return;
        };
        #[cfg(feature = "rdma")]
        if crate::runtime::rdma::is_attach(&job.buf[..job.len]) {
            crate::runtime::rdma::complete_attach(
                self.shared,
                &job.buf[..job.len],
                ok,
                &mut c.wbuf,
            );
            c.role = Role::Unknown;
            if self.spare.len() < SPARE_MAX {
                self.spare.push(job.buf);
            }
            self.flush(i);
            self.close(i);
            return;
        }
        let status: u32 = if ok {
            0
        } else {
            dlock_core::Status::ClientNotInit as u32
        };
        c.wbuf.extend_from_slice(&status.to_le_bytes());
        if self.spare.len() < SPARE_MAX {
            self.spare.push(job.buf);
        }
        self.flush(i);
        if ok {
            self.hand_over(i, client);
        } else {
            self.close(i);
        }
    }

    /// Hands data connection `i`, whose attach for `client` was accepted and answered, to the
    /// data thread, which reads and writes it from now on (and closes the client's older data
    /// connection, if any). Whatever was read past the attach, and whatever of the status the
    /// socket has not taken, goes along.
    fn hand_over(&mut self, i: usize, client: u32) {
        let Some(mut c) = self.conns.get_mut(i).and_then(Option::take) else {
            return;
        };
        let _ = self.poll.registry().deregister(c.stream.source());
        self.free.push(i);
        let peer = *c
            .peer
            .get_or_insert_with(|| super::identify(&c.stream, c.ip, &self.peers));
        let ex = &self.shared.exchange;
        // Relaxed: a count (see `open`); the queue push publishes the connection itself.
        ex.data_conns
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let handover = Handover {
            stream: c.stream,
            client,
            early: c.rbuf[..c.rlen].to_vec(),
            unsent: std::mem::take(&mut c.wbuf),
            peer,
        };
        if ex.handover.push(handover).is_err() {
            // Sized for every connection the cap allows, so this is a bug; the connection
            // closes (dropped here) and the client reconnects.
            ex.data_conns
                .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
            tracing::error!("data connection hand-over queue full");
            return;
        }
        self.shared.wake_data();
    }

    /// One control connection per client: the registration of `client` just accepted on
    /// connection `newest` replaces any other connection bound to it, gone or not (a client
    /// connects again when it reconnects after a network error, and a half-open old connection
    /// may not have been noticed yet). A linear scan: binding is rare next to requests.
    fn close_others(&mut self, newest: usize, client: u32) {
        for j in 0..self.conns.len() {
            let older = self.conns[j].as_ref().is_some_and(|c| {
                j != newest && matches!(c.role, Role::Control(conn) if conn.speaks_for(client))
            });
            if older {
                tracing::debug!(client, "a newer connection replaces this one");
                self.close(j);
            }
        }
    }

    /// Marks the control connection bound to `client`, which is no longer registered, as gone:
    /// from now on it holds its place like an unregistered connection (closed after the
    /// handshake timeout, first evicted at the cap), and its requests are answered
    /// `CLIENT_NOT_INIT` here (see `dispatch`). Its data connection is the data thread's, which
    /// closes it.
    fn client_gone(&mut self, client: u32) {
        let now = Instant::now();
        for j in 0..self.conns.len() {
            let Some(c) = self.conns[j].as_mut() else {
                continue;
            };
            let Role::Control(conn) = c.role else {
                continue;
            };
            if conn.serving() != Some(client) {
                continue;
            }
            self.shared.counters.bump(Counter::ConnectionsOfGoneClients);
            c.role = Role::Control(conn.client_gone(client));
            c.gone = Some(now);
        }
    }
}
