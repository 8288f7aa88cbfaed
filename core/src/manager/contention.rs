//! Contention-aware grants: a lock fought over recently is granted *plain* even to a request
//! that asks for a cached grant, and the holder is told so in the grant's reply.
//!
//! A cached grant pays when its holder reuses it locally before anyone else wants it; on a lock
//! other clients keep asking for, it is asked back before it pays, and every such revoke costs a
//! round trip a plain grant never pays (here ~100 µs against 42–57 µs for a plain hand-off, and a
//! wait for the holder's thread to notice it). The mature lock managers stop caching such locks
//! for a while. Lustre's LDLM counts conflicting requests on a resource and, past a threshold
//! within `contention_seconds`, marks it *contended* and serves it lockless (no cached lock at
//! all) until the period ends; GFS2 demotes a glock as soon as its minimum hold is over when
//! another node is waiting; the VMS and Linux DLMs deliver a blocking AST to a new holder at
//! once when a conflicting request is already queued. dlock takes Lustre's rule with one
//! timestamp per lock: a lock is *contended* while its latest conflict — a request that found
//! it held in a conflicting mode, by a cached holder (which it revoked) or a plain one (which
//! refused it or kept it waiting) — is younger than [`Timing::contention_window_ms`].
//!
//! # The grant ([`grant_as`])
//!
//! | asked `CACHEABLE` | window | the lock's latest conflict       | grant                          |
//! |-------------------|--------|----------------------------------|--------------------------------|
//! | no                | —      | —                                | `Plain`                        |
//! | yes               | 0      | —                                | `Cached` (the rule is off)     |
//! | yes               | `w`    | never (0)                        | `Cached`                       |
//! | yes               | `w`    | `now < at + w` (or `now < at`)   | `Contended`                    |
//! | yes               | `w`    | otherwise                        | `Cached`                       |
//!
//! # The stamp (the server's `note_conflict` and `send_revoke`)
//!
//! | a request for mode `m` finds the lock held          | stamps the lock's conflict time |
//! |-----------------------------------------------------|---------------------------------|
//! | by a cached holder in a mode conflicting with `m`, which it revokes | yes             |
//! | in a conflicting mode, and is refused (`Fail`) or left waiting (parked, or a fair ticket queued, `Eagain`) | yes |
//! | and is granted (no conflict), or is refused for another reason (a retained lock, a void ticket, a wrong kind) | no |
//! | the window is 0                                     | no (the rule is off)            |
//!
//! A `Contended` grant is recorded plain on the server: it is never revoked and never lapses by
//! the revoke timeout, it ends by the holder's unlock or its lease like any plain grant, and a
//! conflicting request waits for it as for any plain holder. The holder asked for a cached
//! grant and must learn that it is not one, or it would keep a grant nobody ever asks back:
//!
//! | the holder registered at            | it is told                                                        |
//! |-------------------------------------|-------------------------------------------------------------------|
//! | protocol 8 or newer (`PROTO_VERSION_PLAIN_GRANTS`) | in the grant's own result: [`CommandResult::plain`](crate::proto::CommandResult::plain), the top bit of the echoed op byte (`proto::data`'s layout) |
//! | older                               | by a revoke for the grant sent at once                            |
//!
//! A protocol-8 client records the grant plain (`CachedLock::granted_plain`): no new local user,
//! and its last local release is the plain unlock — in a row-group transaction, one more key
//! in the transaction's batch unlock. No event is written, sent or read for it, and its users
//! are never warned of as overdue, since a plain grant never lapses by the revoke timeout. An
//! older client gets the revoke it has always answered: it wants exclusive, so a shared holder
//! gives back rather than keeps, and names the grant's own fencing token, so the client keeps
//! it even when it overtakes the grant's reply. The reply's 32 bytes had no spare bit for the
//! mark: every op code is below 16, so the echoed op byte's top bit is free, and only a client
//! that negotiated 8 is sent it, which is a client that masks it off. A grant an
//! all-or-nothing unit undoes is answered `Eagain`, unmarked.
//!
//! Only a conflict stamps the lock's time: a contended grant and its unlock do not. So a
//! contended lock turns cacheable again one window after its last conflict, and a lock that
//! keeps being fought over — by plain holders as well as cached ones — stays plain for as long
//! as the fight goes on: no cached grant is made for the next conflict to revoke, and nobody
//! waits out a minimum hold on it. (When only a revoke stamped it, a lock fought over by its
//! plain holders turned cacheable once per window and paid a revoke, and the minimum hold's
//! wait, each time.) A clock behind the stamp reads as "just fought over": a lock is never
//! cached early. The stamp lives in the lock's manager cell (`LockManagerCell::contended_ms`,
//! which a lock's creation clears), apart from `revoke_sent_ms`, which times an outstanding
//! revoke's lapse: a fight that goes on must not push that lapse back. It costs 8 bytes per
//! lock (400 KB at the default 51,200 locks; `LAYOUT_VERSION` 7).
//!
//! # The minimum hold of a grant on a lock fought over ([`hold_ms`])
//!
//! The minimum hold ([`Timing::min_hold_ms`]) protects a node's first use of a lock nobody
//! else wants. A lock fought over has shown it is wanted, and the window's end still gives it
//! one cached grant (the next conflict revokes it and the lock turns plain again): with a hold,
//! that conflict waited out the hold, which at 5 ms cost the no-affinity workload up to 27 % of
//! its uncached rate. So a cached grant made less than two windows after the lock's
//! latest conflict — the grant the end of a window gave to a lock still fought over — is
//! revoked at once; the hold protects only a grant on a lock that stayed quiet a whole window
//! longer. GFS2 gets the same effect with an adaptive per-glock hold that shrinks when the glock
//! is demoted under contention and grows back when it is not; here the lock's conflict stamp
//! is the memory, so the rule costs no byte and no scan. With `g` the lock's latest cached grant
//! and `at` its latest conflict:
//!
//! | window | the lock's latest conflict          | the grant's minimum hold           |
//! |--------|-------------------------------------|------------------------------------|
//! | 0      | —                                   | `min_hold_ms` (the rule is off)    |
//! | `w`    | never (0)                           | `min_hold_ms`                      |
//! | `w`    | after the grant (`at > g`)          | `min_hold_ms`                      |
//! | `w`    | `at <= g < at + 2w`                 | 0: revoked at once                 |
//! | `w`    | otherwise (`g >= at + 2w`)          | `min_hold_ms`                      |
//!
//! A conflict after the grant does not waive its hold: it is the request that found the hold
//! running and was refused or parked (which stamps the lock), and a trylock's retry must not cut
//! short the hold its first attempt met. A waived hold's conflict is revoked at once, and a
//! revoke outstanding is judged by its lapse, not by the hold, so a stamp after the grant never
//! hides a waiver that was due. The server passes the lock's latest cached grant for every
//! holder: a conflict between two shared grants waives the first's hold with the second's,
//! and both are grants on a lock fought over.

