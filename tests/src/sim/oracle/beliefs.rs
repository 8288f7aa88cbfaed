//! What clients believe: the part of the oracle that reads the clients' own records.
//!
//! A client *believes* it holds a lock in a mode when its record says so and it trusts the
//! record: it is alive and has not lost its server as far as it knows, its lease has not run
//! out by its own count (from the send of the last request the server answered), the grant has
//! not expired by its own count (from the grant request's send), and it has not asked to
//! release it (an application that called unlock stops using the lock, whatever the reply —
//! a lost reply leaves the record holding a grant the server may already have handed on). Each
//! simulator says who believes what ([`Belief`]); the rules are here, the same for both:
//!
//! * **Mutual exclusion**: at no moment do two clients believe they hold one lock unless both
//!   believe it shared.
//! * **Fencing order**: no client believes it holds a lock under a fencing token older than
//!   one another client has already believed it held the lock under in a mode that excludes
//!   this one (a later grant that excludes an earlier one carries a larger token; storage
//!   that checks tokens would refuse the older holder, so believing it is already the bug).
//!   It is what a client that re-claims, from a replacement server, a grant the old one had
//!   taken back and given on (its lease lapsed) would break, even when it is the only
//!   believer left.
//!
//! One case is outside the fencing rule, as recovery is designed (`recovery.rs`: the first
//! accepted claim keeps a lock, and a proof cannot show a grant is still current): a holder
//! that misses a whole server incarnation — a replacement that served without it, handed its
//! lock on and crashed before it re-registered — re-claims its grant from the next one, and
//! nothing it or that server sees tells it the grant went elsewhere meanwhile. Mutual exclusion
//! still holds, and a fencing token at the storage orders the two holders; a simulator marks
//! such beliefs `fenced: false` (restored across an epoch gap) and the rule skips them.
//!
//! A server crash ends every belief until its client re-syncs with the replacement: the
//! kernel resets a dead process's connections, so each client learns of it before it could act
//! on a lock again. (A server host that vanishes without a word is outside this model: a client
//! would go on believing until its lease ran out, while the replacement gives the lock to the
//! first claim — a stale one, say — and only fencing tokens would order the two.)

use dlock_core::Mode;

/// One client's belief about one lock, as its simulator reads it from the client's record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Belief {
    /// The simulated process (its index in the simulator).
    pub holder: usize,
    pub mode: Mode,
    /// The fencing token of the grant the record holds.
    pub token: u64,
    /// Whether the fencing rule applies: false for a grant re-claimed across a missed server
    /// incarnation (the module doc says why).
    pub fenced: bool,
}

/// The belief rules' memory: per lock name, the newest tokens believers have held it under.
#[derive(Debug, Default)]
pub struct Beliefs {
    /// The largest token any believer has held each lock under, and who.
    newest: Vec<(u64, usize)>,
    /// The largest token an exclusive believer has held each lock under, and who.
    newest_exclusive: Vec<(u64, usize)>,
    /// Beliefs compared against the rules.
    pub checks: u64,
}

impl Beliefs {
    /// The rules' memory for `names` lock names.
    pub fn new(names: usize) -> Self {
        Beliefs {
            newest: vec![(0, usize::MAX); names],
            newest_exclusive: vec![(0, usize::MAX); names],
            checks: 0,
        }
    }

    /// Checks the clients that now believe they hold lock `name` (every one of them: a
    /// simulator passes the whole list each time it changes, or at every step);
    /// `describe(holder)` says who a holder is, for the failure's message.
    pub fn check(
        &mut self,
        name: usize,
        now: u64,
        believers: &[Belief],
        describe: impl Fn(usize) -> String,
    ) -> Result<(), String> {
        self.checks += believers.len() as u64;
        if let Some(x) = believers.iter().find(|b| b.mode == Mode::Exclusive)
            && believers.len() > 1
        {
            let others: Vec<String> = believers
                .iter()
                .filter(|b| b.holder != x.holder)
                .map(|b| {
                    format!(
                        "{} ({:?}, token {:#x})",
                        describe(b.holder),
                        b.mode,
                        b.token
                    )
                })
                .collect();
            return Err(format!(
                "lock {name}: {} believes it holds it exclusively (token {:#x}) at {now} beside {others:?}",
                describe(x.holder),
                x.token
            ));
        }
        for b in believers {
            let newest = self.newest[name].0;
            let (above, by) = match b.mode {
                Mode::Exclusive => self.newest[name],
                Mode::Shared => self.newest_exclusive[name],
            };
            if b.fenced && b.token < above {
                return Err(format!(
                    "lock {name}: {} believes it holds it {:?} under token {:#x} at {now}, \
                     after {} held it under the newer token {above:#x}",
                    describe(b.holder),
                    b.mode,
                    b.token,
                    describe(by)
                ));
            }
            if b.token > newest {
                self.newest[name] = (b.token, b.holder);
            }
            if b.mode == Mode::Exclusive && b.token > self.newest_exclusive[name].0 {
                self.newest_exclusive[name] = (b.token, b.holder);
            }
        }
        Ok(())
    }
}
