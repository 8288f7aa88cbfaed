//! The revoke decision: when a request conflicts with a lock's holders, which of them to ask
//! for the lock back, now or at what time, and what the request is answered.
//!
//! The rules are those of the DLMs that grew up around caching nodes. The VMS lock manager
//! and the Linux DLM deliver a *blocking AST* to each holder whose granted mode blocks a new
//! request, once per conflict, and the holder converts down or unlocks when it is done; a
//! request that may not queue is refused at once but can still trigger the blocking ASTs
//! (the Linux DLM's `DLM_LKF_NOQUEUEBAST`), so that its retry can succeed. GFS2 on top of it
//! keeps a glock for a minimum hold time after it was granted before it honours a demote
//! request, so two nodes cannot bounce a hot lock between them faster than either gets work
//! done. dlock applies a configured minimum hold on the server, which sends the revoke only when
//! the hold is over (the server's timer retries a parked request at that moment); by default
//! there is none ([`Timing::DEFAULT`] says why: the holder's own rule gives its guarantees).
//!
//! # One holder ([`judge`])
//!
//! With `granted` the holder's grant time, `hold` its minimum hold ([`Timing::min_hold_ms`],
//! or none on a lock fought over just before the grant: [`super::contention::hold_ms`]), `sent`
//! the time its outstanding revoke went out and `timeout` the revoke timeout
//! ([`Timing::revoke_timeout_for`]: [`Timing::revoke_timeout_ms`], or the holder's lease — always
//! the lease for a holder registered below [`PROTO_VERSION_REVOKE_TIMEOUT`], which was never told
//! a shorter one):
//!
//! | holder                                   | conflicts | when                         | action            |
//! |------------------------------------------|-----------|------------------------------|-------------------|
//! | the requester itself, nothing, a ticket  | —         | —                            | `Compatible`      |
//! | a grant                                  | no        | —                            | `Compatible`      |
//! | a grant of a dead (retaining) client     | yes       | —                            | `Retained`        |
//! | plain or retain-only (not cached)        | yes       | —                            | `Blocks`          |
//! | cached, no revoke outstanding            | yes       | `now < granted + hold`       | `RevokeAt(granted + hold)` |
//! | cached, no revoke outstanding            | yes       | otherwise                    | `Revoke(wanted)`  |
//! | revoke outstanding                       | yes       | `now < sent + timeout`       | `AwaitGiveBack(sent + timeout)` |
//! | revoke outstanding                       | yes       | otherwise                    | `Lapse`           |
//!
//! "Conflicts" is [`super::conflicts`]: only two shared grants coexist. `wanted` is the
//! requested mode: a revoke that wants shared lets an exclusive holder of an RW or fair lock
//! downgrade instead of unlocking (atomic locks have no shared mode, so their revokes always
//! want exclusive). Tickets are queued requests, not grants: the fair word orders them.
//!
//! # The request ([`Verdict::answer`])
//!
//! | holders' actions                                  | `wait_ms > 0`          | no wait                  |
//! |---------------------------------------------------|------------------------|--------------------------|
//! | any `Retained`                                    | `Wait { retained }`    | `Refuse(LockRetained)`   |
//! | else any `Blocks`, `Revoke`, `RevokeAt`, `AwaitGiveBack` | `Wait`          | `Refuse(Fail)`           |
//! | else (only `Compatible` and `Lapse`)              | `Grant { cached }`     | `Grant { cached }`       |
//!
//! Revokes go out whatever the answer: a trylock without a wait fails *and* revokes. A request
//! that does not wait leaves nobody parked to act at a `RevokeAt` time, so the server keeps
//! that revoke due on the lock and its timer sends it when the hold ends. `Lapse`d grants are released by the
//! server (as if the holder's lease had run out) before it runs the lock word, which is why
//! they do not block. A grant is `cached` exactly when the request asked for it. It is
//! [`Verdict::wanted`] already when a holder of the lock has a revoke outstanding or due (a
//! conflicting request is on its way in) or another request is parked on the lock: the server
//! then has the parked requests retried at the end of the new grant's minimum hold, which
//! revokes it. (Granting it plain instead, as this module first did, left the holder unable to
//! tell: a grant's reply does not say whether it is cached, so a client that asked would keep a
//! plain grant as cached, and no revoke would ever ask for it back.)
//!
//! The verdict says what the holders allow; the lock word still decides (a fair lock grants in
//! ticket order and may queue a request the holders would allow).

use super::conflicts;
use super::grant::GrantState;
use crate::ids::{LockKind, Mode};
use crate::proto::PROTO_VERSION_REVOKE_TIMEOUT;
use crate::status::Status;

