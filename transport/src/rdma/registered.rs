//! Opened devices and registered memory.
//!
//! [`RdmaDevice::register`] is the one place that calls `ibv_reg_mr`. ibverbs 0.9.2 can only
//! register a `Vec` it allocates itself, but the server's tables live in a mapping the server
//! made (the region), and the device must write them where they are; hence the raw call.

use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

use ibverbs_sys as ffi;
use memmap2::MmapMut;

use super::verbs::{Context, Pd};
use super::{RdmaConfig, RdmaError};

/// An opened RDMA device with one protection domain. Every registration and queue pair made
/// from one `RdmaDevice` (or its clones) can be used together.
#[derive(Clone)]
pub struct RdmaDevice {
    pub(crate) pd: Arc<Pd>,
}

impl fmt::Debug for RdmaDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ctx = &self.pd.ctx;
        f.debug_struct("RdmaDevice")
            .field("name", &ctx.name)
            .field("port_num", &ctx.port_num)
            .field("lid", &ctx.lid)
            .field("mtu", &ctx.mtu)
            .field("gid", &ctx.gid)
            .field("atomics", &ctx.atomics)
            .finish()
    }
}

impl RdmaDevice {
    /// Opens the device named in `cfg` and allocates its protection domain.
    ///
    /// [`RdmaError::NoDevice`] when the host has no RDMA at all,
    /// [`RdmaError::DeviceNotFound`] when it has other devices.
    pub fn open(cfg: &RdmaConfig) -> Result<Self, RdmaError> {
        let ctx = Context::open(cfg)?;
        Ok(Self {
            pd: Pd::alloc(&ctx)?,
        })
    }

    /// The kernel device name.
    pub fn name(&self) -> &str {
        &self.pd.ctx.name
    }

    /// Whether the device executes remote atomics (needed for object operations).
    pub fn supports_atomics(&self) -> bool {
        self.pd.ctx.atomics
    }

    /// Registers `len` bytes at `ptr` for local write and remote read, write and atomic access.
    ///
    /// # Safety
    ///
    /// - `ptr..ptr + len` is memory this process has mapped (for example a `memmap2` mapping),
    ///   readable and writable.
    /// - It stays mapped at the same address, and is not moved, remapped or unmapped, for as
    ///   long as the returned [`RegisteredRegion`] lives: the device reads and writes those
    ///   physical pages without the CPU, so a stale registration would let it touch memory
    ///   that belongs to something else.
    /// - Whoever holds the keys may change the bytes at any time while the registration lives;
    ///   the caller accesses the memory only in ways that tolerate that (atomics, or buffers no
    ///   posted work request names).
    pub unsafe fn register(&self, ptr: *mut u8, len: usize) -> Result<RegisteredRegion, RdmaError> {
        // Remote write and atomic access require local write (ibv_reg_mr(3)).
        let access = ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE
            | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_READ
            | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE
            | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC;
        // SAFETY: the caller's contract is `register`'s, which is `register_with`'s.
        unsafe { self.register_with(ptr, len, access) }
    }

    /// Registers `len` bytes at `ptr` for remote READ and atomics but not remote WRITE: a
    /// server's object cells, which clients change only with atomics.
    ///
    /// # Safety
    ///
    /// As for [`Self::register`].
    pub(crate) unsafe fn register_read_atomic(
        &self,
        ptr: *mut u8,
        len: usize,
    ) -> Result<RegisteredRegion, RdmaError> {
        // Remote atomic access requires local write (ibv_reg_mr(3)).
        let access = ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE
            | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_READ
            | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC;
        // SAFETY: the caller's contract is `register`'s, which is `register_with`'s.
        unsafe { self.register_with(ptr, len, access) }
    }

    /// `ibv_reg_mr` with the given access flags.
    ///
    /// # Safety
    ///
    /// As for [`Self::register`]; with remote access flags, whoever holds the rkey may change
    /// the memory at any time.
    unsafe fn register_with(
        &self,
        ptr: *mut u8,
        len: usize,
        access: ffi::ibv_access_flags,
    ) -> Result<RegisteredRegion, RdmaError> {
        if ptr.is_null() || len == 0 {
            return Err(RdmaError::InvalidArgument("empty memory range"));
        }
        // SAFETY: the protection domain is live; the caller guarantees the range is mapped and
        // stays so for the registration's life; `access` holds only flags this libibverbs knows.
        let mr = unsafe { ffi::ibv_reg_mr(self.pd.as_ptr(), ptr.cast(), len, access.0 as i32) };
        let mr = NonNull::new(mr).ok_or_else(|| RdmaError::Verb {
            verb: "ibv_reg_mr",
            errno: std::io::Error::last_os_error().raw_os_error().unwrap_or(0),
        })?;
        Ok(RegisteredRegion {
            mr,
            _pd: Arc::clone(&self.pd),
        })
    }

