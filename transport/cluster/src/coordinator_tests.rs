//! The coordinator's compare-and-swap against a real etcd: a write that lost a race, or whose
//! writer lost the election, changes nothing, and the next round builds on what won.

#[path = "../tests/common/mod.rs"]
mod common;

use super::*;
use crate::keys::MemberState;
use etcd_client::PutOptions;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Registers member `id` under `lease` by hand (no agent, so no coordinator runs).
async fn put_member(client: &Client, cfg: &AgentConfig, id: u32, lease: i64) {
    let rec = MemberRecord {
        state: MemberState::Serving,
        address: format!("10.0.0.{id}:1"),
        renewals: vec![],
    };
    let key = Keys::new(&cfg.cluster).server(ServerId::new(id).unwrap());
    client
        .kv_client()
        .put(key, rec.encode(), Some(PutOptions::new().with_lease(lease)))
        .await
        .unwrap();
}

#[test]
fn a_lost_race_writes_nothing_and_the_next_round_keeps_the_winners_update() {
    let etcd = common::Etcd::start();
    let cfg = etcd.config("race", 1, 12);
    runtime().block_on(async {
        let client = crate::etcd::connect(&cfg).await.unwrap();
        crate::etcd::check_meta(&client, &cfg).await.unwrap();
        let lease = client.clone().lease_grant(30, None).await.unwrap().id();
        let keys = Keys::new(&cfg.cluster);
        let leader = client
            .election_client()
            .campaign(keys.election(), "1", lease)
            .await
            .unwrap()
            .take_leader()
            .unwrap();
        put_member(&client, &cfg, 1, lease).await;
        // This coordinator reads and computes a map for member 1 ...
        let mine = read(&client, &cfg).await.unwrap();
        let stale = next_map(&mine, &cfg).unwrap().unwrap();
        // ... while a member joins and another writer stores a map with both.
        put_member(&client, &cfg, 2, lease).await;
        let theirs = read(&client, &cfg).await.unwrap();
        let winner = next_map(&theirs, &cfg).unwrap().unwrap();
        assert_eq!(
            write(&client, &cfg, &leader, &winner, theirs.map_rev).await,
            Ok(Write::Written)
        );
        // The stale write loses, and changes nothing.
        assert_eq!(
            write(&client, &cfg, &leader, &stale, mine.map_rev).await,
            Ok(Write::LostRace)
        );
        let stored = read(&client, &cfg).await.unwrap();
        assert_eq!(*stored.current, *winner);
        // A writer whose election key is not the leader's writes nothing either.
        let impostor = LeaderKey::new()
            .with_name(keys.election())
            .with_key(format!("{}/nobody", keys.election()))
            .with_rev(leader.rev());
        let again = next_map(&stored, &cfg).unwrap();
        assert!(again.is_none(), "nothing changed since the winner's map");
        assert_eq!(
            write(&client, &cfg, &impostor, &winner, stored.map_rev).await,
            Ok(Write::NotLeader)
        );
        // The next round reads the winner's map and builds on it: member 2 is not lost.
        put_member(&client, &cfg, 3, lease).await;
        assert!(matches!(
            step(&client, &cfg, &leader).await,
            Ok(Step::Written { .. })
        ));
        let last = read(&client, &cfg).await.unwrap();
        assert_eq!(last.current.version(), winner.version() + 1);
        let owners: std::collections::BTreeSet<u32> = last
            .current
            .owners()
            .iter()
            .filter_map(|o| o.server.map(ServerId::get))
            .collect();
        assert_eq!(owners.into_iter().collect::<Vec<_>>(), [1, 2, 3]);
    });
}
