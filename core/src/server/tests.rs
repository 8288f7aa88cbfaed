//! State-machine tests through the typed API: registration, named locks, every lock kind on the
//! data path, objects, liveness, recovery, fencing tokens and limits.

use super::*;
use crate::LockKind;
use crate::ids::{LockId, ObjectId, Session, SessionKey, Ticket};
use crate::proto::{
    Command, CommandResult, FLAG_ALL_OR_NOTHING, Held, LockClaim, LockCommand, LockOp,
    ObjectCommand, ObjectOp,
};
use crate::table::Tables;

/// A 64-byte aligned, zeroed heap region.
pub(crate) struct TestRegion(Vec<Line>);

#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

impl TestRegion {
    pub(crate) fn new(cfg: &Config) -> Self {
        let lines = cfg.region_size().unwrap().div_ceil(64);
        TestRegion(vec![Line([0; 64]); lines])
    }

    pub(crate) fn bytes(&mut self) -> &mut [u8] {
        let len = self.0.len() * 64;
        // SAFETY: `Line` is 64 plain bytes with no padding, so the vector's buffer is `len`
        // initialised bytes, borrowed mutably through `self` for the slice's lifetime.
        unsafe { std::slice::from_raw_parts_mut(self.0.as_mut_ptr().cast::<u8>(), len) }
    }
}

/// The session secret of registered client `raw` (0 when it is not registered).
fn session(s: &Server<'_>, raw: u32) -> Session {
    s.client_session(raw).map_or(Session::NONE, |(_, k)| k)
}

pub(crate) fn small() -> Config {
    Config {
        locks_max: 64,
        clients_max: 8,
        objects_max: 16,
        client_lease_ms: 1_000,
        ..Config::default()
    }
}

pub(crate) fn server<'r>(region: &'r mut TestRegion, cfg: &Config) -> Server<'r> {
    Server::new(
        Tables::format(region.bytes(), cfg).unwrap(),
        cfg,
        super::predictable_entropy,
    )
}

pub(crate) fn lock(kind: LockKind, op: LockOp, id: LockId, expire_ms: u32) -> Command {
    Command::Lock(LockCommand {
        kind,
        op,
        lock: id.raw(),
        expire_ms,
        ticket: Ticket::default(),
        wait_ms: 0,
    })
}

fn ticketed(kind: LockKind, op: LockOp, id: LockId, expire_ms: u32, ticket: Ticket) -> Command {
    Command::Lock(LockCommand {
        kind,
        op,
        lock: id.raw(),
        expire_ms,
        ticket,
        wait_ms: 0,
    })
}

/// Runs one command and returns its result.
pub(crate) fn run(s: &mut Server<'_>, client: ClientId, cmd: Command, now: u64) -> CommandResult {
    let mut r = [CommandResult {
        status: Status::Success,
        word: 0,
        aux: 0,
    }; 1];
    s.execute_message(client.get(), 0, &[cmd], &mut r, now)
        .unwrap();
    r[0]
}

fn run_all(
    s: &mut Server<'_>,
    client: ClientId,
    flags: u32,
    cmds: &[Command],
    now: u64,
) -> Vec<CommandResult> {
    let mut r = vec![
        CommandResult {
            status: Status::Success,
            word: 0,
            aux: 0
        };
        cmds.len()
    ];
    s.execute_message(client.get(), flags, cmds, &mut r, now)
        .unwrap();
    r
}

#[test]
fn client_ids_are_random_distinct_31_bit_and_non_zero() {
    let cfg = small();
    let mut region = TestRegion::new(&cfg);
    let mut s = server(&mut region, &cfg);
    let ids: Vec<u32> = (0..8)
        .map(|_| s.client_init(2, 0, 0).unwrap().get())
        .collect();
    let mut sorted = ids.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), 8);
    assert!(ids.iter().all(|&id| id != 0 && id < 1 << 31));
    assert_ne!(ids[1], ids[0] + 1, "ids are not sequential");
}

#[test]
fn full_client_table_refuses_and_changes_nothing() {
    let cfg = small();
    let mut region = TestRegion::new(&cfg);
    let mut s = server(&mut region, &cfg);
    for _ in 0..cfg.clients_max {
        s.client_init(2, 0, 0).unwrap();
    }
    let before = s.tables().digest();
    assert_eq!(s.client_init(2, 0, 0), Err(Status::ServerNoResource));
    assert_eq!(s.tables().digest(), before);
}

#[test]
fn abnormal_client_is_evicted_to_make_room_and_its_locks_freed() {
    let cfg = small();
    let mut region = TestRegion::new(&cfg);
    let mut s = server(&mut region, &cfg);
    let ids: Vec<ClientId> = (0..cfg.clients_max)
        .map(|_| s.client_init(2, 0, 0).unwrap())
        .collect();
    let l = s
        .get_lock(ids[3].get(), LockKind::Rw, b"t1:rg0", 0)
        .unwrap();
    assert_eq!(
        run(
            &mut s,
            ids[3],
            lock(LockKind::Rw, LockOp::TryShared, l, 0),
            0
        )
        .status,
        Status::Success
    );
    s.client_disconnected(ids[3].get(), 0);
    let newcomer = s.client_init(2, 0, 1).unwrap();
    assert!(!s.is_registered(ids[3].get()));
    assert_eq!(
        s.client_reinit(ids[3].get(), 2, 0, &session(&s, ids[3].get()), 2),
        Err(Status::ClientRemovedByServer)
    );
    // The evicted reader's grant is gone, so a writer gets in.
    let l2 = s
        .get_lock(newcomer.get(), LockKind::Rw, b"t1:rg0", 2)
        .unwrap();
    assert_eq!(
        run(
            &mut s,
            newcomer,
            lock(LockKind::Rw, LockOp::TryExclusive, l2, 0),
            2
        )
        .status,
        Status::Success
    );
}

#[test]
fn get_lock_by_name_is_byte_exact_and_idempotent() {
    let cfg = small();
    let mut region = TestRegion::new(&cfg);
    let mut s = server(&mut region, &cfg);
    let a = s.client_init(2, 0, 0).unwrap().get();
    let b = s.client_init(2, 0, 0).unwrap().get();
    let x = s
        .get_lock(a, LockKind::Atomic, b"name\0with nul", 0)
        .unwrap();
    assert_eq!(s.get_lock(a, LockKind::Atomic, b"name\0with nul", 0), Ok(x));
    assert_eq!(s.get_lock(b, LockKind::Atomic, b"name\0with nul", 0), Ok(x));
    assert_ne!(s.get_lock(a, LockKind::Atomic, b"name\0with nuL", 0), Ok(x));
    assert_eq!(
        s.get_lock(a, LockKind::Fair, b"name\0with nul", 0),
        Err(Status::Einval)
    );
    let long = [7u8; 512];
    assert!(s.get_lock(a, LockKind::Atomic, &long, 0).is_ok());
    let before = s.tables().digest();
    assert_eq!(
        s.get_lock(a, LockKind::Atomic, &[7u8; 513], 0),
        Err(Status::Einval)
    );
    assert_eq!(s.get_lock(a, LockKind::Atomic, b"", 0), Err(Status::Einval));
    assert_eq!(s.tables().digest(), before);
}

#[test]
fn lock_table_fills_at_locks_max_and_refuses_without_change() {
    let cfg = small();
    let mut region = TestRegion::new(&cfg);
    let mut s = server(&mut region, &cfg);
    let a = s.client_init(2, 0, 0).unwrap().get();
    for i in 0..cfg.locks_max {
        s.get_lock(a, LockKind::Atomic, format!("lock-{i}").as_bytes(), 0)
            .unwrap();
    }
    let before = s.tables().digest();
    assert_eq!(
        s.get_lock(a, LockKind::Atomic, b"one-too-many", 0),
        Err(Status::ServerNoResource)
    );
    assert_eq!(s.tables().digest(), before);
    assert_eq!(s.usage().locks, cfg.locks_max);
}

#[test]
fn release_is_refused_while_locked_and_stale_ids_are_rejected_after_reuse() {
    let cfg = small();
    let mut region = TestRegion::new(&cfg);
    let mut s = server(&mut region, &cfg);
    let a = s.client_init(2, 0, 0).unwrap();
    let l = s.get_lock(a.get(), LockKind::Atomic, b"x", 0).unwrap();
    assert_eq!(
        run(
            &mut s,
            a,
            lock(LockKind::Atomic, LockOp::TryExclusive, l, 100),
            0
        )
        .status,
        Status::Success
    );
    assert_eq!(s.release_lock(a.get(), l.raw(), 1), Err(Status::Fail));
    assert_eq!(
        run(
            &mut s,
            a,
            lock(LockKind::Atomic, LockOp::UnlockExclusive, l, 0),
            1
        )
        .status,
        Status::Success
    );
    assert_eq!(s.release_lock(a.get(), l.raw(), 1), Ok(()));
    assert_eq!(s.release_lock(a.get(), l.raw(), 1), Err(Status::LockNotGet));
    // The slot is reused by another name with a new generation: the old id is stale.
    let m = s.get_lock(a.get(), LockKind::Atomic, b"y", 2).unwrap();
    assert_eq!(m.index(), l.index());
    assert_ne!(m.generation(), l.generation());
    assert_eq!(
        run(
            &mut s,
            a,
            lock(LockKind::Atomic, LockOp::TryExclusive, l, 100),
            2
        )
        .status,
        Status::LockNotGet
    );
}

