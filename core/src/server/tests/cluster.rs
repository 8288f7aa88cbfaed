//! A cluster server: the partition check on every command and name, self-fencing, a takeover's
//! recovery (proved re-claims, `ReclaimDone`, the grace end), per-partition tokens, counters
//! gated by their high-water marks, lost partitions, `GetMap` and `ClientJoin`.

use super::*;
use crate::cluster::{Map, Member, PARTITIONS_MAX, Partitions, ServerId, Timing, assign};
use crate::ids::{FencingToken, GrantProof, Peer};
use crate::proto::{
    CONTROL_FRAME_MAX, ControlHeader, ControlRequest, ControlRequestFrame, ControlResponse,
    MsgType, PROTO_VERSION, decode_control_response, encode_control_request,
};
use crate::server::proof::{GrantSubject, grant_proof};

const P: u16 = 8;
const TIMING: Timing = Timing {
    ttl_ms: 1_000,
    drift_ppm: 10_000,
    grant_lease_max_ms: 2_000,
};

fn sid(n: u32) -> ServerId {
    ServerId::new(n).unwrap()
}

/// The map after `current` for members `(id, incarnation, draining)`.
fn next(current: &Map, members: &[(u32, u64, bool)]) -> Box<Map> {
    let addrs: Vec<Vec<u8>> = members
        .iter()
        .map(|(n, _, _)| format!("127.0.0.1:{n}").into_bytes())
        .collect();
    let ms: Vec<Member<'_>> = members
        .iter()
        .zip(&addrs)
        .map(|(&(n, incarnation, draining), a)| Member {
            id: sid(n),
            incarnation,
            address: a,
            draining,
        })
        .collect();
    let mut out = Box::new(Map::new(current.partitions()));
    assign(current, &ms, &[], &mut out).unwrap();
    out
}

fn first_map() -> Box<Map> {
    next(
        &Map::new(Partitions::new(P).unwrap()),
        &[(1, 11, false), (2, 22, false)],
    )
}

/// A keyed cluster server `me` (memory leaked, as `TestServer`'s region is).
fn member(me: u32) -> TestServer {
    member_of(me, &small())
}

/// [`member`] with tables of `cfg` (its reclaim table sized by `cfg.clients_max`).
fn member_of(me: u32, cfg: &Config) -> TestServer {
    let mut s = TestServer::keyed(cfg);
    let side = ClusterSide {
        map: Box::leak(Box::new(Map::new(Partitions::new(P).unwrap()))),
        encoded: Box::leak(vec![0u8; crate::cluster::MAP_ENCODED_MAX].into_boxed_slice()),
        parts: Box::leak(
            vec![PartState::default(); usize::from(PARTITIONS_MAX)].into_boxed_slice(),
        ),
        expected: Box::leak(vec![0u32; cfg.clients_max as usize].into_boxed_slice()),
        reclaims: Box::leak(
            vec![0u64; ClusterSide::reclaims_len(cfg.clients_max)].into_boxed_slice(),
        ),
    };
    let settings = ClusterSettings {
        me: sid(me),
        timing: TIMING,
        counter_step: 100,
    };
    s.enable_cluster(side, settings);
    s.set_authority_until(Some(u64::MAX));
    s
}

/// A name whose partition `map` gives to server `owner`.
fn name_owned_by(map: &Map, owner: u32, skip: usize) -> Vec<u8> {
    (0..)
        .map(|i| format!("row-{i}").into_bytes())
        .filter(|n| {
            let p = crate::cluster::partition_of(n, map.partitions());
            map.owner(p).unwrap().server == Some(sid(owner))
        })
        .nth(skip)
        .unwrap()
}

fn partition(name: &[u8]) -> u16 {
    crate::cluster::partition_of(name, Partitions::new(P).unwrap())
}

/// A persisted client of `s`.
fn persisted_client(s: &mut TestServer, now: u64) -> ClientId {
    let c = s.client_init(PROTO_VERSION, 0, now).unwrap();
    s.client_persisted(c.get());
    c
}

