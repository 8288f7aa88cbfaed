//! Server state machine cost per operation, beside a `Mutex<HashMap>` lock table doing the same
//! work in the same run.
//!
//! Run: `cargo bench -p dlock-benches --bench state_machine`. Each iteration counts its lock
//! operations (items), so divan's throughput column reads as operations per second and the
//! per-operation time is the median divided by the item count.

use std::hint::black_box;

use divan::Bencher;
use divan::counter::ItemsCount;
use dlock_benches::{MutexTable, cmd, encoded, region, server};
use dlock_core::proto::{
    Command, CommandResult, DATA_MESSAGE_MAX, LockOp, ObjectCommand, ObjectOp,
};
use dlock_core::{Config, LockId, LockKind, Status};

fn main() {
    divan::main();
}

const BLANK: CommandResult = CommandResult {
    status: Status::Success,
    word: 0,
    aux: 0,
    plain: false,
};
const NOW_MS: u64 = 1_000;

fn cfg() -> Config {
    Config {
        locks_max: 1_024,
        clients_max: 16,
        objects_max: 64,
        ..Config::default()
    }
}

/// One trylock message and one unlock message, one command each: 2 operations.
#[divan::bench]
fn dlock_trylock_unlock(bencher: Bencher) {
    let cfg = cfg();
    let mut region = region(&cfg);
    let mut s = server(&mut region);
    let c = s.client_init(2, 0, 0).unwrap().get();
    let id = s.get_lock(c, LockKind::Atomic, b"row-group-1", 0).unwrap();
    let (lock, unlock) = (
        [cmd(LockOp::TryExclusive, id)],
        [cmd(LockOp::UnlockExclusive, id)],
    );
    let mut r = [BLANK];
    bencher.counter(ItemsCount::new(2usize)).bench_local(|| {
        s.execute_message(c, 0, &lock, &mut r, NOW_MS).unwrap();
        debug_assert_eq!(r[0].status, Status::Success);
        s.execute_message(c, 0, &unlock, &mut r, NOW_MS).unwrap();
        black_box(&r);
    });
}

/// The same on the baseline table.
#[divan::bench]
fn mutex_hashmap_trylock_unlock(bencher: Bencher) {
    let t = MutexTable::with_locks(cfg().locks_max);
    let mut out = [Status::Success];
    bencher.counter(ItemsCount::new(2usize)).bench_local(|| {
        t.try_lock(black_box(&[7]), 1, 5_000, NOW_MS, &mut out);
        t.unlock(black_box(&[7]), 1, &mut out);
        black_box(&out);
    });
}

/// A registered client and 31 atomic locks it references.
fn batch_of_31(s: &mut dlock_core::server::Server<'_>) -> (u32, Vec<LockId>) {
    let c = s.client_init(2, 0, 0).unwrap().get();
    let ids = (0..31)
        .map(|i| {
            s.get_lock(c, LockKind::Atomic, format!("t1:rg{i}").as_bytes(), 0)
                .unwrap()
        })
        .collect();
    (c, ids)
}

/// A 31-key trylock message and the 31-key unlock message: 62 operations.
#[divan::bench]
fn dlock_batch31_trylock_unlock(bencher: Bencher) {
    let cfg = cfg();
    let mut region = region(&cfg);
    let mut s = server(&mut region);
    let (c, ids) = batch_of_31(&mut s);
    let lock: Vec<Command> = ids
        .iter()
        .map(|&id| cmd(LockOp::TryExclusive, id))
        .collect();
    let unlock: Vec<Command> = ids
        .iter()
        .map(|&id| cmd(LockOp::UnlockExclusive, id))
        .collect();
    let mut r = [BLANK; 31];
    bencher.counter(ItemsCount::new(62usize)).bench_local(|| {
        s.execute_message(c, 0, &lock, &mut r, NOW_MS).unwrap();
        debug_assert!(r.iter().all(|r| r.status == Status::Success));
        s.execute_message(c, 0, &unlock, &mut r, NOW_MS).unwrap();
        black_box(&r);
    });
}

