//! `server_start` and `dclient_lib_init` with the reference's config structs.
//!
//! Each reference struct is turned into `dlock.h`'s and handed to dlock's own entry point, so
//! every check, default and policy is dlock's:
//!
//! | reference field                              | dlock                                        |
//! |----------------------------------------------|----------------------------------------------|
//! | `type`                                       | must be `SERVER_PRIMARY` (`DLOCK_EINVAL`)    |
//! | `primary.*`                                  | `primary_cfg` as is (the same layout): `num_of_replica` 0 and `replica_enable` false or `DLOCK_EINVAL`; `server_ip_str` the TCP listener; `server_port` 0 is 21616, < 0 any free port (`server_tcp_port`); `ctrl_cpuset`/`cmd_cpuset` pin the two threads to their first CPU; `recovery_client_num` as in the reference |
//! | `sleep_mode_enable`                          | park the idle data thread at once            |
//! | `log_level`                                  | ignored (dlock logs through `tracing`)       |
//! | `dev_name`, `eid`, `tp_mode`, `ub_token_disable` | ignored: there is no URMA; clients reach the server over TCP at the address given |
//! | `ssl`                                        | dlock's `ssl_cfg` (paths as given; the password callbacks through `super::key`) |
//! | `primary_port` (client)                      | as is: <= 0 is 21616                         |
//! | — (dlock's capacities, leases, epoch, `insecure_plaintext`, `insecure_recovery`, `session_key_file`) | from `server_cfg_ext` / `client_cfg_ext`, zero (the defaults) without one |
//! | `recovery_client_num` > 0                    | needs `server_cfg_ext::session_key_file` (the failed server's key) or `insecure_recovery`, else `DLOCK_EINVAL` |
//!
//! Plaintext: without `ssl.ssl_enable`, a server listens on a loopback address only, unless
//! `server_cfg_ext::insecure_plaintext` says otherwise (anyone who reaches the port could
//! register, and everything crosses the network in clear); on any other address
//! `server_start` is `DLOCK_EINVAL`. A plaintext client connects to whatever address it is
//! given.
//!
//! The URMA fields are never read, so a program that leaves them uninitialised (as reference
//! programs do with fields they do not use) starts the same server as one that zeroes them.

use std::ffi::c_int;

use super::key;
use super::types::{client_cfg, client_cfg_ext, server_cfg, server_cfg_ext, ssl_cfg};
use crate::ffi::types::{self as native, SERVER_PRIMARY, dlock_prkey_pwd_cb_t};
use crate::ffi::{client, guard, read, server};

/// dlock's `ssl_cfg` for the reference's: the paths and the verify hook as given (dlock refuses
/// a verify hook), the password callback through `password` (a `key` adapter), no erase
/// callback (the adapter calls the reference's). Everything is ignored without `ssl_enable`.
pub(super) fn native_ssl(ssl: &ssl_cfg, password: dlock_prkey_pwd_cb_t) -> native::ssl_cfg {
    if ssl.ssl_enable == 0 {
        return native::ssl_cfg::DISABLED;
    }
    native::ssl_cfg {
        ssl_enable: 1,
        ca_path: ssl.ca_path,
        crl_path: ssl.crl_path,
        cert_path: ssl.cert_path,
        prkey_path: ssl.prkey_path,
        cert_verify_cb: ssl.cert_verify_cb,
        prkey_pwd_cb: ssl.prkey_pwd_cb.and(password),
        erase_prkey_cb: None,
    }
}

