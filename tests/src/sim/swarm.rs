//! Swarm testing: each seed draws which kinds of fault its run has, and how often.
//!
//! A fault mix that is the same for every run finds what that mix finds. Groce et al. ("Swarm
//! Testing", ISSTA 2012) showed that leaving features out at random finds more: a run without
//! losses lets clients hold locks long enough for the rarer faults to meet them, a run without
//! crashes lets queues grow long. So each seed turns each kind on with probability one half
//! and, when on, draws its rate log-uniformly over two to three orders of magnitude (a skew
//! toward rare, with runs where a fault is routine).
//!
//! Beside the independent kinds, *compound* faults put together what the bugs the simulators
//! found needed, which independent rates would meet only once in billions of operations:
//!
//! | compound             | what happens                                                                   | the bug it once took |
//! |----------------------|--------------------------------------------------------------------------------|----------------------|
//! | `unlock_then_crash`  | an unlock executes, its reply is held back (or its link breaks under it), and the server crashes before the client retries (others may take the lock meanwhile) | a stale exclusive claim displacing an accepted one (`MergeClaimOwner`) |
//! | `lapse_then_crash`   | a client holding locks stops past its lease; the server expires it, others take its locks, and the server crashes before the client wakes | a lapsed client re-claiming grants it lost (`ClientLeaseLapse`) |
//! | `unlock_then_lapse`  | an unlock executes, the link breaks under its reply, and the client stops past its lease | a client that cannot know whether it still holds a lock it asked to release |
//! | `claims_reply_lost`  | a recovering server merges a batch of claims and the link breaks under the reply | claims answered late, after the window closed |
//!
//! The lock manager's features are toggles of the same kind, each on for half the seeds:
//!
//! | toggle              | what the clients do when it is on                                        |
//! |---------------------|--------------------------------------------------------------------------|
//! | `cache_ppm`         | that share of acquisitions asks for a cached grant (`CACHEABLE`): released locally, re-acquired locally, given back (or downgraded) on a revoke; in the real-client simulator, that share of the reference-shaped process slots runs the transport's `CachedLocks` |
//! | `revoke_ignore_ppm` | that share of revokes is ignored, so the holder's grant lapses at the revoke timeout; in the real-client simulator, the chance (per draw) that a `CachedLocks` process goes deaf for half a lease to three leases: it keeps its guards and heartbeats but reads no revoke |
//! | `min_hold_ms`       | the server's minimum hold (`Timing::min_hold_ms`): revokes wait for its end, except of a grant made less than two contention windows after a conflict on its lock |
//! | `contention_window_ms` | the server's contention window (`Timing::contention_window_ms`): a cacheable request on a lock fought over within it (any conflicting request, refused, left waiting or revoking) is granted plain, which its result says (protocol 8) |
//! | `value_ppm`         | that share of lock records asks for the lock's value block with every grant, and half their exclusive unlocks write one |
//! | `event_loss_ppm`    | that share of event messages finds no room on its connection: the client reads an overflow in its place and re-checks everything it caches (gives back every cached grant) |
//! | `retain_ppm`        | that share of acquisitions asks to be retained on the holder's death (`RETAIN`); a recoverer lists the dead clients' retained locks and calls `recovery_done`, and other clients now and then try to, which must be refused |
//! | `downgrade_ppm`     | (the real-client simulator) that share of a reference-shaped process's actions on an RW lock its record holds exclusively downgrades it in place (`Client::downgrade`), and that share of a `CachedLocks` process's write guards it lets go downgrades instead (`CachedWriteGuard::downgrade`) |
//! | `reconnect_ppm`     | (the real-client simulator) the chance that a `CachedLocks` process whose connection broke reconnects and registers again (`Client::reinit`) instead of starting over: its cached grants then count as revoked (`manager::trust`, rule 2) |
//!
//! A plan is drawn from its own generator ([`FaultPlan::draw`]), so a seed's plan does not
//! depend on what else the simulator draws; the toggles are drawn after the faults, so a seed's
//! faults are what they were before the toggles existed.

use super::rng::Rng;

