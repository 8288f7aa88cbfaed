//! What the native API promises about types, checked by the compiler: compile-fail doc tests
//! (each must fail with the error code it names, and the last block, the same calls on the
//! kinds that have them, must compile) and static assertions of `Send` and `Sync`.

use super::{
    AtomicLock, AtomicLockGuard, FairLock, FairLockReadGuard, FairLockWriteGuard, GuardSet, Locks,
    RwLock, RwLockReadGuard, RwLockWriteGuard,
};

/// Claims the compiler checks: each example fails to compile, with the error named, because the
/// kind of a lock is its handle's type.
///
/// An atomic lock has no shared mode, so its handle has no `try_read`:
///
/// ```compile_fail,E0599
/// # fn f(locks: dlock_transport::client::Locks) -> Result<(), dlock_transport::client::Error> {
/// let x = locks.atomic("x")?;
/// let shared = x.try_read(std::time::Duration::from_secs(5))?;
/// # Ok(()) }
/// ```
///
/// Nor can a set ask for one (an atomic entry is the handle alone, exclusive):
///
/// ```compile_fail,E0277
/// # fn f(locks: dlock_transport::client::Locks) -> Result<(), dlock_transport::client::Error> {
/// use dlock_core::Mode;
/// use dlock_transport::client::SetMode;
/// let x = locks.atomic("x")?;
/// let set = locks.try_lock_all([(&x, Mode::Shared)], std::time::Duration::from_secs(5), SetMode::PerItem)?;
/// # Ok(()) }
/// ```
///
/// An RW grant has no lease of its own, so an RW guard has no `extend`:
///
/// ```compile_fail,E0599
/// # fn f(locks: dlock_transport::client::Locks) -> Result<(), dlock_transport::client::Error> {
/// let mut w = locks.rw("t")?.try_write()?;
/// w.extend(std::time::Duration::from_secs(5))?;
/// # Ok(()) }
/// ```
///
/// Readers cannot write a lock's value block, so a read guard has no `set_value`:
///
/// ```compile_fail,E0599
/// # fn f(locks: dlock_transport::client::Locks) -> Result<(), dlock_transport::client::Error> {
/// let mut r = locks.rw("t")?.try_read()?;
/// r.set_value(&[0; 32]);
/// # Ok(()) }
/// ```
///
/// And the same calls with the kinds that have them compile:
///
/// ```
/// # fn f(locks: dlock_transport::client::Locks) -> Result<(), dlock_transport::client::Error> {
/// use dlock_core::Mode;
/// use dlock_transport::client::SetMode;
/// let lease = std::time::Duration::from_secs(5);
/// let (x, f) = (locks.fair("x")?, locks.fair("f")?);
/// let shared = x.try_read(lease)?;
/// let set = locks.try_lock_all([(&f, Mode::Shared)], lease, SetMode::PerItem)?;
/// let mut w = locks.atomic("t")?.try_lock(lease)?;
/// w.extend(lease)?;
/// w.set_value(&[0; 32]);
/// let mut rw = locks.rw("r")?.try_write()?;
/// rw.set_value(&[0; 32]);
/// # drop((shared, set, rw)); Ok(()) }
/// ```
#[cfg(doctest)]
pub fn a_kind_error_does_not_compile() {}

/// Handles, typed handles, guards and sets over a real link cross threads and are shared
/// between them.
const _: () = {
    const fn is_send_sync<T: Send + Sync>() {}
    is_send_sync::<Locks>();
    is_send_sync::<AtomicLock>();
    is_send_sync::<RwLock>();
    is_send_sync::<FairLock>();
    is_send_sync::<AtomicLockGuard>();
    is_send_sync::<RwLockReadGuard>();
    is_send_sync::<RwLockWriteGuard>();
    is_send_sync::<FairLockReadGuard>();
    is_send_sync::<FairLockWriteGuard>();
    is_send_sync::<GuardSet>();
};
