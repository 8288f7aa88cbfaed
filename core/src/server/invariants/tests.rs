//! `check_invariants` holds through every kind of traffic, and names each kind of disagreement
//! a bug could leave in the tables.

use std::vec;
use std::vec::Vec;

use super::super::{Server, predictable_entropy};
use super::{Table, Violation};
use crate::config::Config;
use crate::ids::{ClientId, GrantProof, LockId, LockKind, Session, Ticket};
use crate::manager::GrantState;
use crate::proto::{Command, CommandResult, Held, LockClaim, LockCommand, LockOp, PROTO_VERSION};
use crate::status::Status;
use crate::table::Tables;
use crate::word::rw::RwWord;

fn config() -> Config {
    Config {
        locks_max: 16,
        clients_max: 8,
        objects_max: 4,
        client_lease_ms: 1_000,
        ..Config::default()
    }
}

/// Memory for `cfg`'s tables, with room to align them.
fn memory(cfg: &Config) -> Vec<u8> {
    vec![0u8; cfg.region_size().expect("valid config") + 64]
}

fn server<'r>(memory: &'r mut [u8], cfg: &Config) -> Server<'r> {
    let size = cfg.region_size().expect("valid config");
    let at = memory.as_ptr().align_offset(64);
    let tables = Tables::format(&mut memory[at..at + size], cfg).expect("tables");
    Server::new(tables, cfg, predictable_entropy)
}

fn cmd(kind: LockKind, op: LockOp, lock: LockId, expire_ms: u32, wait_ms: u32) -> Command {
    Command::Lock(LockCommand {
        kind,
        op,
        lock: lock.raw(),
        expire_ms,
        ticket: Ticket::default(),
        wait_ms,
        partition_epoch: 0,
        flags: crate::proto::LockFlags::NONE,
    })
}

fn run(s: &mut Server<'_>, c: ClientId, command: Command, now: u64) -> CommandResult {
    let mut r = [CommandResult {
        status: Status::Fail,
        word: 0,
        aux: 0,
        plain: false,
    }];
    s.execute_message(c.get(), 0, &[command], &mut r, now)
        .expect("one command");
    r[0]
}

/// Asserts the invariants hold, naming the step if not.
#[track_caller]
fn holds(s: &Server<'_>, step: &str) {
    if let Err(v) = s.check_invariants() {
        panic!("after {step}: {v}");
    }
}

/// Three clients on an atomic, an RW and a fair lock and an object: grants, readers, a fair
/// queue, a parked request.
struct Busy {
    a: ClientId,
    b: ClientId,
    atomic: LockId,
    rw: LockId,
    fair: LockId,
}

fn busy(s: &mut Server<'_>) -> Busy {
    let [a, b, c] = [0; 3].map(|_| s.client_init(PROTO_VERSION, 0, 0).unwrap());
    let lock = |s: &mut Server<'_>, who: ClientId, kind, name: &[u8]| {
        s.get_lock(who.get(), kind, name, 0).unwrap()
    };
    let (atomic, rw, fair) = (
        lock(s, a, LockKind::Atomic, b"atomic"),
        lock(s, a, LockKind::Rw, b"rw"),
        lock(s, a, LockKind::Fair, b"fair"),
    );
    for who in [b, c] {
        for (kind, name) in [
            (LockKind::Atomic, &b"atomic"[..]),
            (LockKind::Rw, b"rw"),
            (LockKind::Fair, b"fair"),
        ] {
            lock(s, who, kind, name);
        }
    }
    holds(s, "naming the locks");
    let ok = |r: CommandResult| r.status;
    assert_eq!(
        ok(run(
            s,
            a,
            cmd(LockKind::Atomic, LockOp::TryExclusive, atomic, 100, 0),
            1
        )),
        Status::Success
    );
    assert_eq!(
        ok(run(s, a, cmd(LockKind::Rw, LockOp::TryShared, rw, 0, 0), 1)),
        Status::Success
    );
    assert_eq!(
        ok(run(s, b, cmd(LockKind::Rw, LockOp::TryShared, rw, 0, 0), 1)),
        Status::Success
    );
    assert_eq!(
        ok(run(
            s,
            a,
            cmd(LockKind::Fair, LockOp::TryExclusive, fair, 500, 0),
            1
        )),
        Status::Success
    );
    assert_eq!(
        ok(run(
            s,
            b,
            cmd(LockKind::Fair, LockOp::TryShared, fair, 500, 0),
            1
        )),
        Status::Eagain
    );
    holds(s, "grants, readers and a ticket");
    let mut r = [run(
        s,
        a,
        cmd(LockKind::Atomic, LockOp::TryExclusive, atomic, 100, 0),
        1,
    )];
    let parked = s.execute_message(
        c.get(),
        0,
        &[cmd(
            LockKind::Atomic,
            LockOp::TryExclusive,
            atomic,
            100,
            5_000,
        )],
        &mut r,
        2,
    );
    assert_eq!(parked, Ok(super::super::Disposition::Deferred));
    holds(s, "a parked request");
    let object = s.object_create(a.get(), b"xid", 1, 10, 2).unwrap();
    s.object_get(b.get(), b"xid", 10, 2).unwrap();
    s.object_destroy(a.get(), object.raw(), 3).unwrap();
    holds(s, "an object destroyed while referenced");
    Busy {
        a,
        b,
        atomic,
        rw,
        fair,
    }
}