/// The manager's timing settings (the integration adds them to `Config`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    /// How long a cached grant is kept before it may be revoked, counted from its grant (0, the
    /// default: revoked at once, the holder giving it back after its users; [`Timing::DEFAULT`]).
    /// A grant made less than two contention windows after a conflict on its lock has none: the
    /// hold protects a first use of a lock nobody else wants, and a lock just fought over has
    /// shown it is wanted ([`super::contention::hold_ms`]).
    pub min_hold_ms: u32,
    /// How long a holder has to answer a revoke before its grant lapses; 0: the holder's
    /// client lease (the integration spec's default).
    pub revoke_timeout_ms: u32,
    /// How long after a conflict on it (a revoke, or a request refused or left waiting by a
    /// holder in its way) a lock counts as contended: a request asking for a cached grant is
    /// then granted plain, and told so in its result ([`super::contention`]). 0 turns the rule
    /// off.
    pub contention_window_ms: u32,
}

impl Timing {
    /// No server-side minimum hold, revokes that lapse after the holder's lease, and a contention
    /// window of a second.
    ///
    /// The minimum hold has two purposes: a node that was just granted a lock is not robbed of
    /// it before it used it, and two nodes cannot bounce a hot lock between them faster than
    /// they get work done. Here the holder already guarantees both, so a hold on the server only
    /// adds to the waiter's wait. A cached grant is only ever asked for by a local user, and the
    /// holder gives it back only when its local users are done ([`super::cache`]: a revoke is
    /// deferred while a user holds the lock, and one that overtakes the reply granting it is
    /// kept for that grant and honoured at the user's release) — the hold "ends once the holder
    /// has released the lock locally once", which the server cannot see but need not. And each
    /// hand-over therefore follows at least one use on the giving side, so a lock cannot bounce
    /// faster than the work done under it. A 5 ms hold counted from the grant, the first
    /// default, made every key that moves between workers wait out the rest of those 5 ms: at
    /// thousands of transactions a second, with keys in other workers' ranges, cached row groups
    /// ran at half the uncached rate (`docs/lock-manager.md`, "Measured"). A positive
    /// `min_hold_ms` remains for engines whose use of a lock outlasts the user that asked for it
    /// (warming a page cache under it, say), the glock's case in GFS2; it holds only grants on
    /// locks not fought over in the two contention windows before ([`super::contention`]), so
    /// that the one cached grant a window's end gives a lock still fought over does not make its
    /// next conflict wait out the hold (at 5 ms that wait cost the no-affinity engine bench up to
    /// 27 % of its uncached rate, 0.73–0.98 of it). With that rule a 5-ms hold meets no conflict
    /// in the bench's steady state, which runs at the uncached rate (median 1.03 of it); what it
    /// still costs is a fresh server's cold start, one wait of up to the hold on each lock's
    /// first conflict (`min_hold_conflicts` counts them; `docs/lock-manager.md`, "Measured").
    /// It stays 0 by default because the holder already gives each grant its use.
    ///
    /// A contention window of 1,000 ms. A window must be long against the interval between
    /// conflicts on a lock fought over (each window that ends before the next conflict gives
    /// one cached grant for it to revoke) and short against the interval between stray
    /// conflicts on a lock its holder keeps reusing (inside the window the holder loses its
    /// caching). Since every conflict stamps the lock, and a grant made plain costs what an
    /// uncached one does (its result says so, and its unlock rides the caller's batch), a
    /// long window costs the fought-over workload nothing and the affinity workload at most
    /// its caching, which is what uncached runs at. In the engine bench (`docs/lock-manager.md`,
    /// "Measured"), with no affinity, window 0 sent 0.15 revokes and 2.15 messages per
    /// transaction (uncached: 2.07) at 0.45 of the uncached rate; 100 ms, 0.024 revokes;
    /// 1,000 ms, 0.003 revokes and 2.15 messages at 1.04 of the uncached rate, the client's
    /// CPU per transaction within 5 % of the uncached one's; 10,000 ms no fewer revokes
    /// (0.007). An engine whose stray conflicts are rarer than its reuses can shorten it, and
    /// `--contention-window-ms 0` turns the rule off.
    pub const DEFAULT: Timing = Timing {
        min_hold_ms: 0,
        revoke_timeout_ms: 0,
        contention_window_ms: 1_000,
    };

