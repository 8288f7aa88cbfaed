//! Protocol 6's `ReclaimDones`: every partition a client re-claimed at a server in one
//! message, each counted and answered as its own `ReclaimDone` would be.

use super::*;
use crate::proto::{PartitionEpoch, PartitionStatus, RECLAIM_DONES_MAX};

/// Sends client `client`'s `ReclaimDones` of `dones` to `s` as bytes, at `now`; the reply's
/// status and its per-partition statuses.
fn say_dones(
    s: &mut TestServer,
    client: u32,
    dones: &[PartitionEpoch],
    now: u64,
) -> (Option<Status>, Vec<PartitionStatus>) {
    say_dones_in(s, PROTO_VERSION, client, dones, now)
}

/// [`say_dones`] in a frame of protocol `version`.
fn say_dones_in(
    s: &mut TestServer,
    version: u8,
    client: u32,
    dones: &[PartitionEpoch],
    now: u64,
) -> (Option<Status>, Vec<PartitionStatus>) {
    let frame = ControlRequestFrame {
        header: ControlHeader {
            version,
            msg: MsgType::ReclaimDones,
            message_id: 9,
            word: client,
        },
        body: ControlRequest::ReclaimDones(crate::proto::Batch::from_slice(dones)),
    };
    let mut req = vec![0u8; CONTROL_FRAME_MAX];
    let n = encode_control_request(&frame, &mut req).unwrap();
    let mut out = vec![0u8; CONTROL_FRAME_MAX];
    let m = s.handle_control(&req[..n], &mut out, now).unwrap();
    let reply = decode_control_response(&out[..m]).unwrap();
    let statuses = match reply.body {
        ControlResponse::PartitionStatuses(s) => s.iter().collect(),
        _ => Vec::new(),
    };
    (reply.header.status(), statuses)
}

#[test]
fn one_reclaim_dones_ends_the_recovery_of_every_partition_it_names() {
    let m1 = first_map();
    let mut s2 = member(2);
    s2.apply_map(&m1, 22, &[], 0);
    let m2 = next(&m1, &[(2, 22, false)]);
    let key = SessionKey::new(crate::ids::tests::GOOD_KEY).unwrap();
    let a = 1 << 23 | 5;
    s2.apply_map(&m2, 22, &[(sid(1), 11, &[a])], 1_000);
    let session = Session::minted(&key, test_mac, a, [5; 8]);
    s2.client_join(Peer::EXEMPT, back(a, PROTO_VERSION, &session), 1_000)
        .unwrap();
    s2.client_persisted(a);
    let taken: Vec<u16> = m2
        .owned_by(sid(2))
        .filter(|&p| m1.owner(p).unwrap().server == Some(sid(1)))
        .collect();
    assert!(taken.len() >= 2, "server 2 took several partitions");
    let mut dones: Vec<PartitionEpoch> = taken
        .iter()
        .map(|&p| PartitionEpoch {
            partition: p,
            epoch: m2.owner(p).unwrap().epoch,
        })
        .collect();
    // One more, for a takeover that is not this one: refused alone.
    let stale = PartitionEpoch {
        epoch: dones[0].epoch + 1,
        ..dones[0]
    };
    dones.push(stale);
    let after_wait = 1_000 + TIMING.margin_ms();

    let stranger = 1 << 23 | 9;
    let (status, statuses) = say_dones(&mut s2, stranger, &dones, after_wait);
    assert_eq!(
        status,
        Some(Status::ClientNotInit),
        "a stranger is refused whole"
    );
    assert!(statuses.is_empty());
    assert!(
        taken
            .iter()
            .all(|&p| !s2.partition_state(p).unwrap().serving)
    );

    // In a frame of version 5, which has no such message: refused whole, nothing counted.
    let (status, statuses) = say_dones_in(&mut s2, 5, a, &dones, after_wait);
    assert_eq!(status, Some(Status::ProtoVersionNegotiationFail));
    assert!(statuses.is_empty());
    assert!(
        taken
            .iter()
            .all(|&p| !s2.partition_state(p).unwrap().serving)
    );

    let (status, statuses) = say_dones(&mut s2, a, &dones, after_wait);
    assert_eq!(status, Some(Status::Success));
    let expected: Vec<PartitionStatus> = dones
        .iter()
        .map(|d| PartitionStatus {
            partition: d.partition,
            status: if *d == stale {
                Status::PartitionMoved
            } else {
                Status::Success
            },
        })
        .collect();
    assert_eq!(statuses, expected, "a status per partition, in order");
    assert!(
        taken
            .iter()
            .all(|&p| s2.partition_state(p).unwrap().serving),
        "the only old client said it is done everywhere at once"
    );
}

#[test]
fn a_standalone_server_refuses_reclaim_dones_whole() {
    let mut s = TestServer::new(&small());
    let c = s.client_init(PROTO_VERSION, 0, 1).unwrap();
    let dones = [PartitionEpoch {
        partition: 0,
        epoch: 1,
    }; RECLAIM_DONES_MAX];
    assert_eq!(
        say_dones(&mut s, c.get(), &dones, 2).0,
        Some(Status::Einval)
    );
}