/// Faults injected in a run, by kind.
#[derive(Clone, Copy, Debug, Default)]
pub struct Faults {
    pub messages_lost: u64,
    pub replies_duplicated: u64,
    pub messages_delayed: u64,
    pub connections_reset: u64,
    pub crashes_holding: u64,
    pub crashes_waiting: u64,
    pub crashes_other: u64,
    pub pauses: u64,
    pub pauses_beyond_lease: u64,
    pub clock_jumps: u64,
    pub server_crashes: u64,
    pub recoveries_ended_by_deadline: u64,
    pub tables_full: u64,
    /// Claims of locks a client never held (a thief's), all of which must be refused.
    pub forged_claims: u64,
    pub unlock_then_crash: u64,
    pub lapse_then_crash: u64,
    pub unlock_then_lapse: u64,
    pub claims_reply_lost: u64,
    /// Revokes the server sent (a toggle's count, not a fault).
    pub revokes: u64,
    /// Revokes a holder ignored, leaving its grant to lapse.
    pub revokes_ignored: u64,
    /// Data channels broken apart from their control channels.
    pub streams_broken: u64,
    /// Event messages lost for want of room (each read as an overflow).
    pub event_messages_lost: u64,
    /// Cached exclusive grants downgraded in place on a shared revoke.
    pub downgrades: u64,
    /// Cached grants re-acquired without a message.
    pub local_acquires: u64,
    /// Value blocks written by exclusive unlocks.
    pub values_written: u64,
    /// Spells in which a cached-locks process of the real-client simulator read no revoke.
    pub cache_deaf_spells: u64,
    /// Cached-locks processes of the real-client simulator that reconnected and registered
    /// again after their connection broke.
    pub cache_reconnects: u64,
    /// Write guards a cached-locks process of the real-client simulator downgraded in place.
    pub cache_downgrades: u64,
    /// Dead clients whose retained locks a recoverer released.
    pub recoveries_done: u64,
    /// `recovery_done` calls from clients without the role (all refused).
    pub recoveries_refused: u64,
}

impl Faults {
    /// Adds `o` to these counts.
    pub fn add(&mut self, o: &Faults) {
        let pairs = [
            (&mut self.messages_lost, o.messages_lost),
            (&mut self.replies_duplicated, o.replies_duplicated),
            (&mut self.messages_delayed, o.messages_delayed),
            (&mut self.connections_reset, o.connections_reset),
            (&mut self.crashes_holding, o.crashes_holding),
            (&mut self.crashes_waiting, o.crashes_waiting),
            (&mut self.crashes_other, o.crashes_other),
            (&mut self.pauses, o.pauses),
            (&mut self.pauses_beyond_lease, o.pauses_beyond_lease),
            (&mut self.clock_jumps, o.clock_jumps),
            (&mut self.server_crashes, o.server_crashes),
            (
                &mut self.recoveries_ended_by_deadline,
                o.recoveries_ended_by_deadline,
            ),
            (&mut self.tables_full, o.tables_full),
            (&mut self.forged_claims, o.forged_claims),
            (&mut self.unlock_then_crash, o.unlock_then_crash),
            (&mut self.lapse_then_crash, o.lapse_then_crash),
            (&mut self.unlock_then_lapse, o.unlock_then_lapse),
            (&mut self.claims_reply_lost, o.claims_reply_lost),
            (&mut self.revokes, o.revokes),
            (&mut self.revokes_ignored, o.revokes_ignored),
            (&mut self.event_messages_lost, o.event_messages_lost),
            (&mut self.streams_broken, o.streams_broken),
            (&mut self.downgrades, o.downgrades),
            (&mut self.local_acquires, o.local_acquires),
            (&mut self.values_written, o.values_written),
            (&mut self.cache_deaf_spells, o.cache_deaf_spells),
            (&mut self.cache_reconnects, o.cache_reconnects),
            (&mut self.cache_downgrades, o.cache_downgrades),
            (&mut self.recoveries_done, o.recoveries_done),
            (&mut self.recoveries_refused, o.recoveries_refused),
        ];
        for (mine, theirs) in pairs {
            *mine += theirs;
        }
    }
}

