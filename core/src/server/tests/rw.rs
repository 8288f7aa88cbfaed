//! The reader-writer lock on the data path.

use super::*;

#[test]
fn rw_shared_unlock_from_non_holder_fails() {
    let mut s = TestServer::new(&small());
    let a = s.client(0);
    let b = s.client(0);
    let la = s.get_lock(a.get(), LockKind::Rw, b"x", 0).unwrap();
    let lb = s.get_lock(b.get(), LockKind::Rw, b"x", 0).unwrap();
    assert_eq!(
        s.run(a, lock(LockKind::Rw, LockOp::TryShared, la, 0), 0)
            .status,
        Status::Success
    );
    assert_eq!(
        s.run(b, lock(LockKind::Rw, LockOp::UnlockShared, lb, 0), 0)
            .status,
        Status::Fail
    );
    assert_eq!(
        s.run(b, lock(LockKind::Rw, LockOp::TryExclusive, lb, 0), 0)
            .status,
        Status::Fail
    );
}