    /// The revoke timeout of a holder whose client lease is `lease_ms` and which registered at
    /// protocol `version`: the configured one, or that lease when none is (0), the configured
    /// one is longer, or the client registered below [`PROTO_VERSION_REVOKE_TIMEOUT`]. The one
    /// rule for everyone who counts it (the revoke decision, the server sending a revoke, the
    /// timeout told at registration, and the simulators' clients and oracle).
    ///
    /// Never longer than the lease: a client trusts a cached grant for the revoke timeout after
    /// its last answered request, and the server may free a client's grants a lease after it
    /// last heard from it (an abnormal client evicted, a silent one expired). A longer timeout
    /// would let the client trust a grant the server had already given to another.
    ///
    /// Never shorter than what the client was told: a client registered below protocol 7 is
    /// told no revoke timeout (the word is reserved and zero for it) and trusts a cached grant
    /// for its lease, so its revokes lapse at the lease whatever the server is configured
    /// with. Lapsing them at a shorter configured timeout let a revoke delayed on the wire
    /// past that timeout find the grant handed to another while the client, still inside its
    /// lease, handed it out locally: two writers (an engine pinned at 6 during a rolling
    /// upgrade, or a node of the older release).
    #[inline]
    pub const fn revoke_timeout_for(&self, lease_ms: u32, version: u8) -> u32 {
        match self.revoke_timeout_ms {
            _ if version < PROTO_VERSION_REVOKE_TIMEOUT => lease_ms,
            t if t == 0 || t > lease_ms => lease_ms,
            t => t,
        }
    }
}

impl Default for Timing {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// The request being decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    /// The lock's kind (checked against the request by the server before).
    pub kind: LockKind,
    /// The mode asked for.
    pub mode: Mode,
    /// The requester's client slot: its own grant is never in its way.
    pub slot: u32,
    /// Whether the request may wait (`wait_ms > 0`).
    pub waits: bool,
    /// Whether the request asked for a cached grant (`CACHEABLE`).
    pub cacheable: bool,
    /// Whether other requests are parked on the lock.
    pub others_waiting: bool,
}

/// One holder of the lock, as the server's tables know it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Holder {
    /// Its client slot.
    pub slot: u32,
    /// What it holds.
    pub state: GrantState,
    /// Its client is dead and retains its grants until `recovery_done`.
    pub dead: bool,
    /// When its grant began. A later time is safe (it only delays the revoke, or waives the
    /// hold for a conflict between the two grants: [`super::contention`]), so the server may
    /// pass the lock's latest cached grant for every holder.
    pub granted_ms: u64,
    /// When a request last found the lock held in a conflicting mode (0: never): a grant made
    /// less than two contention windows after it has no minimum hold
    /// ([`super::contention::hold_ms`]).
    pub contended_ms: u64,
    /// When its outstanding revoke went out (read only if one is). A later time is safe (it
    /// only delays the lapse), so the server may pass the lock's latest revoke.
    pub revoke_sent_ms: u64,
    /// Its client's lease, the revoke timeout when [`Timing::revoke_timeout_ms`] is 0.
    pub lease_ms: u32,
    /// The protocol version its client registered at: below
    /// [`PROTO_VERSION_REVOKE_TIMEOUT`] its revoke timeout is its lease
    /// ([`Timing::revoke_timeout_for`]).
    pub version: u8,
}

/// What to do about one holder ([`judge`]; module doc: the table).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub enum HolderAction {
    /// Not in the way.
    Compatible,
    /// Send it a revoke now, wanting this mode, and mark its grant revoking.
    Revoke {
        /// The mode the request wants (shared: the holder may downgrade).
        wanted: Mode,
    },
    /// Cached but inside its minimum hold: revoke it at `due_ms`.
    RevokeAt {
        /// When the hold ends.
        due_ms: u64,
    },
    /// Already asked: wait for it to give the lock back, until `lapses_ms`.
    AwaitGiveBack {
        /// When its grant lapses if it has not answered.
        lapses_ms: u64,
    },
    /// Asked and silent past the revoke timeout: release its grant as an expired lease.
    Lapse,
    /// A grant that is not cached: never revoked; it goes by unlock or lease.
    Blocks,
    /// A dead client's retained grant: held until `recovery_done`.
    Retained,
}

/// What one holder means for `req` at `now_ms` (module doc: the holder table).
#[inline]
pub fn judge(req: &Request, h: &Holder, timing: &Timing, now_ms: u64) -> HolderAction {
    let Some(held) = h.state.grant_mode() else {
        return HolderAction::Compatible;
    };
    if h.slot == req.slot || !conflicts(held, req.mode) {
        return HolderAction::Compatible;
    }
    if h.dead {
        return HolderAction::Retained;
    }
    if !h.state.is_cached() {
        return HolderAction::Blocks;
    }
    if h.state.revoke_outstanding() {
        let timeout = timing.revoke_timeout_for(h.lease_ms, h.version);
        let lapses_ms = h.revoke_sent_ms.saturating_add(u64::from(timeout));
        return if now_ms < lapses_ms {
            HolderAction::AwaitGiveBack { lapses_ms }
        } else {
            HolderAction::Lapse
        };
    }
    // A clock behind the grant reads as "just granted": the hold is not cut short.
    let hold = super::contention::hold_ms(timing, h.contended_ms, h.granted_ms);
    let due_ms = h.granted_ms.saturating_add(u64::from(hold));
    if now_ms < due_ms {
        return HolderAction::RevokeAt { due_ms };
    }
    let wanted = match req.kind {
        LockKind::Atomic => Mode::Exclusive,
        LockKind::Rw | LockKind::Fair => req.mode,
    };
    HolderAction::Revoke { wanted }
}