#[test]
fn commands_need_a_reference_and_the_right_kind() {
    let cfg = small();
    let mut region = TestRegion::new(&cfg);
    let mut s = server(&mut region, &cfg);
    let a = s.client_init(2, 0, 0).unwrap();
    let b = s.client_init(2, 0, 0).unwrap();
    let l = s.get_lock(a.get(), LockKind::Rw, b"x", 0).unwrap();
    assert_eq!(
        run(&mut s, b, lock(LockKind::Rw, LockOp::TryExclusive, l, 0), 0).status,
        Status::LockNotGet
    );
    assert_eq!(
        run(
            &mut s,
            a,
            lock(LockKind::Atomic, LockOp::TryExclusive, l, 10),
            0
        )
        .status,
        Status::Einval
    );
    let bogus = LockId::new(cfg.locks_max + 5, 1);
    assert_eq!(
        run(
            &mut s,
            a,
            lock(LockKind::Rw, LockOp::TryExclusive, bogus, 0),
            0
        )
        .status,
        Status::LockNotGet
    );
    let unknown = ClientId::new(12345).unwrap();
    assert_eq!(
        run(
            &mut s,
            unknown,
            lock(LockKind::Rw, LockOp::TryExclusive, l, 0),
            0
        )
        .status,
        Status::ClientNotInit
    );
}

#[test]
fn rw_shared_unlock_from_non_holder_fails() {
    let cfg = small();
    let mut region = TestRegion::new(&cfg);
    let mut s = server(&mut region, &cfg);
    let a = s.client_init(2, 0, 0).unwrap();
    let b = s.client_init(2, 0, 0).unwrap();
    let la = s.get_lock(a.get(), LockKind::Rw, b"x", 0).unwrap();
    let lb = s.get_lock(b.get(), LockKind::Rw, b"x", 0).unwrap();
    assert_eq!(
        run(&mut s, a, lock(LockKind::Rw, LockOp::TryShared, la, 0), 0).status,
        Status::Success
    );
    assert_eq!(
        run(
            &mut s,
            b,
            lock(LockKind::Rw, LockOp::UnlockShared, lb, 0),
            0
        )
        .status,
        Status::Fail
    );
    assert_eq!(
        run(
            &mut s,
            b,
            lock(LockKind::Rw, LockOp::TryExclusive, lb, 0),
            0
        )
        .status,
        Status::Fail
    );
}

#[test]
fn fencing_tokens_grow_per_lock_across_slot_reuse_and_carry_the_epoch() {
    let cfg = Config {
        epoch: 7,
        ..small()
    };
    let mut region = TestRegion::new(&cfg);
    let mut s = server(&mut region, &cfg);
    let a = s.client_init(2, 0, 0).unwrap();
    let mut last = 0;
    for round in 0..5u64 {
        let l = s
            .get_lock(a.get(), LockKind::Atomic, b"same-name", round)
            .unwrap();
        let r = run(
            &mut s,
            a,
            lock(LockKind::Atomic, LockOp::TryExclusive, l, 10),
            round,
        );
        assert_eq!(r.status, Status::Success);
        assert!(r.aux > last, "token {} after {}", r.aux, last);
        assert_eq!(FencingToken(r.aux).epoch(), 7);
        last = r.aux;
        assert_eq!(
            run(
                &mut s,
                a,
                lock(LockKind::Atomic, LockOp::ExtendExclusive, l, 10),
                round
            )
            .aux,
            last
        );
        run(
            &mut s,
            a,
            lock(LockKind::Atomic, LockOp::UnlockExclusive, l, 0),
            round,
        );
        s.release_lock(a.get(), l.raw(), round).unwrap();
    }
}

#[test]
fn silent_client_is_declared_dead_and_every_lock_it_held_is_released() {
    let cfg = small();
    let mut region = TestRegion::new(&cfg);
    let mut s = server(&mut region, &cfg);
    let dead = s.client_init(2, 0, 0).unwrap();
    let live = s.client_init(2, 0, 0).unwrap();
    let names: [(&[u8], LockKind, LockOp); 3] = [
        (b"a", LockKind::Atomic, LockOp::TryExclusive),
        (b"r", LockKind::Rw, LockOp::TryShared),
        (b"w", LockKind::Rw, LockOp::TryExclusive),
    ];
    for (name, kind, op) in names {
        let l = s.get_lock(dead.get(), kind, name, 0).unwrap();
        assert_eq!(
            run(&mut s, dead, lock(kind, op, l, 60_000), 0).status,
            Status::Success
        );
    }
    s.heartbeat(live.get(), 900).unwrap();
    assert_eq!(s.tick(1_000), 0, "lease not over yet");
    assert_eq!(s.tick(1_001), 1);
    assert!(!s.is_registered(dead.get()));
    assert_eq!(
        s.usage().locks,
        0,
        "the dead client's references were the only ones"
    );
    for (name, kind, _) in names {
        let l = s.get_lock(live.get(), kind, name, 1_001).unwrap();
        assert_eq!(
            run(
                &mut s,
                live,
                lock(kind, LockOp::TryExclusive, l, 100),
                1_001
            )
            .status,
            Status::Success
        );
    }
}

#[test]
fn deinit_releases_everything_the_client_held() {
    let cfg = small();
    let mut region = TestRegion::new(&cfg);
    let mut s = server(&mut region, &cfg);
    let a = s.client_init(2, 0, 0).unwrap();
    let b = s.client_init(2, 0, 0).unwrap();
    let la = s.get_lock(a.get(), LockKind::Rw, b"x", 0).unwrap();
    let lb = s.get_lock(b.get(), LockKind::Rw, b"x", 0).unwrap();
    run(
        &mut s,
        a,
        lock(LockKind::Rw, LockOp::TryExclusive, la, 0),
        0,
    );
    s.object_create(a.get(), b"xid", 100, 10, 0).unwrap();
    s.client_deinit(a.get(), 1).unwrap();
    assert_eq!(
        run(
            &mut s,
            b,
            lock(LockKind::Rw, LockOp::TryExclusive, lb, 0),
            1
        )
        .status,
        Status::Success
    );
    assert_eq!(
        s.usage().objects,
        0,
        "an owned, unreferenced object goes with its owner"
    );
    assert_eq!(s.client_deinit(a.get(), 1), Err(Status::ClientNotInit));
}

#[test]
fn objects_follow_the_reference_lifecycle() {
    let cfg = small();
    let mut region = TestRegion::new(&cfg);
    let mut s = server(&mut region, &cfg);
    let a = s.client_init(2, 0, 0).unwrap();
    let b = s.client_init(2, 0, 0).unwrap();
    let id = s.object_create(a.get(), b"csn", 1_000, 60, 0).unwrap();
    assert_eq!(
        s.object_create(a.get(), b"csn", 0, 60, 0),
        Err(Status::ObjectAlreadyCreated)
    );
    assert_eq!(
        s.object_create(b.get(), b"csn", 0, 60, 0),
        Err(Status::ObjectAlreadyExisted)
    );
    assert_eq!(
        s.object_get(b.get(), b"nope", 60, 0),
        Err(Status::ObjectNotCreate)
    );
    let faa = |id: ObjectId, add| {
        Command::Object(ObjectCommand {
            op: ObjectOp::Faa,
            object: id.raw(),
            a: add,
            b: 0,
        })
    };
    // Creating is not a reference: the creator must get it too.
    assert_eq!(run(&mut s, a, faa(id, 1), 0).status, Status::ObjectNotGet);
    let (gid, cell) = s.object_get(b.get(), b"csn", 60, 0).unwrap();
    assert_eq!((gid, cell), (id, id.index()));
    assert_eq!(run(&mut s, b, faa(id, 5), 0).aux, 1_000);
    let cas = |expect, new| {
        Command::Object(ObjectCommand {
            op: ObjectOp::Cas,
            object: id.raw(),
            a: expect,
            b: new,
        })
    };
    let miss = run(&mut s, b, cas(1_000, 7), 0);
    assert_eq!(
        (miss.status, miss.aux),
        (Status::ObjectCasFailed, 1_005),
        "CAS returns the observed value"
    );
    let hit = run(&mut s, b, cas(1_005, 7), 0);
    assert_eq!((hit.status, hit.aux), (Status::Success, 1_005));
    let snap = Command::Object(ObjectCommand {
        op: ObjectOp::Snapshot,
        object: id.raw(),
        a: 0,
        b: 0,
    });
    assert_eq!(run(&mut s, b, snap, 0).aux, 7);
    assert_eq!(
        s.object_destroy(b.get(), id.raw(), 0),
        Err(Status::ObjectInvalidOwner)
    );
    // Deferred: b still references it within the lease.
    assert_eq!(s.object_destroy(a.get(), id.raw(), 0), Ok(()));
    assert_eq!(
        s.object_destroy(a.get(), id.raw(), 0),
        Err(Status::ObjectAlreadyDestroyed)
    );
    assert_eq!(
        s.object_get(a.get(), b"csn", 60, 0),
        Err(Status::ObjectAlreadyDestroyed)
    );
    assert_eq!(s.usage().objects, 1);
    s.object_release(b.get(), id.raw(), 0).unwrap();
    assert_eq!(s.usage().objects, 0);
    assert_eq!(run(&mut s, b, snap, 0).status, Status::ObjectNotGet);
}