/// The same 62 operations on the baseline table, one mutex acquisition per 31 keys.
#[divan::bench]
fn mutex_hashmap_batch31(bencher: Bencher) {
    let t = MutexTable::with_locks(cfg().locks_max);
    let ids: Vec<u32> = (0..31).map(|i| i * 17).collect();
    let mut out = [Status::Success; 31];
    bencher.counter(ItemsCount::new(62usize)).bench_local(|| {
        t.try_lock(black_box(&ids), 1, 5_000, NOW_MS, &mut out);
        t.unlock(black_box(&ids), 1, &mut out);
        black_box(&out);
    });
}

/// One fetch-and-add message.
#[divan::bench]
fn dlock_object_faa(bencher: Bencher) {
    let cfg = cfg();
    let mut region = region(&cfg);
    let mut s = server(&mut region);
    let c = s.client_init(2, 0, 0).unwrap().get();
    let id = s.object_create(c, b"xid", 1, 60, 0).unwrap();
    s.object_get(c, b"xid", 60, 0).unwrap();
    let faa = [Command::Object(ObjectCommand {
        op: ObjectOp::Faa,
        object: id.raw(),
        a: 1,
        b: 0,
        partition_epoch: 0,
    })];
    let mut r = [BLANK];
    bencher.counter(ItemsCount::new(1usize)).bench_local(|| {
        s.execute_message(c, 0, &faa, &mut r, NOW_MS).unwrap();
        black_box(&r);
    });
}

/// The baseline for FAA: a `Mutex<u64>` counter.
#[divan::bench]
fn mutex_counter_faa(bencher: Bencher) {
    let m = std::sync::Mutex::new(1u64);
    bencher.counter(ItemsCount::new(1usize)).bench_local(|| {
        let mut g = m.lock().expect("not poisoned");
        let old = *g;
        *g += 1;
        black_box(old)
    });
}

/// The 31-key batch through the bytes path a transport uses: decode, execute, encode the reply.
#[divan::bench]
fn dlock_bytes_batch31_trylock_unlock(bencher: Bencher) {
    let cfg = cfg();
    let mut region = region(&cfg);
    let mut s = server(&mut region);
    let (c, ids) = batch_of_31(&mut s);
    let lock = encoded(
        c,
        &ids.iter()
            .map(|&id| cmd(LockOp::TryExclusive, id))
            .collect::<Vec<_>>(),
    );
    let unlock = encoded(
        c,
        &ids.iter()
            .map(|&id| cmd(LockOp::UnlockExclusive, id))
            .collect::<Vec<_>>(),
    );
    let mut out = [0u8; DATA_MESSAGE_MAX];
    bencher.counter(ItemsCount::new(62usize)).bench_local(|| {
        s.handle_data(black_box(&lock), &mut out, NOW_MS).unwrap();
        s.handle_data(black_box(&unlock), &mut out, NOW_MS).unwrap();
        black_box(&out);
    });
}

/// One trylock and one unlock through the bytes path.
#[divan::bench]
fn dlock_bytes_trylock_unlock(bencher: Bencher) {
    let cfg = cfg();
    let mut region = region(&cfg);
    let mut s = server(&mut region);
    let c = s.client_init(2, 0, 0).unwrap().get();
    let id = s.get_lock(c, LockKind::Atomic, b"row-group-1", 0).unwrap();
    let (lock, unlock) = (
        encoded(c, &[cmd(LockOp::TryExclusive, id)]),
        encoded(c, &[cmd(LockOp::UnlockExclusive, id)]),
    );
    let mut out = [0u8; DATA_MESSAGE_MAX];
    bencher.counter(ItemsCount::new(2usize)).bench_local(|| {
        s.handle_data(black_box(&lock), &mut out, NOW_MS).unwrap();
        s.handle_data(black_box(&unlock), &mut out, NOW_MS).unwrap();
        black_box(&out);
    });
}