/// What the request is answered ([`Verdict::answer`]; module doc: the request table).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub enum Answer {
    /// Nothing in the way: run the lock word, and record a grant as cached if `cached`.
    Grant {
        /// Whether the grant may be cached.
        cached: bool,
    },
    /// Park the request. At its deadline it is answered `LockRetained` if `retained` (a
    /// retained grant was among what blocked it when it was last tried), else `Etimeout`.
    Wait {
        /// Whether a retained grant blocks it.
        retained: bool,
    },
    /// Answer at once with this status (`Fail` or `LockRetained`).
    Refuse(Status),
}

/// The holders' actions folded together: the request's answer and when to look again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub struct Verdict {
    blocked: bool,
    retained: bool,
    revoking: bool,
    revokes: u32,
    lapses: u32,
    retry_at_ms: u64,
}

impl Default for Verdict {
    fn default() -> Self {
        Self::NONE
    }
}

impl Verdict {
    /// Before any holder is judged.
    pub const NONE: Verdict = Verdict {
        blocked: false,
        retained: false,
        revoking: false,
        revokes: 0,
        lapses: 0,
        retry_at_ms: u64::MAX,
    };

    /// The verdict with one more holder, `h`, judged `action`.
    #[inline]
    pub const fn with(self, h: &Holder, action: HolderAction) -> Verdict {
        let mut v = self;
        match action {
            HolderAction::Compatible => v.revoking |= h.state.revoke_outstanding(),
            HolderAction::Revoke { .. } => {
                (v.blocked, v.revoking) = (true, true);
                v.revokes += 1;
            }
            HolderAction::RevokeAt { due_ms: at }
            | HolderAction::AwaitGiveBack { lapses_ms: at } => {
                (v.blocked, v.revoking) = (true, true);
                if at < v.retry_at_ms {
                    v.retry_at_ms = at;
                }
            }
            HolderAction::Lapse => v.lapses += 1,
            HolderAction::Blocks => v.blocked = true,
            HolderAction::Retained => v.retained = true,
        }
        v
    }

    /// What `req` is answered (module doc: the request table).
    #[inline]
    pub const fn answer(&self, req: &Request) -> Answer {
        if self.retained {
            return match req.waits {
                true => Answer::Wait { retained: true },
                false => Answer::Refuse(Status::LockRetained),
            };
        }
        if self.blocked {
            return match req.waits {
                true => Answer::Wait { retained: false },
                false => Answer::Refuse(Status::Fail),
            };
        }
        Answer::Grant {
            cached: req.cacheable,
        }
    }

    /// Whether a grant made now is wanted by someone already (module doc): a holder has a
    /// revoke outstanding or due, or another request is parked on the lock.
    #[inline]
    pub const fn wanted(&self, req: &Request) -> bool {
        self.revoking || req.others_waiting
    }

    /// Revokes to send now.
    #[inline]
    pub const fn revokes(&self) -> u32 {
        self.revokes
    }

    /// Grants that lapse now.
    #[inline]
    pub const fn lapses(&self) -> u32 {
        self.lapses
    }

    /// When the holders' situation changes without anyone sending anything (a minimum hold
    /// ends, an outstanding revoke lapses): when a parked request deserves a retry.
    #[inline]
    pub const fn retry_at_ms(&self) -> Option<u64> {
        match self.retry_at_ms {
            u64::MAX => None,
            at => Some(at),
        }
    }
}

/// Judges every holder of the lock for `req` at `now_ms`, telling `act` what to do about each
/// (the server sends a revoke for [`HolderAction::Revoke`] and releases the grant for
/// [`HolderAction::Lapse`]), and returns the verdict. `holders` may be any iterator, such as a
/// scan of the holds grid's column for the lock; nothing is allocated.
#[inline]
pub fn decide<I>(
    req: &Request,
    holders: I,
    timing: &Timing,
    now_ms: u64,
    mut act: impl FnMut(&Holder, HolderAction),
) -> Verdict
where
    I: IntoIterator<Item = Holder>,
{
    let mut verdict = Verdict::NONE;
    for h in holders {
        let action = judge(req, &h, timing, now_ms);
        act(&h, action);
        verdict = verdict.with(&h, action);
    }
    verdict
}

#[cfg(test)]
#[path = "revoke_tests.rs"]
mod tests;