#[test]
fn object_table_fills_at_objects_max() {
    let cfg = small();
    let mut region = TestRegion::new(&cfg);
    let mut s = server(&mut region, &cfg);
    let a = s.client_init(2, 0, 0).unwrap().get();
    for i in 0..cfg.objects_max {
        s.object_create(a, format!("o{i}").as_bytes(), 0, 1, 0)
            .unwrap();
    }
    let before = s.tables().digest();
    assert_eq!(
        s.object_create(a, b"one more", 0, 1, 0),
        Err(Status::ObjectTooMany)
    );
    assert_eq!(s.tables().digest(), before);
}

#[test]
fn oversized_or_empty_message_is_refused_whole() {
    let cfg = small();
    let mut region = TestRegion::new(&cfg);
    let mut s = server(&mut region, &cfg);
    let a = s.client_init(2, 0, 0).unwrap();
    let l = s.get_lock(a.get(), LockKind::Rw, b"x", 0).unwrap();
    let cmds = vec![lock(LockKind::Rw, LockOp::TryShared, l, 0); 32];
    let mut r = vec![
        CommandResult {
            status: Status::Success,
            word: 0,
            aux: 0
        };
        32
    ];
    let before = s.tables().digest();
    assert_eq!(
        s.execute_message(a.get(), 0, &cmds, &mut r, 0),
        Err(Status::Einval)
    );
    assert_eq!(
        s.execute_message(a.get(), 0, &[], &mut r, 0),
        Err(Status::Einval)
    );
    assert_eq!(s.tables().digest(), before);
}

#[test]
fn all_or_nothing_batch_leaves_nothing_held_when_one_key_fails() {
    let cfg = small();
    let mut region = TestRegion::new(&cfg);
    let mut s = server(&mut region, &cfg);
    let a = s.client_init(2, 0, 0).unwrap();
    let b = s.client_init(2, 0, 0).unwrap();
    let ids: Vec<LockId> = (0..5)
        .map(|i| {
            s.get_lock(a.get(), LockKind::Rw, format!("k{i}").as_bytes(), 0)
                .unwrap()
        })
        .collect();
    let held_by_b = s.get_lock(b.get(), LockKind::Rw, b"k3", 0).unwrap();
    assert_eq!(
        run(
            &mut s,
            b,
            lock(LockKind::Rw, LockOp::TryExclusive, held_by_b, 0),
            0
        )
        .status,
        Status::Success
    );
    let before = s.tables().digest();
    let cmds: Vec<Command> = ids
        .iter()
        .map(|&l| lock(LockKind::Rw, LockOp::TryExclusive, l, 0))
        .collect();
    let r = run_all(&mut s, a, FLAG_ALL_OR_NOTHING, &cmds, 1);
    let statuses: Vec<Status> = r.iter().map(|r| r.status).collect();
    assert_eq!(
        statuses,
        [
            Status::Eagain,
            Status::Eagain,
            Status::Eagain,
            Status::Fail,
            Status::Eagain
        ]
    );
    assert_eq!(s.tables().digest(), before, "nothing stays held");
    // Without the flag the same batch is per item, as in the reference.
    let r = run_all(&mut s, a, 0, &cmds, 2);
    assert_eq!(r.iter().filter(|r| r.status == Status::Success).count(), 4);
}

#[test]
fn recovering_server_answers_not_ready_until_expected_clients_resync() {
    let cfg = Config {
        recovery_clients: 2,
        epoch: 2,
        ..small()
    };
    let mut region = TestRegion::new(&cfg);
    let mut s = server(&mut region, &cfg);
    assert_eq!(s.client_init(2, 0, 0), Err(Status::NotReady));
    let (a, b) = (ClientId::new(11).unwrap(), ClientId::new(22).unwrap());
    s.client_reinit(a.get(), 2, 0, &session(&s, a.get()), 0)
        .unwrap();
    s.client_reinit(b.get(), 2, 0, &session(&s, b.get()), 0)
        .unwrap();
    assert_eq!(
        s.get_lock(a.get(), LockKind::Atomic, b"x", 0),
        Err(Status::NotReady)
    );
    let claim = |held, remaining_ms, token| LockClaim {
        kind: LockKind::Atomic,
        held,
        name: b"x",
        old_lock: 0,
        word: 0,
        ticket: Ticket::default(),
        remaining_ms,
        age_ms: 0,
        token,
        proof: crate::GrantProof::NONE,
    };
    // Old epoch-1 token of a's grant; b's stale claim expires earlier and loses.
    let old_token = (1u64 << 48) + 900;
    let la = s
        .update_lock(a.get(), &claim(Held::Exclusive, 5_000, old_token), 0)
        .unwrap();
    assert_eq!(
        s.update_lock(b.get(), &claim(Held::Exclusive, 1_000, 0), 0),
        Err(Status::Fail)
    );
    s.reinit_done(a.get(), 0).unwrap();
    assert_eq!(s.state(), ServerState::Recovering { remaining: 1 });
    s.reinit_done(b.get(), 0).unwrap();
    assert_eq!(s.state(), ServerState::Ready);
    // a still holds x: its unlock works, b's trylock fails until then.
    let lb = s.get_lock(b.get(), LockKind::Atomic, b"x", 1).unwrap();
    assert_eq!(lb, la);
    assert_eq!(
        run(
            &mut s,
            b,
            lock(LockKind::Atomic, LockOp::TryExclusive, lb, 10),
            1
        )
        .status,
        Status::Fail
    );
    assert_eq!(
        run(
            &mut s,
            a,
            lock(LockKind::Atomic, LockOp::UnlockExclusive, la, 0),
            1
        )
        .status,
        Status::Success
    );
    let r = run(
        &mut s,
        b,
        lock(LockKind::Atomic, LockOp::TryExclusive, lb, 10),
        1,
    );
    assert_eq!(r.status, Status::Success);
    assert!(r.aux > old_token && FencingToken(r.aux).epoch() == 2);
}

#[test]
fn recovering_client_that_never_returns_stops_blocking_recovery_after_its_lease() {
    let cfg = Config {
        recovery_clients: 1,
        ..small()
    };
    let mut region = TestRegion::new(&cfg);
    let mut s = server(&mut region, &cfg);
    s.client_reinit(77, 2, 0, &session(&s, 77), 0).unwrap();
    assert_eq!(s.tick(cfg.client_lease_ms as u64 + 1), 1);
    assert_eq!(s.state(), ServerState::Ready);
}

#[test]
fn fair_lock_queues_then_grants_by_ticket_and_abandoning_a_ticket_is_accepted() {
    let cfg = small();
    let mut region = TestRegion::new(&cfg);
    let mut s = server(&mut region, &cfg);
    let a = s.client_init(2, 0, 0).unwrap();
    let b = s.client_init(2, 0, 0).unwrap();
    let l = s.get_lock(a.get(), LockKind::Fair, b"f", 0).unwrap();
    let lb = s.get_lock(b.get(), LockKind::Fair, b"f", 0).unwrap();
    let ra = run(
        &mut s,
        a,
        lock(LockKind::Fair, LockOp::TryExclusive, l, 10_000),
        0,
    );
    assert_eq!(ra.status, Status::Success);
    let ta = crate::word::fair::FairWord::from_bits(ra.word).counters();
    let rb = run(
        &mut s,
        b,
        lock(LockKind::Fair, LockOp::TryExclusive, lb, 10_000),
        0,
    );
    assert_eq!(rb.status, Status::Eagain);
    let tb = Ticket {
        exclusive: rb.aux as u16,
        shared: (rb.aux >> 16) as u16,
    };
    assert_eq!(
        s.release_lock(b.get(), lb.raw(), 0),
        Err(Status::TicketToUnlock)
    );
    assert_eq!(
        run(
            &mut s,
            b,
            ticketed(LockKind::Fair, LockOp::TicketExclusive, lb, 10_000, tb),
            1
        )
        .status,
        Status::Eagain
    );
    assert_eq!(
        run(
            &mut s,
            a,
            ticketed(LockKind::Fair, LockOp::UnlockExclusive, l, 0, ta),
            2
        )
        .status,
        Status::Success
    );
    let g = run(
        &mut s,
        b,
        ticketed(LockKind::Fair, LockOp::TicketExclusive, lb, 10_000, tb),
        3,
    );
    assert_eq!(g.status, Status::Success);
    assert!(g.aux > ra.aux);
    assert_eq!(
        run(
            &mut s,
            b,
            ticketed(LockKind::Fair, LockOp::UnlockExclusive, lb, 0, tb),
            4
        )
        .status,
        Status::Success
    );
    assert_eq!(s.release_lock(b.get(), lb.raw(), 4), Ok(()));
}