/// The fault mix of one run. Rates are per million chances: per message for the network's,
/// per opportunity for the compound ones (an unlock's reply, a pause, a claims reply), and
/// per scheduling step for the rest (a simulator's step is its own unit, so each simulator
/// scales them with [`FaultPlan::per_step`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct FaultPlan {
    /// A message breaks its link.
    pub loss_ppm: u32,
    /// A data reply arrives twice.
    pub dup_ppm: u32,
    /// A message takes a long way (20 to `long_delay_max_ms`).
    pub long_delay_ppm: u32,
    pub long_delay_max_ms: u64,
    /// The usual delay is up to this.
    pub short_delay_max_ms: u64,
    /// A client process crashes.
    pub crash_ppm: u32,
    /// A client process stops for a while (half the time past its lease).
    pub pause_ppm: u32,
    /// The clock jumps forward (a frozen VM, a host that slept).
    pub jump_ppm: u32,
    /// The server crashes and a replacement recovers from the clients.
    pub server_crash_ppm: u32,
    pub unlock_then_crash_ppm: u32,
    pub lapse_then_crash_ppm: u32,
    pub unlock_then_lapse_ppm: u32,
    pub claims_reply_lost_ppm: u32,
    /// An acquisition asks for a cached grant (per acquisition; module doc: the toggles).
    pub cache_ppm: u32,
    /// A revoke is ignored (per revoke).
    pub revoke_ignore_ppm: u32,
    /// The server's minimum hold of a cached grant (ms; 0: none).
    pub min_hold_ms: u32,
    /// A lock record asks for value blocks (per record).
    pub value_ppm: u32,
    /// An acquisition asks to be retained on its holder's death (per acquisition).
    pub retain_ppm: u32,
    /// An event message finds no room on its connection (per message): its revokes are lost
    /// and the client reads an overflow instead.
    pub event_loss_ppm: u32,
    /// A link's data channel breaks while its control channel lives on (per scheduling step;
    /// the real-client simulator's fault).
    pub stream_break_ppm: u32,
    /// The server's contention window (ms; 0: off).
    pub contention_window_ms: u32,
    /// A reference-shaped process of the real-client simulator downgrades an RW lock its
    /// record holds exclusively, instead of the action it drew (per such action).
    pub downgrade_ppm: u32,
    /// A cached-locks process of the real-client simulator whose connection broke reconnects
    /// (per break) instead of starting over.
    pub reconnect_ppm: u32,
}

/// What becomes of a reply the server is about to send.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplyFate {
    /// Sent with the network's own faults.
    Normal,
    /// Delivered after `delay_ms`, and the server crashes after `crash_in_ms` (sooner): the
    /// reply is lost with it.
    HeldThenCrash { delay_ms: u64, crash_in_ms: u64 },
    /// The link breaks under it, and the server crashes after `crash_in_ms`: the client
    /// re-registers with the old server meanwhile, still holding the grant by its record.
    LostThenCrash { crash_in_ms: u64 },
    /// The link breaks under it; and if `lapse`, its client stops past its lease.
    Lost { lapse: bool },
}

/// What a reply answers, for the compound faults that pick on some.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplyTo {
    /// A data message with an unlock the server executed.
    Unlock,
    /// A batch of claims.
    Claims,
    Other,
}

/// A rate log-uniform in `[lo, hi]` per million, or 0: on with probability one half.
fn maybe(rng: &mut Rng, lo: u32, hi: u32) -> u32 {
    if rng.below(2) == 0 {
        return 0;
    }
    let (lo, hi) = (f64::from(lo.max(1)).ln(), f64::from(hi).ln());
    let x = rng.next_u64() as f64 / u64::MAX as f64;
    (lo + x * (hi - lo)).exp().round() as u32
}

