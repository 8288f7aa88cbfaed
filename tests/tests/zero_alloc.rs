//! The server state machine allocates nothing after start-up: a counting global allocator sees
//! zero allocations across a million mixed operations.
//!
//! The count is per thread (the test harness's own threads allocate freely), and this file holds
//! a single test so nothing else runs on its thread.

use dlock_core::proto::{
    CONTROL_FRAME_MAX, ControlHeader, ControlRequest, ControlRequestFrame, DATA_MESSAGE_MAX,
    DataHeader, LockOp, ObjectOp, PROTO_VERSION, encode_control_request, encode_data_request,
};
use dlock_core::{Config, LockKind, Status};
use dlock_tests::counting::{Counting, thread_allocations};
use dlock_tests::{BLANK, lock_cmd, object_cmd, region, run, server, ticket_cmd, ticket_of};

// The counting allocator the zero-allocation tests share (`dlock_tests::counting`).
#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn a_million_mixed_operations_allocate_nothing() {
    let cfg = Config {
        locks_max: 4_096,
        clients_max: 64,
        objects_max: 256,
        ..Config::default()
    };
    let mut region = region(&cfg);
    let mut s = server(&mut region);
    let clients: Vec<_> = (0..8).map(|_| s.client_init(2, 0, 0).unwrap()).collect();
    let names: Vec<Vec<u8>> = (0..64)
        .map(|i| format!("table-7:row-group-{i}").into_bytes())
        .collect();
    let kinds = [LockKind::Atomic, LockKind::Rw, LockKind::Fair];
    let batch: Vec<_> = (0..31)
        .map(|i| {
            s.get_lock(
                clients[0].get(),
                LockKind::Rw,
                format!("batch-{i}").as_bytes(),
                0,
            )
            .unwrap()
        })
        .collect();
    let obj = s.object_create(clients[0].get(), b"xid", 1, 60, 0).unwrap();
    s.object_get(clients[1].get(), b"xid", 60, 0).unwrap();
    let mut results = [BLANK; 31];
    let batch_try: Vec<_> = batch
        .iter()
        .map(|&l| lock_cmd(LockKind::Rw, LockOp::TryExclusive, l, 0))
        .collect();
    let batch_unlock: Vec<_> = batch
        .iter()
        .map(|&l| lock_cmd(LockKind::Rw, LockOp::UnlockExclusive, l, 0))
        .collect();

    // The bytes path too: frames encoded up front, decoded and answered in the loop.
    let c0 = clients[0].get();
    let data_frame = {
        let header = DataHeader {
            version: PROTO_VERSION,
            count: 0,
            message_id: 1,
            client: c0,
            flags: 0,
        };
        let mut buf = vec![0; DATA_MESSAGE_MAX];
        let n = encode_data_request(&header, &batch_try, &mut buf).unwrap();
        buf.truncate(n);
        buf
    };
    let control_frame = {
        let body = ControlRequest::GetLock {
            kind: LockKind::Rw,
            name: b"batch-3",
        };
        let header = ControlHeader {
            version: PROTO_VERSION,
            msg: body.msg_type(),
            message_id: 2,
            word: c0,
        };
        let mut buf = vec![0; CONTROL_FRAME_MAX];
        let n = encode_control_request(&ControlRequestFrame { header, body }, &mut buf).unwrap();
        buf.truncate(n);
        buf
    };
    let mut reply = vec![0u8; CONTROL_FRAME_MAX];

    let before = thread_allocations();
    assert!(before > 0, "the counter sees the set-up's allocations");
    let mut ops = 0u64;
    let mut granted = 0u64;
    let mut now = 1u64;
    while ops < 1_000_000 {
        now += 1;
        let c = clients[(ops % 8) as usize];
        let name = &names[(ops % 64) as usize];
        let kind = kinds[(ops % 3) as usize];
        let name_kind = [name.as_slice(), kind_suffix(kind)];
        // Control: join the lock (idempotent after the first time), lock, unlock, release.
        let mut key = [0u8; 64];
        let key = join(&mut key, &name_kind);
        let l = s.get_lock(c.get(), kind, key, now).unwrap();
        let r = run(
            &mut s,
            c,
            lock_cmd(kind, LockOp::TryExclusive, l, 1_000),
            now,
        );
        if r.status == Status::Success {
            granted += 1;
            assert_eq!(
                run(
                    &mut s,
                    c,
                    ticket_cmd(kind, LockOp::UnlockExclusive, l, 0, ticket_of(&r)),
                    now
                )
                .status,
                Status::Success
            );
        }
        if r.status == Status::Eagain {
            // Queued on a fair lock: abandon the ticket.
            assert_eq!(
                run(
                    &mut s,
                    c,
                    ticket_cmd(kind, LockOp::UnlockExclusive, l, 0, ticket_of(&r)),
                    now
                )
                .status,
                Status::Success
            );
        }
        if ops.is_multiple_of(7) {
            s.release_lock(c.get(), l.raw(), now).unwrap();
        }
        // Data: a 31-key batch and its unlock, and a fetch-and-add.
        s.execute_message(clients[0].get(), 0, &batch_try, &mut results, now)
            .unwrap();
        s.execute_message(clients[0].get(), 0, &batch_unlock, &mut results, now)
            .unwrap();
        run(
            &mut s,
            clients[1],
            object_cmd(ObjectOp::Faa, obj, 1, 0),
            now,
        );
        s.heartbeat(clients[0].get(), now).unwrap();
        s.handle_data(&data_frame, &mut reply, now).unwrap();
        s.execute_message(clients[0].get(), 0, &batch_unlock, &mut results, now)
            .unwrap();
        s.handle_control(&control_frame, &mut reply, now).unwrap();
        ops += 4 + 62 + 1 + 1 + 62 + 1;
    }
    assert_eq!(
        thread_allocations() - before,
        0,
        "the state machine allocated"
    );
    assert!(granted > 1_000, "the loop really took locks ({granted})");
}

fn kind_suffix(kind: LockKind) -> &'static [u8] {
    match kind {
        LockKind::Atomic => b"/atomic",
        LockKind::Rw => b"/rw",
        LockKind::Fair => b"/fair",
    }
}

/// Concatenates `parts` into `buf` without allocating.
fn join<'a>(buf: &'a mut [u8; 64], parts: &[&[u8]]) -> &'a [u8] {
    let mut n = 0;
    for p in parts {
        buf[n..n + p.len()].copy_from_slice(p);
        n += p.len();
    }
    &buf[..n]
}
