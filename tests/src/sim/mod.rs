//! Deterministic simulation: the real server state machine and many clients over a faulty
//! network, all in one thread and driven by one seed. Two simulators share the framework:
//!
//! | simulator | clients                                                                     | test file          |
//! |-----------|-----------------------------------------------------------------------------|--------------------|
//! | [`model`] | up to 1,000 model clients built on the client's own lock records (`dlock_core::client`), a thief among them under a session key | `tests/sim.rs`      |
//! | [`real`]  | the real `dlock_transport::client::Client` over a simulated `Connection`: its batches, async pair, records, reinit and re-claims; and the native API (`Locks`, typed handles, guards held across steps, blocking and async calls, sets, drops) | `tests/sim_client.rs` |
//!
//! and everything else:
//!
//! | part         | what it is                                                                   |
//! |--------------|------------------------------------------------------------------------------|
//! | [`net`]      | the one network model: links with a control and a data channel, in-order delivery per channel, delays, losses that break a link, duplicated data replies, server crashes that break every link |
//! | [`endpoint`] | the server's end of it: the runtime's rules from `dlock_core::server` (control admission, routing, binding, over the core's `Routing`) around the state machine |
//! | [`oracle`]   | the one oracle: a model of grants, claims, tokens, fair order and objects built from the bytes on the wire, the rules about what clients believe, and `Server::check_invariants` and `check_routing` after every step that reached the server |
//! | [`swarm`]    | each seed's fault mix: which kinds are on, how often, and the compound faults the bugs found so far needed |
//! | [`rng`]      | the one source of randomness                                                 |
//!
//! A run is a pure function of its seed: the workload, every fault and delay, the server's
//! entropy and its clock all come from it. The first violation stops the run with a
//! [`Failure`] naming the seed and the step; `DLOCK_SIM_SEED=<seed>` replays it step for step
//! (`DLOCK_SIM_TRACE=1` prints every lock result), `DLOCK_SIM_OPS=1e9` sizes a campaign, and
//! `DLOCK_SIM_MUTATION=<name>` runs it against a bug put back ([`Mutation`]).

pub mod cluster;
pub mod endpoint;
pub mod model;
pub mod net;
pub mod oracle;
pub mod real;
pub mod rng;
pub mod swarm;

use std::fmt;

pub use dlock_core::mutation::Mutation;
pub use rng::Rng;
pub use swarm::{FaultPlan, Faults};

/// The seed from `DLOCK_SIM_SEED`, if set (decimal or `0x` hex).
pub fn seed_from_env() -> Option<u64> {
    let v = std::env::var("DLOCK_SIM_SEED").ok()?;
    let v = v.trim();
    Some(match v.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).expect("DLOCK_SIM_SEED is a hex number"),
        None => v.parse().expect("DLOCK_SIM_SEED is a number"),
    })
}

/// The total operations a campaign asks for with `DLOCK_SIM_OPS` (`1e9` or `1000000`).
pub fn ops_from_env() -> Option<u64> {
    let v = std::env::var("DLOCK_SIM_OPS").ok()?;
    let n: f64 = v
        .trim()
        .parse()
        .expect("DLOCK_SIM_OPS is a number such as 1e9");
    Some(n as u64)
}

/// The mutation `DLOCK_SIM_MUTATION` names, if set: a campaign against a bug put back.
pub fn mutation_from_env() -> Option<Mutation> {
    let v = std::env::var("DLOCK_SIM_MUTATION").ok()?;
    let names: Vec<&str> = Mutation::ALL.iter().map(|m| m.name()).collect();
    Some(
        Mutation::from_name(v.trim())
            .unwrap_or_else(|| panic!("DLOCK_SIM_MUTATION is one of {names:?}")),
    )
}

/// Runs `f` with mutation `m` switched on for this thread, or as it is when `None`.
pub fn mutated<R>(m: Option<Mutation>, f: impl FnOnce() -> R) -> R {
    match m {
        Some(m) => dlock_core::mutation::with(m, f),
        None => f(),
    }
}

/// A campaign: `total` operations on this thread, over seeds drawn from the clock (`half`, the
/// test's share of the work, keeps the seeds of two tests running side by side apart), each
/// run by `run(seed)`, which says how many operations it did. The first failure ends it, saying
/// how many operations and seeds it took to find; progress is printed every half minute.
pub fn campaign(
    total: u64,
    half: u64,
    mut run: impl FnMut(u64) -> Result<u64, Failure>,
) -> Result<(), Failure> {
    let base = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
        .rotate_left(17)
        & !1
        | half & 1;
    let start = std::time::Instant::now();
    let mut said = start;
    let (mut done, mut i) = (0, 0u64);
    while done < total {
        match run(base.wrapping_add(2 * i)) {
            Ok(ops) => done += ops,
            Err(f) => {
                eprintln!(
                    "campaign: found after {} operations ({} seeds) in {:.1?}",
                    done + f.ops,
                    i + 1,
                    start.elapsed()
                );
                return Err(f);
            }
        }
        i += 1;
        if said.elapsed().as_secs() >= 30 {
            said = std::time::Instant::now();
            eprintln!(
                "campaign: {done} operations, {i} seeds, {:.1?}",
                start.elapsed()
            );
        }
    }
    eprintln!(
        "campaign: {done} operations over {i} seeds in {:.1?}",
        start.elapsed()
    );
    Ok(())
}

/// What a finished run did.
#[derive(Clone, Copy, Debug, Default)]
pub struct Report {
    pub seed: u64,
    /// Client operations issued (each command of a batch counts).
    pub ops: u64,
    /// Events processed.
    pub steps: u64,
    /// Oracle comparisons made (the server's answers, the clients' beliefs, the tables).
    pub checks: u64,
    pub clients: usize,
    pub faults: Faults,
    /// Guards (and sets of them) the native API's processes took (the real-client simulator).
    pub guards: u64,
}

impl Report {
    /// Adds `o`'s counts to these.
    pub fn add(&mut self, o: &Report) {
        self.ops += o.ops;
        self.steps += o.steps;
        self.checks += o.checks;
        self.faults.add(&o.faults);
        self.guards += o.guards;
    }
}

/// A violated property, with what it takes to replay it.
#[derive(Clone, Debug)]
pub struct Failure {
    /// The simulator's test file (`sim` or `sim_client`).
    pub sim: &'static str,
    pub seed: u64,
    pub step: u64,
    /// Operations issued before it (how long a campaign took to find it).
    pub ops: u64,
    pub tick: u64,
    pub message: String,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "simulation seed {:#x} failed at step {} after {} operations (server tick {}): {}\n\
             replay: DLOCK_SIM_SEED={:#x} cargo test --release -p dlock-tests --test {} replay -- --nocapture",
            self.seed, self.step, self.ops, self.tick, self.message, self.seed, self.sim
        )
    }
}

/// The session key the servers of a keyed run share: 32 bytes from a CSPRNG (once, by hand).
pub fn sim_session_key() -> dlock_core::SessionKey {
    const KEY: [u8; 32] = [
        0x91, 0x4e, 0x07, 0xd2, 0x3b, 0xa8, 0x65, 0xf1, 0x1c, 0xe9, 0x52, 0x8f, 0x36, 0xc4, 0x7a,
        0x0b, 0xd8, 0x23, 0x9e, 0x61, 0xb5, 0x4c, 0x0f, 0xea, 0x77, 0x18, 0xcd, 0x42, 0xa3, 0x5e,
        0x89, 0x06,
    ];
    dlock_core::SessionKey::new(KEY).expect("a strong key")
}
