//! The C structs of `include/dlock.h`, field for field, and the constants the header defines.
//!
//! The names are the C names (as `libc` does) so that the header check in `tests/c_abi.rs` can
//! map a Rust signature to its C prototype without a translation table, and so that a reader
//! can hold this file next to the header. Sizes and alignments are asserted here; the field
//! offsets are compared with what the C compiler computes by the C test program.
//!
//! A C `bool` field is a `u8` here: C may hand us any byte in it, and reading a byte other than
//! 0 or 1 as a Rust `bool` would be undefined behaviour. Non-zero means true.
//!
//! The reference's structs carry URMA settings (device name, EID, transport mode) that have no
//! counterpart here; they are left out rather than accepted and ignored, so the structs are not
//! binary-compatible with the reference's — only source-compatible for the fields kept. Its TLS
//! settings (`struct ssl_cfg`) are kept, appended at the end of `client_cfg` and `server_cfg`.
//!
//! A C function pointer field is an `Option<unsafe extern "C" fn ..>`: C's NULL is `None`, so
//! every bit pattern C may store is a valid value.

#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::mem::{align_of, size_of};

use dlock_core::server::Counter;

/// Longest lock name in bytes (`MAX_LOCK_DESC_LEN`).
pub const MAX_LOCK_DESC_LEN: usize = dlock_core::config::NAME_LEN_MAX;
/// Longest object name in bytes (`MAX_UMO_ATOMIC64_DESC_LEN`).
pub const MAX_UMO_ATOMIC64_DESC_LEN: usize = MAX_LOCK_DESC_LEN;
/// Entries in one batch call (`MAX_LOCK_BATCH_SIZE`).
pub const MAX_LOCK_BATCH_SIZE: usize = dlock_core::config::BATCH_MAX;
/// Servers one process may run (`MAX_NUM_SERVER`).
pub const MAX_NUM_SERVER: usize = dlock_core::config::SERVERS_MAX;
/// The TCP port used when none is given (`CONTROL_PORT_CLIENT`).
pub const DLOCK_DEFAULT_PORT: u16 = dlock_core::config::DEFAULT_PORT;
/// Largest server id handed out (ids run 1..=this, round-robin).
pub const DLOCK_SERVER_ID_MAX: c_int = 0xF_FFFF;
/// `client_heartbeat`'s largest timeout, in seconds.
pub const DLOCK_HEARTBEAT_TIMEOUT_MAX_S: c_uint = 300;
/// Counters in `struct debug_stats` (`DEBUG_STATS_MAX`).
pub const DEBUG_STATS_MAX: usize = Counter::COUNT;

/// `enum dlock_type`.
pub const DLOCK_ATOMIC: c_uint = 0;
/// `enum dlock_type`.
pub const DLOCK_RW: c_uint = 1;
/// `enum dlock_type`.
pub const DLOCK_FAIR: c_uint = 2;

/// `enum lock_ops`.
pub const LOCK_EXCLUSIVE: c_int = 0;
/// `enum lock_ops`.
pub const LOCK_SHARED: c_int = 1;
/// `enum lock_ops`.
pub const UNLOCK: c_int = 2;
/// `enum lock_ops`.
pub const EXTEND_LOCK_EXCLUSIVE: c_int = 3;
/// `enum lock_ops`.
pub const EXTEND_LOCK_SHARED: c_int = 4;

/// `enum server_type`: the only kind that can be started.
pub const SERVER_PRIMARY: c_int = 0;

/// A lock to create or open by name (`get_lock`, `batch_get_lock`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct lock_desc {
    /// The name: `len` bytes, not NUL-terminated, compared byte for byte.
    pub p_desc: *const c_char,
    /// 1..=`MAX_LOCK_DESC_LEN`.
    pub len: c_uint,
    /// `DLOCK_ATOMIC`, `DLOCK_RW` or `DLOCK_FAIR`.
    pub lock_type: c_uint,
    /// Unused, as in the reference (the lease is per request).
    pub lease_time: c_uint,
}

/// One lock operation (`trylock`, `lock`, `lock_extend`, batches, async).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct lock_request {
    /// From `get_lock`.
    pub lock_id: c_int,
    /// An `enum lock_ops` value.
    pub lock_op: c_int,
    /// Lease in seconds, relative (the reference's unit); 0 on a trylock reads the cache.
    pub expire_time: c_uint,
}

