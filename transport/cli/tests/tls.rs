//! `dlock serve` and `dlock stat` with TLS flags, as an operator runs them: a server on a
//! non-loopback-style configuration refuses plaintext, and with certificates the two talk.

#[path = "../../tests/common/certs.rs"]
mod certs;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use certs::{Ca, TempDir};

const DLOCK: &str = env!("CARGO_BIN_EXE_dlock");

/// Kills the server when the test ends, however it ends.
struct Serving(Child);

impl Drop for Serving {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn serve_refuses_plaintext_off_loopback_and_speaks_tls_with_certificates() {
    let refused = Command::new(DLOCK)
        .args([
            "serve",
            "--bind",
            "0.0.0.0:21999",
            "--clients",
            "4",
            "--locks",
            "8",
            "--objects",
            "4",
        ])
        .output()
        .unwrap();
    assert!(!refused.status.success());
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(said.contains("refusing to serve plaintext"), "{said}");

    let dir = TempDir::new("cli");
    let ca = Ca::new(&dir, "ca");
    let server = ca.server(&dir, "server");
    let client = ca.client(&dir, "client", "operator");
    let port = free_port().to_string();
    let addr = format!("127.0.0.1:{port}");
    let path = |p: &std::path::Path| p.to_str().unwrap().to_owned();
    let _serving = Serving(
        Command::new(DLOCK)
            .args([
                "serve",
                "--bind",
                &addr,
                "--clients",
                "4",
                "--locks",
                "8",
                "--objects",
                "4",
            ])
            .args([
                "--tls-cert",
                &path(&server.cert),
                "--tls-key",
                &path(&server.key),
            ])
            .args(["--tls-ca", &path(&ca.cert)])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let stat = |tls: bool| {
        let mut cmd = Command::new(DLOCK);
        cmd.args(["stat", "--connect", &addr]);
        if tls {
            cmd.args([
                "--tls-cert",
                &path(&client.cert),
                "--tls-key",
                &path(&client.key),
            ])
            .args(["--tls-ca", &path(&ca.cert)]);
        }
        cmd.output().unwrap()
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    let out = loop {
        let out = stat(true);
        if out.status.success() || Instant::now() > deadline {
            break out;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("tls_not_tls"), "{text}");
    // Plaintext against the TLS listener: an error, and the refusal is counted.
    assert!(!stat(false).status.success());
    let text = String::from_utf8_lossy(&stat(true).stdout).into_owned();
    let not_tls = text
        .lines()
        .find(|l| l.starts_with("tls_not_tls"))
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap();
    assert_eq!(not_tls, "1", "{text}");
}

/// A TLS setting in the TOML file without the certificate, key and CA is an error, not a
/// server quietly left in plaintext.
#[test]
fn a_tls_setting_in_the_config_file_without_certificates_is_refused() {
    let dir = TempDir::new("cli-toml");
    let file = dir.write("dlock.toml", "tls_crl = [\"/nonexistent.crl\"]\n");
    let out = Command::new(DLOCK)
        .args([
            "serve",
            "--config",
            file.to_str().unwrap(),
            "--clients",
            "4",
        ])
        .args([
            "--locks",
            "8",
            "--objects",
            "4",
            "--bind",
            "127.0.0.1:21998",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("TLS needs all of"), "{said}");
}

/// `dlock serve` on a free loopback port with `args`; the address and the server, once
/// `dlock stat` with `ready` reaches it.
fn serve(args: &[String], ready: &[String]) -> (String, Serving) {
    let addr = format!("127.0.0.1:{}", free_port());
    let serving = Serving(
        Command::new(DLOCK)
            .args(["serve", "--bind", &addr, "--clients", "4", "--locks", "8"])
            .args(["--objects", "4"])
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out = Command::new(DLOCK)
            .args(["stat", "--connect", &addr])
            .args(ready)
            .output()
            .unwrap();
        if out.status.success() {
            break;
        }
        assert!(Instant::now() < deadline, "the server never answered");
        std::thread::sleep(Duration::from_millis(100));
    }
    (addr, serving)
}

/// What `dlock <command> --connect addr <args>` printed on stderr; it must have failed.
fn refusal(command: &[&str], addr: &str, args: &[String]) -> String {
    let out = Command::new(DLOCK)
        .args(command)
        .args(["--connect", addr])
        .args(args)
        .output()
        .unwrap();
    assert!(!out.status.success(), "{command:?} {args:?} succeeded");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// `flag value` pairs as arguments.
fn flags(pairs: &[(&str, &std::path::Path)]) -> Vec<String> {
    pairs
        .iter()
        .flat_map(|(flag, path)| [flag.to_string(), path.to_str().unwrap().to_owned()])
        .collect()
}

#[test]
fn stat_and_bench_print_why_tls_refused_them() {
    let dir = TempDir::new("cli-reasons");
    let ca = Ca::new(&dir, "ca");
    let other = Ca::new(&dir, "other-ca");
    let server = ca.server(&dir, "server");
    let good = ca.client(&dir, "good", "operator");
    let expired = ca.expired_client(&dir, "expired", "old");
    let revoked = ca.client(&dir, "revoked", "gone");
    let foreign = other.client(&dir, "foreign", "stranger");
    let crl = ca.crl(&dir, "ca.crl", &[revoked.serial]);
    let client = |leaf: &certs::Leaf, trust: &std::path::Path| {
        flags(&[
            ("--tls-cert", &leaf.cert),
            ("--tls-key", &leaf.key),
            ("--tls-ca", trust),
        ])
    };
    let good_args = client(&good, &ca.cert);
    let server_args = flags(&[
        ("--tls-cert", &server.cert),
        ("--tls-key", &server.key),
        ("--tls-ca", &ca.cert),
        ("--tls-crl", &crl),
    ]);
    let (addr, _tls) = serve(&server_args, &good_args);
    let mut wrong_name = good_args.clone();
    wrong_name.extend(["--tls-server-name".to_owned(), "db.example".to_owned()]);
    let cases = [
        (
            client(&expired, &ca.cert),
            "TLS handshake refused by server: client certificate expired",
        ),
        (
            client(&revoked, &ca.cert),
            "TLS handshake refused by server: client certificate revoked",
        ),
        (
            client(&foreign, &ca.cert),
            "TLS handshake refused by server: client certificate not signed by a trusted CA",
        ),
        (client(&good, &other.cert), "server certificate not trusted"),
        (wrong_name, "server name mismatch"),
        (Vec::new(), "server speaks TLS, client plaintext"),
    ];
    for (args, reason) in &cases {
        let said = refusal(&["stat"], &addr, args);
        assert!(said.contains(reason), "stat {args:?}: {said}");
    }
    // `dlock bench` says why too.
    let bench = ["bench", "--duration", "1", "--clients", "1"];
    let said = refusal(&bench, &addr, &client(&expired, &ca.cert));
    assert!(said.contains("client certificate expired"), "bench: {said}");

    let (plain, _plaintext) = serve(&[], &[]);
    let said = refusal(&["stat"], &plain, &good_args);
    assert!(
        said.contains("server speaks plaintext, client TLS"),
        "{said}"
    );
}