#[test]
fn every_kind_of_traffic_keeps_the_tables_in_agreement() {
    let cfg = config();
    let mut mem = memory(&cfg);
    let mut s = server(&mut mem, &cfg);
    holds(&s, "start");
    let x = busy(&mut s);
    // The atomic grant expires and the parked request takes it over: `a`'s hold is stale.
    s.poll_waiters(200);
    holds(&s, "an expired grant taken over by a parked request");
    s.take_replies(|_| {});
    holds(&s, "the replies collected");
    assert_eq!(
        run(
            &mut s,
            x.a,
            cmd(LockKind::Fair, LockOp::UnlockExclusive, x.fair, 0, 0),
            300
        )
        .status,
        Status::Success
    );
    assert_eq!(
        run(
            &mut s,
            x.b,
            cmd(LockKind::Rw, LockOp::UnlockShared, x.rw, 0, 0),
            300
        )
        .status,
        Status::Success
    );
    holds(&s, "unlocks");
    s.client_deinit(x.b.get(), 300).unwrap();
    holds(&s, "a deinit");
    s.release_lock(x.a.get(), x.atomic.raw(), 300).unwrap();
    holds(&s, "a release");
    assert!(s.tick(10_000) > 0, "the rest expire");
    holds(&s, "expiry of everyone");
    assert_eq!(s.usage().clients, 0);
}

