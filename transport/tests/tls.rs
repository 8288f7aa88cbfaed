//! The TLS building blocks plugged in the way the control thread will use them: a mio event
//! loop (edge-triggered readiness) driving `ServerTls` on mio sockets, counting refusals per
//! kind, with blocking clients from `connect_client`.

// Only `common::certs` is used here.
#[allow(dead_code)]
mod common;

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::thread;
use std::time::{Duration, Instant};

use common::certs::{Ca, TempDir};
use dlock_transport::tls::{
    HandshakeRefusal, ServerTls, TlsConfig, client_config, connect_client, server_config,
};
use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token};

const LISTENER: Token = Token(0);
const TIMEOUT: Duration = Duration::from_secs(10);

/// What the server saw once `connections` connections ended.
#[derive(Debug, Default)]
struct Seen {
    identities: Vec<String>,
    refusals: [u64; HandshakeRefusal::COUNT],
}

/// An echo server over one mio poll loop, serving `connections` connections then returning.
fn serve(config: TlsConfig, connections: usize) -> (SocketAddr, thread::JoinHandle<Seen>) {
    let tls = server_config(&config).expect("server config");
    let mut listener = TcpListener::bind("127.0.0.1:0".parse().expect("addr")).expect("bind");
    let addr = listener.local_addr().expect("local addr");
    let handle = thread::spawn(move || {
        let mut poll = Poll::new().expect("poll");
        poll.registry()
            .register(&mut listener, LISTENER, Interest::READABLE)
            .expect("register listener");
        let mut events = Events::with_capacity(16);
        let mut conns: HashMap<Token, Conn> = HashMap::new();
        let mut seen = Seen::default();
        let mut ended = 0;
        let mut next = 1;
        let deadline = Instant::now() + TIMEOUT;
        while ended < connections {
            assert!(Instant::now() < deadline, "server loop timed out: {seen:?}");
            poll.poll(&mut events, Some(Duration::from_millis(100)))
                .expect("poll");
            for event in &events {
                if event.token() == LISTENER {
                    while let Ok((mut sock, _)) = listener.accept() {
                        let token = Token(next);
                        next += 1;
                        poll.registry()
                            .register(&mut sock, token, Interest::READABLE | Interest::WRITABLE)
                            .expect("register connection");
                        let conn = ServerTls::new(tls.clone()).expect("server connection");
                        conns.insert(
                            token,
                            Conn {
                                sock,
                                tls: conn,
                                pending: Vec::new(),
                            },
                        );
                    }
                    continue;
                }
                let Some(conn) = conns.get_mut(&event.token()) else {
                    continue;
                };
                if drive(conn, &mut seen) {
                    let mut conn = conns.remove(&event.token()).expect("connection");
                    poll.registry()
                        .deregister(&mut conn.sock)
                        .expect("deregister");
                    ended += 1;
                }
            }
        }
        seen
    });
    (addr, handle)
}

/// One connection of the echo server.
struct Conn {
    sock: TcpStream,
    tls: ServerTls,
    /// Plaintext read but not yet taken by rustls (its send buffer is bounded).
    pending: Vec<u8>,
}

/// Runs one connection as far as it can go without blocking: echoes what it reads, stops
/// reading while the echo cannot be sent (back-pressure), and relies on the edge-triggered
/// readable/writable events to be called again. True once the connection ended.
fn drive(conn: &mut Conn, seen: &mut Seen) -> bool {
    let mut buf = [0u8; 512];
    loop {
        while !conn.pending.is_empty() {
            let n = conn.tls.write_plain(&conn.pending).expect("queue echo");
            conn.pending.drain(..n);
            if !conn.tls.flush(&mut conn.sock).expect("flush") {
                return false; // socket full: wait for write readiness
            }
        }
        match conn.tls.read_plain(&mut conn.sock, &mut buf) {
            Ok(0) => {
                seen.identities
                    .push(conn.tls.peer_identity().unwrap_or_default());
                return true;
            }
            Ok(n) => conn.pending.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                // Handshake messages are queued by reads: send them.
                conn.tls.flush(&mut conn.sock).expect("flush");
                return false;
            }
            Err(e) => {
                let refusal = conn.tls.refusal().unwrap_or(HandshakeRefusal::Other);
                eprintln!("refused: {e}");
                seen.refusals[refusal.index()] += 1;
                return true;
            }
        }
    }
}

fn connect(addr: SocketAddr, client: &TlsConfig) -> io::Result<impl Read + Write> {
    let sock = std::net::TcpStream::connect(addr)?;
    sock.set_read_timeout(Some(TIMEOUT))?;
    connect_client(sock, client_config(client)?, "localhost")
}

#[test]
fn mio_server_echoes_for_good_clients_and_counts_a_foreign_one() {
    let dir = TempDir::new("mio");
    let ca = Ca::new(&dir, "ca");
    let server = ca.server(&dir, "server");
    let alice = ca.client(&dir, "alice", "alice");
    let other = Ca::new(&dir, "other");
    let mallory = other.client(&dir, "mallory", "mallory");
    let (addr, handle) = serve(TlsConfig::new(&server.cert, &server.key, &ca.cert), 3);

    let good = TlsConfig::new(&alice.cert, &alice.key, &ca.cert);
    let mut first = connect(addr, &good).expect("alice accepted");
    let mut second = connect(addr, &good).expect("alice accepted twice");
    // Large enough to take several records and several readiness events each way.
    let message: Vec<u8> = (0..64 * 1024).map(|i| (i % 251) as u8).collect();
    for stream in [&mut first, &mut second] {
        stream.write_all(&message).expect("write");
        let mut echo = vec![0u8; message.len()];
        stream.read_exact(&mut echo).expect("echo");
        assert!(echo == message, "echo differs");
    }
    drop(first);
    drop(second);

    let foreign = TlsConfig::new(&mallory.cert, &mallory.key, &ca.cert);
    let error = connect(addr, &foreign).err().expect("mallory refused");
    assert_eq!(error.kind(), io::ErrorKind::PermissionDenied, "{error}");
    assert!(error.to_string().contains("refused by server"), "{error}");

    let seen = handle.join().expect("server thread");
    assert_eq!(seen.identities, ["alice", "alice"]);
    let mut expected = [0; HandshakeRefusal::COUNT];
    expected[HandshakeRefusal::UnknownCa.index()] = 1;
    assert_eq!(seen.refusals, expected);
}
