//! The configurations the C-ABI failover tests share (`c_recovery.rs`, `c_cached_failover.rs`:
//! each its own binary, since the server and client registries are process-wide): a small
//! plaintext server on the loopback that can stand in for a failed one, and a client of it.

use std::ffi::c_int;

use dlock_engine_glue::ffi::types::*;

/// A primary on the loopback at `port` (`-1`: any free one) with room for a few locks and
/// clients, waiting for `recovery_client_num` clients to re-sync (0: a first server), at
/// `epoch`; recovery without a session key is allowed when it waits for anyone.
pub fn server_cfg(port: c_int, recovery_client_num: u32, epoch: u32) -> server_cfg {
    server_cfg {
        r#type: SERVER_PRIMARY,
        log_level: 0,
        sleep_mode_enable: 1,
        primary: primary_cfg {
            num_of_replica: 0,
            recovery_client_num,
            ctrl_cpuset: std::ptr::null(),
            cmd_cpuset: std::ptr::null(),
            server_ip_str: c"127.0.0.1".as_ptr(),
            server_port: port,
            replica_port: 0,
            replica_enable: 0,
        },
        locks_max: 64,
        clients_max: 8,
        objects_max: 4,
        client_lease_ms: 0,
        client_lease_max_ms: 0,
        epoch,
        shm_name: std::ptr::null(),
        ssl: ssl_cfg::DISABLED,
        insecure_plaintext: 0,
        session_key_file: std::ptr::null(),
        insecure_recovery: u8::from(recovery_client_num > 0),
        recoverer_local: 0,
        cluster: cluster_cfg::STANDALONE,
    }
}

/// A plaintext client of the server at `port` on the loopback, with a 2-s timeout.
pub fn client_cfg(port: c_int) -> client_cfg {
    client_cfg {
        log_level: 0,
        primary_port: port,
        lease_ms: 0,
        timeout_ms: 2_000,
        ssl: ssl_cfg::DISABLED,
    }
}
