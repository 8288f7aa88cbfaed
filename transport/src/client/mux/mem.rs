//! An in-memory connection for the hand-off's tests and loom models: what the hub writes
//! collects on the server's side, and what the test answers is read on the hub's. Built on the
//! `sync` facade, so the same pipe runs under loom.

use std::io;
use std::sync::PoisonError;
use std::time::Instant;

use dlock_core::proto::{control_frame_len, peek_data_header};

use super::hub::{Pipe, Wait};
use crate::sync::{Condvar, Mutex, MutexGuard};

/// Both directions of an in-memory connection.
#[derive(Debug, Default)]
pub struct MemPipe {
    state: Mutex<MemState>,
    cv: Condvar,
}

#[derive(Debug, Default)]
struct MemState {
    /// Written by the hub, not yet taken by the server.
    to_server: Vec<u8>,
    /// Answered by the server, not yet read by the hub.
    to_client: Vec<u8>,
    shut: bool,
}

impl MemPipe {
    fn lock(&self) -> MutexGuard<'_, MemState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The server's side: waits for one whole request and answers it with the same bytes (a
    /// reply has a request's framing: header, then one 32-byte entry per command). `None` once
    /// the connection is shut.
    pub fn echo_one(&self) -> Option<Vec<u8>> {
        let mut s = self.lock();
        loop {
            if let Ok((_, len)) = peek_data_header(&s.to_server)
                && s.to_server.len() >= len
            {
                let msg: Vec<u8> = s.to_server.drain(..len).collect();
                s.to_client.extend_from_slice(&msg);
                drop(s);
                self.cv.notify_all();
                return Some(msg);
            }
            if s.shut {
                return None;
            }
            s = self.cv.wait(s).unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// The server's side: waits for one whole control request and takes it, unanswered.
    /// `None` once the connection is shut.
    pub fn take_control(&self) -> Option<Vec<u8>> {
        let mut s = self.lock();
        loop {
            if let Ok(len) = control_frame_len(&s.to_server)
                && s.to_server.len() >= len
            {
                return Some(s.to_server.drain(..len).collect());
            }
            if s.shut {
                return None;
            }
            s = self.cv.wait(s).unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// The server's side: sends `bytes` to the hub.
    pub fn answer(&self, bytes: &[u8]) {
        self.lock().to_client.extend_from_slice(bytes);
        self.cv.notify_all();
    }

    /// The server closes the connection: the hub's reads end.
    pub fn close(&self) {
        self.lock().shut = true;
        self.cv.notify_all();
    }
}

impl Pipe for MemPipe {
    fn read(&self, out: &mut [u8], wait: Wait) -> io::Result<usize> {
        let mut s = self.lock();
        loop {
            if !s.to_client.is_empty() {
                let n = s.to_client.len().min(out.len());
                out[..n].copy_from_slice(&s.to_client[..n]);
                s.to_client.drain(..n);
                return Ok(n);
            }
            if s.shut {
                return Ok(0);
            }
            s = match wait {
                Wait::Look => return Err(io::ErrorKind::WouldBlock.into()),
                Wait::Until(None) => self.cv.wait(s).unwrap_or_else(PoisonError::into_inner),
                Wait::Until(Some(d)) => {
                    let Some(left) = d.checked_duration_since(Instant::now()) else {
                        return Err(io::ErrorKind::TimedOut.into());
                    };
                    self.cv
                        .wait_timeout(s, left)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0
                }
            };
        }
    }

    fn write_all(&self, bytes: &[u8]) -> io::Result<()> {
        let mut s = self.lock();
        if s.shut {
            return Err(io::ErrorKind::BrokenPipe.into());
        }
        s.to_server.extend_from_slice(bytes);
        drop(s);
        self.cv.notify_all();
        Ok(())
    }

    fn shutdown(&self) {
        self.lock().shut = true;
        self.cv.notify_all();
    }
}
