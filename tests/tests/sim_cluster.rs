//! The cluster simulator (`dlock_tests::sim::cluster`): a model of etcd, several cluster
//! servers with their agents, and clients routing by the map, under crashes, servers cut off
//! from etcd, etcd outages, drains and lost or delayed messages. Every failure prints its seed
//! and step; replay one with `DLOCK_SIM_SEED=<seed> cargo test --release -p dlock-tests --test
//! sim_cluster replay -- --nocapture`. `DLOCK_SIM_OPS=1e7` runs a campaign over fresh seeds
//! instead of the normal run.

use std::time::Instant;

use dlock_tests::sim::cluster::{self, Counts};
use dlock_tests::sim::{self, Failure, Report};

/// Operations per seed in the normal run.
const OPS_PER_SEED: u64 = 6_000;
/// Seeds per normal run (two tests run half each, on the harness's two threads).
const SEEDS: u64 = 24;
/// Operations per seed in a campaign.
const CAMPAIGN_OPS_PER_SEED: u64 = 50_000;

fn add(total: &mut Counts, c: &Counts) {
    total.crashes += c.crashes;
    total.cuts += c.cuts;
    total.outages += c.outages;
    total.drains += c.drains;
    total.maps_applied += c.maps_applied;
    total.moved_answers += c.moved_answers;
    total.not_ready += c.not_ready;
    total.reclaim_dones += c.reclaim_dones;
    total.reregistrations += c.reregistrations;
}

fn run_all(seeds: impl Iterator<Item = u64>, ops: u64) -> Result<(Report, Counts), Failure> {
    let start = Instant::now();
    let (mut total, mut counts) = (Report::default(), Counts::default());
    let mut n = 0;
    for s in seeds {
        let (r, c) = cluster::run(s, ops)?;
        total.add(&r);
        add(&mut counts, &c);
        n += 1;
    }
    eprintln!(
        "{n} seeds: {} ops, {} steps, {} oracle checks in {:.1?}; {counts:?}",
        total.ops,
        total.steps,
        total.checks,
        start.elapsed(),
    );
    Ok((total, counts))
}

/// The seeds of the normal run: fixed, so CI is reproducible; a campaign draws fresh ones.
fn seed(i: u64) -> u64 {
    0xC105_7E40_0000 + i
}

#[test]
fn replay() {
    if let Some(s) = sim::seed_from_env() {
        let ops = sim::ops_from_env().unwrap_or(OPS_PER_SEED);
        match cluster::run(s, ops) {
            Ok(r) => eprintln!("{r:#?}"),
            Err(f) => panic!("{f}"),
        }
    }
}

/// The normal run over seeds of one parity, or half a campaign.
fn normal_or_campaign(half: u64) {
    if sim::seed_from_env().is_some() {
        return;
    }
    let result = match sim::ops_from_env() {
        Some(total) => {
            let mut counts = Counts::default();
            let found = sim::campaign(total / 2, half, |s| {
                let (r, c) = cluster::run(s, CAMPAIGN_OPS_PER_SEED)?;
                add(&mut counts, &c);
                Ok(r.ops)
            });
            eprintln!("campaign: {counts:?}");
            found
        }
        None => {
            let seeds = (0..SEEDS).filter(|i| i % 2 == half).map(seed);
            run_all(seeds, OPS_PER_SEED).map(|(_, c)| {
                // The faults the run is for did happen (a run that never failed over proves
                // nothing about failover).
                assert!(c.crashes > 0 && c.cuts > 0 && c.drains > 0, "{c:?}");
                assert!(c.maps_applied > 0 && c.moved_answers > 0, "{c:?}");
            })
        }
    };
    if let Err(f) = result {
        panic!("{f}");
    }
}

#[test]
fn failovers_moves_and_fenced_servers_keep_locks_tokens_and_counters_even_seeds() {
    normal_or_campaign(0);
}

#[test]
fn failovers_moves_and_fenced_servers_keep_locks_tokens_and_counters_odd_seeds() {
    normal_or_campaign(1);
}

/// The oracle sees what it is for: servers that never fence themselves (a cut-off owner goes on
/// granting after its partitions moved) let two clients hold one lock, and some seed of the
/// normal run's shows it.
#[test]
fn servers_that_never_fence_themselves_let_two_clients_hold_a_lock() {
    let found = (0..SEEDS).map(seed).find_map(|s| {
        cluster::run_never_fencing(s, OPS_PER_SEED)
            .err()
            .filter(|f| f.message.contains("two holders") || f.message.contains("token"))
    });
    let f = found.expect("some seed catches an owner that never fences itself");
    eprintln!("{f}");
}
