//! The reference's limits at the default capacities: the last slot of every table succeeds, the
//! next request gets the reference's status, and the refusal changes nothing.

use dlock_core::proto::LockOp;
use dlock_core::{Config, LockKind, Status};
use dlock_tests::{BLANK, lock_cmd, region, server};

#[test]
fn the_51200th_lock_succeeds_and_the_next_is_no_resource() {
    let cfg = Config::default();
    let mut region = region(&cfg);
    let mut s = server(&mut region);
    let c = s.client_init(2, 0, 0).unwrap().get();
    let mut last = None;
    for i in 0..51_200u32 {
        last = Some(s.get_lock(c, LockKind::Rw, &i.to_le_bytes(), 0).unwrap());
    }
    assert_eq!(last.unwrap().index(), 51_199);
    let before = s.tables().digest();
    assert_eq!(
        s.get_lock(c, LockKind::Rw, b"51201st", 0),
        Err(Status::ServerNoResource)
    );
    assert_eq!(s.tables().digest(), before);
    // An existing name is still joinable at capacity.
    assert!(s.get_lock(c, LockKind::Rw, &7u32.to_le_bytes(), 0).is_ok());
}

#[test]
fn the_1000th_client_registers_and_the_next_is_no_resource() {
    let cfg = Config::default();
    let mut region = region(&cfg);
    let mut s = server(&mut region);
    for _ in 0..1_000 {
        s.client_init(2, 0, 0).unwrap();
    }
    let before = s.tables().digest();
    assert_eq!(s.client_init(2, 0, 0), Err(Status::ServerNoResource));
    assert_eq!(s.tables().digest(), before);
}

#[test]
fn the_102400th_object_is_created_and_the_next_is_too_many() {
    let cfg = Config::default();
    let mut region = region(&cfg);
    let mut s = server(&mut region);
    let c = s.client_init(2, 0, 0).unwrap().get();
    for i in 0..102_400u32 {
        s.object_create(c, &i.to_le_bytes(), u64::from(i), 60, 0)
            .unwrap();
    }
    let before = s.tables().digest();
    assert_eq!(
        s.object_create(c, b"one more", 0, 60, 0),
        Err(Status::ObjectTooMany)
    );
    assert_eq!(s.tables().digest(), before);
}

#[test]
fn a_batch_of_32_and_a_513_byte_name_are_einval_and_change_nothing() {
    let cfg = Config {
        locks_max: 64,
        clients_max: 4,
        objects_max: 4,
        ..Config::default()
    };
    let mut region = region(&cfg);
    let mut s = server(&mut region);
    let c = s.client_init(2, 0, 0).unwrap();
    let l = s.get_lock(c.get(), LockKind::Atomic, b"x", 0).unwrap();
    let before = s.tables().digest();
    let cmds = vec![lock_cmd(LockKind::Atomic, LockOp::TryExclusive, l, 10); 32];
    let mut r = [BLANK; 32];
    assert_eq!(
        s.execute_message(c.get(), 0, &cmds, &mut r, 0),
        Err(Status::Einval)
    );
    assert_eq!(
        s.get_lock(c.get(), LockKind::Atomic, &[b'n'; 513], 0),
        Err(Status::Einval)
    );
    assert_eq!(
        s.object_create(c.get(), &[b'n'; 513], 0, 1, 0),
        Err(Status::Einval)
    );
    assert_eq!(s.tables().digest(), before);
}