/// dlock's `server_cfg` for the reference's primary `cfg`: the URMA fields dropped, dlock's own
/// from `ext`. `None` unless `cfg.type` is `SERVER_PRIMARY` (its union then holds no
/// `primary_cfg`).
pub(super) fn native_server_cfg(
    cfg: &server_cfg,
    ext: &server_cfg_ext,
    ssl: native::ssl_cfg,
) -> Option<native::server_cfg> {
    if cfg.r#type != SERVER_PRIMARY {
        return None;
    }
    // SAFETY: a primary's union holds a `primary_cfg`, plain data for which any bits are valid
    // (its pointers are only read by `server_start`, under its contract).
    let primary = unsafe { cfg.role.primary };
    Some(native::server_cfg {
        r#type: SERVER_PRIMARY,
        log_level: cfg.log_level,
        sleep_mode_enable: cfg.sleep_mode_enable,
        primary,
        locks_max: ext.locks_max,
        clients_max: ext.clients_max,
        objects_max: ext.objects_max,
        client_lease_ms: ext.client_lease_ms,
        client_lease_max_ms: ext.client_lease_max_ms,
        epoch: ext.epoch,
        shm_name: std::ptr::null(),
        ssl,
        insecure_plaintext: ext.insecure_plaintext,
        session_key_file: ext.session_key_file,
        insecure_recovery: ext.insecure_recovery,
        recoverer_local: ext.recoverer_local,
        // The reference has no cluster; its extension carries none either.
        cluster: native::cluster_cfg::STANDALONE,
    })
}

/// dlock's `client_cfg` for the reference's: the URMA fields dropped, dlock's own from `ext`.
pub(super) fn native_client_cfg(
    cfg: &client_cfg,
    ext: &client_cfg_ext,
    ssl: native::ssl_cfg,
) -> native::client_cfg {
    native::client_cfg {
        log_level: cfg.log_level,
        primary_port: cfg.primary_port,
        lease_ms: ext.lease_ms,
        timeout_ms: ext.timeout_ms,
        ssl,
    }
}

/// `*ext`, or the defaults for NULL.
///
/// # Safety
///
/// - `ext` is NULL or points to a readable `T`.
unsafe fn ext_or_default<T: Copy + Default>(ext: *const T) -> T {
    // SAFETY: forwarded from the caller.
    unsafe { read(ext) }.unwrap_or_default()
}

/// `server_start(const server_cfg &cfg, int &server_id[, const server_cfg_ext &ext])` of the
/// reference's `dlock_server_api.h`: starts a server from the reference's settings (mapped as
/// the module docs say) and dlock's `ext` (NULL: the defaults). Returns what `dlock.h`'s
/// `server_start` returns.
///
/// # Safety
///
/// - `cfg` is NULL or points to a readable reference `server_cfg` whose `primary` strings and
///   `ssl` paths are NULL or NUL-terminated (its URMA fields may hold anything).
/// - `cfg.ssl.prkey_pwd_cb` and `erase_prkey_cb` are NULL or meet the reference's contract:
///   the first stores a pointer to the password and its length, which stay valid until the
///   second is called on them; both are called on this thread before this returns.
/// - `ext` is NULL or points to a readable `server_cfg_ext`.
/// - `server_id` is NULL or valid for writing an `int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlock_compat_server_start(
    cfg: *const server_cfg,
    ext: *const server_cfg_ext,
    server_id: *mut c_int,
) -> c_int {
    guard(|| {
        // SAFETY: NULL or readable (caller's contract).
        let (cfg, ext) = match unsafe { read(cfg) } {
            // SAFETY: NULL or readable (caller's contract).
            Ok(cfg) => (cfg, unsafe { ext_or_default(ext) }),
            Err(s) => return s.code(),
        };
        let ssl = native_ssl(&cfg.ssl, Some(key::server_key_password));
        let Some(native) = native_server_cfg(&cfg, &ext, ssl) else {
            return dlock_core::Status::Einval.code();
        };
        key::with_server_key(key::callbacks(&cfg.ssl), || {
            // SAFETY: the strings are the caller's, NULL or NUL-terminated; the password
            // adapter finds the caller's callbacks while this call runs, which is when dlock
            // calls it; `server_id` as the caller passed it.
            unsafe { server::server_start(&native, server_id) }
        })
    })
}

