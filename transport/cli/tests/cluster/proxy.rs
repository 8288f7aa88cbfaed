//! A TCP proxy on loopback between one server and etcd, which the test breaks: from `cut` on,
//! the connections through it are shut down and new ones are closed as soon as they are
//! accepted, so that server loses etcd while its clients still reach it. Plain std threads,
//! two per connection (one per direction), which is all a test's few connections need.

use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// The proxy's state, shared with its threads.
#[derive(Default)]
struct Links {
    /// Cut: every stream was shut down, and new ones are.
    cut: bool,
    /// Both ends of every connection made, to shut them down at the cut.
    streams: Vec<TcpStream>,
}

/// A proxy to one upstream address; closed (and its listener thread ended) when dropped.
pub struct Proxy {
    addr: SocketAddr,
    links: Arc<Mutex<Links>>,
    closed: Arc<AtomicBool>,
}

impl Proxy {
    /// Listens on a free loopback port and forwards every connection to `upstream`.
    pub fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a loopback port for the proxy");
        let addr = listener.local_addr().unwrap();
        let links = Arc::new(Mutex::new(Links::default()));
        let closed = Arc::new(AtomicBool::new(false));
        let (l, c) = (Arc::clone(&links), Arc::clone(&closed));
        std::thread::spawn(move || {
            for down in listener.incoming() {
                // Relaxed: the flag only ends this loop; `Drop` wakes it with a connection.
                if c.load(Ordering::Relaxed) {
                    return;
                }
                let Ok(down) = down else { continue };
                let Ok(up) = TcpStream::connect(upstream) else {
                    continue;
                };
                let mut links = l.lock().unwrap();
                if links.cut {
                    let _ = down.shutdown(Shutdown::Both);
                    let _ = up.shutdown(Shutdown::Both);
                    continue;
                }
                for s in [&down, &up] {
                    if let Ok(s) = s.try_clone() {
                        links.streams.push(s);
                    }
                }
                drop(links);
                pump(&down, &up);
                pump(&up, &down);
            }
        });
        Proxy {
            addr,
            links,
            closed,
        }
    }

    /// The endpoint a server is given for etcd.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Breaks every connection through the proxy, and every later one.
    pub fn cut(&self) {
        let mut links = self.links.lock().unwrap();
        links.cut = true;
        for s in links.streams.drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.cut();
        self.closed.store(true, Ordering::Relaxed);
        // Wakes the accepting thread so that it sees `closed`.
        let _ = TcpStream::connect(self.addr);
    }
}

/// Copies `from` into `to` on a thread of its own until either closes.
fn pump(from: &TcpStream, to: &TcpStream) {
    let (Ok(mut from), Ok(mut to)) = (from.try_clone(), to.try_clone()) else {
        return;
    };
    std::thread::spawn(move || {
        // An error is the cut (or the other end going): either way this direction is over.
        let _ = std::io::copy(&mut from, &mut to);
        let _ = to.shutdown(Shutdown::Write);
    });
}