/// Our atomic lock word: `{owner, reserved, expiry tick in ms}`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct atomic_state {
    /// The holder's client id, 0 when free.
    pub client_id: i32,
    /// Zero.
    pub rsvd: u32,
    /// Server tick (ms since the server started) after which the grant lapses.
    pub expiry_ms: u64,
}

/// Our RW lock word: `{exclusive owner, readers, first acquisition tick}`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct rw_state {
    /// The exclusive holder's client id; 0 when free or shared.
    pub client_id: i32,
    /// Shared holders.
    pub rcount: u32,
    /// Server tick of the first acquisition of the current hold; 0 when free.
    pub since_ms: u64,
}

/// Our fair lock word: the reference's four ticket counters, then a packed 64-bit word
/// (`rms` bits 0..16, `rflag` bit 16, `rcnt` bits 17..23, expiry tick in ms bits 24..64).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct fairlock_state {
    /// Completed exclusive grants.
    pub n_exclusive: u16,
    /// Completed shared grants.
    pub n_shared: u16,
    /// Next exclusive ticket.
    pub m_exclusive: u16,
    /// Next shared ticket.
    pub m_shared: u16,
    /// `rms`, `rflag`, `rcnt`, `timeout_ms` (the header's `DLOCK_FAIR_*` macros unpack it).
    pub ext: u64,
}

/// A lock word as the server last reported it (what `void *result` points to).
#[repr(C)]
#[derive(Clone, Copy)]
pub union lock_state {
    /// Atomic lock view.
    pub atomic: atomic_state,
    /// RW lock view.
    pub rw: rw_state,
    /// Fair lock view.
    pub fl: fairlock_state,
    /// The first eight bytes.
    pub base: u64,
    /// The whole word, little-endian.
    pub raw: [u8; 16],
}

impl lock_state {
    /// The view of a 128-bit lock word as the C unions lay it out (little-endian hosts).
    pub const fn from_word(word: u128) -> lock_state {
        lock_state {
            raw: word.to_le_bytes(),
        }
    }
}

impl std::fmt::Debug for lock_state {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // SAFETY: every field is plain old data over the same 16 bytes, so `raw` is always
        // initialised whichever field was written.
        let raw = unsafe { self.raw };
        write!(f, "lock_state({:#034x})", u128::from_le_bytes(raw))
    }
}

/// One batch entry's result: the word, the entry's status and the grant's fencing token.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct lock_op_res {
    /// The lock word (an anonymous union in C: `res.atomic`, `res.rw`, `res.fl`).
    pub state: lock_state,
    /// This entry's status.
    pub op_ret: c_int,
    /// Zero.
    pub rsvd: u32,
    /// The grant's fencing token (0 when the entry holds no grant): stamp protected writes
    /// with it; it is larger than every token issued before for the lock.
    pub fence: u64,
}

/// A `umo_atomic64` object to create or open by name.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct umo_atomic64_desc {
    /// The name: `len` bytes, not NUL-terminated.
    pub p_desc: *const c_char,
    /// 1..=`MAX_UMO_ATOMIC64_DESC_LEN`.
    pub len: u32,
    /// Lease in seconds, > 0.
    pub lease_time: u32,
}

/// `prkey_pwd_cb`: writes the private key's password into `buf` (room for `size` bytes, no NUL
/// needed) and returns its length in bytes, or a negative value when it has none to give. As
/// OpenSSL's `pem_password_cb` without `rwflag` and `userdata`.
pub type dlock_prkey_pwd_cb_t =
    Option<unsafe extern "C" fn(buf: *mut c_char, size: c_int) -> c_int>;

/// `erase_prkey_cb`: called with the buffer `prkey_pwd_cb` filled once dlock has copied the
/// password out, so that the application can wipe it its own way (dlock zeroes it afterwards
/// too).
pub type dlock_erase_prkey_cb_t = Option<unsafe extern "C" fn(buf: *mut c_char, size: c_int)>;