fn at_epoch(cmd: Command, epoch: u32) -> Command {
    match cmd {
        Command::Lock(c) => Command::Lock(LockCommand {
            partition_epoch: epoch,
            ..c
        }),
        Command::Object(o) => Command::Object(ObjectCommand {
            partition_epoch: epoch,
            ..o
        }),
        other => other,
    }
}

fn try_x(id: LockId, epoch: u32) -> Command {
    at_epoch(
        lock(LockKind::Atomic, LockOp::TryExclusive, id, 60_000),
        epoch,
    )
}

#[test]
fn a_command_at_another_epoch_or_for_another_owner_is_answered_partition_moved() {
    let m1 = first_map();
    let mut s = member(1);
    assert!(s.apply_map(&m1, 11, &[], 0));
    let c = persisted_client(&mut s, 0);
    let theirs = name_owned_by(&m1, 2, 0);
    assert_eq!(
        s.get_lock(c.get(), LockKind::Atomic, &theirs, 1),
        Err(Status::PartitionMoved),
        "a name of a partition owned elsewhere is refused"
    );
    let ours = name_owned_by(&m1, 1, 0);
    let id = s.get_lock(c.get(), LockKind::Atomic, &ours, 1).unwrap();
    for epoch in [0, 2] {
        let r = s.run(c, try_x(id, epoch), 2);
        assert_eq!(
            (r.status, r.aux),
            (Status::PartitionMoved, m1.version()),
            "epoch {epoch}"
        );
    }
    let r = s.run(c, try_x(id, 1), 3);
    assert_eq!(r.status, Status::Success);
    assert_eq!(
        r.aux,
        FencingToken::cluster(1, 1).0,
        "the partition's token"
    );
}

#[test]
fn a_fenced_server_grants_nothing_and_serves_again_when_its_authority_returns() {
    let m1 = first_map();
    let mut s = member(1);
    s.apply_map(&m1, 11, &[], 0);
    let c = persisted_client(&mut s, 0);
    let id = s
        .get_lock(c.get(), LockKind::Atomic, &name_owned_by(&m1, 1, 0), 0)
        .unwrap();
    s.set_authority_until(Some(100));
    let r = s.run(c, try_x(id, 1), 100);
    assert_eq!((r.status, r.aux), (Status::PartitionMoved, m1.version()));
    assert_eq!(
        s.tables().lock_cells[id.index() as usize].word,
        0,
        "nothing granted"
    );
    s.set_authority_until(Some(1_000));
    assert_eq!(s.run(c, try_x(id, 1), 150).status, Status::Success);
}

#[test]
fn a_client_is_granted_nothing_until_its_id_is_persisted() {
    let m1 = first_map();
    let mut s = member(1);
    s.apply_map(&m1, 11, &[], 0);
    let c = s.client_init(PROTO_VERSION, 0, 0).unwrap();
    let id = s
        .get_lock(c.get(), LockKind::Atomic, &name_owned_by(&m1, 1, 0), 0)
        .unwrap();
    assert_eq!(s.run(c, try_x(id, 1), 1).status, Status::NotReady);
    s.client_persisted(c.get());
    assert_eq!(s.run(c, try_x(id, 1), 2).status, Status::Success);
}