#[test]
fn fair_ticket_the_lock_never_issued_is_void() {
    let cfg = small();
    let mut region = TestRegion::new(&cfg);
    let mut s = server(&mut region, &cfg);
    let a = s.client_init(2, 0, 0).unwrap();
    let b = s.client_init(2, 0, 0).unwrap();
    let la = s.get_lock(a.get(), LockKind::Fair, b"f", 0).unwrap();
    let lb = s.get_lock(b.get(), LockKind::Fair, b"f", 0).unwrap();
    assert_eq!(
        run(
            &mut s,
            a,
            lock(LockKind::Fair, LockOp::TryExclusive, la, 100),
            0
        )
        .status,
        Status::Success
    );
    assert_eq!(
        run(
            &mut s,
            b,
            lock(LockKind::Fair, LockOp::TryExclusive, lb, 100),
            0
        )
        .status,
        Status::Eagain
    );
    // b forges a ticket far ahead of `mx`: a late retry with it would otherwise preempt and
    // move `nx` past `mx`.
    let forged = Ticket {
        exclusive: 40,
        shared: 0,
    };
    let before = s.tables().digest();
    let r = run(
        &mut s,
        b,
        ticketed(LockKind::Fair, LockOp::TicketExclusive, lb, 100, forged),
        10_000,
    );
    assert_eq!(r.status, Status::Fail);
    assert_ne!(
        s.tables().digest(),
        before,
        "the forged ticket's holder lost its queue place"
    );
    let w = crate::word::fair::FairWord::from_bits(s.t.lock_cells[la.index() as usize].word);
    assert_eq!((w.nx(), w.mx()), (0, 2), "the counters did not move");
}

#[test]
fn fair_writer_is_never_granted_beside_a_reader() {
    let cfg = small();
    let mut region = TestRegion::new(&cfg);
    let mut s = server(&mut region, &cfg);
    let a = s.client_init(2, 0, 0).unwrap();
    let l = s.get_lock(a.get(), LockKind::Fair, b"f", 0).unwrap();
    // The state the reference can reach when a voided shared ticket is revived after `rflag`
    // resets: the shared counters agree (`ns == ms`) while a reader still holds.
    let w = crate::word::fair::FairWord::new()
        .with_ns(5)
        .with_ms(5)
        .with_rcnt(1)
        .with_timeout_ms(50_000);
    s.t.lock_cells[l.index() as usize].word = w.into_bits();
    let r = run(
        &mut s,
        a,
        lock(LockKind::Fair, LockOp::TryExclusive, l, 100),
        0,
    );
    assert_eq!(r.status, Status::Eagain);
    let after = crate::word::fair::FairWord::from_bits(s.t.lock_cells[l.index() as usize].word);
    assert_eq!(
        (after.rcnt(), after.mx()),
        (1, 1),
        "queued behind the reader, ticket taken"
    );
    assert_eq!(
        s.t.lock_cells[l.index() as usize].ext,
        0,
        "no exclusive owner"
    );
}

fn waiting(kind: LockKind, op: LockOp, id: LockId, expire_ms: u32, wait_ms: u32) -> Command {
    Command::Lock(LockCommand {
        kind,
        op,
        lock: id.raw(),
        expire_ms,
        ticket: Ticket::default(),
        wait_ms,
    })
}

/// Sends one waiting command; `None` when it was parked.
fn wait_for(s: &mut Server<'_>, client: ClientId, cmd: Command, now: u64) -> Option<CommandResult> {
    let mut r = [CommandResult {
        status: Status::Success,
        word: 0,
        aux: 0,
    }];
    match s
        .execute_message(client.get(), 0, &[cmd], &mut r, now)
        .unwrap()
    {
        Disposition::Replied => Some(r[0]),
        Disposition::Deferred => None,
    }
}

fn replies(s: &mut Server<'_>) -> Vec<WaitReply> {
    let mut out = Vec::new();
    s.take_replies(|r| out.push(r));
    out
}

#[test]
fn blocked_lock_is_granted_the_moment_the_holder_unlocks() {
    let cfg = small();
    let mut region = TestRegion::new(&cfg);
    let mut s = server(&mut region, &cfg);
    let a = s.client_init(2, 0, 0).unwrap();
    let b = s.client_init(2, 0, 0).unwrap();
    let la = s.get_lock(a.get(), LockKind::Rw, b"x", 0).unwrap();
    let lb = s.get_lock(b.get(), LockKind::Rw, b"x", 0).unwrap();
    let held = run(
        &mut s,
        a,
        lock(LockKind::Rw, LockOp::TryExclusive, la, 0),
        0,
    );
    assert_eq!(held.status, Status::Success);
    assert_eq!(
        wait_for(
            &mut s,
            b,
            waiting(LockKind::Rw, LockOp::TryExclusive, lb, 0, 5_000),
            1
        ),
        None
    );
    assert_eq!(s.replies_ready(), 0);
    assert_eq!(
        run(
            &mut s,
            a,
            lock(LockKind::Rw, LockOp::UnlockExclusive, la, 0),
            2
        )
        .status,
        Status::Success
    );
    let got = replies(&mut s);
    assert_eq!(got.len(), 1);
    assert_eq!(
        (got[0].client, got[0].result.status),
        (b.get(), Status::Success)
    );
    assert!(
        got[0].result.aux > held.aux,
        "a fresh, larger fencing token"
    );
    assert_eq!(
        got[0].command.op,
        LockOp::TryExclusive,
        "the reply echoes the request"
    );
    // b really holds it now.
    assert_eq!(
        run(&mut s, a, lock(LockKind::Rw, LockOp::TryShared, la, 0), 3).status,
        Status::Fail
    );
}

#[test]
fn waiter_gets_etimeout_when_its_deadline_passes_and_not_before() {
    let cfg = small();
    let mut region = TestRegion::new(&cfg);
    let mut s = server(&mut region, &cfg);
    let a = s.client_init(2, 0, 0).unwrap();
    let b = s.client_init(2, 0, 0).unwrap();
    let la = s.get_lock(a.get(), LockKind::Rw, b"x", 0).unwrap();
    let lb = s.get_lock(b.get(), LockKind::Rw, b"x", 0).unwrap();
    run(&mut s, a, lock(LockKind::Rw, LockOp::TryShared, la, 0), 0);
    assert_eq!(
        wait_for(
            &mut s,
            b,
            waiting(LockKind::Rw, LockOp::TryExclusive, lb, 0, 300),
            0
        ),
        None
    );
    s.poll_waiters(300);
    assert_eq!(
        s.replies_ready(),
        0,
        "the deadline tick itself is still in time"
    );
    s.poll_waiters(301);
    let got = replies(&mut s);
    assert_eq!(got[0].result.status, Status::Etimeout);
    assert_eq!(s.stats().get(Counter::WaitTimeouts), 1);
}

#[test]
fn atomic_waiter_is_granted_when_the_holders_lease_runs_out() {
    let cfg = small();
    let mut region = TestRegion::new(&cfg);
    let mut s = server(&mut region, &cfg);
    let a = s.client_init(2, 0, 0).unwrap();
    let b = s.client_init(2, 0, 0).unwrap();
    let la = s.get_lock(a.get(), LockKind::Atomic, b"x", 0).unwrap();
    let lb = s.get_lock(b.get(), LockKind::Atomic, b"x", 0).unwrap();
    run(
        &mut s,
        a,
        lock(LockKind::Atomic, LockOp::TryExclusive, la, 100),
        0,
    );
    assert_eq!(
        wait_for(
            &mut s,
            b,
            waiting(LockKind::Atomic, LockOp::TryExclusive, lb, 100, 5_000),
            10
        ),
        None
    );
    s.poll_waiters(100);
    assert_eq!(s.replies_ready(), 0);
    s.poll_waiters(101);
    assert_eq!(replies(&mut s)[0].result.status, Status::Success);
}

#[test]
fn fair_waiters_are_served_in_ticket_order() {
    let cfg = small();
    let mut region = TestRegion::new(&cfg);
    let mut s = server(&mut region, &cfg);
    let ids: Vec<ClientId> = (0..3).map(|_| s.client_init(2, 0, 0).unwrap()).collect();
    let locks: Vec<LockId> = ids
        .iter()
        .map(|c| s.get_lock(c.get(), LockKind::Fair, b"f", 0).unwrap())
        .collect();
    let first = run(
        &mut s,
        ids[0],
        lock(LockKind::Fair, LockOp::TryExclusive, locks[0], 10_000),
        0,
    );
    assert_eq!(first.status, Status::Success);
    for i in 1..3 {
        let cmd = waiting(
            LockKind::Fair,
            LockOp::TryExclusive,
            locks[i],
            10_000,
            60_000,
        );
        assert_eq!(wait_for(&mut s, ids[i], cmd, i as u64), None);
    }
    let mut holder_ticket = crate::word::fair::FairWord::from_bits(first.word);
    for next in 1..3 {
        let t = Ticket {
            exclusive: holder_ticket.mx(),
            shared: holder_ticket.ms(),
        };
        let unlock = ticketed(
            LockKind::Fair,
            LockOp::UnlockExclusive,
            locks[next - 1],
            0,
            t,
        );
        assert_eq!(
            run(&mut s, ids[next - 1], unlock, 10 + next as u64).status,
            Status::Success
        );
        let got = replies(&mut s);
        assert_eq!(got.len(), 1, "exactly the next ticket is served");
        assert_eq!(
            (got[0].client, got[0].result.status),
            (ids[next].get(), Status::Success)
        );
        assert_eq!(got[0].command.op, LockOp::TryExclusive);
        holder_ticket = crate::word::fair::FairWord::from_bits(got[0].result.word);
    }
}