/// `dclient_lib_init(const client_cfg *cfg[, const client_cfg_ext *ext])` of the reference's
/// `dlock_client_api.h`: the reference's settings (mapped as the module docs say) and dlock's
/// `ext` (NULL: the defaults). Returns what `dlock.h`'s `dclient_lib_init` returns.
///
/// # Safety
///
/// - `cfg` is NULL or points to a readable reference `client_cfg` whose `ssl` paths are NULL
///   or NUL-terminated (its URMA fields may hold anything).
/// - `cfg.ssl.prkey_pwd_cb` and `erase_prkey_cb` are NULL or meet the reference's contract (see
///   `dlock_compat_server_start`) and stay callable, from any thread, until
///   `dclient_lib_deinit`.
/// - `ext` is NULL or points to a readable `client_cfg_ext`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlock_compat_dclient_lib_init(
    cfg: *const client_cfg,
    ext: *const client_cfg_ext,
) -> c_int {
    guard(|| {
        // SAFETY: NULL or readable (caller's contract).
        let (cfg, ext) = match unsafe { read(cfg) } {
            // SAFETY: NULL or readable (caller's contract).
            Ok(cfg) => (cfg, unsafe { ext_or_default(ext) }),
            Err(s) => return s.code(),
        };
        let native = native_client_cfg(
            &cfg,
            &ext,
            native_ssl(&cfg.ssl, Some(key::client_key_password)),
        );
        key::init_client(key::callbacks(&cfg.ssl), || {
            // SAFETY: the paths are the caller's, NULL or NUL-terminated; the password adapter
            // finds the caller's callbacks from the moment this succeeds until the next
            // initialisation, and they stay callable until `dclient_lib_deinit`.
            unsafe { client::dclient_lib_init(&native) }
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ffi::compat::types::{dlock_eid_t, server_role};
    use crate::ffi::types::primary_cfg;
    use std::ffi::c_char;

    /// A pointer nothing may read: the URMA fields of a reference config are never used.
    const WILD: *const c_char = 0xA5A5_A5A5_A5A5_A5A5_usize as *const c_char;

    fn primary() -> primary_cfg {
        primary_cfg {
            num_of_replica: 0,
            recovery_client_num: 3,
            ctrl_cpuset: c"1".as_ptr(),
            cmd_cpuset: c"2-3".as_ptr(),
            server_ip_str: c"127.0.0.1".as_ptr(),
            server_port: 21617,
            replica_port: 0,
            replica_enable: 0,
        }
    }

    /// A reference config with garbage wherever reference code leaves fields unset.
    fn reference_server_cfg() -> server_cfg {
        server_cfg {
            r#type: SERVER_PRIMARY,
            dev_name: WILD,
            eid: dlock_eid_t { raw: [0xA5; 16] },
            log_level: 6,
            sleep_mode_enable: 0xA5,
            role: server_role { primary: primary() },
            ssl: ssl_cfg {
                ssl_enable: 0,
                ca_path: WILD,
                crl_path: WILD,
                cert_path: WILD,
                prkey_path: WILD,
                cert_verify_cb: None,
                prkey_pwd_cb: None,
                erase_prkey_cb: None,
            },
            tp_mode: 0x5A5A_5A5A,
            ub_token_disable: 0xA5,
        }
    }

    #[test]
    fn a_reference_server_cfg_keeps_its_primary_settings_and_zeroes_dlocks_own() {
        let cfg = reference_server_cfg();
        let ssl = native_ssl(&cfg.ssl, None);
        let n = native_server_cfg(&cfg, &server_cfg_ext::default(), ssl).unwrap();
        let p = primary();
        assert_eq!(n.r#type, SERVER_PRIMARY);
        assert_eq!(n.log_level, 6);
        assert_ne!(n.sleep_mode_enable, 0);
        assert_eq!(n.primary.recovery_client_num, p.recovery_client_num);
        assert_eq!(n.primary.server_ip_str, p.server_ip_str);
        assert_eq!(n.primary.server_port, p.server_port);
        assert_eq!(n.primary.ctrl_cpuset, p.ctrl_cpuset);
        assert_eq!(n.primary.cmd_cpuset, p.cmd_cpuset);
        assert_eq!(
            (n.locks_max, n.clients_max, n.objects_max, n.epoch),
            (0, 0, 0, 0)
        );
        assert_eq!((n.client_lease_ms, n.client_lease_max_ms), (0, 0));
        assert!(n.shm_name.is_null());
        assert_eq!(n.insecure_plaintext, 0);
        // TLS off: the garbage paths are not carried over.
        assert_eq!(n.ssl.ssl_enable, 0);
        assert!(n.ssl.ca_path.is_null() && n.ssl.prkey_path.is_null());
    }

    #[test]
    fn the_extension_carries_dlocks_capacities_and_the_plaintext_opt_in() {
        let cfg = reference_server_cfg();
        let ext = server_cfg_ext {
            locks_max: 64,
            clients_max: 8,
            objects_max: 4,
            client_lease_ms: 500,
            client_lease_max_ms: 1_000,
            epoch: 2,
            insecure_plaintext: 1,
            ..server_cfg_ext::default()
        };
        let n = native_server_cfg(&cfg, &ext, native::ssl_cfg::DISABLED).unwrap();
        assert_eq!(
            (n.locks_max, n.clients_max, n.objects_max, n.epoch),
            (64, 8, 4, 2)
        );
        assert_eq!((n.client_lease_ms, n.client_lease_max_ms), (500, 1_000));
        assert_eq!(n.insecure_plaintext, 1);
    }

    #[test]
    fn a_replica_is_refused_before_its_union_is_read() {
        let mut cfg = reference_server_cfg();
        cfg.r#type = 1; // SERVER_REPLICA
        let none = native_server_cfg(&cfg, &server_cfg_ext::default(), native::ssl_cfg::DISABLED);
        assert!(none.is_none());
    }

    unsafe extern "C" fn pwd(_p: *mut *mut c_char, _len: *mut c_int) {}

    #[test]
    fn tls_settings_keep_their_paths_and_route_the_password_through_the_adapter() {
        let mut cfg = reference_server_cfg();
        cfg.ssl = ssl_cfg {
            ssl_enable: 1,
            ca_path: c"ca.pem".as_ptr(),
            crl_path: std::ptr::null(),
            cert_path: c"cert.pem".as_ptr(),
            prkey_path: c"key.pem".as_ptr(),
            cert_verify_cb: None,
            prkey_pwd_cb: None,
            erase_prkey_cb: None,
        };
        let adapter: dlock_prkey_pwd_cb_t = Some(key::server_key_password);
        // No password callback: an unencrypted key, none asked for.
        let n = native_ssl(&cfg.ssl, adapter);
        assert_eq!(n.ssl_enable, 1);
        assert_eq!(n.ca_path, cfg.ssl.ca_path);
        assert_eq!(n.cert_path, cfg.ssl.cert_path);
        assert_eq!(n.prkey_path, cfg.ssl.prkey_path);
        assert!(n.prkey_pwd_cb.is_none() && n.erase_prkey_cb.is_none());
        cfg.ssl.prkey_pwd_cb = Some(pwd);
        let n = native_ssl(&cfg.ssl, adapter);
        assert_eq!(
            n.prkey_pwd_cb.map(|f| f as usize),
            adapter.map(|f| f as usize)
        );
        assert!(n.erase_prkey_cb.is_none());
    }

    #[test]
    fn a_reference_client_cfg_keeps_its_port_and_takes_dlocks_own_from_the_extension() {
        let cfg = client_cfg {
            dev_name: WILD,
            eid: dlock_eid_t { raw: [0xA5; 16] },
            log_level: 4,
            primary_port: 30_000,
            ssl: reference_server_cfg().ssl,
            tp_mode: 0x5A5A_5A5A,
            ub_token_disable: 0xA5,
        };
        let ssl = native_ssl(&cfg.ssl, None);
        let n = native_client_cfg(&cfg, &client_cfg_ext::default(), ssl);
        assert_eq!((n.log_level, n.primary_port), (4, 30_000));
        assert_eq!((n.lease_ms, n.timeout_ms), (0, 0));
        assert_eq!(n.ssl.ssl_enable, 0);
        let ext = client_cfg_ext {
            lease_ms: 700,
            timeout_ms: 2_000,
        };
        let n = native_client_cfg(&cfg, &ext, native::ssl_cfg::DISABLED);
        assert_eq!((n.lease_ms, n.timeout_ms), (700, 2_000));
    }
}