/// Server 1 grants lock `name` to its client, then dies: server 2 takes its partitions over.
/// Returns (server 2 after the takeover map, the client joined to it, its proved claim parts).
fn takeover(early: bool) -> (TestServer, ClientId, Vec<u8>, u64, GrantProof, Box<Map>) {
    let m1 = first_map();
    let mut s1 = member(1);
    s1.apply_map(&m1, 11, &[], 0);
    let c = persisted_client(&mut s1, 0);
    let name = name_owned_by(&m1, 1, 0);
    let id = s1.get_lock(c.get(), LockKind::Atomic, &name, 0).unwrap();
    let token = s1.run(c, try_x(id, 1), 1).aux;
    let proof = grant_proof(
        &SessionKey::new(crate::ids::tests::GOOD_KEY).unwrap(),
        test_mac,
        &GrantSubject {
            client: c.get(),
            kind: LockKind::Atomic,
            held: Held::Exclusive,
            partition: partition(&name),
            epoch: 1,
            token,
            ticket: Ticket::default(),
            name: &name,
        },
    );
    let mut s2 = member(2);
    s2.apply_map(&m1, 22, &[], 0);
    let m2 = next(&m1, &[(2, 22, false)]);
    // Without the old owner's list (unreadable) the partition waits for its grace end.
    let ids = [c.get()];
    let lists: &[(ServerId, u64, &[u32])] = if early { &[(sid(1), 11, &ids)] } else { &[] };
    assert!(s2.apply_map(&m2, 22, lists, 1_000));
    let session = s1.session(c.get());
    s2.client_join(Peer::EXEMPT, back(c.get(), PROTO_VERSION, &session), 1_000)
        .unwrap();
    s2.client_persisted(c.get());
    (s2, c, name, token, proof, m2)
}

fn claim_of<'n>(name: &'n [u8], token: u64, proof: GrantProof) -> LockClaim<'n> {
    LockClaim {
        kind: LockKind::Atomic,
        held: Held::Exclusive,
        name,
        old_lock: 0,
        word: 0,
        ticket: Ticket::default(),
        remaining_ms: 60_000,
        age_ms: 10,
        token,
        proof,
        value: None,
    }
}

#[test]
fn a_taken_over_partition_takes_proved_reclaims_and_serves_once_every_old_client_is_done() {
    let (mut s2, c, name, token, proof, m2) = takeover(true);
    let p = partition(&name);
    let epoch = m2.owner(p).unwrap().epoch;
    let d = persisted_client(&mut s2, 1_000);
    assert_eq!(
        s2.get_lock(d.get(), LockKind::Atomic, &name, 1_001),
        Err(Status::NotReady),
        "nothing but re-claims while recovering"
    );
    let forged = GrantProof {
        epoch: 1,
        mac: [7; 16],
    };
    assert_eq!(
        s2.update_lock(c.get(), &claim_of(&name, token, forged), 1_002),
        Err(Status::Einval),
        "a claim without its proof is refused"
    );
    let id = s2
        .update_lock(c.get(), &claim_of(&name, token, proof), 1_003)
        .unwrap();
    s2.reclaim_done(c.get(), p, epoch, 1_004).unwrap();
    assert!(
        !s2.partition_state(p).unwrap().serving,
        "the new owner's wait (the drift margin) is not over"
    );
    s2.tick(1_000 + TIMING.margin_ms());
    assert!(s2.partition_state(p).unwrap().serving, "early end");
    let theirs = s2
        .get_lock(d.get(), LockKind::Atomic, &name, 1_100)
        .unwrap();
    assert_eq!(
        s2.run(d, try_x(theirs, epoch), 1_100).status,
        Status::Fail,
        "the re-claimed grant is held"
    );
    let unlock = at_epoch(
        lock(LockKind::Atomic, LockOp::UnlockExclusive, id, 0),
        epoch,
    );
    assert_eq!(s2.run(c, unlock, 1_101).status, Status::Success);
    let r = s2.run(d, try_x(theirs, epoch), 1_102);
    assert_eq!(r.status, Status::Success);
    assert!(r.aux > token, "tokens grow across the takeover");
    assert_eq!(r.aux, FencingToken::cluster(epoch, 1).0);
}

#[test]
fn a_taken_over_partition_serves_at_its_grace_end_without_reclaims() {
    let (mut s2, _c, name, _token, _proof, _m2) = takeover(false);
    let p = partition(&name);
    let grace = s2.partition_state(p).unwrap().grace_end_ms;
    assert_eq!(
        grace,
        1_000 + TIMING.margin_ms() + TIMING.stretch_ms(u64::from(TIMING.grant_lease_max_ms))
    );
    s2.tick(grace - 1);
    assert!(!s2.partition_state(p).unwrap().serving);
    s2.tick(grace);
    assert!(s2.partition_state(p).unwrap().serving);
}

