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