/// `cert_verify_cb`: the reference's hook to check a peer certificate against the CRL file
/// itself. dlock checks the CA and CRL files with its own verifier and has no OpenSSL
/// certificate to pass, so the field must be NULL (`server_start` and `dclient_lib_init`
/// refuse anything else with `DLOCK_EINVAL`).
pub type dlock_cert_verify_cb_t =
    Option<unsafe extern "C" fn(cert: *mut c_void, crl_path: *const c_char) -> c_int>;

/// A revoke of a cached grant, as `client_revokes_poll` reports it (ours; the reference has
/// no cached grants).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct dlock_revoke {
    /// The lock another client wants, or [`DLOCK_REVOKE_ALL`] when revokes were lost (an event
    /// ring overflowed) and every cached lock of the client was revoked.
    pub lock_id: c_int,
    /// The mode wanted: `LOCK_EXCLUSIVE` (give the lock back) or `LOCK_SHARED` (give it back,
    /// or downgrade it with `lock_downgrade`).
    pub wanted_op: c_int,
}

/// `dlock_revoke::lock_id` of a revoke of every cached lock (never a lock id: ids are > 0).
pub const DLOCK_REVOKE_ALL: c_int = 0;

/// `client_revoke_callback_register`'s callback: told of each revoke of a cached grant of
/// `client_id`, with the registration's `user_data`. Called on the thread that calls
/// `client_revokes_poll` for that client, with no lock of the library held.
pub type dlock_revoke_cb_t = Option<
    unsafe extern "C" fn(client_id: c_int, revoke: *const dlock_revoke, user_data: *mut c_void),
>;

/// TLS 1.3 with certificates on both ends of every TCP connection (the reference's `ssl_cfg`).
/// Paths are read (and made absolute) when the settings are handed in; NULL and "" mean none.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ssl_cfg {
    /// C `bool`: TLS on TCP connections. False: plaintext, and every other field is ignored.
    pub ssl_enable: u8,
    /// The CA bundle (PEM) the peer's certificate must chain to. Required when enabled.
    pub ca_path: *const c_char,
    /// NULL or "": no revocation check; else a PEM file of CRLs checked on the peer's chain
    /// (once given, a certificate whose issuer has no CRL in it is refused).
    pub crl_path: *const c_char,
    /// This end's certificate chain (PEM, leaf first). Required when enabled.
    pub cert_path: *const c_char,
    /// This end's private key (PEM: PKCS#8, encrypted PKCS#8 with `prkey_pwd_cb`, PKCS#1,
    /// SEC1). Required when enabled.
    pub prkey_path: *const c_char,
    /// Must be NULL (see [`dlock_cert_verify_cb_t`]).
    pub cert_verify_cb: dlock_cert_verify_cb_t,
    /// NULL for an unencrypted key; else asked once for the password of an encrypted one.
    pub prkey_pwd_cb: dlock_prkey_pwd_cb_t,
    /// NULL, or called on the password buffer after use.
    pub erase_prkey_cb: dlock_erase_prkey_cb_t,
}

impl ssl_cfg {
    /// TLS off, every pointer NULL.
    pub const DISABLED: ssl_cfg = ssl_cfg {
        ssl_enable: 0,
        ca_path: std::ptr::null(),
        crl_path: std::ptr::null(),
        cert_path: std::ptr::null(),
        prkey_path: std::ptr::null(),
        cert_verify_cb: None,
        prkey_pwd_cb: None,
        erase_prkey_cb: None,
    };
}

/// `dclient_lib_init` settings.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct client_cfg {
    /// Accepted and ignored: logs go to the host's `tracing` subscriber.
    pub log_level: c_int,
    /// TCP port for `client_init("ip")`: <= 0 is 21616, else 1024..=65535.
    pub primary_port: c_int,
    /// Client lease to ask the server for, in ms (0: the server's).
    pub lease_ms: c_uint,
    /// Synchronous request timeout in ms (0: the reference's 5,000).
    pub timeout_ms: c_uint,
    /// TLS for clients registered by `"ip[:port]"` (the in-process server needs none). The
    /// server's certificate must carry the IP address the client was given.
    pub ssl: ssl_cfg,
}