/// A fresh busy server, a corruption, and the violation it must produce.
#[track_caller]
fn corrupted(corrupt: impl FnOnce(&mut Server<'_>, &Busy)) -> Violation {
    let cfg = config();
    let mut mem = memory(&cfg);
    let mut s = server(&mut mem, &cfg);
    let x = busy(&mut s);
    corrupt(&mut s, &x);
    s.check_invariants().expect_err("the corruption is seen")
}

fn slot(s: &Server<'_>, c: ClientId) -> u32 {
    s.client_slot_of(c.get()).unwrap()
}

#[test]
fn reference_counts_that_disagree_with_the_bits_are_named() {
    let v = corrupted(|s, x| s.t.lock_meta[x.rw.index() as usize].refs += 1);
    assert!(
        matches!(v, Violation::Refs { table: Table::Locks, slot, recorded: 4, counted: 3 } if slot == 1),
        "{v}"
    );
    let v = corrupted(|s, x| {
        let a = slot(s, x.a);
        s.t.clients[a as usize].lock_refs -= 1;
    });
    assert!(
        matches!(
            v,
            Violation::ClientRefs {
                table: Table::Locks,
                recorded: 2,
                counted: 3,
                ..
            }
        ),
        "{v}"
    );
    let v = corrupted(|s, _| s.t.object_meta[0].refs += 1);
    assert!(
        matches!(
            v,
            Violation::Refs {
                table: Table::Objects,
                slot: 0,
                ..
            }
        ),
        "{v}"
    );
}

#[test]
fn an_exclusive_hold_beside_another_owner_is_named() {
    // What a later claim displacing an accepted one leaves: `a` holds the RW lock exclusively
    // by its record, the word names `b`.
    let v = corrupted(|s, x| {
        let (a, lock) = (slot(s, x.a), x.rw.index());
        let (b_slot, b) = (slot(s, x.b), x.b.get());
        s.t.lock_holds.set(b_slot, lock, GrantState::None.bits());
        s.t.lock_holds.set(a, lock, GrantState::Exclusive.bits());
        s.t.lock_cells[lock as usize].word = RwWord::new().with_owner(b).into_bits();
    });
    assert!(matches!(v, Violation::Owner { lock: 1, .. }), "{v}");
}

#[test]
fn a_cached_grant_on_a_lock_not_marked_cached_is_named() {
    // The revoke decision scans only marked locks: this holder would never be asked.
    let v = corrupted(|s, x| {
        let a = slot(s, x.a);
        s.t.lock_holds
            .set(a, x.rw.index(), GrantState::SharedCached.bits());
    });
    assert!(matches!(v, Violation::Cached { lock: 1, .. }), "{v}");
    let marked = corrupted(|s, x| {
        let a = slot(s, x.a);
        s.t.lock_holds
            .set(a, x.rw.index(), GrantState::SharedCached.bits());
        s.t.lock_manager[x.rw.index() as usize].cached = 1;
        // Something else to find, so that `corrupted` has a violation to return.
        s.t.lock_meta[x.fair.index() as usize].refs += 1;
    });
    assert!(matches!(marked, Violation::Refs { .. }), "{marked}");
}

#[test]
fn readers_holds_and_words_that_disagree_are_named() {
    let v = corrupted(|s, x| {
        let w = RwWord::from_bits(s.t.lock_cells[x.rw.index() as usize].word);
        s.t.lock_cells[x.rw.index() as usize].word = w.with_readers(1).into_bits();
    });
    assert!(
        matches!(
            v,
            Violation::Readers {
                lock: 1,
                recorded: 1,
                counted: 2
            }
        ),
        "{v}"
    );
    let v = corrupted(|s, x| {
        let b = slot(s, x.b);
        s.t.lock_refs.set(b, x.fair.index(), 0);
        s.t.clients[b as usize].lock_refs -= 1;
        s.t.lock_meta[x.fair.index() as usize].refs -= 1;
    });
    assert!(matches!(v, Violation::Hold { lock: 2, .. }), "{v}");
    let v = corrupted(|s, x| {
        let a = slot(s, x.a);
        s.t.lock_holds
            .set(a, x.atomic.index(), GrantState::Shared.bits());
    });
    assert!(matches!(v, Violation::Hold { lock: 0, .. }), "{v}");
    let v = corrupted(|s, x| s.t.lock_cells[x.fair.index() as usize].fence = s.next_token);
    assert!(matches!(v, Violation::Fence { lock: 2, .. }), "{v}");
}

#[test]
fn free_lists_and_indexes_that_disagree_with_the_slots_are_named() {
    // A live slot handed out again.
    let v = corrupted(|s, x| s.t.lock_free.push(x.fair.index()));
    assert!(
        matches!(
            v,
            Violation::FreeList {
                table: Table::Locks,
                slot: 2
            }
        ),
        "{v}"
    );
    // A name the index lost.
    let v = corrupted(|s, x| {
        let hash = s.t.lock_names[x.rw.index() as usize].hash;
        s.t.lock_index.remove(hash, x.rw.index());
    });
    assert!(
        matches!(
            v,
            Violation::Index {
                table: Table::Locks,
                slot: 1
            }
        ),
        "{v}"
    );
    // A client the index lost.
    let v = corrupted(|s, x| {
        let b = slot(s, x.b);
        s.t.client_index.remove(super::super::client_tag(x.b), b);
    });
    assert!(
        matches!(
            v,
            Violation::Index {
                table: Table::Clients,
                ..
            }
        ),
        "{v}"
    );
}

#[test]
fn waiters_off_their_queue_or_miscounted_are_named() {
    let v = corrupted(|s, x| s.t.lock_waiters[x.atomic.index() as usize] = 0);
    assert!(matches!(v, Violation::Waiter { .. }), "{v}");
    let v = corrupted(|s, _| s.waiting += 1);
    assert!(
        matches!(
            v,
            Violation::WaiterCounts {
                waiting: 2,
                counted_waiting: 1,
                ..
            }
        ),
        "{v}"
    );
    let v = corrupted(|s, x| {
        let w = s.t.lock_waiters[x.atomic.index() as usize] - 1;
        s.t.waiters[w as usize].client = x.a.get();
    });
    assert!(matches!(v, Violation::Waiter { .. }), "{v}");
}

#[test]
fn objects_and_client_entries_out_of_shape_are_named() {
    // Destroyed, and nobody references it: it should have been freed.
    let v = corrupted(|s, x| {
        let b = slot(s, x.b);
        s.t.object_refs.set(b, 0, 0);
        s.t.clients[b as usize].object_refs -= 1;
        s.t.object_meta[0].refs = 0;
    });
    assert!(matches!(v, Violation::Object { object: 0 }), "{v}");
    let v = corrupted(|s, x| {
        let a = slot(s, x.a);
        s.t.clients[a as usize].state = crate::table::ClientState::Recovering as u8;
    });
    assert!(matches!(v, Violation::ClientEntry { .. }), "{v}");
}

/// A recovering server that expects two clients, both re-registered.
fn recovering<'r>(memory: &'r mut [u8]) -> (Server<'r>, [u32; 2]) {
    let cfg = Config {
        recovery_clients: 2,
        epoch: 2,
        ..config()
    };
    let mut s = server(memory, &cfg);
    for raw in [0x11, 0x22] {
        s.client_reinit(raw, PROTO_VERSION, 0, &Session::NONE, 0)
            .unwrap();
    }
    (s, [0x11, 0x22])
}

