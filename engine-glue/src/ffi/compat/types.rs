//! The reference's structs whose layout differs from `dlock.h`'s, field for field as its
//! `dlock_types.h` lays them out, and dlock's two extension structs: what the C++ headers in
//! `include/ub/umdk/ulock/dlock/` declare in `namespace dlock`.
//!
//! The names are the C names, as in [`crate::ffi::types`], so that `tests/reference_headers.rs`
//! can hold them next to the headers; the field offsets are compared there with what the C++
//! compiler computes. Structs whose layout is the same as dlock's (`lock_desc`, `lock_request`,
//! `umo_atomic64_desc`, `primary_cfg`) are not repeated: the headers declare them for the
//! functions bound straight to dlock's symbols, and the same test checks that they match.
//!
//! As in `crate::ffi::types`, a C `bool` is a `u8` (non-zero is true) and a C enum field an
//! `int`, so any byte pattern a C++ program leaves in a field it never set is a valid value.

#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::mem::{align_of, size_of};

use crate::ffi::types::primary_cfg;

/// Counters in the reference's `struct debug_stats` (its `DEBUG_STATS_MAX`).
pub const REF_DEBUG_STATS_MAX: usize = 45;

/// `dlock_eid_t`: a 16-byte URMA endpoint id (a union of bytes and two 64-bit views, hence
/// the alignment). dlock has no URMA: it is never read.
#[repr(C, align(8))]
#[derive(Clone, Copy, Debug)]
pub struct dlock_eid_t {
    /// The id, network order.
    pub raw: [u8; 16],
}

/// `tls_cert_verify_callback_func_t`: the reference's hook to check a peer certificate
/// (OpenSSL's `X509_STORE_CTX`) against the CRL file itself. The same C type as dlock's
/// `dlock_cert_verify_cb_t`, and refused the same way: dlock has no OpenSSL context to pass.
pub type tls_cert_verify_callback_func_t =
    Option<unsafe extern "C" fn(ctx: *mut c_void, crl_path: *const c_char) -> c_int>;

/// `tls_prkey_pwd_callback_func_t`: hands out a pointer to the application's own buffer
/// holding the key password, and the password's length in bytes.
pub type tls_prkey_pwd_callback_func_t =
    Option<unsafe extern "C" fn(prkey_pwd: *mut *mut c_char, prkey_pwd_len: *mut c_int)>;

/// `tls_erase_prkey_callback_func_t`: wipes the buffer the password callback handed out.
pub type tls_erase_prkey_callback_func_t =
    Option<unsafe extern "C" fn(prkey_pwd: *mut c_void, prkey_pwd_len: c_int)>;

/// The reference's `struct ssl_cfg`: dlock's layout, the reference's callback types.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ssl_cfg {
    /// C `bool`: TLS on the TCP connections.
    pub ssl_enable: u8,
    /// PEM CA bundle.
    pub ca_path: *const c_char,
    /// PEM CRLs, or NULL.
    pub crl_path: *const c_char,
    /// PEM certificate chain of this end.
    pub cert_path: *const c_char,
    /// PEM private key of this end.
    pub prkey_path: *const c_char,
    /// Must be NULL (see [`tls_cert_verify_callback_func_t`]).
    pub cert_verify_cb: tls_cert_verify_callback_func_t,
    /// NULL for an unencrypted key.
    pub prkey_pwd_cb: tls_prkey_pwd_callback_func_t,
    /// Called on the password's buffer once dlock has copied the password out.
    pub erase_prkey_cb: tls_erase_prkey_callback_func_t,
}

/// The reference's `struct client_cfg`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct client_cfg {
    /// URMA device name: ignored.
    pub dev_name: *const c_char,
    /// URMA endpoint id: ignored.
    pub eid: dlock_eid_t,
    /// Accepted and ignored, as by `dlock.h`.
    pub log_level: c_int,
    /// TCP port for `client_init("ip")`: <= 0 is 21616, else 1024..=65535.
    pub primary_port: c_int,
    /// TLS settings.
    pub ssl: ssl_cfg,
    /// `trans_mode_t` (URMA connection mode): ignored.
    pub tp_mode: c_int,
    /// C `bool`, URMA token policy: ignored.
    pub ub_token_disable: u8,
}

/// The reference's `struct replica_cfg` (replicas are refused, as by the reference).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct replica_cfg {
    /// Unused.
    pub primary_ip_str: *const c_char,
    /// Unused.
    pub primary_port: c_int,
}

/// The anonymous union of `struct server_cfg`: `cfg.primary` or `cfg.replica` in C++.
#[repr(C)]
#[derive(Clone, Copy)]
pub union server_role {
    /// `SERVER_PRIMARY`'s settings: dlock's `primary_cfg`, the same layout.
    pub primary: primary_cfg,
    /// `SERVER_REPLICA`'s settings: unused.
    pub replica: replica_cfg,
}

impl std::fmt::Debug for server_role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // SAFETY: plain data, every bit pattern a valid `primary_cfg` (pointers are not read).
        let p = unsafe { self.primary };
        p.fmt(f)
    }
}

