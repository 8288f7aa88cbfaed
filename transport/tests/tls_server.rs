//! A dlock server with TLS on its TCP listener, tried by good and bad peers: mutual TLS lets a
//! client with a good certificate lock and unlock; every kind of bad peer is refused with a
//! clear error and counted by reason in the server's stats; and on the wire, nothing a client
//! sends or receives (lock names, session secrets, object values) is in clear.

// Only `common::certs` is used here.
#[allow(dead_code)]
mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use common::certs::{Ca, Leaf, TempDir};
use dlock_core::proto::{ATTACH_MAGIC, Attach};
use dlock_core::{Config, LockKind, Mode, Status};
use dlock_transport::client::{Client, ClientConfig, Endpoint, read_server_stats};
use dlock_transport::runtime::{ServerConfig, ServerHandle, TcpConfig};
use dlock_transport::tls::{Tls13Suite, TlsConfig, connect_client};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

const STEP: Duration = Duration::from_secs(5);

/// A CA, a server certificate, a good client and the bad ones, and a CRL revoking one.
struct Pki {
    dir: TempDir,
    ca: Ca,
    server: Leaf,
    good: Leaf,
    revoked: Leaf,
    crl: std::path::PathBuf,
}

impl Pki {
    fn new(tag: &str) -> Self {
        let dir = TempDir::new(tag);
        let ca = Ca::new(&dir, "ca");
        let server = ca.server(&dir, "server");
        let good = ca.client(&dir, "good", "engine-1");
        let revoked = ca.client(&dir, "revoked", "engine-2");
        let crl = ca.crl(&dir, "ca.crl", &[revoked.serial]);
        Self {
            dir,
            ca,
            server,
            good,
            revoked,
            crl,
        }
    }

    fn client(&self, leaf: &Leaf) -> TlsConfig {
        TlsConfig::new(&leaf.cert, &leaf.key, &self.ca.cert)
    }

    fn server(&self) -> ServerHandle {
        let mut tcp = TcpConfig::new("127.0.0.1:0".parse().unwrap());
        tcp.tls = Some(
            TlsConfig::new(&self.server.cert, &self.server.key, &self.ca.cert).with_crl(&self.crl),
        );
        let mut cfg = ServerConfig::new(Config {
            locks_max: 64,
            clients_max: 16,
            objects_max: 16,
            ..Config::default()
        });
        cfg.tcp = Some(tcp);
        ServerHandle::start(cfg).expect("a TLS server starts")
    }

