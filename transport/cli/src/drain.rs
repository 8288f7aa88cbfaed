//! `dlock drain --connect ADDR`: asks a cluster server to give every partition it owns away
//! (the `Drain` control request; the server's membership asks the coordinator), then waits
//! until the server's applied map gives it none (its `partitions_owned` counter is 0) and says
//! so: the server can then be stopped (SIGTERM) without a pause for any client.
//!
//! The server answers a drain only to a peer it trusts with its administration: over TLS with
//! a client certificate, or plaintext from its own host (loopback); `Einval` otherwise, and on
//! a standalone server (`proto::cluster`). `kill -USR1 <pid>` on the server's host does the
//! same.

use std::time::{Duration, Instant};

use dlock_core::Status;
use dlock_core::proto::{
    CONTROL_FRAME_MAX, CONTROL_HEADER_LEN, ControlHeader, ControlRequest, ControlRequestFrame,
    MsgType, PROTO_VERSION, decode_control_response, encode_control_request,
};
use dlock_transport::client::link::Link;
use dlock_transport::client::{Endpoint, read_server_stats};

/// How long one request may take.
const TIMEOUT: Duration = Duration::from_secs(5);
/// How often the server's counters are read while it drains.
const POLL: Duration = Duration::from_millis(200);

/// Sends the drain to the server at `endpoint`.
pub(crate) fn ask(endpoint: &Endpoint) -> Result<(), String> {
    let mut link = Link::connect(endpoint).map_err(|e| e.to_string())?;
    let frame = ControlRequestFrame {
        header: ControlHeader {
            version: PROTO_VERSION,
            msg: MsgType::Drain,
            message_id: 1,
            word: 0,
        },
        body: ControlRequest::Drain,
    };
    let mut req = [0u8; CONTROL_HEADER_LEN];
    let n = encode_control_request(&frame, &mut req).map_err(|e| format!("{e:?}"))?;
    let mut reply = vec![0u8; CONTROL_FRAME_MAX];
    let m = link
        .control(&req[..n], &mut reply, Some(Instant::now() + TIMEOUT))
        .map_err(|e| e.to_string())?;
    let f = decode_control_response(&reply[..m]).map_err(|e| format!("{e:?}"))?;
    match f.header.status() {
        Some(Status::Success) => Ok(()),
        Some(Status::Einval) => Err("the server refused to drain: it is standalone, or this \
             connection is neither TLS with a client certificate nor from the server's own host"
            .into()),
        s => Err(format!("the server answered {s:?}")),
    }
}

/// The server's partitions owned now, as its `Stats` says.
fn owned(endpoint: &Endpoint) -> Result<u64, String> {
    let stats = read_server_stats(endpoint, TIMEOUT).map_err(|e| e.to_string())?;
    stats
        .iter()
        .find(|(k, _)| *k == "partitions_owned")
        .map(|(_, v)| *v)
        .ok_or_else(|| "the server reports no partitions_owned counter".into())
}

/// Asks the server at `endpoint` to drain and waits, at most `wait`, until it owns nothing;
/// `report` is told the count as it falls.
pub(crate) fn drain(
    endpoint: &Endpoint,
    wait: Duration,
    report: &mut dyn FnMut(u64),
) -> Result<(), String> {
    ask(endpoint)?;
    let deadline = Instant::now() + wait;
    let mut last = None;
    loop {
        let n = owned(endpoint)?;
        if last != Some(n) {
            report(n);
            last = Some(n);
        }
        if n == 0 {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "the server still owns {n} partitions after {wait:?}: is the coordinator \
                 reachable (dlock cluster status)? The drain stands; run this again to wait more"
            ));
        }
        std::thread::sleep(POLL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::tests::start;
    use dlock_core::cluster::{Map, Member, Partitions, ServerId, assign};
    use dlock_transport::runtime::membership::StaticCluster;

    fn member(id: u32, draining: bool) -> Member<'static> {
        Member {
            id: ServerId::new(id).unwrap(),
            incarnation: 7,
            address: b"127.0.0.1:1",
            draining,
        }
    }

    /// The coordinator's part: the map after `prev` with server 1 draining or not.
    fn next(prev: &Map, draining: bool) -> Map {
        let mut out = Map::new(prev.partitions());
        assign(
            prev,
            &[member(1, draining), member(2, false)],
            &[],
            &mut out,
        )
        .unwrap();
        out
    }

    #[test]
    fn a_drained_server_is_waited_for_until_it_owns_nothing() {
        let cluster = StaticCluster::new();
        let map = next(&Map::new(Partitions::new(32).unwrap()), false);
        cluster.set_map(map.clone());
        let server = start(Some(&cluster));
        let endpoint = Endpoint::Tcp(server.tcp_addr().unwrap());
        // The server applies its first map on its own time: drain it once it owns its share.
        let started = Instant::now();
        while owned(&endpoint) != Ok(16) {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "no map applied"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        let seen = std::thread::scope(|s| {
            let waiter = s.spawn(|| {
                let mut seen = Vec::new();
                drain(&endpoint, Duration::from_secs(60), &mut |n| seen.push(n)).map(|()| seen)
            });
            // The coordinator moves the partitions once the membership was asked to drain.
            let asked = Instant::now();
            while cluster.drained().is_empty() {
                assert!(
                    asked.elapsed() < Duration::from_secs(30),
                    "no drain reached it"
                );
                std::thread::sleep(Duration::from_millis(5));
            }
            cluster.set_map(next(&map, true));
            waiter.join().unwrap()
        })
        .unwrap();
        assert_eq!(cluster.drained(), [ServerId::new(1).unwrap()]);
        assert_eq!(seen.last(), Some(&0), "{seen:?}");
        assert!(seen[0] > 0, "it owned partitions when asked: {seen:?}");
    }

    #[test]
    fn a_standalone_server_refuses_to_drain() {
        let server = start(None);
        let err = ask(&Endpoint::Tcp(server.tcp_addr().unwrap())).unwrap_err();
        assert!(err.contains("refused to drain"), "{err}");
    }
}