#[test]
fn a_dying_holder_wakes_the_waiter_and_the_waiter_itself_is_not_declared_dead() {
    let cfg = small();
    let mut region = TestRegion::new(&cfg);
    let mut s = server(&mut region, &cfg);
    let a = s.client_init(2, 0, 0).unwrap();
    let b = s.client_init(2, 0, 0).unwrap();
    let la = s.get_lock(a.get(), LockKind::Rw, b"x", 0).unwrap();
    let lb = s.get_lock(b.get(), LockKind::Rw, b"x", 0).unwrap();
    run(
        &mut s,
        a,
        lock(LockKind::Rw, LockOp::TryExclusive, la, 0),
        0,
    );
    assert_eq!(
        wait_for(
            &mut s,
            b,
            waiting(LockKind::Rw, LockOp::TryExclusive, lb, 0, 60_000),
            0
        ),
        None
    );
    assert_eq!(
        s.tick(cfg.client_lease_ms as u64 + 1),
        1,
        "only the silent holder dies"
    );
    assert!(s.is_registered(b.get()));
    assert_eq!(replies(&mut s)[0].result.status, Status::Success);
}

#[test]
fn one_parked_request_per_client_and_waiting_requests_travel_alone() {
    let cfg = small();
    let mut region = TestRegion::new(&cfg);
    let mut s = server(&mut region, &cfg);
    let a = s.client_init(2, 0, 0).unwrap();
    let b = s.client_init(2, 0, 0).unwrap();
    let la = s.get_lock(a.get(), LockKind::Rw, b"x", 0).unwrap();
    let lb = s.get_lock(b.get(), LockKind::Rw, b"x", 0).unwrap();
    let lb2 = s.get_lock(b.get(), LockKind::Rw, b"y", 0).unwrap();
    run(
        &mut s,
        a,
        lock(LockKind::Rw, LockOp::TryExclusive, la, 0),
        0,
    );
    let cmd = waiting(LockKind::Rw, LockOp::TryExclusive, lb, 0, 1_000);
    assert_eq!(wait_for(&mut s, b, cmd, 0), None);
    assert_eq!(
        wait_for(&mut s, b, cmd, 0).map(|r| r.status),
        Some(Status::Easync)
    );
    let two = [cmd, lock(LockKind::Rw, LockOp::TryExclusive, lb2, 0)];
    let r = run_all(&mut s, b, 0, &two, 0);
    assert_eq!(
        (r[0].status, r[1].status),
        (Status::Einval, Status::Success)
    );
}

#[test]
fn a_cancelled_parked_request_is_never_granted_and_frees_the_clients_waiter() {
    let cfg = small();
    let mut region = TestRegion::new(&cfg);
    let mut s = server(&mut region, &cfg);
    let on_x = a_holds_b_waits(&mut s, LockKind::Rw, 0, LockOp::TryExclusive, 2);
    let [(a, la), (b, lb)] = on_x[..] else {
        unreachable!("two clients")
    };
    let cmd = waiting(LockKind::Rw, LockOp::TryExclusive, lb, 0, 60_000);
    s.cancel_parked(b.get(), 1);
    // b may park again at once (no `Easync`), and a's unlock grants only the new request.
    assert_eq!(wait_for(&mut s, b, cmd, 1), None);
    run(
        &mut s,
        a,
        lock(LockKind::Rw, LockOp::UnlockExclusive, la, 0),
        2,
    );
    let got = replies(&mut s);
    assert_eq!(got.len(), 1, "one reply: the cancelled request has none");
    assert_eq!(got[0].result.status, Status::Success);
    // Cancelling with nothing parked, or for an unknown client, changes nothing.
    s.cancel_parked(b.get(), 2);
    s.cancel_parked(0x7fff_fff0, 2);
    assert_eq!(s.replies_ready(), 0);
}

/// `n` clients (at least 2) with a reference each to lock "x" of `kind`: the first holds it
/// exclusively for `a_expire_ms` (tick 0) and the second waits for it with `b_op` (tick 1).
fn a_holds_b_waits(
    s: &mut Server<'_>,
    kind: LockKind,
    a_expire_ms: u32,
    b_op: LockOp,
    n: usize,
) -> Vec<(ClientId, LockId)> {
    let on_x: Vec<_> = (0..n)
        .map(|_| {
            let c = s.client_init(2, 0, 0).unwrap();
            (c, s.get_lock(c.get(), kind, b"x", 0).unwrap())
        })
        .collect();
    let ((a, la), (b, lb)) = (on_x[0], on_x[1]);
    let held = run(s, a, lock(kind, LockOp::TryExclusive, la, a_expire_ms), 0);
    assert_eq!(held.status, Status::Success, "{kind:?}");
    assert_eq!(
        wait_for(s, b, waiting(kind, b_op, lb, 60_000, 60_000), 1),
        None,
        "{kind:?}: b parks"
    );
    on_x
}

/// A parked request granted but cancelled before its reply went out (the client's data path was
/// replaced): the client never learns it holds the lock, so the server releases it again —
/// for every kind, also RW, whose grants never lapse — and the next waiter gets it.
#[test]
fn a_grant_whose_reply_is_cancelled_is_released_again() {
    for (kind, op) in [
        (LockKind::Atomic, LockOp::TryExclusive),
        (LockKind::Rw, LockOp::TryExclusive),
        (LockKind::Rw, LockOp::TryShared),
        (LockKind::Fair, LockOp::TryExclusive),
    ] {
        let cfg = small();
        let mut region = TestRegion::new(&cfg);
        let mut s = server(&mut region, &cfg);
        let on_x = a_holds_b_waits(&mut s, kind, 60_000, op, 3);
        let [(a, la), (b, _), (c, lc)] = on_x[..] else {
            unreachable!("three clients")
        };
        // c parks behind b.
        let c_wants = waiting(kind, LockOp::TryExclusive, lc, 60_000, 60_000);
        assert_eq!(wait_for(&mut s, c, c_wants, 2), None);
        // a unlocks: b is granted, its reply is ready but not yet taken.
        run(&mut s, a, lock(kind, LockOp::UnlockExclusive, la, 0), 3);
        assert_eq!(s.replies_ready(), 1, "{kind:?}: b granted");
        s.cancel_parked(b.get(), 4);
        // b's grant is released, so c (queued behind b) is granted now.
        let got = replies(&mut s);
        assert_eq!(got.len(), 1, "{kind:?}: only c's reply: {got:?}");
        assert_eq!(got[0].result.status, Status::Success, "{kind:?}");
        assert_eq!(got[0].client, c.get(), "{kind:?}");
    }
}

#[test]
fn parked_request_replies_through_the_bytes_path_with_its_message_id() {
    use crate::proto::{DATA_MESSAGE_MAX, DataHeader, decode_data_response, encode_data_request};
    let cfg = small();
    let mut region = TestRegion::new(&cfg);
    let mut s = server(&mut region, &cfg);
    let a = s.client_init(2, 0, 0).unwrap();
    let b = s.client_init(2, 0, 0).unwrap();
    let la = s.get_lock(a.get(), LockKind::Atomic, b"x", 0).unwrap();
    let lb = s.get_lock(b.get(), LockKind::Atomic, b"x", 0).unwrap();
    run(
        &mut s,
        a,
        lock(LockKind::Atomic, LockOp::TryExclusive, la, 1_000),
        0,
    );
    let header = DataHeader {
        version: crate::proto::PROTO_VERSION,
        count: 0,
        message_id: 777,
        client: b.get(),
        flags: 0,
    };
    let mut req = [0u8; DATA_MESSAGE_MAX];
    let n = encode_data_request(
        &header,
        &[waiting(
            LockKind::Atomic,
            LockOp::TryExclusive,
            lb,
            50,
            9_000,
        )],
        &mut req,
    )
    .unwrap();
    let mut out = [0u8; DATA_MESSAGE_MAX];
    assert_eq!(
        s.handle_data(&req[..n], &mut out, 1),
        Ok(0),
        "parked: no reply yet"
    );
    run(
        &mut s,
        a,
        lock(LockKind::Atomic, LockOp::UnlockExclusive, la, 0),
        2,
    );
    let got = replies(&mut s);
    let m = got[0].encode(&mut out).unwrap();
    let reply = decode_data_response(&out[..m]).unwrap();
    assert_eq!(reply.header().message_id, 777);
    assert_eq!(reply.result(0).id, lb.raw());
    assert_eq!(reply.result(0).result.status, Status::Success);
}