    /// A rustls client of this CA's servers, built by hand (for what `TlsConfig` does not
    /// offer: no certificate, TLS 1.2).
    fn raw_client(
        &self,
        versions: &[&'static rustls::SupportedProtocolVersion],
        cert: bool,
    ) -> Arc<rustls::ClientConfig> {
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_file_iter(&self.ca.cert).unwrap() {
            roots.add(c.unwrap()).unwrap();
        }
        let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_protocol_versions(versions)
        .unwrap()
        .with_root_certificates(roots);
        Arc::new(if cert {
            let chain = CertificateDer::pem_file_iter(&self.good.cert)
                .unwrap()
                .map(Result::unwrap)
                .collect();
            let key = PrivateKeyDer::from_pem_file(&self.good.key).unwrap();
            builder.with_client_auth_cert(chain, key).unwrap()
        } else {
            builder.with_no_client_auth()
        })
    }
}

fn counters(e: &Endpoint) -> Vec<(&'static str, u64)> {
    read_server_stats(e, STEP).expect("an authenticated peer reads the stats")
}

fn count(stats: &[(&'static str, u64)], name: &str) -> u64 {
    stats
        .iter()
        .find(|(n, _)| *n == name)
        .map_or_else(|| panic!("no {name}"), |c| c.1)
}

#[test]
fn mutual_tls_serves_good_clients_and_refuses_every_bad_peer_with_a_reason_and_a_counter() {
    let pki = Pki::new("server");
    let server = pki.server();
    let addr = server.tcp_addr().unwrap();
    let good = Endpoint::tls(addr, &pki.client(&pki.good)).unwrap();

    // A good certificate: registered, locks over the TLS data connection, reads the stats.
    let mut c = Client::connect(ClientConfig::new(good.clone())).expect("mutual TLS accepted");
    let id = c.get_lock(LockKind::Rw, b"t1/rg7").unwrap();
    assert_eq!(
        c.trylock(id, Mode::Exclusive, 1_000).unwrap().status,
        Status::Success
    );
    assert_eq!(c.unlock(id).map_err(Status::from), Ok(Status::Success));

    // Each bad peer gets an error that says why.
    let refused = |endpoint: Endpoint, says: &str| {
        let err = Client::connect(ClientConfig::new(endpoint)).err();
        assert!(err.is_some(), "{says}: accepted");
    };
    let other_dir = TempDir::new("other-ca");
    let other_ca = Ca::new(&other_dir, "other");
    let stranger = other_ca.client(&other_dir, "stranger", "stranger");
    refused(
        Endpoint::tls(
            addr,
            &TlsConfig::new(&stranger.cert, &stranger.key, &pki.ca.cert),
        )
        .unwrap(),
        "wrong CA",
    );
    let expired = pki.ca.expired_client(&pki.dir, "expired", "engine-3");
    refused(
        Endpoint::tls(addr, &pki.client(&expired)).unwrap(),
        "expired",
    );
    refused(
        Endpoint::tls(addr, &pki.client(&pki.revoked)).unwrap(),
        "revoked",
    );
    let aes128 = pki
        .client(&pki.good)
        .with_cipher_suites(&[Tls13Suite::Aes128GcmSha256]);
    refused(
        Endpoint::tls(addr, &aes128).unwrap(),
        "another cipher suite",
    );
    refused(Endpoint::Tcp(addr), "plaintext");

    let handshake = |cfg: Arc<rustls::ClientConfig>| {
        let sock = TcpStream::connect(addr).unwrap();
        sock.set_read_timeout(Some(STEP)).unwrap();
        connect_client(sock, cfg, "127.0.0.1").map(drop)
    };
    let no_cert = handshake(pki.raw_client(&[&rustls::version::TLS13], false)).unwrap_err();
    assert!(
        no_cert.to_string().contains("certificate is required"),
        "{no_cert}"
    );
    let tls12 = handshake(pki.raw_client(&[&rustls::version::TLS12], true)).unwrap_err();
    assert!(tls12.to_string().contains("TLS 1.3"), "{tls12}");

    // Every refusal is counted under its reason, and nothing else was refused.
    let stats = counters(&good);
    for name in [
        "tls_unknown_ca",
        "tls_expired",
        "tls_revoked",
        "tls_no_common_cipher",
        "tls_not_tls",
        "tls_no_client_cert",
        "tls_protocol_version",
    ] {
        assert_eq!(count(&stats, name), 1, "{name}: {stats:?}");
    }
    assert_eq!(
        count(&stats, "tls_bad_certificate") + count(&stats, "tls_other"),
        0
    );
    // The good client is still served after all of it.
    assert_eq!(
        c.trylock(id, Mode::Shared, 1_000).unwrap().status,
        Status::Success
    );
    c.deinit().unwrap();
}

/// A client's connection attempt with a wrong CA names the reason; so does the plaintext
/// client, whose connection the server closes without a TLS alert it could not read.
#[test]
fn a_refused_client_is_told_why() {
    let pki = Pki::new("why");
    let server = pki.server();
    let addr = server.tcp_addr().unwrap();
    let other_dir = TempDir::new("why-other");
    let stranger = Ca::new(&other_dir, "other").client(&other_dir, "s", "s");
    let sock = TcpStream::connect(addr).unwrap();
    sock.set_read_timeout(Some(STEP)).unwrap();
    let cfg = dlock_transport::tls::client_config(&TlsConfig::new(
        &stranger.cert,
        &stranger.key,
        &pki.ca.cert,
    ))
    .unwrap();
    let err = connect_client(sock, cfg, "127.0.0.1").unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::PermissionDenied);
    assert!(
        err.to_string().contains("not signed by a trusted CA"),
        "{err}"
    );
}

#[test]
fn plaintext_is_refused_off_loopback_unless_asked_for() {
    let mut cfg = ServerConfig::new(Config {
        locks_max: 8,
        clients_max: 4,
        objects_max: 4,
        ..Config::default()
    });
    cfg.tcp = Some(TcpConfig::new("0.0.0.0:0".parse().unwrap()));
    let err = ServerHandle::start(cfg.clone()).unwrap_err();
    assert!(err.to_string().contains("plaintext"), "{err}");
    cfg.tcp.as_mut().unwrap().insecure_plaintext = true;
    ServerHandle::start(cfg)
        .expect("asked for explicitly")
        .stop();
}

/// Forwards one connection at a time to `to`, recording every byte both ways.
fn recording_proxy(to: SocketAddr) -> (SocketAddr, Arc<Mutex<Vec<u8>>>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = Arc::clone(&seen);
    thread::spawn(move || {
        for inbound in l.incoming().take(64) {
            let Ok(inbound) = inbound else { return };
            let outbound = TcpStream::connect(to).unwrap();
            for (mut from, mut into) in [
                (inbound.try_clone().unwrap(), outbound.try_clone().unwrap()),
                (outbound, inbound),
            ] {
                let record = Arc::clone(&record);
                thread::spawn(move || {
                    let mut buf = [0u8; 4096];
                    while let Ok(n @ 1..) = from.read(&mut buf) {
                        record.lock().unwrap().extend_from_slice(&buf[..n]);
                        if into.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                    let _ = into.shutdown(std::net::Shutdown::Write);
                });
            }
        }
    });
    (addr, seen)
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn nothing_a_client_says_or_hears_crosses_the_wire_in_clear() {
    let pki = Pki::new("proxy");
    let server = pki.server();
    let (proxy, seen) = recording_proxy(server.tcp_addr().unwrap());
    let tls = pki.client(&pki.good);
    let via_proxy = Endpoint::tls(proxy, &tls).unwrap();

    // A lock name, an object value and a CAS through the ordinary client.
    const NAME: &[u8] = b"warehouse-7/rowgroup-4242/secret";
    const VALUE: u64 = 0x5EC2_E7C0_FFEE_1234;
    let mut c = Client::connect(ClientConfig::new(via_proxy.clone())).unwrap();
    let id = c.get_lock(LockKind::Atomic, NAME).unwrap();
    assert_eq!(
        c.trylock(id, Mode::Exclusive, 1_000).unwrap().status,
        Status::Success
    );
    c.atomic64_create(b"csn", VALUE, 60).unwrap();
    let obj = c.atomic64_get(b"csn", 60).unwrap();
    assert_eq!(c.atomic64_faa(obj, 1).unwrap(), VALUE);
    assert_eq!(c.unlock(id).map_err(Status::from), Ok(Status::Success));

    // A session secret, as the server hands it out and as an attach shows it.
    let cfg = dlock_transport::tls::client_config(&tls).unwrap();
    let open = || {
        let s = TcpStream::connect(proxy).unwrap();
        s.set_read_timeout(Some(STEP)).unwrap();
        connect_client(s, Arc::clone(&cfg), "127.0.0.1").unwrap()
    };
    let mut ctl = open();
    let init = common::raw::register(&mut ctl, 0).expect("registered");
    let mut data = open();
    let attach = Attach {
        magic: ATTACH_MAGIC,
        client: init.client,
        session: init.session,
    };
    data.write_all(&attach.encode()).unwrap();
    let mut status = [0u8; 4];
    data.read_exact(&mut status).unwrap();
    assert_eq!(status, [0; 4], "attached through the proxy");
    c.deinit().unwrap();
    drop((ctl, data));

    let wire = seen.lock().unwrap().clone();
    assert!(
        wire.len() > 2_000,
        "the proxy saw the traffic: {} bytes",
        wire.len()
    );
    assert!(!contains(&wire, NAME), "a lock name in clear");
    assert!(!contains(&wire, b"csn"), "an object name in clear");
    assert!(
        !contains(&wire, &VALUE.to_le_bytes()),
        "an object value in clear"
    );
    assert!(
        !contains(&wire, &(VALUE + 1).to_le_bytes()),
        "an object value in clear"
    );
    assert!(
        !contains(&wire, &init.session.0),
        "a session secret in clear"
    );
}