#[test]
fn a_lost_partition_answers_moved_and_frees_its_slots_once_its_grants_are_over() {
    let m1 = first_map();
    let mut s = member(1);
    s.apply_map(&m1, 11, &[], 0);
    let c = persisted_client(&mut s, 0);
    let id = s
        .get_lock(c.get(), LockKind::Atomic, &name_owned_by(&m1, 1, 0), 0)
        .unwrap();
    assert_eq!(s.run(c, try_x(id, 1), 1).status, Status::Success);
    // Server 1 drains: its partitions move to server 2.
    let m2 = next(&m1, &[(1, 11, true), (2, 22, false)]);
    s.apply_map(&m2, 11, &[], 10);
    let r = s.run(c, try_x(id, 1), 11);
    assert_eq!((r.status, r.aux), (Status::PartitionMoved, m2.version()));
    assert_eq!(
        s.usage().locks,
        1,
        "kept while its grant may be believed in"
    );
    s.tick(10 + TIMING.stretch_ms(u64::from(TIMING.grant_lease_max_ms)));
    assert_eq!(s.usage().locks, 0, "freed");
}

#[test]
fn any_server_sends_its_map_in_chunks_and_a_standalone_one_refuses() {
    let m1 = first_map();
    let mut s = member(1);
    s.apply_map(&m1, 11, &[], 0);
    let ask = |s: &mut TestServer, offset| {
        let frame = ControlRequestFrame {
            header: ControlHeader {
                version: PROTO_VERSION,
                msg: MsgType::GetMap,
                message_id: 1,
                word: 0,
            },
            body: ControlRequest::GetMap { offset },
        };
        let mut req = [0u8; 64];
        let n = encode_control_request(&frame, &mut req).unwrap();
        let mut out = vec![0u8; CONTROL_FRAME_MAX];
        let m = s.handle_control(&req[..n], &mut out, 1).unwrap();
        out.truncate(m);
        out
    };
    let reply = ask(&mut s, 0);
    let frame = decode_control_response(&reply).unwrap();
    let ControlResponse::MapChunk(chunk) = frame.body else {
        panic!("{frame:?}")
    };
    assert_eq!(chunk.next_offset(), None, "a small map is one chunk");
    let mut got = Box::new(Map::new(Partitions::new(1).unwrap()));
    Map::decode(chunk.chunk, &mut got).unwrap();
    assert_eq!(*got, *m1);
    let mut standalone = TestServer::new(&small());
    let reply = ask(&mut standalone, 0);
    assert_eq!(
        decode_control_response(&reply).unwrap().header.status(),
        Some(Status::Einval)
    );
}

#[test]
fn a_join_takes_the_clusters_session_and_refuses_another_for_the_same_id() {
    let m1 = first_map();
    let (mut s1, mut s2) = (member(1), member(2));
    s1.apply_map(&m1, 11, &[], 0);
    s2.apply_map(&m1, 22, &[], 0);
    let c = s1.client_init(PROTO_VERSION, 0, 0).unwrap();
    assert_eq!(c.get() >> 23, 1, "the minting server's id in the top bits");
    let session = s1.session(c.get());
    let join = |s: &mut TestServer, session: &Session| {
        s.client_join(Peer::EXEMPT, back(c.get(), PROTO_VERSION, session), 0)
    };
    assert_eq!(join(&mut s2, &Session::NONE), Err(Status::Einval));
    assert_eq!(join(&mut s2, &session), Ok(c));
    assert_eq!(s2.session(c.get()), session, "one session cluster-wide");
    assert_eq!(join(&mut s2, &session), Ok(c), "a repeated join resumes");
    let other = Session::minted(
        &SessionKey::new(crate::ids::tests::GOOD_KEY).unwrap(),
        test_mac,
        c.get(),
        [9; 8],
    );
    assert_eq!(join(&mut s2, &other), Err(Status::ServerNoResource));
}