impl FaultPlan {
    /// The plan of seed `seed`: every kind on or off, and its rate.
    pub fn draw(seed: u64) -> FaultPlan {
        let mut rng = Rng::new(seed ^ 0x5A4A_4D00_F417_7E55);
        FaultPlan {
            loss_ppm: maybe(&mut rng, 20, 5_000),
            dup_ppm: maybe(&mut rng, 100, 30_000),
            long_delay_ppm: maybe(&mut rng, 500, 80_000),
            long_delay_max_ms: rng.range(40, 400),
            short_delay_max_ms: rng.range(0, 6),
            crash_ppm: maybe(&mut rng, 5, 600),
            pause_ppm: maybe(&mut rng, 5, 600),
            jump_ppm: maybe(&mut rng, 1, 80),
            server_crash_ppm: maybe(&mut rng, 1, 60),
            unlock_then_crash_ppm: maybe(&mut rng, 500, 50_000),
            lapse_then_crash_ppm: maybe(&mut rng, 20_000, 500_000),
            unlock_then_lapse_ppm: maybe(&mut rng, 500, 30_000),
            claims_reply_lost_ppm: maybe(&mut rng, 10_000, 300_000),
            cache_ppm: maybe(&mut rng, 50_000, 1_000_000),
            revoke_ignore_ppm: maybe(&mut rng, 5_000, 300_000),
            min_hold_ms: maybe(&mut rng, 1, 60),
            value_ppm: maybe(&mut rng, 100_000, 1_000_000),
            retain_ppm: maybe(&mut rng, 50_000, 1_000_000),
            event_loss_ppm: maybe(&mut rng, 5_000, 300_000),
            stream_break_ppm: maybe(&mut rng, 20, 3_000),
            // Drawn last, so every earlier draw of a seed is what it was before they existed.
            contention_window_ms: maybe(&mut rng, 1, 200),
            downgrade_ppm: maybe(&mut rng, 50_000, 500_000),
            reconnect_ppm: maybe(&mut rng, 200_000, 1_000_000),
        }
    }

    /// A plan without faults (every simulator's calm runs).
    pub fn calm() -> FaultPlan {
        FaultPlan::default()
    }

    /// A per-step rate scaled by `factor` (saturating at certainty).
    pub fn per_step(ppm: u32, factor: u32) -> u32 {
        ppm.saturating_mul(factor).min(1_000_000)
    }

    /// One message's delay: usually short, now and then long (which reorders it against the
    /// other links and channels).
    pub fn delay(&self, rng: &mut Rng, faults: &mut Faults) -> u64 {
        if rng.chance(self.long_delay_ppm) {
            faults.messages_delayed += 1;
            rng.range(20, self.long_delay_max_ms.max(20))
        } else {
            rng.range(0, self.short_delay_max_ms)
        }
    }

    /// What becomes of a reply to `to` (the compound faults that start with a reply).
    pub fn reply_fate(&self, to: ReplyTo, rng: &mut Rng, faults: &mut Faults) -> ReplyFate {
        match to {
            ReplyTo::Unlock if rng.chance(self.unlock_then_crash_ppm) => {
                faults.unlock_then_crash += 1;
                let delay_ms = rng.range(30, 400);
                let crash_in_ms = rng.range(10, delay_ms - 5);
                if rng.below(2) == 0 {
                    ReplyFate::HeldThenCrash {
                        delay_ms,
                        crash_in_ms,
                    }
                } else {
                    ReplyFate::LostThenCrash { crash_in_ms }
                }
            }
            ReplyTo::Unlock if rng.chance(self.unlock_then_lapse_ppm) => {
                faults.unlock_then_lapse += 1;
                ReplyFate::Lost { lapse: true }
            }
            ReplyTo::Claims if rng.chance(self.claims_reply_lost_ppm) => {
                faults.claims_reply_lost += 1;
                ReplyFate::Lost { lapse: false }
            }
            _ => ReplyFate::Normal,
        }
    }

    /// Whether a pause of a client holding locks past its lease takes the server down with it
    /// (after the lease, before the client wakes), and if so how long after the lease.
    pub fn lapse_then_crash(&self, rng: &mut Rng, faults: &mut Faults) -> Option<u64> {
        rng.chance(self.lapse_then_crash_ppm).then(|| {
            faults.lapse_then_crash += 1;
            rng.range(60, 400)
        })
    }
}
