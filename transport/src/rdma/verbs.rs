//! Owners of raw verbs objects: device context, protection domain, completion queue, queue
//! pair, and the queue-pair state transitions. Memory registration lives in `registered.rs`,
//! posting work requests in `post.rs`; no other file calls `ibv_*` functions.
//!
//! Each owner frees its object on drop and holds an `Arc` to the object it was created from, so
//! a child is always destroyed before its parent (a QP before its PD and CQ, a PD before its
//! context), whatever order the caller drops things in. Destroy errors are ignored: they only
//! happen while a child still exists, which the `Arc`s rule out, and a panic in `drop` would
//! turn a leak into an abort.
//!
//! The queue-pair transitions mirror `ibverbs::PreparedQueuePair::handshake` (0.9.2), with two
//! changes: receives are posted between INIT and RTR (so the peer can never find an empty
//! receive queue), and the responder's access flags, the PSNs and the path MTU come from the
//! endpoint records instead of being fixed.

use std::ffi::CStr;
use std::io;
use std::ptr::{self, NonNull};
use std::sync::Arc;

use ibverbs_sys as ffi;

use super::endpoint::Endpoint;
use super::{RdmaConfig, RdmaError};

/// The errno of the verb that just failed by returning NULL.
fn last_errno() -> i32 {
    io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn verb(verb: &'static str, errno: i32) -> RdmaError {
    RdmaError::Verb { verb, errno }
}

/// `ibv_wc_status_str`, for error messages.
pub(crate) fn wc_status_str(status: u32) -> String {
    // SAFETY: `ibv_wc_status_str` accepts any value and returns a pointer to a static,
    // NUL-terminated string ("unknown" for values it does not know).
    let s = unsafe { ffi::ibv_wc_status_str(status) };
    if s.is_null() {
        return "unknown".to_owned();
    }
    // SAFETY: non-null, static and NUL-terminated (see above).
    unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
}

/// An opened device and what we learnt about the port we use.
pub(crate) struct Context {
    ctx: NonNull<ffi::ibv_context>,
    pub(crate) name: String,
    pub(crate) port_num: u8,
    pub(crate) lid: u16,
    /// `ibv_mtu` of the port (1 = 256 B … 5 = 4096 B).
    pub(crate) mtu: u8,
    /// The GID index and GID this port routes with, if it uses a global routing header.
    pub(crate) gid: Option<(u8, [u8; 16])>,
    /// Whether the device executes remote atomics.
    pub(crate) atomics: bool,
}

// SAFETY: libibverbs objects may be used from any thread (its documented thread-safety level),
// and `Context` has no Rust-side interior state: its other fields are plain values.
unsafe impl Send for Context {}
// SAFETY: as above; every method takes `&self` and only passes the pointer to thread-safe verbs.
unsafe impl Sync for Context {}

impl Context {
    /// Opens the device named in `cfg` and queries its port.
    pub(crate) fn open(cfg: &RdmaConfig) -> Result<Arc<Context>, RdmaError> {
        let ctx = open_by_name(&cfg.device)?;
        // Own the context at once so every early return below closes it.
        let mut me = Context {
            ctx,
            name: cfg.device.clone(),
            port_num: cfg.port_num,
            lid: 0,
            mtu: 0,
            gid: None,
            atomics: false,
        };
        let port = me.query_port()?;
        me.lid = port.lid;
        me.mtu = port.active_mtu as u8;
        let ethernet = u32::from(port.link_layer) == ffi::IBV_LINK_LAYER_ETHERNET;
        if let Some(index) = cfg.gid_index.or(ethernet.then_some(0)) {
            me.gid = Some((index, me.query_gid(index)?));
        }
        let mut dev = ffi::ibv_device_attr::default();
        // SAFETY: `ctx` is an open context and `dev` a writable `ibv_device_attr`.
        let errno = unsafe { ffi::ibv_query_device(me.ctx.as_ptr(), &mut dev) };
        if errno != 0 {
            return Err(verb("ibv_query_device", errno));
        }
        me.atomics = dev.atomic_cap != ffi::IBV_ATOMIC_NONE;
        Ok(Arc::new(me))
    }

    fn query_port(&self) -> Result<ffi::ibv_port_attr, RdmaError> {
        let mut attr = ffi::ibv_port_attr::default();
        // SAFETY: `ctx` is open; the exported `ibv_query_port` fills the older, shorter
        // `_compat_ibv_port_attr`, which is a prefix of the zeroed `ibv_port_attr` we pass (this
        // is exactly what ibverbs 0.9.2 does).
        let errno = unsafe {
            ffi::ibv_query_port(self.ctx.as_ptr(), self.port_num, (&raw mut attr).cast())
        };
        if errno != 0 {
            return Err(verb("ibv_query_port", errno));
        }
        // The GID table and LID are only meaningful on an ACTIVE or ARMED port.
        if attr.state != ffi::ibv_port_state::IBV_PORT_ACTIVE
            && attr.state != ffi::ibv_port_state::IBV_PORT_ARMED
        {
            return Err(RdmaError::PortNotActive {
                port_num: self.port_num,
                state: attr.state,
            });
        }
        Ok(attr)
    }

    fn query_gid(&self, index: u8) -> Result<[u8; 16], RdmaError> {
        let mut gid = ffi::ibv_gid { raw: [0; 16] };
        // SAFETY: `ctx` is open and `gid` is a writable `ibv_gid`.
        let errno = unsafe {
            ffi::ibv_query_gid(self.ctx.as_ptr(), self.port_num, i32::from(index), &mut gid)
        };
        if errno != 0 {
            return Err(verb("ibv_query_gid", errno));
        }
        // SAFETY: every bit pattern is a valid `[u8; 16]`, so reading this union field is fine.
        Ok(unsafe { gid.raw })
    }
}

/// Finds the device called `name` and opens it.
fn open_by_name(name: &str) -> Result<NonNull<ffi::ibv_context>, RdmaError> {
    let mut n = 0i32;
    // SAFETY: `n` is a writable int; the returned list is freed below on every path.
    let list = unsafe { ffi::ibv_get_device_list(&mut n) };
    if list.is_null() {
        return Err(match last_errno() {
            libc::ENOSYS | libc::ENOENT | libc::ENODEV => RdmaError::NoDevice,
            errno => verb("ibv_get_device_list", errno),
        });
    }
    // SAFETY: a non-null list holds `n` device pointers (and a NULL after them).
    let devices = unsafe { std::slice::from_raw_parts(list, usize::try_from(n).unwrap_or(0)) };
    let found = devices.iter().copied().find(|&d| {
        // SAFETY: `d` is a device of the live list; the name is a NUL-terminated string owned
        // by the device.
        let p = unsafe { ffi::ibv_get_device_name(d) };
        // SAFETY: non-null and NUL-terminated (see above), read before the list is freed.
        !p.is_null() && unsafe { CStr::from_ptr(p) }.to_bytes() == name.as_bytes()
    });
    let opened = found.map(|d| {
        // SAFETY: `d` is a device of the live list; a context outlives the list it came from
        // (ibv_free_device_list(3): open what you need before freeing the list).
        let ctx = unsafe { ffi::ibv_open_device(d) };
        NonNull::new(ctx).ok_or_else(|| verb("ibv_open_device", last_errno()))
    });
    let empty = devices.is_empty();
    // SAFETY: `list` came from `ibv_get_device_list` and is freed once; nothing read from it is
    // used afterwards except the opened context, which stays valid.
    unsafe { ffi::ibv_free_device_list(list) };
    match opened {
        Some(ctx) => ctx,
        None if empty => Err(RdmaError::NoDevice),
        None => Err(RdmaError::DeviceNotFound {
            name: name.to_owned(),
        }),
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: opened by `ibv_open_device`, closed once; every child holds an `Arc` to this
        // context, so none is left.
        unsafe { ffi::ibv_close_device(self.ctx.as_ptr()) };
    }
}

/// A protection domain: the memory regions and queue pairs that may be used together.
pub(crate) struct Pd {
    pd: NonNull<ffi::ibv_pd>,
    pub(crate) ctx: Arc<Context>,
}

// SAFETY: see `Context`: the pointer is only handed to thread-safe verbs.
unsafe impl Send for Pd {}
// SAFETY: as above.
unsafe impl Sync for Pd {}

impl Pd {
    pub(crate) fn alloc(ctx: &Arc<Context>) -> Result<Arc<Pd>, RdmaError> {
        // SAFETY: `ctx` is open.
        let pd = unsafe { ffi::ibv_alloc_pd(ctx.ctx.as_ptr()) };
        let pd = NonNull::new(pd).ok_or_else(|| verb("ibv_alloc_pd", last_errno()))?;
        Ok(Arc::new(Pd {
            pd,
            ctx: Arc::clone(ctx),
        }))
    }

    pub(crate) fn as_ptr(&self) -> *mut ffi::ibv_pd {
        self.pd.as_ptr()
    }
}

impl Drop for Pd {
    fn drop(&mut self) {
        // SAFETY: allocated by `ibv_alloc_pd`, freed once; QPs and MRs hold an `Arc<Pd>`.
        unsafe { ffi::ibv_dealloc_pd(self.pd.as_ptr()) };
    }
}

/// A completion queue, polled by busy-waiting (no completion channel: the poll loop never
/// sleeps on it).
pub(crate) struct Cq {
    cq: NonNull<ffi::ibv_cq>,
    _ctx: Arc<Context>,
}

// SAFETY: see `Context`.
unsafe impl Send for Cq {}
// SAFETY: as above; `ibv_poll_cq` on one CQ from two threads is serialised by the provider.
unsafe impl Sync for Cq {}

impl Cq {
    pub(crate) fn create(ctx: &Arc<Context>, entries: usize) -> Result<Arc<Cq>, RdmaError> {
        let entries = i32::try_from(entries).map_err(|_| RdmaError::InvalidArgument("cq size"))?;
        // SAFETY: `ctx` is open; no CQ context, no channel, vector 0.
        let cq = unsafe {
            ffi::ibv_create_cq(
                ctx.ctx.as_ptr(),
                entries,
                ptr::null_mut(),
                ptr::null_mut(),
                0,
            )
        };
        let cq = NonNull::new(cq).ok_or_else(|| verb("ibv_create_cq", last_errno()))?;
        Ok(Arc::new(Cq {
            cq,
            _ctx: Arc::clone(ctx),
        }))
    }

    /// Pops up to `out.len()` completions; returns how many.
    pub(crate) fn poll(&self, out: &mut [ffi::ibv_wc]) -> Result<usize, RdmaError> {
        let max = i32::try_from(out.len()).unwrap_or(i32::MAX);
        // SAFETY: `cq` is live, so its `context` pointer and the provider's ops table are too.
        // `ibv_poll_cq` is an inline function in verbs.h that calls exactly this entry.
        let poll_cq = unsafe { (*(*self.cq.as_ptr()).context).ops.poll_cq };
        let poll_cq = poll_cq.ok_or(verb("ibv_poll_cq", libc::ENOSYS))?;
        // SAFETY: `out` has room for `max` completions of the C layout `ibv_wc` (ibverbs-sys
        // checks that layout).
        let n = unsafe { poll_cq(self.cq.as_ptr(), max, out.as_mut_ptr()) };
        usize::try_from(n).map_err(|_| verb("ibv_poll_cq", -n))
    }
}

impl Drop for Cq {
    fn drop(&mut self) {
        // SAFETY: created by `ibv_create_cq`, destroyed once; QPs using it hold an `Arc<Cq>`.
        unsafe { ffi::ibv_destroy_cq(self.cq.as_ptr()) };
    }
}

/// The responder rights a queue pair grants its peer.
#[derive(Clone, Copy, Debug)]
pub(crate) enum RemoteAccess {
    /// A client: the server never touches its memory.
    None,
    /// The server: clients may READ and do atomics on the object cells, never WRITE.
    ReadAtomic,
}

/// A reliable-connected queue pair.
pub(crate) struct Qp {
    qp: NonNull<ffi::ibv_qp>,
    pd: Arc<Pd>,
    _cq: Arc<Cq>,
}

// SAFETY: see `Context`; posting to one QP from two threads is serialised by the provider.
unsafe impl Send for Qp {}
// SAFETY: as above.
unsafe impl Sync for Qp {}

impl Qp {
    /// Creates an RC queue pair in RESET with one CQ for both queues.
    pub(crate) fn create(
        pd: &Arc<Pd>,
        cq: &Arc<Cq>,
        send_wr_max: usize,
        recv_wr_max: usize,
    ) -> Result<Qp, RdmaError> {
        let bad = |_| RdmaError::InvalidArgument("queue depth");
        let mut attr = ffi::ibv_qp_init_attr {
            qp_context: ptr::null_mut(),
            send_cq: cq.cq.as_ptr(),
            recv_cq: cq.cq.as_ptr(),
            srq: ptr::null_mut(),
            cap: ffi::ibv_qp_cap {
                max_send_wr: u32::try_from(send_wr_max).map_err(bad)?,
                max_recv_wr: u32::try_from(recv_wr_max).map_err(bad)?,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            qp_type: ffi::ibv_qp_type::IBV_QPT_RC,
            // Every work request we post asks for its own completion (IBV_SEND_SIGNALED).
            sq_sig_all: 0,
        };
        // SAFETY: `pd` and `cq` are live and belong to the same context; `attr` is initialised.
        let qp = unsafe { ffi::ibv_create_qp(pd.as_ptr(), &mut attr) };
        let qp = NonNull::new(qp).ok_or_else(|| verb("ibv_create_qp", last_errno()))?;
        Ok(Qp {
            qp,
            pd: Arc::clone(pd),
            _cq: Arc::clone(cq),
        })
    }

    /// The raw queue pair, for posting (`post.rs`); live as long as `self`.
    pub(crate) fn as_ptr(&self) -> *mut ffi::ibv_qp {
        self.qp.as_ptr()
    }

    pub(crate) fn qp_num(&self) -> u32 {
        // SAFETY: `qp` is live; `qp_num` is set at creation and never changes.
        unsafe { (*self.qp.as_ptr()).qp_num }
    }

    pub(crate) fn context(&self) -> &Context {
        &self.pd.ctx
    }

    fn modify(
        &self,
        what: &'static str,
        attr: &mut ffi::ibv_qp_attr,
        mask: ffi::ibv_qp_attr_mask,
    ) -> Result<(), RdmaError> {
        // SAFETY: `qp` is live and `attr` is initialised for every bit set in `mask`.
        let errno = unsafe { ffi::ibv_modify_qp(self.qp.as_ptr(), attr, mask.0 as i32) };
        if errno != 0 {
            return Err(verb(what, errno));
        }
        Ok(())
    }

    /// RESET → INIT: bind to the port and set what the peer may do to our memory.
    pub(crate) fn to_init(&self, access: RemoteAccess) -> Result<(), RdmaError> {
        let flags = match access {
            RemoteAccess::None => ffi::ibv_access_flags(0),
            RemoteAccess::ReadAtomic => {
                ffi::ibv_access_flags::IBV_ACCESS_REMOTE_READ
                    | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC
            }
        };
        let mut attr = ffi::ibv_qp_attr {
            qp_state: ffi::ibv_qp_state::IBV_QPS_INIT,
            pkey_index: 0,
            port_num: self.context().port_num,
            qp_access_flags: flags.0,
            ..Default::default()
        };
        let mask = ffi::ibv_qp_attr_mask::IBV_QP_STATE
            | ffi::ibv_qp_attr_mask::IBV_QP_PKEY_INDEX
            | ffi::ibv_qp_attr_mask::IBV_QP_PORT
            | ffi::ibv_qp_attr_mask::IBV_QP_ACCESS_FLAGS;
        self.modify("ibv_modify_qp(INIT)", &mut attr, mask)
    }

    /// INIT → RTR → RTS against `remote`, sending from `local_psn`.
    pub(crate) fn to_rts(&self, local_psn: u32, remote: &Endpoint) -> Result<(), RdmaError> {
        let ctx = self.context();
        let mut ah = ffi::ibv_ah_attr {
            dlid: remote.lid,
            port_num: ctx.port_num,
            ..Default::default()
        };
        if let Some(gid) = remote.gid {
            let (index, _) = ctx.gid.ok_or(RdmaError::BadEndpoint(
                "peer routes by GID, this port has none",
            ))?;
            ah.is_global = 1;
            ah.grh.dgid = ffi::ibv_gid { raw: gid };
            ah.grh.hop_limit = 0xff;
            ah.grh.sgid_index = index;
        }
        let mut attr = ffi::ibv_qp_attr {
            qp_state: ffi::ibv_qp_state::IBV_QPS_RTR,
            // Both ends must agree on the path MTU; the smaller active MTU always works.
            path_mtu: u32::from(remote.mtu.min(ctx.mtu)),
            dest_qp_num: remote.qp_num,
            rq_psn: remote.psn,
            // `RdmaClient` has at most one READ or atomic outstanding, so the responder needs
            // resources for one (and every device supports at least one).
            max_dest_rd_atomic: 1,
            // 12 = 0.64 ms before the peer retries a SEND that found no receive posted.
            min_rnr_timer: 12,
            ah_attr: ah,
            ..Default::default()
        };
        let mask = ffi::ibv_qp_attr_mask::IBV_QP_STATE
            | ffi::ibv_qp_attr_mask::IBV_QP_AV
            | ffi::ibv_qp_attr_mask::IBV_QP_PATH_MTU
            | ffi::ibv_qp_attr_mask::IBV_QP_DEST_QPN
            | ffi::ibv_qp_attr_mask::IBV_QP_RQ_PSN
            | ffi::ibv_qp_attr_mask::IBV_QP_MAX_DEST_RD_ATOMIC
            | ffi::ibv_qp_attr_mask::IBV_QP_MIN_RNR_TIMER;
        self.modify("ibv_modify_qp(RTR)", &mut attr, mask)?;

        let mut attr = ffi::ibv_qp_attr {
            qp_state: ffi::ibv_qp_state::IBV_QPS_RTS,
            sq_psn: local_psn,
            // 14 → 4.096 µs × 2^14 ≈ 67 ms per transport retry; ibverbs' 4 (65 µs) is shorter
            // than a busy switch may need.
            timeout: 14,
            retry_cnt: 7,
            // 7 = retry forever on receiver-not-ready; our own deadline bounds the wait.
            rnr_retry: 7,
            max_rd_atomic: 1,
            ..Default::default()
        };
        let mask = ffi::ibv_qp_attr_mask::IBV_QP_STATE
            | ffi::ibv_qp_attr_mask::IBV_QP_SQ_PSN
            | ffi::ibv_qp_attr_mask::IBV_QP_TIMEOUT
            | ffi::ibv_qp_attr_mask::IBV_QP_RETRY_CNT
            | ffi::ibv_qp_attr_mask::IBV_QP_RNR_RETRY
            | ffi::ibv_qp_attr_mask::IBV_QP_MAX_QP_RD_ATOMIC;
        self.modify("ibv_modify_qp(RTS)", &mut attr, mask)
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        // SAFETY: created by `ibv_create_qp`, destroyed once. Destroying flushes every posted
        // work request, so after this the device no longer touches any buffer we posted; the
        // owners of those buffers drop them after the QP (field order in `Channel`).
        unsafe { ffi::ibv_destroy_qp(self.qp.as_ptr()) };
    }
}