#[test]
fn a_partition_taken_again_under_a_new_registration_revives_no_grant_of_the_old_one() {
    let m1 = first_map();
    let mut s = member(1);
    s.apply_map(&m1, 11, &[], 0);
    let c = persisted_client(&mut s, 0);
    let name = name_owned_by(&m1, 1, 0);
    let id = s.get_lock(c.get(), LockKind::Atomic, &name, 0).unwrap();
    assert_eq!(s.run(c, try_x(id, 1), 1).status, Status::Success);
    // Server 1 lost its lease and registered again (incarnation 12): a new member, whose
    // partitions the coordinator hands over at raised epochs, here back to it.
    let m2 = next(&m1, &[(1, 12, false), (2, 22, false)]);
    let p = partition(&name);
    assert_eq!(m2.owner(p).unwrap().server, Some(sid(1)));
    assert!(m2.owner(p).unwrap().epoch > 1);
    s.apply_map(&m2, 12, &[], 10);
    assert_eq!(s.usage().locks, 0, "the old ownership's slots are gone");
    assert!(
        !s.partition_state(p).unwrap().serving,
        "it recovers like any takeover"
    );
}

#[test]
fn a_renewal_keeps_the_partition_serving_at_the_new_epoch_with_larger_tokens() {
    let m1 = first_map();
    let mut s = member(1);
    s.apply_map(&m1, 11, &[], 0);
    let c = persisted_client(&mut s, 0);
    let name = name_owned_by(&m1, 1, 0);
    let p = partition(&name);
    let id = s.get_lock(c.get(), LockKind::Rw, &name, 0).unwrap();
    let shared = |epoch| at_epoch(lock(LockKind::Rw, LockOp::TryShared, id, 0), epoch);
    let first = s.run(c, shared(1), 1);
    assert_eq!(first.aux, FencingToken::cluster(1, 1).0);
    let members: Vec<Member<'_>> = [(1, 11), (2, 22)]
        .iter()
        .map(|&(n, inc)| Member {
            id: sid(n),
            incarnation: inc,
            address: b"127.0.0.1:1",
            draining: false,
        })
        .collect();
    let mut m2 = Box::new(Map::new(m1.partitions()));
    assign(&m1, &members, &[(sid(1), p)], &mut m2).unwrap();
    assert_eq!(m2.owner(p).unwrap().epoch, 2);
    s.apply_map(&m2, 11, &[], 10);
    assert!(
        s.partition_state(p).unwrap().serving,
        "no recovery for a renewal"
    );
    let r = s.run(c, shared(1), 11);
    assert_eq!((r.status, r.aux), (Status::PartitionMoved, m2.version()));
    let unlock = at_epoch(lock(LockKind::Rw, LockOp::UnlockShared, id, 0), 2);
    assert_eq!(
        s.run(c, unlock, 12).status,
        Status::Success,
        "the grant lives on"
    );
    let again = s.run(c, shared(2), 13);
    assert_eq!(again.aux, FencingToken::cluster(2, 1).0);
    assert!(again.aux > first.aux);
}

#[test]
fn a_parked_request_is_answered_partition_moved_when_its_partition_moves() {
    let m1 = first_map();
    let mut s = member(1);
    s.apply_map(&m1, 11, &[], 0);
    let (c, d) = (persisted_client(&mut s, 0), persisted_client(&mut s, 0));
    let name = name_owned_by(&m1, 1, 0);
    let held = s.get_lock(c.get(), LockKind::Atomic, &name, 0).unwrap();
    let wanted = s.get_lock(d.get(), LockKind::Atomic, &name, 0).unwrap();
    assert_eq!(s.run(c, try_x(held, 1), 1).status, Status::Success);
    let wait = at_epoch(
        waiting(
            LockKind::Atomic,
            LockOp::TryExclusive,
            wanted,
            60_000,
            10_000,
        ),
        1,
    );
    assert_eq!(s.wait_for(d, wait, 2), None, "parked");
    let m2 = next(&m1, &[(1, 11, true), (2, 22, false)]);
    s.apply_map(&m2, 11, &[], 3);
    let replies = s.replies();
    assert_eq!(replies.len(), 1);
    assert_eq!(
        (replies[0].result.status, replies[0].result.aux),
        (Status::PartitionMoved, m2.version())
    );
}