fn claim(kind: LockKind, held: Held, name: &[u8], ticket: Ticket, token: u64) -> LockClaim<'_> {
    LockClaim {
        kind,
        held,
        name,
        old_lock: 0,
        word: 0,
        ticket,
        remaining_ms: 5_000,
        age_ms: 0,
        token,
        proof: crate::GrantProof::NONE,
    }
}

/// A server recovering for `n` clients, and those clients re-registered.
fn recovering<'r>(region: &'r mut TestRegion, cfg: &Config, n: u32) -> (Server<'r>, Vec<ClientId>) {
    let mut s = server(region, cfg);
    let ids: Vec<ClientId> = (0..n).map(|i| ClientId::new(100 + i).unwrap()).collect();
    for c in &ids {
        s.client_reinit(c.get(), 2, 0, &session(&s, c.get()), 0)
            .unwrap();
    }
    (s, ids)
}

#[test]
fn claims_after_the_server_is_ready_are_refused() {
    let cfg = Config {
        recovery_clients: 1,
        epoch: 2,
        ..small()
    };
    let mut region = TestRegion::new(&cfg);
    let (mut s, ids) = recovering(&mut region, &cfg, 2);
    s.reinit_done(ids[0].get(), 0).unwrap();
    assert_eq!(s.state(), ServerState::Ready);
    let c = s.client_init(2, 0, 1).unwrap();
    let l = s.get_lock(c.get(), LockKind::Rw, b"x", 1).unwrap();
    assert_eq!(
        run(&mut s, c, lock(LockKind::Rw, LockOp::TryExclusive, l, 0), 1).status,
        Status::Success
    );
    // ids[1] re-registered in the recovery, which is over: its claim restores nothing.
    let steal = claim(LockKind::Rw, Held::Exclusive, b"x", Ticket::default(), 0);
    assert_eq!(s.update_lock(ids[1].get(), &steal, 2), Err(Status::Fail));
    // c never re-registered here: a claim from it is refused as out of place.
    assert_eq!(s.update_lock(c.get(), &steal, 2), Err(Status::Einval));
    let w = crate::word::rw::RwWord::from_bits(s.t.lock_cells[l.index() as usize].word);
    assert_eq!(w.owner(), c.get(), "the new holder keeps it");
}

#[test]
fn repeated_claims_merge_once() {
    let cfg = Config {
        recovery_clients: 1,
        epoch: 2,
        ..small()
    };
    let mut region = TestRegion::new(&cfg);
    let (mut s, ids) = recovering(&mut region, &cfg, 1);
    let shared = claim(LockKind::Rw, Held::Shared, b"r", Ticket::default(), 5);
    let l = s.update_lock(ids[0].get(), &shared, 0).unwrap();
    assert_eq!(s.update_lock(ids[0].get(), &shared, 0), Ok(l));
    let w = crate::word::rw::RwWord::from_bits(s.t.lock_cells[l.index() as usize].word);
    assert_eq!(w.readers(), 1);
    let ex = claim(
        LockKind::Fair,
        Held::Exclusive,
        b"f",
        Ticket {
            exclusive: 3,
            shared: 1,
        },
        6,
    );
    let f = s.update_lock(ids[0].get(), &ex, 0).unwrap();
    assert_eq!(
        s.update_lock(ids[0].get(), &ex, 0),
        Ok(f),
        "not refused the second time"
    );
}

#[test]
fn fair_claims_anywhere_in_the_counter_range_restore_a_working_queue() {
    let cfg = Config {
        recovery_clients: 1,
        epoch: 2,
        ..small()
    };
    let mut region = TestRegion::new(&cfg);
    let (mut s, ids) = recovering(&mut region, &cfg, 1);
    let a = ids[0];
    let t = Ticket {
        exclusive: 0x9001,
        shared: 0x9000,
    };
    let l = s
        .update_lock(a.get(), &claim(LockKind::Fair, Held::Shared, b"f", t, 1), 0)
        .unwrap();
    let e = s
        .update_lock(
            a.get(),
            &claim(LockKind::Fair, Held::Exclusive, b"g", t, 1),
            0,
        )
        .unwrap();
    s.reinit_done(a.get(), 0).unwrap();
    assert_eq!(
        run(
            &mut s,
            a,
            ticketed(LockKind::Fair, LockOp::UnlockShared, l, 0, t),
            1
        )
        .status,
        Status::Success
    );
    assert_eq!(
        run(
            &mut s,
            a,
            ticketed(LockKind::Fair, LockOp::UnlockExclusive, e, 0, t),
            1
        )
        .status,
        Status::Success
    );
    for id in [l, e] {
        let r = run(
            &mut s,
            a,
            lock(LockKind::Fair, LockOp::TryExclusive, id, 100),
            2,
        );
        assert_eq!(r.status, Status::Success, "the queue is not wedged");
    }
}

#[test]
fn forged_claim_tokens_and_impossible_claims_are_refused_without_a_trace() {
    let cfg = Config {
        recovery_clients: 1,
        epoch: 2,
        ..small()
    };
    let mut region = TestRegion::new(&cfg);
    let (mut s, ids) = recovering(&mut region, &cfg, 1);
    let before = s.tables().digest();
    let forged = claim(
        LockKind::Atomic,
        Held::Exclusive,
        b"x",
        Ticket::default(),
        u64::MAX,
    );
    assert_eq!(s.update_lock(ids[0].get(), &forged, 0), Err(Status::Einval));
    let nonsense = claim(LockKind::Atomic, Held::Shared, b"x", Ticket::default(), 0);
    assert_eq!(
        s.update_lock(ids[0].get(), &nonsense, 0),
        Err(Status::Einval)
    );
    assert_eq!(s.tables().digest(), before);
    // A merge refusal drops the reference the claim created.
    let b = ClientId::new(555).unwrap();
    s.client_reinit(b.get(), 2, 0, &session(&s, b.get()), 0)
        .unwrap();
    let mine = claim(LockKind::Rw, Held::Exclusive, b"w", Ticket::default(), 0);
    s.update_lock(ids[0].get(), &mine, 0).unwrap();
    let theirs = claim(LockKind::Rw, Held::Shared, b"w", Ticket::default(), 0);
    assert_eq!(s.update_lock(b.get(), &theirs, 0), Err(Status::Fail));
    let lock = s.find_lock(b"w").unwrap();
    assert_eq!(s.t.lock_refs.get(s.client_slot(b.get()).unwrap(), lock), 0);
    assert_eq!(s.t.lock_meta[lock as usize].refs, 1);
}

#[test]
fn waiting_for_other_clients_to_resync_does_not_cost_a_client_its_lease() {
    let cfg = Config {
        recovery_clients: 2,
        epoch: 2,
        ..small()
    };
    let mut region = TestRegion::new(&cfg);
    let (mut s, ids) = recovering(&mut region, &cfg, 2);
    s.reinit_done(ids[0].get(), 0).unwrap();
    for now in (200..2_000).step_by(200) {
        assert_eq!(s.heartbeat(ids[0].get(), now), Err(Status::NotReady));
        s.client_reinit(ids[1].get(), 2, 0, &session(&s, ids[1].get()), now)
            .unwrap();
        assert_eq!(s.tick(now), 0, "at {now}");
    }
}

#[test]
fn forged_other_half_of_a_fair_ticket_is_refused() {
    let cfg = small();
    let mut region = TestRegion::new(&cfg);
    let mut s = server(&mut region, &cfg);
    let a = s.client_init(2, 0, 0).unwrap();
    let b = s.client_init(2, 0, 0).unwrap();
    let la = s.get_lock(a.get(), LockKind::Fair, b"f", 0).unwrap();
    let lb = s.get_lock(b.get(), LockKind::Fair, b"f", 0).unwrap();
    assert_eq!(
        run(
            &mut s,
            a,
            lock(LockKind::Fair, LockOp::TryExclusive, la, 100),
            0
        )
        .status,
        Status::Success
    );
    let q = run(
        &mut s,
        b,
        lock(LockKind::Fair, LockOp::TryShared, lb, 100),
        0,
    );
    assert_eq!(q.status, Status::Eagain);
    let forged = Ticket {
        exclusive: 40,
        shared: (q.aux >> 16) as u16,
    };
    let r = run(
        &mut s,
        b,
        ticketed(LockKind::Fair, LockOp::TicketShared, lb, 100, forged),
        500,
    );
    assert_eq!(r.status, Status::Fail);
    let w = crate::word::fair::FairWord::from_bits(s.t.lock_cells[la.index() as usize].word);
    assert_eq!((w.nx(), w.mx()), (0, 1));
}

#[test]
fn fair_lock_in_the_other_mode_while_holding_is_einval() {
    let cfg = small();
    let mut region = TestRegion::new(&cfg);
    let mut s = server(&mut region, &cfg);
    let a = s.client_init(2, 0, 0).unwrap();
    let l = s.get_lock(a.get(), LockKind::Fair, b"f", 0).unwrap();
    assert_eq!(
        run(
            &mut s,
            a,
            lock(LockKind::Fair, LockOp::TryExclusive, l, 100),
            0
        )
        .status,
        Status::Success
    );
    assert_eq!(
        run(
            &mut s,
            a,
            lock(LockKind::Fair, LockOp::TryShared, l, 100),
            0
        )
        .status,
        Status::Einval
    );
    assert_eq!(
        run(
            &mut s,
            a,
            lock(LockKind::Fair, LockOp::TryExclusive, l, 100),
            0
        )
        .status,
        Status::AlreadyLocked
    );
}