use super::revoke::Timing;

/// How a grant the lock word makes is recorded ([`grant_as`]; module doc: the table).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub enum GrantAs {
    /// Not asked for caching: a plain grant.
    Plain,
    /// Cached: the holder keeps it after its users and gives it back when revoked.
    Cached,
    /// Asked for caching on a contended lock: recorded plain, and the holder told so (in the
    /// grant's result at protocol 8, by a revoke sent at once before), so it gives the lock back
    /// when its users are done.
    Contended,
}

impl GrantAs {
    /// Whether the grant is recorded as cached on the server.
    #[inline]
    pub const fn is_cached(self) -> bool {
        matches!(self, GrantAs::Cached)
    }
}

/// Whether a lock whose latest conflict was at `conflict_ms` (0: never) is contended at
/// `now_ms` (module doc).
#[inline]
#[must_use]
pub const fn contended(timing: &Timing, conflict_ms: u64, now_ms: u64) -> bool {
    if timing.contention_window_ms == 0 || conflict_ms == 0 {
        return false;
    }
    // `now < at` (a clock behind the stamp) subtracts to 0: still inside the window.
    now_ms.saturating_sub(conflict_ms) < timing.contention_window_ms as u64
}

/// How a grant for a request that asked for a cached grant (`cacheable`) and that the revoke
/// decision allows to be cached is recorded, on a lock whose latest conflict was at
/// `conflict_ms` (module doc: the table).
#[inline]
pub const fn grant_as(timing: &Timing, cacheable: bool, conflict_ms: u64, now_ms: u64) -> GrantAs {
    if !cacheable {
        return GrantAs::Plain;
    }
    match contended(timing, conflict_ms, now_ms) {
        true => GrantAs::Contended,
        false => GrantAs::Cached,
    }
}

