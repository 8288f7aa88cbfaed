//! Posting work requests: the data path's unsafe surface, kept in one file.
//!
//! Posting is `unsafe` for the reason ibverbs gives: the device reads or writes the named memory
//! after the call returns, until the work request's completion is polled, and the compiler
//! cannot see that. Callers (`channel.rs`) uphold the contract with a slot-ownership discipline.
//!
//! `ibv_post_send` and `ibv_post_recv` are inline functions in `verbs.h` that jump through the
//! provider's ops table; bindgen cannot bind inline functions, so we make the same call.

use std::ptr;

use ibverbs_sys as ffi;

use super::RdmaError;
use super::verbs::Qp;

fn verb(verb: &'static str, errno: i32) -> RdmaError {
    RdmaError::Verb { verb, errno }
}

/// One scatter/gather element: a range of registered memory.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Sge {
    pub(crate) addr: u64,
    pub(crate) len: u32,
    pub(crate) lkey: u32,
}

/// What a send-queue work request does.
#[derive(Clone, Copy, Debug)]
pub(crate) enum SendOp {
    /// Two-sided: the bytes of the SGE (possibly none) land in the peer's next posted receive,
    /// and `imm`, if any, in its receive completion (`IBV_WR_SEND_WITH_IMM`): the queue pair's
    /// event credits travel there (`channel.rs`), outside the message the peer reads.
    Send { imm: Option<u32> },
    /// Read 8 bytes (the SGE's length) at `remote_addr` into the SGE.
    Read { remote_addr: u64, rkey: u32 },
    /// Add `add` to the u64 at `remote_addr`; the old value lands in the SGE.
    FetchAdd {
        remote_addr: u64,
        rkey: u32,
        add: u64,
    },
    /// Store `new` at `remote_addr` if it holds `expected`; the observed value lands in the SGE.
    CompareSwap {
        remote_addr: u64,
        rkey: u32,
        expected: u64,
        new: u64,
    },
}

impl SendOp {
    /// The opcode's name, which completion errors report.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Send { imm: None } => "IBV_WR_SEND",
            Self::Send { imm: Some(_) } => "IBV_WR_SEND_WITH_IMM",
            Self::Read { .. } => "IBV_WR_RDMA_READ",
            Self::FetchAdd { .. } => "IBV_WR_ATOMIC_FETCH_AND_ADD",
            Self::CompareSwap { .. } => "IBV_WR_ATOMIC_CMP_AND_SWP",
        }
    }
}

impl Qp {
    /// Posts one signaled send-queue work request.
    ///
    /// # Safety
    ///
    /// - `sge` lies inside a memory region registered with key `sge.lkey` on this queue pair's
    ///   protection domain, with local write access unless `op` is [`SendOp::Send`]. An SGE of
    ///   length 0 names no memory: the work request then carries none (a zero-length SEND).
    /// - That memory stays mapped until the completion for `wr_id` has been polled, or this
    ///   queue pair has been destroyed.
    /// - Until then the program does not write it (for `Send`, the device reads it while the
    ///   request is outstanding) and, unless `op` is `Send`, does not read it either (the
    ///   device writes the result there).
    pub(crate) unsafe fn post_send(
        &self,
        wr_id: u64,
        sge: Sge,
        op: SendOp,
    ) -> Result<(), RdmaError> {
        let mut sg = ffi::ibv_sge {
            addr: sge.addr,
            length: sge.len,
            lkey: sge.lkey,
        };
        let mut wr = ffi::ibv_send_wr {
            wr_id,
            next: ptr::null_mut(),
            sg_list: &mut sg,
            // A zero-length SEND names no memory at all, rather than an empty range of it.
            num_sge: i32::from(sge.len > 0),
            opcode: ffi::ibv_wr_opcode::IBV_WR_SEND,
            send_flags: ffi::ibv_send_flags::IBV_SEND_SIGNALED.0,
            wr: Default::default(),
            qp_type: Default::default(),
            __bindgen_anon_1: Default::default(),
            __bindgen_anon_2: Default::default(),
        };
        match op {
            SendOp::Send { imm: None } => {}
            SendOp::Send { imm: Some(imm) } => {
                wr.opcode = ffi::ibv_wr_opcode::IBV_WR_SEND_WITH_IMM;
                // The verbs API carries immediate data in network byte order (`__be32`).
                wr.__bindgen_anon_1.imm_data = imm.to_be();
            }
            SendOp::Read { remote_addr, rkey } => {
                wr.opcode = ffi::ibv_wr_opcode::IBV_WR_RDMA_READ;
                wr.wr.rdma = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 { remote_addr, rkey };
            }
            SendOp::FetchAdd {
                remote_addr,
                rkey,
                add,
            } => {
                wr.opcode = ffi::ibv_wr_opcode::IBV_WR_ATOMIC_FETCH_AND_ADD;
                wr.wr.atomic = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_2 {
                    remote_addr,
                    compare_add: add,
                    swap: 0,
                    rkey,
                };
            }
            SendOp::CompareSwap {
                remote_addr,
                rkey,
                expected,
                new,
            } => {
                wr.opcode = ffi::ibv_wr_opcode::IBV_WR_ATOMIC_CMP_AND_SWP;
                wr.wr.atomic = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_2 {
                    remote_addr,
                    compare_add: expected,
                    swap: new,
                    rkey,
                };
            }
        }
        let mut bad: *mut ffi::ibv_send_wr = ptr::null_mut();
        // SAFETY: `qp` is live, so are its context and ops table; `ibv_post_send` is an inline
        // function in verbs.h that calls exactly this entry.
        let post = unsafe { (*(*self.as_ptr()).context).ops.post_send };
        let post = post.ok_or(verb("ibv_post_send", libc::ENOSYS))?;
        // SAFETY: `wr` and `sg` are valid for the call (the provider copies them into the send
        // queue before returning); the memory `sg` names satisfies this function's contract.
        let errno = unsafe { post(self.as_ptr(), &mut wr, &mut bad) };
        if errno != 0 {
            return Err(verb("ibv_post_send", errno));
        }
        Ok(())
    }

    /// Posts one receive buffer.
    ///
    /// # Safety
    ///
    /// - `sge` lies inside a memory region registered with key `sge.lkey`, with local write
    ///   access, on this queue pair's protection domain.
    /// - That memory stays mapped, and the program neither reads nor writes it, until the
    ///   completion for `wr_id` has been polled or this queue pair has been destroyed.
    pub(crate) unsafe fn post_recv(&self, wr_id: u64, sge: Sge) -> Result<(), RdmaError> {
        let mut sg = ffi::ibv_sge {
            addr: sge.addr,
            length: sge.len,
            lkey: sge.lkey,
        };
        let mut wr = ffi::ibv_recv_wr {
            wr_id,
            next: ptr::null_mut(),
            sg_list: &mut sg,
            num_sge: 1,
        };
        let mut bad: *mut ffi::ibv_recv_wr = ptr::null_mut();
        // SAFETY: as in `post_send`: live QP, and `ibv_post_recv` is this inline call.
        let post = unsafe { (*(*self.as_ptr()).context).ops.post_recv };
        let post = post.ok_or(verb("ibv_post_recv", libc::ENOSYS))?;
        // SAFETY: `wr` and `sg` are valid for the call; the memory satisfies the contract above.
        let errno = unsafe { post(self.as_ptr(), &mut wr, &mut bad) };
        if errno != 0 {
            return Err(verb("ibv_post_recv", errno));
        }
        Ok(())
    }
}