fn rw_claim(token: u64) -> LockClaim<'static> {
    LockClaim {
        kind: LockKind::Rw,
        held: Held::Exclusive,
        name: b"rw",
        old_lock: 0,
        word: 0,
        ticket: Ticket::default(),
        remaining_ms: 0,
        age_ms: 1,
        token,
        proof: GrantProof::NONE,
        value: None,
    }
}

#[test]
fn a_second_exclusive_claim_is_refused_and_the_tables_agree() {
    let cfg = Config {
        epoch: 2,
        ..config()
    };
    let mut mem = memory(&cfg);
    let (mut s, [a, b]) = recovering(&mut mem);
    assert!(s.update_lock(a, &rw_claim((1 << 48) + 5), 1).is_ok());
    assert_eq!(
        s.update_lock(b, &rw_claim((1 << 48) + 9), 1),
        Err(Status::Fail)
    );
    holds(&s, "two exclusive claims");
}

/// The simulator's first find, put back: a later exclusive claim displaces the one accepted
/// first. The holds say `a` holds the lock, the word says `b`: caught at the claim.
#[cfg(feature = "sim-mutations")]
#[test]
fn a_displaced_exclusive_claim_breaks_the_invariants_at_once() {
    let cfg = Config {
        epoch: 2,
        ..config()
    };
    let mut mem = memory(&cfg);
    let (mut s, [a, b]) = recovering(&mut mem);
    assert!(s.update_lock(a, &rw_claim((1 << 48) + 5), 1).is_ok());
    crate::mutation::with(crate::mutation::Mutation::MergeClaimOwner, || {
        assert!(s.update_lock(b, &rw_claim((1 << 48) + 9), 1).is_ok());
    });
    let v = s.check_invariants().expect_err("two exclusive holders");
    assert!(matches!(v, Violation::Owner { owner: 0x22, .. }), "{v}");
}