/// The reference's `struct server_cfg`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct server_cfg {
    /// `enum server_type`: `SERVER_PRIMARY`.
    pub r#type: c_int,
    /// URMA device name: ignored.
    pub dev_name: *const c_char,
    /// URMA endpoint id: ignored.
    pub eid: dlock_eid_t,
    /// Accepted and ignored.
    pub log_level: c_int,
    /// C `bool`: park the idle data thread at once.
    pub sleep_mode_enable: u8,
    /// `cfg.primary` (C++ reads it through the anonymous union).
    pub role: server_role,
    /// TLS settings.
    pub ssl: ssl_cfg,
    /// `trans_mode_t`: ignored.
    pub tp_mode: c_int,
    /// C `bool`: ignored.
    pub ub_token_disable: u8,
}

/// dlock's addition to `server_start`: what `dlock.h`'s `server_cfg` has beyond the
/// reference's (0 in any field: the default). The reference's struct cannot carry these, since
/// reference code leaves fields it does not know uninitialised.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct server_cfg_ext {
    /// Lock slots (default 51,200).
    pub locks_max: c_uint,
    /// Registered clients (default 1,000).
    pub clients_max: c_uint,
    /// `umo_atomic64` objects (default 102,400).
    pub objects_max: c_uint,
    /// A silent client is dead after this many ms (default 5,000).
    pub client_lease_ms: c_uint,
    /// The longest lease granted in ms (default 30,000).
    pub client_lease_max_ms: c_uint,
    /// Server incarnation, 1..=65535 (default 1).
    pub epoch: c_uint,
    /// C `bool`: serve plaintext TCP on a non-loopback address.
    pub insecure_plaintext: u8,
    /// C `bool`: recover (`recovery_client_num > 0`) without a session key.
    pub insecure_recovery: u8,
    /// NULL, or the file holding the session key shared with the failed server (64 hex digits).
    pub session_key_file: *const std::ffi::c_char,
    /// C `bool`: local clients are recoverers (dlock.h's `server_cfg::recoverer_local`).
    pub recoverer_local: u8,
}

impl Default for server_cfg_ext {
    /// Every field zero (NULL): the defaults.
    fn default() -> Self {
        server_cfg_ext {
            locks_max: 0,
            clients_max: 0,
            objects_max: 0,
            client_lease_ms: 0,
            client_lease_max_ms: 0,
            epoch: 0,
            insecure_plaintext: 0,
            insecure_recovery: 0,
            session_key_file: std::ptr::null(),
            recoverer_local: 0,
        }
    }
}

/// dlock's addition to `dclient_lib_init` (0 in any field: the default).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct client_cfg_ext {
    /// Client lease to ask the server for, in ms (0: the server's).
    pub lease_ms: c_uint,
    /// Synchronous request timeout in ms (0: the reference's 5,000).
    pub timeout_ms: c_uint,
}

/// The reference's `struct debug_stats`: 45 counters in its order (see `super::stats`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct debug_stats {
    /// One `u64` per counter.
    pub stats: [u64; REF_DEBUG_STATS_MAX],
}

/// The reference's `atomic_state`: 8 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct atomic_state {
    /// The holder, 0 when free.
    pub client_id: i32,
    /// When the grant lapses: seconds on the server's clock (see `super::ops`).
    pub time_out: u32,
}

/// The reference's `rw_state`: 16 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct rw_state {
    /// When the current hold began: seconds on the server's clock; 0 when free.
    pub time_out: u32,
    /// The exclusive holder; 0 when free or shared.
    pub client_id: i32,
    /// Shared holders.
    pub rcount: u32,
    /// Zero.
    pub rsvd: u32,
}

/// The reference's `fairlock_state`: 16 bytes. `t_value` is its union of a `u32` and the bit
/// fields `bs { u16 rms; u16 rflag:1, rsvd:9, rcnt:6; }`: `rms` in bits 0..16, `rflag` bit 16,
/// `rcnt` bits 26..32 (GCC's and Clang's little-endian bit-field order).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct fairlock_state {
    /// Completed exclusive grants.
    pub n_exclusive: u16,
    /// Completed shared grants.
    pub n_shared: u16,
    /// Next exclusive ticket.
    pub m_exclusive: u16,
    /// Next shared ticket.
    pub m_shared: u16,
    /// When the current grant(s) lapse: seconds on the server's clock.
    pub time_out: u32,
    /// `rms`, `rflag`, `rcnt` packed as the reference's bit fields.
    pub t_value: u32,
}

/// The reference's `struct lock_op_res`: the 16-byte state union, then the entry's status.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct lock_op_res {
    /// The state (`res.atomic`, `res.rw`, `res.fl` in C++), zero-padded after an 8-byte
    /// `atomic_state`.
    pub state: [u32; 4],
    /// This entry's status.
    pub op_ret: c_int,
}

const _: () = assert!(size_of::<dlock_eid_t>() == 16 && align_of::<dlock_eid_t>() == 8);
const _: () = assert!(size_of::<atomic_state>() == 8);
const _: () = assert!(size_of::<rw_state>() == 16);
const _: () = assert!(size_of::<fairlock_state>() == 16);
const _: () = assert!(size_of::<lock_op_res>() == 20);
const _: () = assert!(size_of::<debug_stats>() == 8 * REF_DEBUG_STATS_MAX);
// The pointer-sized layouts (64-bit targets): a flag padded to a pointer, four paths, three
// callbacks; the reference's `server_cfg` with its 48-byte union at 40.
#[cfg(target_pointer_width = "64")]
const _: () = assert!(size_of::<ssl_cfg>() == 64);
#[cfg(target_pointer_width = "64")]
const _: () = assert!(size_of::<client_cfg>() == 104);
#[cfg(target_pointer_width = "64")]
const _: () = assert!(size_of::<server_cfg>() == 160);
