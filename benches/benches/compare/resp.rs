//! A minimal Redis client: RESP2 over one blocking `TcpStream`, enough for the five commands the
//! comparison sends (`PING`, `SET`, `INCR`, `SCRIPT LOAD`, `EVALSHA`) and for pipelining them.
//!
//! The `threads` driving's client, kept hand-written although the `redis` crate is now a
//! dev-dependency (for the async drivings): the README's earlier tables were measured with it, and
//! it talks as the `redis` crate's sync connection does (one `write` per flush, replies read
//! through a buffer) without that crate's conversion of every reply into a `redis::Value`. Nagle
//! is off, as in every driving here.

use std::io::{self, BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// How long one reply may take before the benchmark gives up on the server (bounds every loop),
/// in every driving.
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(5);

/// A reply, as far as these commands need one.
#[derive(Debug, PartialEq, Eq)]
pub enum Reply {
    /// `+OK`, `+PONG`.
    Simple(String),
    /// `:n`.
    Int(i64),
    /// `$n ...` (`None` is the nil bulk `$-1`, what `SET NX` answers when the key exists).
    Bulk(Option<Vec<u8>>),
    /// `-ERR ...`.
    Error(String),
}

/// One connection to a Redis server.
#[derive(Debug)]
pub struct Redis {
    stream: TcpStream,
    reader: BufReader<TcpStream>,
    out: Vec<u8>,
    line: Vec<u8>,
}

impl Redis {
    /// Connects to `addr` with Nagle off and a reply timeout.
    pub fn connect(addr: SocketAddr) -> io::Result<Redis> {
        let stream = TcpStream::connect_timeout(&addr, REPLY_TIMEOUT)?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(REPLY_TIMEOUT))?;
        stream.set_write_timeout(Some(REPLY_TIMEOUT))?;
        let reader = BufReader::with_capacity(16 * 1024, stream.try_clone()?);
        Ok(Redis {
            stream,
            reader,
            out: Vec::with_capacity(16 * 1024),
            line: Vec::with_capacity(64),
        })
    }

    /// Queues one command (an array of bulk strings); nothing is sent until [`Redis::flush`].
    pub fn push(&mut self, args: &[&[u8]]) {
        write_header(&mut self.out, b'*', args.len());
        for a in args {
            write_header(&mut self.out, b'$', a.len());
            self.out.extend_from_slice(a);
            self.out.extend_from_slice(b"\r\n");
        }
    }

    /// Sends every queued command in one write.
    pub fn flush(&mut self) -> io::Result<()> {
        self.stream.write_all(&self.out)?;
        self.out.clear();
        Ok(())
    }

    /// Reads the next reply.
    pub fn read(&mut self) -> io::Result<Reply> {
        self.line.clear();
        let n = self.reader.read_until(b'\n', &mut self.line)?;
        if n < 3 || !self.line.ends_with(b"\r\n") {
            return Err(bad("truncated reply line"));
        }
        let body = &self.line[1..n - 2];
        let text = || String::from_utf8_lossy(body).into_owned();
        match self.line[0] {
            b'+' => Ok(Reply::Simple(text())),
            b'-' => Ok(Reply::Error(text())),
            b':' => Ok(Reply::Int(parse_int(body)?)),
            b'$' => {
                let len = parse_int(body)?;
                if len < 0 {
                    return Ok(Reply::Bulk(None));
                }
                let mut v = vec![0; len as usize + 2];
                io::Read::read_exact(&mut self.reader, &mut v)?;
                v.truncate(len as usize);
                Ok(Reply::Bulk(Some(v)))
            }
            _ => Err(bad("reply type this client does not read")),
        }
    }

    /// Sends one command and reads its reply.
    pub fn call(&mut self, args: &[&[u8]]) -> io::Result<Reply> {
        self.push(args);
        self.flush()?;
        self.read()
    }

    /// `SCRIPT LOAD`: the script's SHA1, for `EVALSHA`.
    pub fn script_load(&mut self, script: &str) -> io::Result<String> {
        match self.call(&[b"SCRIPT", b"LOAD", script.as_bytes()])? {
            Reply::Bulk(Some(sha)) => String::from_utf8(sha).map_err(|_| bad("SHA not UTF-8")),
            r => Err(bad(&format!("SCRIPT LOAD answered {r:?}"))),
        }
    }
}

/// An unexpected reply, as an error the benchmark reports.
pub fn bad(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_string())
}

fn write_header(out: &mut Vec<u8>, kind: u8, n: usize) {
    out.push(kind);
    // Formatting into a Vec cannot fail.
    let _ = write!(out, "{n}\r\n");
}

fn parse_int(body: &[u8]) -> io::Result<i64> {
    std::str::from_utf8(body)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad("not an integer"))
}