#[test]
fn a_shared_ticket_voided_by_a_preemption_stays_void_after_rflag_resets() {
    let cfg = small();
    let mut region = TestRegion::new(&cfg);
    let mut s = server(&mut region, &cfg);
    let [a, b, c] = [0; 3].map(|_| s.client_init(2, 0, 0).unwrap());
    let [la, lb, lc] = [a, b, c].map(|x| s.get_lock(x.get(), LockKind::Fair, b"f", 0).unwrap());
    let tick = |r: CommandResult| Ticket {
        exclusive: r.aux as u16,
        shared: (r.aux >> 16) as u16,
    };
    let word_ticket = |r: CommandResult| {
        let w = crate::word::fair::FairWord::from_bits(r.word);
        Ticket {
            exclusive: w.mx(),
            shared: w.ms(),
        }
    };
    assert_eq!(
        run(
            &mut s,
            a,
            lock(LockKind::Fair, LockOp::TryExclusive, la, 100),
            0
        )
        .status,
        Status::Success
    );
    let tb = tick(run(
        &mut s,
        b,
        lock(LockKind::Fair, LockOp::TryShared, lb, 100),
        0,
    ));
    let tc = tick(run(
        &mut s,
        c,
        lock(LockKind::Fair, LockOp::TryShared, lc, 100),
        0,
    ));
    let pre = run(
        &mut s,
        c,
        ticketed(LockKind::Fair, LockOp::TicketShared, lc, 100, tc),
        101,
    );
    assert_eq!(pre.status, Status::Success, "c preempts the overdue writer");
    run(
        &mut s,
        c,
        ticketed(LockKind::Fair, LockOp::UnlockShared, lc, 0, tc),
        102,
    );
    for _ in 0..49 {
        let r = run(
            &mut s,
            c,
            lock(LockKind::Fair, LockOp::TryShared, lc, 100),
            103,
        );
        assert_eq!(r.status, Status::Success);
        run(
            &mut s,
            c,
            ticketed(LockKind::Fair, LockOp::UnlockShared, lc, 0, word_ticket(r)),
            103,
        );
    }
    // b's ticket was voided by the preemption: refused, and b queues again from scratch.
    let r = run(
        &mut s,
        b,
        ticketed(LockKind::Fair, LockOp::TicketShared, lb, 100, tb),
        104,
    );
    assert_eq!(
        r.status,
        Status::Fail,
        "a passed ticket, as the reference answers it"
    );
    for x in [a, b] {
        let l = if x == a { la } else { lb };
        let r = run(
            &mut s,
            x,
            lock(LockKind::Fair, LockOp::TryExclusive, l, 100),
            1_000_000,
        );
        assert!(
            matches!(r.status, Status::Success | Status::Eagain),
            "the lock is not wedged: {:?}",
            r.status
        );
        if r.status == Status::Success {
            run(
                &mut s,
                x,
                ticketed(
                    LockKind::Fair,
                    LockOp::UnlockExclusive,
                    l,
                    0,
                    word_ticket(r),
                ),
                1_000_000,
            );
        }
    }
}

#[test]
fn fair_ticket_retry_with_no_lease_is_einval() {
    let cfg = small();
    let mut region = TestRegion::new(&cfg);
    let mut s = server(&mut region, &cfg);
    let a = s.client_init(2, 0, 0).unwrap();
    let b = s.client_init(2, 0, 0).unwrap();
    let la = s.get_lock(a.get(), LockKind::Fair, b"f", 0).unwrap();
    let lb = s.get_lock(b.get(), LockKind::Fair, b"f", 0).unwrap();
    run(
        &mut s,
        a,
        lock(LockKind::Fair, LockOp::TryExclusive, la, 100),
        0,
    );
    let q = run(
        &mut s,
        b,
        lock(LockKind::Fair, LockOp::TryExclusive, lb, 100),
        0,
    );
    let t = Ticket {
        exclusive: q.aux as u16,
        shared: (q.aux >> 16) as u16,
    };
    assert_eq!(
        run(
            &mut s,
            b,
            ticketed(LockKind::Fair, LockOp::TicketExclusive, lb, 0, t),
            500
        )
        .status,
        Status::Einval
    );
}

#[test]
fn reinit_of_a_live_client_needs_its_session_secret() {
    let cfg = small();
    let mut region = TestRegion::new(&cfg);
    let mut s = server(&mut region, &cfg);
    let a = s.client_init(2, 0, 0).unwrap();
    let b = s.client_init(2, 0, 0).unwrap();
    let secret = session(&s, a.get());
    let mut guess = secret;
    guess.0[Session::LEN - 1] ^= 1;
    // b knows its own session and a's id: neither its own secret, a near miss nor "no session"
    // resumes a.
    for wrong in [guess, session(&s, b.get()), Session::NONE] {
        assert_eq!(
            s.client_reinit(a.get(), 2, 0, &wrong, 1),
            Err(Status::Einval),
            "guessing the id is not enough"
        );
    }
    assert_eq!(s.stats().get(Counter::SessionsRefused), 3);
    assert_eq!(s.client_reinit(a.get(), 2, 0, &secret, 1), Ok(a));
}

#[test]
fn a_channel_attaches_only_with_the_registrations_own_session() {
    let cfg = small();
    let mut region = TestRegion::new(&cfg);
    let mut s = server(&mut region, &cfg);
    let a = s.client_init(2, 0, 0).unwrap();
    let b = s.client_init(2, 0, 0).unwrap();
    let (slot_a, secret_a) = s.client_session(a.get()).unwrap();
    assert_ne!(
        secret_a,
        session(&s, b.get()),
        "every registration has its own secret"
    );
    assert_eq!(s.authenticate(a.get(), &secret_a), Some(slot_a));
    assert_eq!(s.authenticate(a.get(), &session(&s, b.get())), None);
    assert_eq!(s.authenticate(a.get(), &Session::NONE), None);
    assert_eq!(s.authenticate(0x7FFF_FFFF, &secret_a), None, "unknown id");
    assert_eq!(s.stats().get(Counter::SessionsRefused), 3);
}

#[test]
fn a_lease_above_the_maximum_is_capped_and_a_killed_holder_is_freed_within_it() {
    let cfg = Config {
        client_lease_max_ms: 1_000,
        ..small()
    };
    let mut region = TestRegion::new(&cfg);
    let mut s = server(&mut region, &cfg);
    let greedy = s.client_init(2, u32::MAX, 0).unwrap();
    let slot = s.client_session(greedy.get()).unwrap().0;
    assert_eq!(s.tables().clients[slot as usize].lease_ms, 1_000);
    assert_eq!(s.stats().get(Counter::LeasesCapped), 1);
    let id = s.get_lock(greedy.get(), LockKind::Rw, b"x", 0).unwrap();
    let held = run(
        &mut s,
        greedy,
        lock(LockKind::Rw, LockOp::TryShared, id, 0),
        0,
    );
    assert_eq!(held.status, Status::Success);
    // The holder is killed: nothing more from it. Within the maximum lease it is dead and its
    // shared hold is gone, so a writer gets in.
    assert_eq!(s.tick(1_001), 1);
    let w = s.client_init(2, 0, 1_001).unwrap();
    let lw = s.get_lock(w.get(), LockKind::Rw, b"x", 1_001).unwrap();
    assert_eq!(
        run(
            &mut s,
            w,
            lock(LockKind::Rw, LockOp::TryExclusive, lw, 0),
            1_001
        )
        .status,
        Status::Success
    );
}

/// A grant decided but not yet delivered when the client's control connection is lost
/// (`client_disconnected`, which the transport calls when the parked request did not come over
/// that very socket) is released: the client re-registers never knowing it held the lock.
#[test]
fn a_grant_dropped_by_a_lost_connection_is_released() {
    let cfg = small();
    let mut region = TestRegion::new(&cfg);
    let mut s = server(&mut region, &cfg);
    let kind = LockKind::Rw;
    let on_x = a_holds_b_waits(&mut s, kind, 0, LockOp::TryExclusive, 3);
    let [(a, la), (b, _), (c, lc)] = on_x[..] else {
        unreachable!("three clients")
    };
    // a unlocks: b is granted, its reply is ready but not yet taken.
    run(&mut s, a, lock(kind, LockOp::UnlockExclusive, la, 0), 2);
    assert_eq!(s.replies_ready(), 1);
    // Same turn: b's control connection goes away; then b re-registers (same session).
    s.client_disconnected(b.get(), 3);
    assert_eq!(s.replies_ready(), 0, "b's reply was dropped");
    let sess = &session(&s, b.get());
    s.client_reinit(b.get(), 2, 0, sess, 3).unwrap();
    // b never got the grant; c must be able to take the lock.
    assert_eq!(
        run(&mut s, c, lock(kind, LockOp::TryExclusive, lc, 0), 4).status,
        Status::Success,
        "b's undelivered grant still holds the lock"
    );
}

