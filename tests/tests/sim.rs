//! The model-client simulator (`dlock_tests::sim::model`): the server state machine and up to
//! 1,000 model clients over the shared simulated network. Every failure prints its seed and
//! step; replay one with `DLOCK_SIM_SEED=<seed> cargo test --release -p dlock-tests --test sim
//! replay -- --nocapture`. `DLOCK_SIM_OPS=1e8` runs a campaign over fresh seeds instead of the
//! normal run, and `DLOCK_SIM_MUTATION=<name>` runs either against a bug put back.

use std::time::Instant;

use dlock_tests::sim::{self, Failure, Mutation, Report, model};

/// Seeds that find a bug put back, with the operations each runs: every one fails with its
/// mutation on and passes with it off, which [`every_regression_seed_finds_its_bug_and_only_with_it`]
/// checks. A seed proves only what it finds today; when the simulator changes under it, the
/// test says so and a campaign (`DLOCK_SIM_MUTATION`) finds a new one.
///
/// The seeds the simulator recorded before its bugs could be put back (harness mistakes and
/// server or client bugs, fixed since; the README's "Simulation" section lists what each
/// found) proved nothing once the simulator changed under them, and are gone.
///
/// | mutation | what the seed sees |
/// |---|---|
/// | `MergeClaimOwner` | a second exclusive claim of an RW lock accepted while the first stands (the oracle's claim rule) |
/// | `ClientLeaseLapse` | a client that lapsed re-claims a shared grant and believes it under a token older than the writer's who held the lock since (the fencing rule) |
/// | `FairClaimServing` | a fair lock whose readers were re-claimed out of order, its `ns` past `ms` (`check_invariants`) |
/// | `FairClaimExpired` | an expired fair grant restored and extended, believed under a token older than its successor's (the fencing rule) |
/// | `LapseWakesWaiters` | a parked request retried into the lapse of an ignored revoke, answered twice (`check_invariants`: the waiter counts) |
/// | `DowngradeStaysExclusive` | a cached writer downgraded on a shared revoke still believes it holds the lock exclusively beside the reader the server let in (mutual exclusion) |
/// | `OverflowDropped` | an event message lost for want of room is read as an overflow, which the client drops: it goes on using a cached grant whose revoke was lost, beside the holder the server gave the lock to at the revoke's lapse (mutual exclusion) |
const REGRESSIONS: &[(Mutation, u64, u64)] = &[
    (Mutation::MergeClaimOwner, 0xc105_8374_c84e_31d6, 96_000),
    (Mutation::ClientLeaseLapse, 0xdbde_dc41_db3e_31d7, 73_000),
    (Mutation::FairClaimServing, 0xc106_e16c_8324_31e8, 21_000),
    (Mutation::FairClaimExpired, 0xdc0b_b31f_6e66_31d8, 71_000),
    (Mutation::LapseWakesWaiters, 0xd10c_0001_0000, 8_000),
    (
        Mutation::DowngradeStaysExclusive,
        0x0294_d9e1_85b4_31d8,
        8_000,
    ),
];

/// Operations per seed in the normal run; short runs over many seeds find more than long runs
/// over few, since every seed draws a new shape and fault mix.
const OPS_PER_SEED: u64 = 20_000;
/// Seeds per normal run (two tests run half each, on the harness's two threads).
const SEEDS: u64 = 80;
/// Operations per seed in a campaign.
const CAMPAIGN_OPS_PER_SEED: u64 = 100_000;

fn run_all(seeds: impl Iterator<Item = u64>, ops: u64) -> Result<Report, Failure> {
    let start = Instant::now();
    let mut total = Report::default();
    let mut n = 0;
    for s in seeds {
        total.add(&model::run(s, ops)?);
        n += 1;
    }
    eprintln!(
        "{n} seeds: {} ops, {} steps, {} oracle checks in {:.1?}; faults {:?}",
        total.ops,
        total.steps,
        total.checks,
        start.elapsed(),
        total.faults
    );
    Ok(total)
}

/// The seeds of the normal run: fixed, so CI is reproducible; a campaign draws fresh ones.
fn seed(i: u64) -> u64 {
    0xD10C_0000_0000 + i
}

#[test]
fn replay() {
    if let Some(s) = sim::seed_from_env() {
        let ops = sim::ops_from_env().unwrap_or(OPS_PER_SEED);
        match sim::mutated(sim::mutation_from_env(), || model::run(s, ops)) {
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
    let result = sim::mutated(sim::mutation_from_env(), || match sim::ops_from_env() {
        Some(total) => sim::campaign(total / 2, half, |s| {
            model::run(s, CAMPAIGN_OPS_PER_SEED).map(|r| r.ops)
        }),
        None => run_all((0..SEEDS).filter(|i| i % 2 == half).map(seed), OPS_PER_SEED).map(drop),
    });
    if let Err(f) = result {
        panic!("{f}");
    }
}

#[test]
fn mutual_exclusion_tokens_and_objects_hold_under_faults_even_seeds() {
    normal_or_campaign(0);
}

#[test]
fn mutual_exclusion_tokens_and_objects_hold_under_faults_odd_seeds() {
    normal_or_campaign(1);
}

/// Every recorded seed proves itself: with its bug put back it fails, without it passes.
#[test]
fn every_regression_seed_finds_its_bug_and_only_with_it() {
    for &(m, s, ops) in REGRESSIONS {
        let found = dlock_core::mutation::with(m, || model::run(s, ops));
        let f = found.expect_err(&format!("seed {s:#x} finds {m} put back"));
        eprintln!("{m}: {f}");
        if let Err(f) = model::run(s, ops) {
            panic!("seed {s:#x} fails without {m}: {f}");
        }
    }
}

/// The belief check is not vacuous: clients that count a grant's lease from the reply (as the
/// transport client did) believe they hold a lock the server already gave to someone else, by
/// the reply's delay, and the simulator says so within a few seeds.
#[test]
fn leases_counted_from_the_reply_let_two_clients_believe_they_hold_a_lock() {
    let caught =
        (0x64..0x74).find_map(|s| model::run_counting_leases_from_reply(s, OPS_PER_SEED).err());
    let f = caught.expect("a delayed reply stretches a lease past the server's expiry");
    assert!(f.message.contains("believes it holds it"), "{f}");
}