#[test]
fn the_cluster_counters_count_moved_and_fenced_answers_and_owned_and_recovering_partitions() {
    let (mut s2, _c, name, _token, _proof, m2) = takeover(false);
    let owned = m2.owned_by(sid(2)).count() as u64;
    let stats = s2.stats();
    assert_eq!(stats.0[Counter::PartitionsOwned as usize], owned);
    s2.tick(1_001);
    let recovering = s2.stats().0[Counter::PartitionsRecovering as usize];
    assert!(
        recovering > 0 && recovering <= owned,
        "{recovering} of {owned}"
    );
    s2.tick(10_000);
    assert_eq!(s2.stats().0[Counter::PartitionsRecovering as usize], 0);
    let c = persisted_client(&mut s2, 10_000);
    let id = s2
        .get_lock(c.get(), LockKind::Atomic, &name, 10_000)
        .unwrap();
    let epoch = m2.owner(partition(&name)).unwrap().epoch;
    assert_eq!(
        s2.run(c, try_x(id, epoch - 1), 10_001).status,
        Status::PartitionMoved
    );
    s2.set_authority_until(Some(10_002));
    assert_eq!(
        s2.run(c, try_x(id, epoch), 10_002).status,
        Status::PartitionMoved
    );
    let stats = s2.stats();
    assert_eq!(stats.0[Counter::PartitionMoved as usize], 2);
    assert_eq!(stats.0[Counter::Fenced as usize], 1);
}

#[test]
fn recovery_ends_early_only_when_every_client_of_the_old_owner_is_done() {
    let m1 = first_map();
    let mut s2 = member(2);
    s2.apply_map(&m1, 22, &[], 0);
    let m2 = next(&m1, &[(2, 22, false)]);
    let key = SessionKey::new(crate::ids::tests::GOOD_KEY).unwrap();
    let (a, b, stranger) = (1 << 23 | 5, 1 << 23 | 6, 1 << 23 | 7);
    let old: &[u32] = &[a, b];
    s2.apply_map(&m2, 22, &[(sid(1), 11, old)], 1_000);
    for id in [a, b, stranger] {
        let session = Session::minted(&key, test_mac, id, [id as u8; 8]);
        s2.client_join(Peer::EXEMPT, back(id, PROTO_VERSION, &session), 1_000)
            .unwrap();
        s2.client_persisted(id);
    }
    let p = m2
        .owned_by(sid(2))
        .find(|&p| m1.owner(p).unwrap().server == Some(sid(1)))
        .unwrap();
    let epoch = m2.owner(p).unwrap().epoch;
    let after_wait = 1_000 + TIMING.margin_ms();
    s2.reclaim_done(a, p, epoch, after_wait).unwrap();
    s2.reclaim_done(stranger, p, epoch, after_wait).unwrap();
    s2.reclaim_done(a, p, epoch, after_wait).unwrap();
    s2.tick(after_wait);
    assert!(
        !s2.partition_state(p).unwrap().serving,
        "one of two done; a stranger and a repeat do not count"
    );
    assert_eq!(
        s2.reclaim_done(b, p, epoch + 1, after_wait),
        Err(Status::PartitionMoved),
        "a done for another epoch is not this takeover's"
    );
    s2.reclaim_done(b, p, epoch, after_wait).unwrap();
    assert!(s2.partition_state(p).unwrap().serving);
}

#[path = "cluster_counters.rs"]
mod counters;

#[path = "cluster_dones.rs"]
mod dones;