/// A client that deinits with a request parked takes it along: the next client given its slot
/// does not inherit it, and the lock is never granted under the departed client's id.
#[test]
fn a_deinit_takes_the_parked_request_along() {
    let cfg = small();
    let mut region = TestRegion::new(&cfg);
    let mut s = server(&mut region, &cfg);
    let kind = LockKind::Rw;
    let on_x = a_holds_b_waits(&mut s, kind, 0, LockOp::TryExclusive, 2);
    let [(a, la), (b, _)] = on_x[..] else {
        unreachable!("two clients")
    };
    let b_slot = s.client_session(b.get()).unwrap().0;
    s.client_deinit(b.get(), 2).unwrap();
    let c = s.client_init(2, 0, 3).unwrap();
    assert_eq!(
        s.client_session(c.get()).unwrap().0,
        b_slot,
        "c reuses b's slot"
    );
    let lc = s.get_lock(c.get(), kind, b"x", 3).unwrap();
    run(&mut s, a, lock(kind, LockOp::UnlockExclusive, la, 0), 4);
    let got = replies(&mut s);
    assert!(
        got.is_empty(),
        "stale request of departed b answered: {got:?}"
    );
    assert_eq!(
        run(&mut s, c, lock(kind, LockOp::TryExclusive, lc, 0), 5).status,
        Status::Success,
        "lock granted to departed client b"
    );
}

/// Fair shared grants and grants by timeout preemption whose reply is cancelled are released
/// too (under the ticket the granting word names).
#[test]
fn fair_shared_and_preempted_grants_whose_reply_is_cancelled_are_released() {
    for (op, preempt) in [
        (LockOp::TryShared, false),
        (LockOp::TryExclusive, true),
        (LockOp::TryShared, true),
    ] {
        let cfg = small();
        let mut region = TestRegion::new(&cfg);
        let mut s = server(&mut region, &cfg);
        let kind = LockKind::Fair;
        let on_x = a_holds_b_waits(&mut s, kind, 10, op, 3);
        let [(a, la), (b, _), (c, lc)] = on_x[..] else {
            unreachable!("three clients")
        };
        assert_eq!(
            wait_for(
                &mut s,
                c,
                waiting(kind, LockOp::TryExclusive, lc, 60_000, 600_000),
                2
            ),
            None
        );
        let t = if preempt {
            // a overruns its lease; b preempts past it (c is behind b).
            s.poll_waiters(11);
            11
        } else {
            run(&mut s, a, lock(kind, LockOp::UnlockExclusive, la, 0), 3);
            3
        };
        assert_eq!(s.replies_ready(), 1, "{op:?} {preempt}: b granted");
        s.cancel_parked(b.get(), t + 1);
        let got = replies(&mut s);
        if !preempt {
            assert_eq!(got.len(), 1, "{op:?}: {got:?}");
            assert_eq!(
                (got[0].client, got[0].result.status),
                (c.get(), Status::Success)
            );
        } else {
            // Preemption voided c's ticket (requeued); check b's grant itself is gone.
            let idx = la.index() as usize;
            let cell = s.t.lock_cells[idx];
            let w = crate::word::fair::FairWord::from_bits(cell.word);
            assert_eq!(
                (cell.ext, w.rcnt(), w.nx()),
                (0, 0, if op == LockOp::TryExclusive { 2 } else { 1 }),
                "{op:?}: {w:?}"
            );
            if op == LockOp::TryShared {
                assert_eq!(w.ns(), w.rms().wrapping_add(1));
            }
        }
    }
}

/// A stand-in MAC for the tests (the runtime's is HMAC-SHA-256): any keyed function tells a
/// message MACed under the key from one that was not.
pub(crate) fn test_mac(key: &SessionKey, parts: &[&[u8]]) -> [u8; 32] {
    let mut h = u64::from_le_bytes(key.as_bytes()[..8].try_into().unwrap());
    let mut out = [0u8; 32];
    for (i, chunk) in out.chunks_mut(8).enumerate() {
        for &b in parts.iter().flat_map(|p| p.iter()) {
            h = (h ^ u64::from(b))
                .wrapping_mul(0x0100_0000_01b3)
                .rotate_left(17);
        }
        h ^= i as u64;
        chunk.copy_from_slice(&h.to_le_bytes());
    }
    out
}

#[test]
fn a_replacement_server_takes_back_only_sessions_minted_under_the_shared_key() {
    let key = SessionKey::new(crate::ids::tests::GOOD_KEY).unwrap();
    // The failed server, which minted the client's session.
    let cfg = small();
    let mut region = TestRegion::new(&cfg);
    let mut old = server(&mut region, &cfg);
    old.set_session_key(key.clone(), test_mac);
    let victim = old.client_init(2, 0, 0).unwrap();
    let (_, victims_session) = old.client_session(victim.get()).unwrap();
    let _ = old; // the failed server: only its key and the session it minted matter now

    let cfg = Config {
        recovery_clients: 2,
        epoch: 2,
        ..small()
    };
    let mut region = TestRegion::new(&cfg);
    let mut s = server(&mut region, &cfg);
    s.set_session_key(key.clone(), test_mac);
    // An attacker who knows the victim's id, with no session, a made-up one, or a session of
    // its own minted for another id: refused, counted, and nothing registered.
    let mut made_up = Session([0x5A; Session::LEN]);
    made_up.0[0] = 1;
    let other_id = Session::minted(&key, test_mac, victim.get() ^ 1, [3; 8]);
    for forged in [Session::NONE, made_up, other_id] {
        assert_eq!(
            s.client_reinit(victim.get(), 2, 0, &forged, 0),
            Err(Status::Einval)
        );
    }
    assert_eq!(s.stats().get(Counter::SessionsRefused), 3);
    assert_eq!(s.usage().clients, 0);
    // The victim itself comes back with the session the failed server gave it.
    assert_eq!(
        s.client_reinit(victim.get(), 2, 0, &victims_session, 0),
        Ok(victim)
    );
    // The session it is handed now is minted under the key too, for the next failover.
    let (_, fresh) = s.client_session(victim.get()).unwrap();
    assert!(fresh.is_minted_for(&key, test_mac, victim.get()));
}

/// A join is a stream transport's business: the state machine refuses it, alone or in an
/// all-or-nothing batch, and changes nothing.
#[test]
fn a_join_reaching_the_state_machine_is_refused() {
    let cfg = small();
    let mut region = TestRegion::new(&cfg);
    let mut s = server(&mut region, &cfg);
    let a = s.client_init(2, 0, 0).unwrap();
    let join = Command::Join(crate::proto::JoinCommand {
        session: session(&s, a.get()),
    });
    assert_eq!(run(&mut s, a, join, 0).status, Status::Einval);
    let l = s.get_lock(a.get(), LockKind::Atomic, b"x", 0).unwrap();
    let mut r = [CommandResult {
        status: Status::Success,
        word: 0,
        aux: 0,
    }; 2];
    let take = lock(LockKind::Atomic, LockOp::TryExclusive, l, 1_000);
    s.execute_message(a.get(), FLAG_ALL_OR_NOTHING, &[take, join], &mut r, 0)
        .unwrap();
    assert!(r.iter().all(|r| r.status == Status::Einval), "{r:?}");
    assert_eq!(
        run(&mut s, a, take, 0).status,
        Status::Success,
        "not taken before"
    );
}

/// Found by the simulator (seed 0xf14da67bc96231dd): B's unlock was executed before the
/// failover and its reply lost, so B re-claimed the lock too, with a later expiry than A's
/// genuine grant. The reference's rule let the later claim displace the earlier one while A,
/// told its claim succeeded, went on believing it held the lock. The first accepted claim keeps
/// an exclusive lock (atomic and RW alike); the second is refused.
#[test]
fn a_second_exclusive_claim_cannot_displace_an_accepted_one() {
    let cfg = Config {
        recovery_clients: 2,
        epoch: 2,
        ..small()
    };
    let mut region = TestRegion::new(&cfg);
    let (mut s, ids) = recovering(&mut region, &cfg, 2);
    let (a, b) = (ids[0].get(), ids[1].get());
    for kind in [LockKind::Atomic, LockKind::Rw] {
        let name: &[u8] = if kind == LockKind::Atomic { b"a" } else { b"r" };
        let mut first = claim(kind, Held::Exclusive, name, Ticket::default(), 7);
        first.remaining_ms = 500;
        first.age_ms = 10;
        let l = s.update_lock(a, &first, 100).unwrap();
        // Expires later and was acquired later: the reference's rules would let it win.
        let mut second = claim(kind, Held::Exclusive, name, Ticket::default(), 5);
        second.remaining_ms = 5_000;
        second.age_ms = 1;
        assert_eq!(
            s.update_lock(b, &second, 110),
            Err(Status::Fail),
            "{kind:?}"
        );
        let owner = match kind {
            LockKind::Atomic => {
                crate::word::atomic::AtomicWord::from_bits(s.t.lock_cells[l.index() as usize].word)
                    .owner()
            }
            _ => {
                crate::word::rw::RwWord::from_bits(s.t.lock_cells[l.index() as usize].word).owner()
            }
        };
        assert_eq!(owner, a, "{kind:?}: the first claim keeps it");
    }
}
