//! An open transaction ([`Txn`]): the guard of every key a worker's transaction acquires,
//! which releases them all when it commits, aborts or drops. It owns nothing itself: it
//! borrows the worker's [`RowGroupLocks`], whose open transaction it is, and reads and ends
//! that through the worker's own methods.

use std::time::Instant;

use dlock_core::{FencingToken, Mode, Status};
use dlock_transport::client::Connection;
use dlock_transport::client::link::Link;

use super::{AcquireOptions, RowGroup, RowGroupLocks};

/// An open transaction's lock set: the one guard for every key it acquires, however many
/// calls and messages that took. Commit or abort releases every key; so does dropping it (a
/// failed release is then logged; a lost key has already gone to the `on_lost` callback).
///
/// This is the row-group form of the native API's guard set
/// ([`dlock_transport::client::GuardSet`]): it borrows the worker's [`RowGroupLocks`] rather
/// than sharing a client, because a worker runs one transaction at a time, and it unlocks when
/// it ends rather than sending the unlocks for a later call to read, because a transaction's
/// end is where the engine wants its locks released.
///
/// ```
/// # use dlock_engine_glue::EmbeddedServer;
/// # use dlock_engine_glue::dlock_core::Config;
/// # let server = EmbeddedServer::start(EmbeddedServer::config(Config {
/// #     locks_max: 256, clients_max: 8, objects_max: 8, ..Config::default()
/// # }))?;
/// use std::time::Duration;
/// use dlock_engine_glue::dlock_core::Mode;
/// use dlock_engine_glue::rowgroup::{AcquireOptions, RowGroup, RowGroupConfig, RowGroupLocks};
///
/// let mut locks = RowGroupLocks::new(server.client()?, RowGroupConfig::default())?;
/// let mut txn = locks.begin();
/// let (orders, items) = (RowGroup::new(1, 17), RowGroup::new(2, 4));
/// // One call, taken in key order (no deadlock), all or nothing, waiting up to 1 s.
/// let opts = AcquireOptions::wait(Duration::from_secs(1)).all_or_nothing();
/// txn.acquire(&[(orders, Mode::Exclusive), (items, Mode::Shared)], opts)?;
/// let token = txn.token(orders).expect("held"); // goes with every write to `orders`
/// # let _ = token;
/// txn.commit()?; // releases the whole set (dropping the transaction aborts it)
/// # server.shutdown();
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
#[must_use = "dropping a transaction aborts it and releases its keys"]
pub struct Txn<'a, C: Connection = Link> {
    pub(super) locks: &'a mut RowGroupLocks<C>,
}

impl<C: Connection> Txn<'_, C> {
    /// Takes `requests` in key order (see the [`rowgroup`](super) module doc for waiting,
    /// re-entrancy and all-or-nothing). `Fail`: a key was busy and not waited for; `Etimeout`:
    /// the wait ran out; `Einval`: a shared-to-exclusive upgrade; a fatal status
    /// ([`is_fatal`](super::is_fatal)): the client is gone and every key was lost.
    pub fn acquire(
        &mut self,
        requests: &[(RowGroup, Mode)],
        opts: AcquireOptions,
    ) -> Result<(), Status> {
        self.locks.acquire(requests, opts)
    }

    /// The fencing token of `key`'s grant, to carry with every write it protects; `None` when
    /// the key is not held (or was lost: its token is stale).
    pub fn token(&self, key: RowGroup) -> Option<FencingToken> {
        let i = self.locks.find(key).ok()?;
        Some(self.locks.held[i].token)
    }

    /// The mode `key` is held in.
    pub fn mode(&self, key: RowGroup) -> Option<Mode> {
        let i = self.locks.find(key).ok()?;
        Some(self.locks.held[i].mode)
    }

    /// Every held key with its mode and token, in key order.
    pub fn held(&self) -> impl ExactSizeIterator<Item = (RowGroup, Mode, FencingToken)> + '_ {
        self.locks.held.iter().map(|h| (h.key, h.mode, h.token))
    }

    /// Keys this transaction lost, with their stale tokens; non-empty means it must abort.
    pub fn lost(&self) -> &[(RowGroup, FencingToken)] {
        &self.locks.lost
    }

    /// [`RowGroupLocks::keep_leases`], for an engine inside a transaction.
    pub fn keep_leases(&mut self, now: Instant) -> Result<(), Status> {
        self.locks.keep_leases(now)
    }

    /// Releases every key. `Err` when a key was lost (the transaction's writes may have been
    /// fenced off: treat it as aborted) or a release failed.
    pub fn commit(self) -> Result<(), Status> {
        let lost = !self.locks.lost.is_empty();
        let released = self.locks.end();
        if lost {
            return Err(self.locks.dead.unwrap_or(Status::Fail));
        }
        released
    }

    /// Releases every key; `Err` when a release failed (the keys are forgotten all the same).
    pub fn abort(self) -> Result<(), Status> {
        self.locks.end()
    }
}

impl<C: Connection> Drop for Txn<'_, C> {
    fn drop(&mut self) {
        // Empty after commit or abort; otherwise this is the abort. A drop cannot return the
        // error and must not panic, so it is logged (fatal ones also reached `on_lost`).
        if let Err(s) = self.locks.end() {
            tracing::warn!(status = %s, "dlock: row-group release failed when a transaction was dropped");
        }
    }
}