/// The minimum hold of a cached grant made at `granted_ms` on a lock whose latest conflict was
/// at `conflict_ms` (0: never): none when the lock was fought over less than two windows before
/// the grant, else [`Timing::min_hold_ms`] (module doc: the hold table).
#[inline]
#[must_use]
pub const fn hold_ms(timing: &Timing, conflict_ms: u64, granted_ms: u64) -> u32 {
    let window = timing.contention_window_ms as u64;
    let fought_over = window != 0
        && conflict_ms != 0
        && conflict_ms <= granted_ms
        && granted_ms - conflict_ms < 2 * window;
    match fought_over {
        true => 0,
        false => timing.min_hold_ms,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WINDOW: Timing = Timing {
        contention_window_ms: 20,
        ..Timing::DEFAULT
    };
    const OFF: Timing = Timing {
        contention_window_ms: 0,
        ..Timing::DEFAULT
    };

    #[test]
    fn a_request_that_does_not_ask_is_granted_plain_whatever_the_lock() {
        for sent in [0, 90, 100] {
            assert_eq!(grant_as(&WINDOW, false, sent, 100), GrantAs::Plain);
            assert_eq!(grant_as(&OFF, false, sent, 100), GrantAs::Plain);
        }
    }

    #[test]
    fn a_lock_fought_over_inside_the_window_is_granted_contended() {
        // A conflict at 100, window 20: contended for 100..120.
        for now in [100, 101, 119] {
            assert_eq!(
                grant_as(&WINDOW, true, 100, now),
                GrantAs::Contended,
                "{now}"
            );
        }
        assert_eq!(grant_as(&WINDOW, true, 100, 120), GrantAs::Cached);
        assert_eq!(grant_as(&WINDOW, true, 100, 10_000), GrantAs::Cached);
    }

    #[test]
    fn a_lock_never_fought_over_is_cached() {
        // Zero is the cell's "no conflict": a server whose clock starts at 0 caches from the start.
        for now in [0, 1, 19] {
            assert_eq!(grant_as(&WINDOW, true, 0, now), GrantAs::Cached, "{now}");
        }
    }

    #[test]
    fn a_window_of_zero_turns_the_rule_off() {
        for now in [100, 101, 10_000] {
            assert_eq!(grant_as(&OFF, true, 100, now), GrantAs::Cached, "{now}");
        }
    }

    #[test]
    fn a_clock_behind_the_conflict_reads_as_just_fought_over() {
        assert_eq!(grant_as(&WINDOW, true, 100, 50), GrantAs::Contended);
    }

    const HOLD: Timing = Timing {
        min_hold_ms: 5,
        ..WINDOW
    };

    #[test]
    fn a_grant_within_two_windows_of_a_conflict_has_no_hold() {
        // A conflict at 100, window 20: the window's end gives a cached grant at 120 or later,
        // and one made before 140 is revoked at once.
        for granted in [100, 120, 139] {
            assert_eq!(hold_ms(&HOLD, 100, granted), 0, "{granted}");
        }
        for granted in [140, 141, 10_000] {
            assert_eq!(hold_ms(&HOLD, 100, granted), 5, "{granted}");
        }
    }

    #[test]
    fn a_grant_on_a_quiet_lock_keeps_its_hold() {
        // Never fought over, or only after the grant (the request its hold refused or parked).
        assert_eq!(hold_ms(&HOLD, 0, 100), 5);
        assert_eq!(hold_ms(&HOLD, 0, 0), 5);
        assert_eq!(hold_ms(&HOLD, 101, 100), 5);
    }

    #[test]
    fn a_window_of_zero_keeps_every_hold() {
        let off = Timing {
            min_hold_ms: 5,
            ..OFF
        };
        for (conflict, granted) in [(100, 100), (100, 110), (0, 100)] {
            assert_eq!(hold_ms(&off, conflict, granted), 5, "{conflict} {granted}");
        }
    }

    #[test]
    fn a_huge_window_does_not_overflow() {
        let wide = Timing {
            min_hold_ms: 5,
            contention_window_ms: u32::MAX,
            ..Timing::DEFAULT
        };
        assert_eq!(hold_ms(&wide, 1, u64::MAX), 5);
        assert_eq!(hold_ms(&wide, 1, 2 * u64::from(u32::MAX)), 0);
    }

    #[test]
    fn only_a_cached_grant_is_recorded_cached() {
        assert!(GrantAs::Cached.is_cached());
        assert!(!GrantAs::Plain.is_cached());
        assert!(!GrantAs::Contended.is_cached());
    }
}