/// The primary server's settings (the reference's `primary_cfg`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct primary_cfg {
    /// Must be 0 (no replicas, as in the reference).
    pub num_of_replica: c_uint,
    /// Clients expected to re-sync after a failover (0: start ready).
    pub recovery_client_num: c_uint,
    /// NULL or "": unpinned; else a CPU list ("3", "2-5", "1,4"): the control thread is
    /// pinned to its first CPU.
    pub ctrl_cpuset: *const c_char,
    /// The same for the data (command) thread.
    pub cmd_cpuset: *const c_char,
    /// NULL or "": no TCP listener (shared memory only); else the IPv4/IPv6 address to
    /// listen on.
    pub server_ip_str: *const c_char,
    /// TCP port: 0 is 21616, < 0 any free port (see `server_tcp_port`), else 1..=65535.
    pub server_port: c_int,
    /// Ignored (no replicas).
    pub replica_port: c_int,
    /// C `bool`; must be false.
    pub replica_enable: u8,
}

/// `server_start` settings: the reference's fields that mean something here, then dlock's
/// capacities (0 in any of them: the default).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct server_cfg {
    /// `SERVER_PRIMARY`.
    pub r#type: c_int,
    /// Accepted and ignored: logs go to the host's `tracing` subscriber.
    pub log_level: c_int,
    /// C `bool`: park the data thread as soon as it is idle (least CPU); false spins, then
    /// yields, then parks (adaptive).
    pub sleep_mode_enable: u8,
    /// Primary settings.
    pub primary: primary_cfg,
    /// Lock slots (default 51,200).
    pub locks_max: c_uint,
    /// Registered clients (default 1,000).
    pub clients_max: c_uint,
    /// `umo_atomic64` objects (default 102,400).
    pub objects_max: c_uint,
    /// A silent client is declared dead after this many ms (default 5,000; at least 100).
    pub client_lease_ms: c_uint,
    /// The longest lease granted in ms (default 30,000): a client asking for more gets this.
    pub client_lease_max_ms: c_uint,
    /// Server incarnation, 1..=65535 (default 1): a replacement server needs a larger one.
    pub epoch: c_uint,
    /// NULL: anonymous region (clients in this process only); else `/dev/shm/<name>`.
    pub shm_name: *const c_char,
    /// TLS on every connection to the TCP listener (`primary.server_ip_str`).
    pub ssl: ssl_cfg,
    /// C `bool`: serve plaintext TCP on a non-loopback address. Without TLS a server listens on
    /// a loopback address only unless this is set, because anyone who reaches the port could
    /// register and everything would cross the network in clear.
    pub insecure_plaintext: u8,
    /// NULL, or a file with the session key this server shares with the server that may
    /// replace it (64 hex digits on the first line): sessions and grant proofs are minted under
    /// it, and a recovering server takes back only clients and locks proved with it. A key of
    /// obviously low entropy is refused.
    pub session_key_file: *const c_char,
    /// C `bool`: recover (`primary.recovery_client_num > 0`) without a session key. Without a
    /// key a recovering server would take every re-registration and claim at its word, so it
    /// refuses to start unless this is set (the reference has no key and no such check).
    pub insecure_recovery: u8,
    /// C `bool`: every local client (this process's, and others' over the Unix socket) is a
    /// recoverer: its `recovery_done` releases a dead client's retained locks. Remote clients
    /// never are through this ABI. False: nobody is, and retained locks stay until restart.
    pub recoverer_local: u8,
    /// Membership of a dlock cluster on etcd; all zero (NULL) for a standalone server.
    pub cluster: cluster_cfg,
}

