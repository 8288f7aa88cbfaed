//! Every TLS refusal reaches the client as its reason, not as a bare `BAD_RESPONSE`: the
//! client error's source is an I/O error whose inner error is the [`TlsFailure`], and the
//! server counts each refusal under its own name.

#[allow(dead_code)]
mod common;

use std::error::Error as _;
use std::time::Duration;

use common::certs::{Ca, Leaf, TempDir};
use dlock_core::{Config, Status};
use dlock_transport::client::{Client, ClientConfig, Endpoint, Error, read_server_stats};
use dlock_transport::runtime::{ServerConfig, ServerHandle, TcpConfig};
use dlock_transport::tls::{TlsConfig, TlsFailure};
use rustls::AlertDescription;

const STEP: Duration = Duration::from_secs(5);

/// A CA with a server certificate, a TLS server trusting it (and its CRL), and the clients.
struct Pki {
    dir: TempDir,
    ca: Ca,
    good: Leaf,
    server: ServerHandle,
}

impl Pki {
    /// With `revoked`'s serial in the server's CRL.
    fn new(tag: &str) -> (Self, Leaf) {
        let dir = TempDir::new(tag);
        let ca = Ca::new(&dir, "ca");
        let srv = ca.server(&dir, "server");
        let good = ca.client(&dir, "good", "engine-1");
        let revoked = ca.client(&dir, "revoked", "engine-2");
        let crl = ca.crl(&dir, "ca.crl", &[revoked.serial]);
        let mut tcp = TcpConfig::new("127.0.0.1:0".parse().unwrap());
        tcp.tls = Some(TlsConfig::new(&srv.cert, &srv.key, &ca.cert).with_crl(&crl));
        let mut cfg = ServerConfig::new(Config {
            locks_max: 64,
            clients_max: 8,
            objects_max: 4,
            ..Config::default()
        });
        cfg.tcp = Some(tcp);
        let server = ServerHandle::start(cfg).expect("a TLS server starts");
        let pki = Self {
            dir,
            ca,
            good,
            server,
        };
        (pki, revoked)
    }

    fn endpoint(&self, leaf: &Leaf, ca: &std::path::Path, name: Option<&str>) -> Endpoint {
        let mut cfg = TlsConfig::new(&leaf.cert, &leaf.key, ca);
        if let Some(name) = name {
            cfg = cfg.with_server_name(name);
        }
        Endpoint::tls(self.server.tcp_addr().unwrap(), &cfg).unwrap()
    }

    fn counter(&self, name: &str) -> u64 {
        let good = self.endpoint(&self.good, &self.ca.cert, None);
        read_server_stats(&good, STEP)
            .expect("stats")
            .into_iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v)
            .expect("listed")
    }
}

/// The stats read through `e` fails; the error, checked to carry `want` as its reason.
fn refused(e: &Endpoint, want: &TlsFailure, text: &str) -> Error {
    let error = read_server_stats(e, STEP).expect_err("refused");
    assert_eq!(error.status(), Status::BadResponse);
    assert_eq!(error.tls_failure(), Some(want), "{error:?}");
    let source = error
        .source()
        .expect("the reason is the source")
        .to_string();
    assert!(source.contains(text), "{source}");
    error
}

#[test]
fn refused_client_certificates_say_why() {
    let (pki, revoked) = Pki::new("reasons-client");
    let expired = pki.ca.expired_client(&pki.dir, "expired", "old");
    let early = pki.ca.not_yet_valid_client(&pki.dir, "early", "early");
    let other = Ca::new(&pki.dir, "other-ca");
    let foreign = other.client(&pki.dir, "foreign", "stranger");
    let ca = pki.ca.cert.clone();
    let cases = [
        (
            &expired,
            AlertDescription::CertificateExpired,
            "client certificate expired",
        ),
        (
            &early,
            AlertDescription::CertificateExpired,
            "not yet valid",
        ),
        (
            &revoked,
            AlertDescription::CertificateRevoked,
            "client certificate revoked",
        ),
        (
            &foreign,
            AlertDescription::UnknownCA,
            "not signed by a trusted CA",
        ),
    ];
    for (leaf, alert, text) in cases {
        let e = pki.endpoint(leaf, &ca, None);
        refused(&e, &TlsFailure::RefusedByServer(alert), text);
    }
    // Counted apart: an expired certificate and one not valid yet.
    assert_eq!(pki.counter("tls_expired"), 1);
    assert_eq!(pki.counter("tls_not_yet_valid"), 1);
    assert_eq!(pki.counter("tls_bad_certificate"), 0);
    assert_eq!(pki.counter("tls_revoked"), 1);
    assert_eq!(pki.counter("tls_unknown_ca"), 1);
    // Registering says the same, through the native API's error.
    let e = pki.endpoint(&expired, &ca, None);
    let error = Client::connect(ClientConfig::new(e)).expect_err("refused");
    assert_eq!(error.status(), Status::NotReady);
    assert_eq!(
        error.tls_failure(),
        Some(&TlsFailure::RefusedByServer(
            AlertDescription::CertificateExpired
        ))
    );
}

#[test]
fn a_server_the_client_does_not_trust_or_of_another_name_is_named() {
    let (pki, _) = Pki::new("reasons-server");
    let other = Ca::new(&pki.dir, "other-ca");
    let untrusting = pki.endpoint(&pki.good, &other.cert, None);
    refused(
        &untrusting,
        &TlsFailure::ServerNotTrusted,
        "server certificate not trusted",
    );
    let wrong_name = pki.endpoint(&pki.good, &pki.ca.cert, Some("db.example"));
    refused(
        &wrong_name,
        &TlsFailure::ServerNameMismatch {
            expected: "db.example".into(),
        },
        "server name mismatch",
    );
}

#[test]
fn plaintext_against_tls_and_tls_against_plaintext_are_named() {
    let (pki, _) = Pki::new("reasons-plain");
    let plain = Endpoint::Tcp(pki.server.tcp_addr().unwrap());
    refused(
        &plain,
        &TlsFailure::ServerSpeaksTls,
        "server speaks TLS, client plaintext",
    );
    assert_eq!(pki.counter("tls_not_tls"), 1);

    let mut cfg = ServerConfig::new(common::small());
    cfg.tcp = Some(TcpConfig::new("127.0.0.1:0".parse().unwrap()));
    let plaintext = ServerHandle::start(cfg).expect("a plaintext server starts");
    let tls = Endpoint::tls(
        plaintext.tcp_addr().unwrap(),
        &TlsConfig::new(&pki.good.cert, &pki.good.key, &pki.ca.cert),
    )
    .unwrap();
    refused(
        &tls,
        &TlsFailure::ServerSpeaksPlaintext,
        "server speaks plaintext, client TLS",
    );
}
