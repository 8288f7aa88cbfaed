//! The real `dlock_transport::client::Client`, and the native API over it, on the shared
//! simulated network (`dlock_tests::sim::real`). A failure prints its seed and step; `DLOCK_SIM_SEED=<seed>
//! cargo test --release -p dlock-tests --test sim_client replay -- --nocapture` reruns it,
//! `DLOCK_SIM_OPS=2e7` runs a campaign over fresh seeds, and `DLOCK_SIM_MUTATION=<name>` runs
//! either against a bug put back.

use std::time::Instant;

use dlock_tests::sim::{self, Failure, Mutation, Report, real};

/// Actions per seed in the normal run.
const OPS_PER_SEED: u64 = 3_000;
/// Seeds in the normal run.
const SEEDS: u64 = 100;
/// Actions per seed in a campaign.
const CAMPAIGN_OPS_PER_SEED: u64 = 20_000;

/// The seeds of the normal run: fixed, so CI is reproducible.
fn seed(k: u64) -> u64 {
    0xc11e_0000_0000_0000 ^ k.wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

fn run_all(seeds: impl Iterator<Item = u64>, ops: u64) -> Result<Report, Failure> {
    let start = Instant::now();
    let mut total = Report::default();
    let mut n = 0;
    for s in seeds {
        total.add(&real::run(s, ops)?);
        n += 1;
    }
    eprintln!(
        "{n} seeds: {} actions, {} steps, {} oracle checks, {} native guards in {:.1?}; faults {:?}",
        total.ops,
        total.steps,
        total.checks,
        total.guards,
        start.elapsed(),
        total.faults
    );
    Ok(total)
}

/// Many seeds of the real client over the simulated network: the oracle holds after every
/// step. `DLOCK_SIM_OPS` makes it a campaign over fresh seeds instead.
#[test]
fn the_real_client_keeps_mutual_exclusion_over_a_simulated_network() {
    if sim::seed_from_env().is_some() {
        return;
    }
    let mutation = sim::mutation_from_env();
    let result = sim::mutated(mutation, || match sim::ops_from_env() {
        Some(total) => sim::campaign(total, 0, |s| {
            real::run(s, CAMPAIGN_OPS_PER_SEED).map(|r| r.ops)
        }),
        None => run_all((0..SEEDS).map(seed), OPS_PER_SEED).map(|total| {
            // The native processes held guards the oracle checked.
            assert!(total.guards > 0, "no native guard in {total:?}");
        }),
    });
    if let Err(f) = result {
        panic!("{f}");
    }
}

/// Reruns one seed (`DLOCK_SIM_SEED`, hex with 0x or decimal, for `DLOCK_SIM_OPS` actions);
/// without it, a fixed one.
#[test]
fn replay() {
    let s = sim::seed_from_env().unwrap_or(0x5eed);
    let ops = sim::ops_from_env().unwrap_or(OPS_PER_SEED);
    match sim::mutated(sim::mutation_from_env(), || real::run(s, ops)) {
        Ok(report) => eprintln!("{report:#?}"),
        Err(f) => panic!("{f}"),
    }
}

/// The oracle is not blind: when refused exclusive trylocks reach the clients as grants, it
/// finds clients that cannot all hold what they believe within a few seeds.
#[test]
fn the_oracle_catches_clients_told_they_hold_a_lock_they_were_refused() {
    let caught = (0..20u64).find_map(|k| {
        let s = 0xbad0_0000_0000_0000 ^ k.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        real::run_sabotaged(s, OPS_PER_SEED).err()
    });
    let f = caught.expect("a sabotaged run fails the oracle");
    assert!(f.message.contains("believes it holds it"), "{f}");
}

/// Seeds that find a bug put back, with the actions each runs: every one fails with its
/// mutation on and passes with it off (see [`Mutation`]), which
/// [`every_regression_seed_finds_its_bug_and_only_with_it`] checks. When the simulator changes
/// under a seed, the test says so and a campaign (`DLOCK_SIM_MUTATION`) finds a new one. A
/// seed is best drawn with the toggles its bug does not need turned off, so that a drive
/// added later leaves it as it was (the four re-drawn when the downgrades came have
/// `downgrade_ppm`, `value_ppm` and `reconnect_ppm` off; `ReconnectKeepsTrust`'s, re-drawn when
/// cached processes came to downgrade write guards, has `downgrade_ppm` and `value_ppm` off).
///
/// | mutation | what the seed sees |
/// |---|---|
/// | `MergeClaimOwner` | a second exclusive claim of an RW lock accepted while the first stands (the oracle's claim rule) |
/// | `ClientLeaseLapse` | a client that lapsed re-claims a shared grant and believes it under a token older than the writer's who held the lock since (the fencing rule) |
/// | `FairClaimServing` | a fair lock whose readers were re-claimed out of order, its `ns` past `ms` (`check_invariants`) |
/// | `FairClaimExpired` | an expired fair grant restored and extended, believed under a token older than its successor's (the fencing rule) |
/// | `TrustNoBound` | a cached-locks process hands out a guard of its cached grant locally with no data request answered within the revoke timeout (the cached-grant rules) |
/// | `DowngradeStaysExclusive` | a process told its downgrade succeeded still believes it holds the lock exclusively beside the reader the server let in (mutual exclusion) |
/// | `DeadWriterKeepsValue` | an exclusive holder gone without writing the value block, and the next grant reads it valid (the oracle's value-block rule) |
/// | `ReconnectKeepsTrust` | a cached-locks process reconnected and hands out a guard of a grant it held when its connection broke (the cached-grant rules: rule 2 of `manager::trust`) |
/// | `CacheUsesRevoked` | a cached-locks process hands out a local reader of a grant whose exclusive revoke it has read (the cached-grant rules) |
/// | `StreamKeepsParked` | a data connection closed under a parked request while its control connection lived on: the parked reply has no route (`check_routing`) |
/// | `OverflowDropped` | an event message lost for want of room is read as an overflow, which the client drops: it hands out a local reader of a grant the overflow revoked (the cached-grant rules) |
/// | `DowngradeDropsBlock` | a cached write guard that set a value block downgrades, and the server's block (the oracle's model, learned from the downgrade it answered) is the one from before, not the one the guard reads on (the downgrade's block rule of `Sim::cached_downgrade`) |
const REGRESSIONS: &[(Mutation, u64, u64)] = &[
    (Mutation::MergeClaimOwner, 0x5da0_bd22_9c4c_20d2, 3_000),
    (Mutation::ClientLeaseLapse, 0x190b_c3a5_a267_fad4, 3_000),
    (Mutation::FairClaimServing, 0x7db0_7e02_5a11_7c3d, 6_000),
    (Mutation::FairClaimExpired, 0xc5e7_33ec_956e_c178, 11_000),
    (Mutation::TrustNoBound, 0x82d9_f0af_33cb_97a0, 4_000),
    (Mutation::CacheUsesRevoked, 0x01ad_d91a_a0c6_31d8, 1_000),
    (Mutation::OverflowDropped, 0x0388_9142_d6c0_31e4, 2_000),
    (Mutation::StreamKeepsParked, 0x19d4_6508_08f2_31d6, 5_000),
    (
        Mutation::DowngradeStaysExclusive,
        0x9b86_609f_7c74_6c69,
        2_000,
    ),
    (
        Mutation::DeadWriterKeepsValue,
        0x19d7_cbc3_d826_31da,
        11_000,
    ),
    (Mutation::ReconnectKeepsTrust, 0xe6c4_3bce_aba8_a760, 3_000),
    (Mutation::DowngradeDropsBlock, 0xc8fa_b21c_bd59_8fb6, 3_000),
];

#[test]
fn every_regression_seed_finds_its_bug_and_only_with_it() {
    for &(m, s, ops) in REGRESSIONS {
        let found = dlock_core::mutation::with(m, || real::run(s, ops));
        let f = found.expect_err(&format!("seed {s:#x} finds {m} put back"));
        eprintln!("{m}: {f}");
        if let Err(f) = real::run(s, ops) {
            panic!("seed {s:#x} fails without {m}: {f}");
        }
    }
}