/// `server_cfg.cluster`: the server joins a dlock cluster on etcd and serves the partitions
/// its map gives it (`docs/cluster.md`). Needs a library built with the `cluster` feature;
/// without it, setting any field makes `server_start` fail with `DLOCK_EINVAL` (and log why)
/// rather than start a standalone server the caller did not ask for. Strings are NULL or
/// NUL-terminated; 0 in a number means its default.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct cluster_cfg {
    /// NULL or "": standalone. Else etcd's endpoints, comma-separated URLs
    /// (`http://etcd-1:2379,http://etcd-2:2379`; `https://` with `etcd_ca_path`).
    pub etcd_endpoints: *const c_char,
    /// The cluster's name, 1-64 of `[A-Za-z0-9._-]`: its keys live under `/dlock/<name>/`.
    pub cluster_name: *const c_char,
    /// This server's id in the cluster: 1 or more, unique, kept across restarts.
    pub server_id: c_uint,
    /// The etcd lease TTL in ms, rounded up to whole seconds (default 10,000). A server that
    /// loses etcd stops granting before it runs out: keep it above the longest etcd outage to
    /// ride out.
    pub ttl_ms: c_uint,
    /// The cluster's partition count, fixed at its creation (1..=4096, default 256); a server
    /// configured otherwise is refused at start.
    pub partitions: c_uint,
    /// How far ahead of a counter's value its high-water mark is reserved in etcd (default
    /// 100,000): a few seconds' worth of fetch-and-adds.
    pub counter_step: c_uint,
    /// NULL: the other servers reach this one at `primary.server_ip_str` and its port (which
    /// must then be a fixed port of an address that is not unspecified); else `host:port`.
    pub advertise: *const c_char,
    /// etcd over TLS with a client certificate: the CA that signed etcd's certificate, this
    /// server's certificate chain and its private key (PEM paths), all three or none.
    pub etcd_ca_path: *const c_char,
    /// This server's client certificate chain for etcd (PEM).
    pub etcd_cert_path: *const c_char,
    /// Its private key (PEM).
    pub etcd_key_path: *const c_char,
    /// NULL: etcd's certificate must name the endpoint's host; else this name.
    pub etcd_domain: *const c_char,
}

impl cluster_cfg {
    /// A standalone server: every field zero or NULL.
    pub const STANDALONE: cluster_cfg = cluster_cfg {
        etcd_endpoints: std::ptr::null(),
        cluster_name: std::ptr::null(),
        server_id: 0,
        ttl_ms: 0,
        partitions: 0,
        counter_step: 0,
        advertise: std::ptr::null(),
        etcd_ca_path: std::ptr::null(),
        etcd_cert_path: std::ptr::null(),
        etcd_key_path: std::ptr::null(),
        etcd_domain: std::ptr::null(),
    };

    /// Whether any field is set (a standalone server leaves them all zero or NULL).
    pub fn is_set(&self) -> bool {
        let strings = [
            self.etcd_endpoints,
            self.cluster_name,
            self.advertise,
            self.etcd_ca_path,
            self.etcd_cert_path,
            self.etcd_key_path,
            self.etcd_domain,
        ];
        let numbers = [
            self.server_id,
            self.ttl_ms,
            self.partitions,
            self.counter_step,
        ];
        strings.iter().any(|p| !p.is_null()) || numbers.iter().any(|&n| n != 0)
    }
}

/// Server (or client) counters, indexed by `enum debug_stats_code`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct debug_stats {
    /// One `u64` per counter.
    pub stats: [u64; DEBUG_STATS_MAX],
}

const _: () = assert!(size_of::<lock_request>() == 12);
const _: () = assert!(size_of::<atomic_state>() == 16);
const _: () = assert!(size_of::<rw_state>() == 16);
const _: () = assert!(size_of::<fairlock_state>() == 16);
const _: () = assert!(size_of::<lock_state>() == 16);
const _: () = assert!(align_of::<lock_state>() == 8);
const _: () = assert!(size_of::<lock_op_res>() == 32);
const _: () = assert!(size_of::<debug_stats>() == 8 * DEBUG_STATS_MAX);
const _: () = assert!(size_of::<dlock_revoke>() == 8);
const _: () = assert!(size_of::<dlock_revoke_cb_t>() == size_of::<*const c_void>());
// Two pointers, four numbers, five pointers (64-bit targets).
#[cfg(target_pointer_width = "64")]
const _: () = assert!(size_of::<cluster_cfg>() == 72);
// A flag padded to a pointer, four paths, three callbacks (64-bit targets).
#[cfg(target_pointer_width = "64")]
const _: () = assert!(size_of::<ssl_cfg>() == 64);
const _: () = assert!(size_of::<dlock_prkey_pwd_cb_t>() == size_of::<*const c_void>());
// A lock word is what `lock_state` holds.
const _: () = assert!(size_of::<lock_state>() == size_of::<u128>());
