//! What a flood of TLS ClientHellos does to an established client's heartbeats: a measurement,
//! not a check (no test here asserts a speed), so it is `#[ignore]`d and run by hand:
//!
//! ```sh
//! cargo test --release -p dlock-transport --test tls_flood -- --ignored --nocapture
//! ```
//!
//! One TLS client registers and heartbeats in a loop while other threads open
//! [`FLOOD_CONNECTIONS`] TCP connections and send a real ClientHello on each (and nothing more),
//! as fast as they can. Every heartbeat's round trip is recorded; the worst and the 99th
//! percentile under the flood are printed next to those of a quiet period of the same length.

#[allow(dead_code)]
mod common;

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::certs::{Ca, TempDir};
use dlock_core::Config;
use dlock_transport::client::{Client, ClientConfig, Endpoint, read_server_stats};
use dlock_transport::runtime::{ServerConfig, ServerHandle, TcpConfig};
use dlock_transport::tls::TlsConfig;

/// ClientHellos sent (the issue's figure).
const FLOOD_CONNECTIONS: usize = 3_500;
/// Threads opening them.
const FLOOD_THREADS: usize = 2;
/// Pause between two heartbeats.
const HEARTBEAT_EVERY: Duration = Duration::from_millis(1);

/// A rustls client config that trusts nothing and offers TLS 1.3: enough to write a real
/// ClientHello (the server never gets an answer to it).
fn hello_config() -> Arc<rustls::ClientConfig> {
    #[derive(Debug)]
    struct NoVerify;
    impl rustls::client::danger::ServerCertVerifier for NoVerify {
        fn verify_server_cert(
            &self,
            _: &rustls::pki_types::CertificateDer<'_>,
            _: &[rustls::pki_types::CertificateDer<'_>],
            _: &rustls::pki_types::ServerName<'_>,
            _: &[u8],
            _: rustls::pki_types::UnixTime,
        ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
            Ok(rustls::client::danger::ServerCertVerified::assertion())
        }
        fn verify_tls12_signature(
            &self,
            _: &[u8],
            _: &rustls::pki_types::CertificateDer<'_>,
            _: &rustls::DigitallySignedStruct,
        ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
            Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
        }
        fn verify_tls13_signature(
            &self,
            _: &[u8],
            _: &rustls::pki_types::CertificateDer<'_>,
            _: &rustls::DigitallySignedStruct,
        ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
            Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
        }
        fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
            rustls::crypto::ring::default_provider()
                .signature_verification_algorithms
                .supported_schemes()
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("TLS 1.3")
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(NoVerify))
        .with_no_client_auth();
    Arc::new(cfg)
}

/// A real TLS 1.3 ClientHello (key share and all).
fn client_hello(cfg: &Arc<rustls::ClientConfig>) -> Vec<u8> {
    let name = rustls::pki_types::ServerName::try_from("localhost").expect("name");
    let mut conn = rustls::ClientConnection::new(Arc::clone(cfg), name).expect("a client");
    let mut hello = Vec::new();
    conn.write_tls(&mut hello).expect("a ClientHello");
    hello
}

/// Opens `n` connections to `addr` and writes `hello` on each; returns the sockets, so the
/// caller decides when they close. The same hello every time, as a flooder would replay it:
/// the server answers each as a new handshake, and the flood threads spend their CPU on
/// connecting, not on key shares (on a 2-core machine they share the cores with the server).
fn flood(addr: SocketAddr, n: usize, hello: &[u8]) -> Vec<TcpStream> {
    let mut held = Vec::with_capacity(n);
    for _ in 0..n {
        let Ok(mut s) = TcpStream::connect(addr) else {
            continue;
        };
        let _ = s.write_all(hello);
        held.push(s);
    }
    held
}

/// Heartbeats `client` every [`HEARTBEAT_EVERY`] until `stop`, recording each round trip (µs).
fn heartbeats(client: &mut Client, stop: &AtomicBool) -> Vec<u64> {
    let mut rtts = Vec::new();
    while !stop.load(Ordering::Acquire) {
        let t = Instant::now();
        client.heartbeat().expect("a heartbeat");
        rtts.push(t.elapsed().as_micros() as u64);
        std::thread::sleep(HEARTBEAT_EVERY);
    }
    rtts
}

fn summary(label: &str, mut rtts: Vec<u64>) {
    rtts.sort_unstable();
    let at = |q: f64| rtts[((rtts.len() - 1) as f64 * q) as usize];
    println!(
        "{label:<8} {:>6} heartbeats  p50 {:>7} µs  p99 {:>7} µs  worst {:>7} µs",
        rtts.len(),
        at(0.5),
        at(0.99),
        rtts[rtts.len() - 1]
    );
}

#[test]
#[ignore = "a measurement: run by hand with --release --nocapture"]
fn heartbeat_delay_under_a_client_hello_flood() {
    let dir = TempDir::new("flood");
    let ca = Ca::new(&dir, "ca");
    let srv = ca.server(&dir, "server");
    let engine = ca.client(&dir, "engine", "engine-1");
    let mut tcp = TcpConfig::new("127.0.0.1:0".parse().expect("address"));
    tcp.tls = Some(TlsConfig::new(&srv.cert, &srv.key, &ca.cert));
    let mut cfg = ServerConfig::new(Config::default());
    cfg.tcp = Some(tcp);
    let server = ServerHandle::start(cfg).expect("server starts");
    let addr = server.tcp_addr().expect("tcp");
    let endpoint = Endpoint::tls(addr, &TlsConfig::new(&engine.cert, &engine.key, &ca.cert))
        .expect("client TLS settings");
    let mut client = Client::connect(ClientConfig::new(endpoint.clone())).expect("registers");
    let hello = client_hello(&hello_config());

    // Quiet: heartbeats alone, as long as the flood will take.
    let stop = AtomicBool::new(false);
    let started = Instant::now();
    let mut held = Vec::new();
    let flood_rtts = std::thread::scope(|sc| {
        let beats = sc.spawn(|| heartbeats(&mut client, &stop));
        let floods: Vec<_> = (0..FLOOD_THREADS)
            .map(|_| sc.spawn(|| flood(addr, FLOOD_CONNECTIONS / FLOOD_THREADS, &hello)))
            .collect();
        for f in floods {
            held.extend(f.join().expect("a flood thread"));
        }
        // The last hellos are still being answered: keep measuring a little while.
        std::thread::sleep(Duration::from_millis(500));
        stop.store(true, Ordering::Release);
        beats.join().expect("the heartbeat thread")
    });
    let flood_time = started.elapsed();
    drop(held);
    std::thread::sleep(Duration::from_millis(500));
    let stop = AtomicBool::new(false);
    let quiet_rtts = std::thread::scope(|sc| {
        let beats = sc.spawn(|| heartbeats(&mut client, &stop));
        std::thread::sleep(flood_time);
        stop.store(true, Ordering::Release);
        beats.join().expect("the heartbeat thread")
    });
    println!(
        "{FLOOD_CONNECTIONS} ClientHellos from {FLOOD_THREADS} threads in {:.0} ms",
        flood_time.as_secs_f64() * 1e3
    );
    summary("quiet", quiet_rtts);
    summary("flood", flood_rtts);
    let stats = read_server_stats(&endpoint, Duration::from_secs(5)).expect("stats");
    for (name, v) in stats {
        if name.starts_with("tls_") || name.starts_with("connections_") {
            println!("  {name:<28} {v}");
        }
    }
    server.stop();
}
