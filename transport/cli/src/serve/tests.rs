//! `dlock serve`'s settings: flags over the TOML file, refusals, the cluster table.

use super::*;
use crate::{Cli, Command};
use clap::Parser;
use dlock_transport::runtime::Recoverers;

/// `dlock serve --config FILE`, FILE holding `toml`: its cluster settings as `serve` sees
/// them.
#[cfg(feature = "cluster")]
fn serve_cluster(toml: &str) -> Result<cluster::ClusterArgs, String> {
    let dir = std::env::temp_dir().join(format!("dlock-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("serve.toml");
    std::fs::write(&path, toml).unwrap();
    let argv = ["dlock", "serve", "--config", path.to_str().unwrap()];
    let Command::Serve(args) = Cli::try_parse_from(argv).expect("flags parse").command else {
        panic!("not the serve command");
    };
    let r = take_cluster(*args).map(|(_, c)| c);
    let _ = std::fs::remove_dir_all(&dir);
    r
}

/// `serve` took the cluster settings out of the flags before it read the file, so a
/// `[cluster]` table made a standalone server (and its `epoch` went unchecked).
#[cfg(feature = "cluster")]
#[test]
fn a_cluster_table_in_the_file_makes_a_cluster_member() {
    let table = "[cluster]\nendpoints = [\"http://e:2379\"]\nname = \"x\"\nserver_id = 1\n";
    assert!(serve_cluster(table).unwrap().enabled());
    let err = serve_cluster(&format!("epoch = 3\n{table}")).unwrap_err();
    assert!(err.contains("--epoch"), "{err}");
}

/// `--lease-max-ms` reached the server's client table but not the agent, whose timing
/// kept its 30 s default: a new owner ended a taken-over partition's grace period while a
/// client of the old owner could still believe in a grant of up to 60 s.
#[cfg(feature = "cluster")]
#[test]
fn the_longest_lease_granted_reaches_the_cluster_agent() {
    let argv = [
        "dlock",
        "serve",
        "--lease-max-ms",
        "60000",
        "--cluster",
        "http://e:2379",
        "--cluster-name",
        "x",
        "--server-id",
        "1",
    ];
    let Command::Serve(args) = Cli::try_parse_from(argv).expect("flags parse").command else {
        panic!("not the serve command");
    };
    let (args, cluster) = take_cluster(*args).unwrap();
    let cfg = serve_config(args).unwrap();
    let agent = cluster.member_config(&cfg).unwrap();
    assert_eq!(agent.grant_lease_max_ms, 60_000);
    assert_eq!(agent.timing(1_000).grant_lease_max_ms, 60_000);
}

/// `dlock serve` with `flags`, over a TOML file holding `toml`: the server's config.
fn merged(flags: &[&str], toml: &str) -> ServerConfig {
    let argv = ["dlock", "serve"].iter().chain(flags);
    let Command::Serve(args) = Cli::try_parse_from(argv).expect("flags parse").command else {
        panic!("not the serve command");
    };
    let file: ServeArgs = toml::from_str(toml).expect("TOML parses");
    serve_config(args.over(file)).expect("a valid config")
}

#[test]
fn huge_pages_flag_overrides_the_toml_file_both_ways() {
    let on = "huge_pages = true";
    let off = "huge_pages = false";
    assert!(
        !merged(&["--huge-pages=false"], on).huge_pages,
        "flag switches it off"
    );
    assert!(
        merged(&["--huge-pages"], off).huge_pages,
        "bare flag switches it on"
    );
    assert!(merged(&["--huge-pages=true"], off).huge_pages);
    assert!(merged(&[], on).huge_pages, "no flag: the file decides");
    assert!(!merged(&[], off).huge_pages);
    assert!(!merged(&[], "").huge_pages, "neither: off");
    assert!(
        Cli::try_parse_from(["dlock", "serve", "--huge-pages", "false"]).is_err(),
        "a value needs `=`, so `--huge-pages` never swallows the next argument"
    );
}

/// `dlock serve` with `flags` over the TOML `toml`: the error, if the config is refused.
fn refusal(flags: &[&str], toml: &str) -> Option<String> {
    let argv = ["dlock", "serve"].iter().chain(flags);
    let Command::Serve(args) = Cli::try_parse_from(argv).expect("flags parse").command else {
        panic!("not the serve command");
    };
    let file: ServeArgs = toml::from_str(toml).expect("TOML parses");
    serve_config(args.over(file)).err()
}

/// A key file holding `hex`, mode 0600, removed when the returned guard drops.
fn key_file(tag: &str, hex: &str) -> (PathBuf, impl Drop) {
    use std::os::unix::fs::PermissionsExt;
    struct Rm(PathBuf);
    impl Drop for Rm {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
    let path = std::env::temp_dir().join(format!("dlock-cli-key-{tag}-{}", std::process::id()));
    std::fs::write(&path, format!("{hex}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    (path.clone(), Rm(path))
}

#[test]
fn recovery_without_a_session_key_needs_the_operator_to_say_so() {
    let no_key = refusal(&["--recovery-clients", "3"], "").expect("refused");
    assert!(no_key.contains("without a session key"), "{no_key}");
    assert!(refusal(&["--recovery-clients", "3", "--insecure-recovery"], "").is_none());
    assert!(refusal(&["--recovery-clients", "3"], "insecure_recovery = true").is_none());
    let cfg = merged(&["--recovery-clients", "3", "--insecure-recovery"], "");
    assert!(cfg.insecure_recovery);
    let (path, _rm) = key_file(
        "good",
        "3c9a51e207bd6814f92e85c04b76d31fa8620d97ee355ac4812bf049b6137ddc",
    );
    let cfg = merged(
        &[
            "--recovery-clients",
            "3",
            "--session-key-file",
            path.to_str().unwrap(),
        ],
        "",
    );
    assert!(cfg.session_key.is_some() && !cfg.insecure_recovery);
}

#[test]
fn a_session_key_of_obviously_low_entropy_is_refused_at_start() {
    for (tag, hex) in [("zero", "0".repeat(64)), ("ones", "ab".repeat(32))] {
        let (path, _rm) = key_file(tag, &hex);
        let e = refusal(&["--session-key-file", path.to_str().unwrap()], "").expect("refused");
        assert!(e.contains("distinct byte values"), "{tag}: {e}");
    }
    let counting: String = (0..32u8).map(|b| format!("{b:02x}")).collect();
    let (path, _rm) = key_file("counting", &counting);
    let e = refusal(&["--session-key-file", path.to_str().unwrap()], "").expect("refused");
    assert!(e.contains("step by a constant"), "{e}");
}

#[test]
fn other_flags_override_the_toml_file_and_fill_in_from_it() {
    let file = "locks = 1024\nclients = 10\nidle = \"park\"";
    let cfg = merged(&["--locks", "2048", "--idle", "spin"], file);
    assert_eq!(cfg.core.locks_max, 2048, "the flag wins");
    assert_eq!(cfg.core.clients_max, 10, "the file fills in");
    assert_eq!(cfg.idle, IdleStrategy::Spin);
}

#[test]
fn clients_per_peer_comes_from_the_flag_or_the_file_and_defaults_to_half_the_table() {
    let cfg = merged(&["--clients", "100"], "");
    assert_eq!(cfg.core.clients_per_peer(), 50);
    let cfg = merged(&["--clients-per-peer", "7"], "clients_per_peer = 9");
    assert_eq!(cfg.core.clients_per_peer(), 7, "the flag wins");
    let cfg = merged(&[], "clients_per_peer = 9");
    assert_eq!(cfg.core.clients_per_peer(), 9, "the file fills in");
}

#[test]
fn recoverers_come_from_the_flags_or_the_file_and_default_to_nobody() {
    assert_eq!(merged(&[], "").recoverers, Recoverers::default());
    let cfg = merged(
        &[
            "--recoverer",
            "node-a",
            "--recoverer",
            "node-b",
            "--recoverer-local",
        ],
        "recoverer_address = [\"10.0.0.7\"]",
    );
    assert_eq!(cfg.recoverers.names, ["node-a", "node-b"]);
    assert_eq!(
        cfg.recoverers.addresses,
        ["10.0.0.7".parse::<std::net::IpAddr>().unwrap()]
    );
    assert!(cfg.recoverers.local);
}
