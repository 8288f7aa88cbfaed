//! How the data thread is woken from its one idle wait.
//!
//! When it has nothing to do the data thread blocks in a single `epoll_wait` on its own mio
//! `Poll` (`runtime/tcp.rs`), which covers the TCP data connections it owns *and* an eventfd
//! (mio's `Waker`). Everything else that can bring it work rings that eventfd, after taking the
//! park flag in the region (`ShmHeader::take_parked`, the Dekker handshake of `shm`'s module
//! doc, so a waker issues a wake only when the thread sleeps or is about to):
//!
//! - the control thread (a job in the inbox, a connection handed over) and clients in this
//!   process (a doorbell rung) can see the eventfd through [`Shared`]: they write it directly;
//! - clients in another process map the region but cannot see an eventfd of ours. They bump
//!   the region's `bell` word and futex-wake it (`ShmHeader::wake_server`); a small *bridge*
//!   thread sleeps on that word and passes each bump on to the eventfd.
//!
//! Why a bridge rather than passing the eventfd to those clients over the Unix control socket
//! (`SCM_RIGHTS`): the bridge keeps the cross-process protocol what it was (a futex word in the
//! region; no descriptor in the registration exchange, no `recvmsg` in the client, nothing
//! to go wrong when a client re-registers or the descriptor limit is reached), and it costs
//! only where it matters least: one extra thread hop (a few µs) on the wake of a server that
//! had *parked* — an adaptive server stays awake for `ADAPTIVE_AWAKE` after its last work, and
//! a woken one is not woken again. Idle, the bridge sleeps in the kernel and burns nothing.

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::Shared;

impl Shared {
    /// Wakes the data thread if it is parked (or about to park). For wakers in this process;
    /// call after making the work visible (a queue push, a doorbell ring).
    pub(crate) fn wake_data(&self) {
        if self.region.shm_header().take_parked() {
            self.wake_data_now();
        }
    }

    /// Rings the data thread's eventfd unconditionally.
    pub(crate) fn wake_data_now(&self) {
        if let Err(e) = self.data_waker.wake() {
            tracing::warn!(error = %e, "cannot wake the data thread");
        }
    }
}

/// The longest the bridge sleeps before it looks at the stop flag again (shutdown rings the
/// bell, so this only bounds a missed shutdown wake).
const BRIDGE_NAP: Duration = Duration::from_secs(1);

/// The bridge thread: passes every wake that a client in another process issues through the
/// region's `bell` word on to the data thread's eventfd.
pub(super) fn bridge(shared: &Shared) {
    let header = shared.region.shm_header();
    // Relaxed: only a starting value to compare the futex word against.
    let mut seen = header.bell.load(Ordering::Relaxed);
    while !shared.stop.load(Ordering::Acquire) {
        let now = header.wait_bell(seen, Some(BRIDGE_NAP));
        if now != seen {
            seen = now;
            shared.wake_data_now();
        }
    }
}