    /// Maps `len` fresh zeroed bytes and registers them for local access only; the endpoints'
    /// own message buffers.
    ///
    /// No remote access: SEND, RECV, and the results of READ and atomics use only the lkey. Every
    /// queue pair of a server shares one protection domain, so a buffer registered with remote
    /// rights could be read or changed by any client that guessed its rkey (rkeys are 32 bits
    /// and often sequential) — including the slots holding other clients' requests.
    pub(crate) fn register_anonymous(&self, len: usize) -> Result<OwnedBuffer, RdmaError> {
        let mut map = MmapMut::map_anon(len).map_err(|e| RdmaError::Verb {
            verb: "mmap",
            errno: e.raw_os_error().unwrap_or(0),
        })?;
        let base = NonNull::new(map.as_mut_ptr()).ok_or(RdmaError::InvalidArgument("len"))?;
        let access = ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE;
        // SAFETY: `map` is a private anonymous mapping of `len` bytes that `OwnedBuffer` keeps
        // alive, unmoved (a mapping does not move when its `MmapMut` handle moves), and unmaps
        // only after the registration is dropped (field order). Its bytes are accessed only
        // through `OwnedBuffer::base` for slots no posted work request names; with local access
        // only, no peer can change them.
        let mr = unsafe { self.register_with(base.as_ptr(), len, access) }?;
        Ok(OwnedBuffer {
            mr,
            _map: map,
            base,
        })
    }
}

/// A registered memory range; deregistered on drop.
pub struct RegisteredRegion {
    mr: NonNull<ffi::ibv_mr>,
    _pd: Arc<Pd>,
}

// SAFETY: the handle is only read (keys, address, length, set at registration) or passed to the
// thread-safe `ibv_dereg_mr`; the memory it covers is governed by `register`'s contract.
unsafe impl Send for RegisteredRegion {}
// SAFETY: as above; no method mutates through `&self`.
unsafe impl Sync for RegisteredRegion {}

impl RegisteredRegion {
    fn mr(&self) -> &ffi::ibv_mr {
        // SAFETY: `mr` is live until `drop`, and libibverbs never changes these fields after
        // `ibv_reg_mr` returns.
        unsafe { self.mr.as_ref() }
    }

    /// Local key: names this memory in our own work requests.
    pub fn lkey(&self) -> u32 {
        self.mr().lkey
    }

    /// Remote key: what a peer needs, with the address, to read, write or do atomics here.
    pub fn rkey(&self) -> u32 {
        self.mr().rkey
    }

    /// Address of the first registered byte.
    pub fn addr(&self) -> u64 {
        self.mr().addr as u64
    }

    /// Registered bytes.
    pub fn len(&self) -> usize {
        self.mr().length
    }

    /// Always false: empty ranges are refused at registration.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl fmt::Debug for RegisteredRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegisteredRegion")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len())
            .field("lkey", &format_args!("{:#x}", self.lkey()))
            .field("rkey", &format_args!("{:#x}", self.rkey()))
            .finish()
    }
}

impl Drop for RegisteredRegion {
    fn drop(&mut self) {
        // SAFETY: registered by `ibv_reg_mr`, deregistered once. An error (EBUSY while a memory
        // window is bound; we bind none) cannot be acted on in `drop`.
        unsafe { ffi::ibv_dereg_mr(self.mr.as_ptr()) };
    }
}

/// A registered anonymous mapping owned by one endpoint (its message slots and scratch word).
pub(crate) struct OwnedBuffer {
    // Field order is drop order: deregister before unmapping.
    mr: RegisteredRegion,
    _map: MmapMut,
    /// The mapping's first byte; all access goes through this pointer (never through a
    /// reference to the whole mapping), because the device writes slots we do not own.
    base: NonNull<u8>,
}

// SAFETY: the buffer is plain memory plus a registration handle (itself Send); the raw `base`
// pointer is only dereferenced by the owner under `Channel`'s slot discipline.
unsafe impl Send for OwnedBuffer {}

impl OwnedBuffer {
    pub(crate) fn base(&self) -> NonNull<u8> {
        self.base
    }

    pub(crate) fn lkey(&self) -> u32 {
        self.mr.lkey()
    }

    pub(crate) fn len(&self) -> usize {
        self.mr.len()
    }
}