/// What an operator watches a recovery by: the clients each recovering partition still awaits
/// (`reclaim_awaited` summed, `reclaim_awaited_max` the most in one), the partitions that
/// await their grace end whatever is said (`reclaim_untracked`: no list, or one past the
/// table), and the `ReclaimDone(s)` messages taken.
#[test]
fn the_awaited_clients_of_recovering_partitions_are_counted() {
    let m1 = first_map();
    let m2 = next(&m1, &[(2, 22, false)]);
    let taken: Vec<u16> = m2
        .owned_by(sid(2))
        .filter(|&p| m1.owner(p).unwrap().server == Some(sid(1)))
        .collect();
    let n = taken.len() as u64;
    let key = SessionKey::new(crate::ids::tests::GOOD_KEY).unwrap();
    let (a, b) = (1 << 23 | 5, 1 << 23 | 6);
    let gauges = |s: &TestServer| {
        let st = s.stats();
        [
            st.get(Counter::ReclaimAwaited),
            st.get(Counter::ReclaimAwaitedMax),
            st.get(Counter::ReclaimUntracked),
            st.get(Counter::ReclaimDoneMessages),
        ]
    };

    let mut s2 = member(2);
    s2.apply_map(&m1, 22, &[], 0);
    s2.apply_map(&m2, 22, &[(sid(1), 11, &[a, b])], 1_000);
    assert_eq!(
        gauges(&s2),
        [2 * n, 2, 0, 0],
        "two clients awaited everywhere"
    );
    let session = Session::minted(&key, test_mac, a, [5; 8]);
    s2.client_join(Peer::EXEMPT, back(a, PROTO_VERSION, &session), 1_000)
        .unwrap();
    s2.client_persisted(a);
    let dones: Vec<PartitionEpoch> = taken
        .iter()
        .map(|&p| PartitionEpoch {
            partition: p,
            epoch: m2.owner(p).unwrap().epoch,
        })
        .collect();
    let after_wait = 1_000 + TIMING.margin_ms();
    assert_eq!(
        say_dones(&mut s2, a, &dones, after_wait).0,
        Some(Status::Success)
    );
    assert_eq!(gauges(&s2), [n, 1, 0, 1], "one client left in each");

    // Without the old owner's list, every partition waits for its grace end.
    let mut s3 = member(2);
    s3.apply_map(&m1, 22, &[], 0);
    s3.apply_map(&m2, 22, &[], 1_000);
    assert_eq!(gauges(&s3), [0, 0, n, 0]);
    s3.tick(
        1_000 + TIMING.stretch_ms(u64::from(TIMING.grant_lease_max_ms)) + 2 * TIMING.margin_ms(),
    );
    assert_eq!(s3.stats().get(Counter::PartitionsRecovering), 0);
    assert_eq!(
        gauges(&s3),
        [0, 0, 0, 0],
        "nothing recovers, nothing awaited"
    );

    // An old owner with more clients than this server has slots: the same, and said so.
    let slots = small().clients_max;
    let many: Vec<u32> = (0..=slots).map(|i| 1 << 23 | i).collect();
    let mut s4 = member(2);
    s4.apply_map(&m1, 22, &[], 0);
    s4.apply_map(&m2, 22, &[(sid(1), 11, &many)], 1_000);
    assert_eq!(gauges(&s4), [0, 0, n, 0], "past {slots} ids");
}

/// The table of awaited clients is sized by the server's own client table: an old owner with
/// as many clients as that (here more than the 1,024 a fixed table once held) is tracked
/// whole, and its partitions may serve before their grace end; one more is not.
#[test]
fn the_awaited_clients_table_follows_the_configured_client_table() {
    let cfg = Config {
        clients_max: 1_500,
        ..small()
    };
    let m1 = first_map();
    let m2 = next(&m1, &[(2, 22, false)]);
    let n = m2
        .owned_by(sid(2))
        .filter(|&p| m1.owner(p).unwrap().server == Some(sid(1)))
        .count() as u64;
    let gauges = |s: &TestServer| {
        let st = s.stats();
        [
            st.get(Counter::ReclaimAwaited),
            st.get(Counter::ReclaimAwaitedMax),
            st.get(Counter::ReclaimUntracked),
        ]
    };
    let ids = |count: u32| -> Vec<u32> { (0..count).map(|i| 1 << 23 | i).collect() };

    let full = ids(cfg.clients_max);
    let mut s = member_of(2, &cfg);
    s.apply_map(&m1, 22, &[], 0);
    s.apply_map(&m2, 22, &[(sid(1), 11, &full)], 1_000);
    let k = u64::from(cfg.clients_max);
    assert_eq!(gauges(&s), [k * n, k, 0], "{k} clients tracked");

    let past = ids(cfg.clients_max + 1);
    let mut s = member_of(2, &cfg);
    s.apply_map(&m1, 22, &[], 0);
    s.apply_map(&m2, 22, &[(sid(1), 11, &past)], 1_000);
    assert_eq!(gauges(&s), [0, 0, n], "one past the client table");
}
