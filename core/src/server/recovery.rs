//! Failover recovery: rebuilding lock state from the clients (`update_all_locks`).
//!
//! A replacement server starts with `recovery_clients = N` and answers `NotReady` to everything
//! but re-registration until N clients have re-registered (`client_reinit` with their old ids),
//! re-claimed the locks they hold (`update_lock`, one claim per lock, in batches of ≤ 31) and
//! said `reinit_done`. The merge rules are the reference's, restated for a monotonic clock: a
//! claim carries the time left on its grant and the time since it was acquired, instead of
//! absolute wall-clock times that would need the two servers' clocks in sync.
//!
//! | kind   | claim           | merged when                                  | otherwise |
//! |--------|-----------------|----------------------------------------------|-----------|
//! | atomic | exclusive       | time left, free (or already this client's)   | Fail      |
//! | RW     | exclusive       | free (or already this client's)              | Fail      |
//! | RW     | shared          | no exclusive holder                          | Fail      |
//! | fair   | exclusive       | time left, no holder, ticket not behind the counters | Fail |
//! | fair   | shared          | time left, no exclusive holder, ticket at the serving position, < 63 readers | Fail |
//! | fair   | ticketed        | always: next-ticket counters move past it    | —         |
//!
//! The first claim accepted keeps the lock. The reference lets a later claim displace an
//! earlier one (the one expiring later, or acquired later, wins), but the displaced client was
//! already told its claim succeeded and goes on believing it holds the lock: two holders. Two
//! exclusive claims of one lock mean one of them is stale (its unlock was executed and the
//! reply lost; or it was never re-claimed from a server that came and went in between, and
//! that server granted the lock again), and refusing whichever comes second leaves exactly one
//! believer either way — at worst a genuine holder is told its grant is lost, which costs a
//! retry, not exclusion. Ordering claims by fencing token instead (the newer grant displacing
//! the older) would pick the genuine holder, but only by revoking a claim already answered
//! `Success`, which the simulator shows is two believers again.
//!
//! With a session key every grant claim also carries the proof the failed server gave with the
//! grant (`proof.rs`), so no client can claim a lock it was never granted. What a proof cannot
//! rule out is a grant that is over: a client that held a lock once and gave it up keeps its
//! proof, and a claim of it that comes first wins as any stale claim does — a genuine client
//! can make the current holder lose its grant (told `Fail`), though never share the lock.
//!
//! A refused claim tells the client its grant is lost (it resets its local state), so a claim
//! is refused only when the server does not hold that grant for the client. Claims are
//! idempotent (a re-sent batch merges nothing twice) and merge only while the server recovers
//! and the client has not said `reinit_done`. Who may claim:
//!
//! | client                                              | `BatchUpdateLocks` answer                                   |
//! |-----------------------------------------------------|-------------------------------------------------------------|
//! | re-registered here, server recovering, not done     | per claim: merged (id) or refused (`Fail`, `Einval`)        |
//! | re-registered here, recovery over or client done    | per claim: the id of what was restored for it, else `Fail` |
//! | never re-registered into this recovery              | the whole call refused (`Einval`): its records are ours     |
//! | not registered                                      | the whole call refused (`ClientNotInit`)                    |
//!
//! The second row serves a client whose batch was merged and its reply lost: sent again after
//! the window closed, it still learns the new ids of its restored locks instead of being told
//! they are gone. The third is the reference's -1: a per-claim refusal there would make a
//! client forget every lock the server keeps for it.
//!
//! Every claim raises the server's token counter above the claim's fencing token, so the
//! tokens of re-claimed locks keep growing; a lock nobody re-claims starts over at the new
//! epoch, which is why a replacement server must be started with a larger epoch than its
//! predecessor (claims whose token carries an epoch not below ours are refused as forged).
//!
//! Beyond the reference, recovery ends by itself: when `Config::recovery_deadline_ms` has passed
//! since the first tick (or re-registration), the server serves and gives up on the expected
//! clients that have not finished (a crashed client never re-registers, so the reference waits
//! for it forever). [`Server::recovery_progress`] and the `Recovery*` counters show how far it
//! got.

use super::{Counter, Server};
use crate::config::BATCH_MAX;
use crate::config::FAIR_READERS_MAX;
use crate::ids::{ClientId, FencingToken, LockId, LockKind, Mode};
use crate::manager::GrantState;
use crate::proto::{BatchEntries, BatchEntry, Claims, Held, LockClaim};
use crate::server::proof::{GrantSubject, proves};
use crate::status::Status;
use crate::table::{ClientEntry, ClientState, SlotState};
use crate::word::{atomic, deadline, fair, rw};

/// How a recovering server is doing (all zero on a server that started ready).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecoveryProgress {
    /// Clients the server was started to expect (`recovery_clients`).
    pub expected: u32,
    /// Clients that re-registered (`client_reinit`) while it recovered.
    pub reregistered: u32,
    /// Re-registered clients that finished (`reinit_done`).
    pub done: u32,
    /// Grants and fair tickets restored from claims.
    pub locks_restored: u32,
    /// Expected clients given up on (lease ran out while re-syncing, or never finished by the
    /// deadline).
    pub given_up: u32,
    /// The tick at which the deadline passes; `None` before the recovery clock starts, with no
    /// deadline, or once the server serves.
    pub deadline_ms: Option<u64>,
    /// Recovery ended because the deadline passed (not because every client finished).
    pub deadline_passed: bool,
}

impl<'r> Server<'r> {
    /// How recovery is going: expected, re-registered and finished clients, locks restored,
    /// and the deadline.
    pub fn recovery_progress(&self) -> RecoveryProgress {
        RecoveryProgress {
            deadline_ms: match self.progress.deadline_ms {
                Some(d) if self.recovering > 0 => Some(d),
                _ => None,
            },
            ..self.progress
        }
    }

    /// Starts the recovery deadline at the first tick or re-registration, and ends recovery
    /// when it has passed: every expected client not done by then is treated as dead.
    pub(super) fn recovery_clock(&mut self, now_ms: u64) {
        if self.recovering == 0 || self.cfg.recovery_deadline_ms == 0 {
            return;
        }
        let deadline = *self
            .progress
            .deadline_ms
            .get_or_insert(now_ms + u64::from(self.cfg.recovery_deadline_ms));
        if now_ms >= deadline {
            self.give_up_on(self.recovering);
            self.progress.deadline_passed = true;
        }
    }

    /// Stops waiting for `n` of the expected clients; serves when none is left.
    pub(super) fn give_up_on(&mut self, n: u32) {
        let n = n.min(self.recovering);
        self.recovering -= n;
        self.progress.given_up += n;
        self.stats.add(Counter::RecoveryClientsGivenUp, n.into());
        if self.recovering == 0 {
            self.end_recovery();
        }
    }

    /// A `BatchUpdateLocks` frame from client `raw`: refused whole (nothing claimed, nothing
    /// changed) unless the client has a recovery session on this server, else one entry per
    /// claim (see [`Server::update_lock`]).
    ///
    /// Refusing the whole call is what tells the client its records are still this server's: a
    /// client that never re-registered into this server's recovery holds its locks here under
    /// the ids it has, and a per-claim refusal would read as "this grant is gone" and make it
    /// forget locks the server still keeps for it. The reference refuses the call too (-1).
    pub fn update_locks<'e>(
        &mut self,
        raw: u32,
        claims: &Claims<'_>,
        entries: &'e mut [BatchEntry; BATCH_MAX],
        now_ms: u64,
    ) -> Result<BatchEntries<'e>, Status> {
        self.stats.bump(Counter::ControlRequests);
        let slot = self
            .client_slot(raw)
            .ok_or_else(|| self.refuse(Status::ClientNotInit))?;
        // A cluster server takes claims per partition (`cluster_claims.rs`), from any
        // registered client.
        if !self.is_cluster() && self.claim_window(slot) == ClaimWindow::Closed {
            return Err(self.refuse(Status::Einval));
        }
        let n = claims.len().min(BATCH_MAX);
        for (e, claim) in entries.iter_mut().zip(claims.iter()) {
            *e = match self.update_lock(raw, &claim, now_ms) {
                Ok(id) => BatchEntry {
                    id: id.raw(),
                    status: Status::Success,
                },
                Err(status) => BatchEntry { id: 0, status },
            };
        }
        Ok(BatchEntries::from_slice(&entries[..n]))
    }

    /// Whether client `slot` may re-claim locks now (see [`ClaimWindow`]).
    fn claim_window(&self, slot: u32) -> ClaimWindow {
        let c = &self.t.clients[slot as usize];
        if self.recovering > 0 && c.client_state() == ClientState::Recovering {
            ClaimWindow::Open
        } else if c.has(ClientEntry::RECOVERED) {
            ClaimWindow::Late
        } else {
            ClaimWindow::Closed
        }
    }

    /// Re-claims one lock for client `raw`, which re-registered while this server recovered:
    /// creates or joins the lock by name, then merges the claimed grant or ticket. Returns the
    /// lock's (new) id.
    ///
    /// Once the client's window has closed (the server serves, or the client said
    /// `reinit_done`) a claim merges nothing any more — it could only steal what was granted
    /// since — but a claim of what the server already restored for this client is still
    /// answered with the lock's id. So a client whose batch of claims was taken and its reply
    /// lost learns the new ids of what it holds when it sends the batch again, however late;
    /// everything else is `Fail` (not restored: the grant is gone).
    pub fn update_lock(
        &mut self,
        raw: u32,
        claim: &LockClaim<'_>,
        now_ms: u64,
    ) -> Result<LockId, Status> {
        if self.is_cluster() {
            return self.cluster_claim(raw, claim, now_ms);
        }
        self.stats.bump(Counter::ControlRequests);
        let slot = self
            .client_slot(raw)
            .ok_or_else(|| self.refuse(Status::ClientNotInit))?;
        match self.claim_window(slot) {
            ClaimWindow::Open => {}
            ClaimWindow::Late => {
                return self
                    .restored(slot, claim)
                    .ok_or_else(|| self.refuse(Status::Fail));
            }
            ClaimWindow::Closed => return Err(self.refuse(Status::Einval)),
        }
        self.t.clients[slot as usize].last_seen_ms = now_ms;
        let me = ClientId::new(raw).ok_or(Status::Einval)?;
        // A claim names a grant of an earlier incarnation: its token's epoch is below ours.
        // A larger one is forged and would push our token counter towards overflow.
        let valid = matches!(
            (claim.kind, claim.held),
            (_, Held::Reference | Held::Exclusive)
                | (LockKind::Rw | LockKind::Fair, Held::Shared)
                | (LockKind::Fair, Held::Ticketed(_))
        );
        if !valid || FencingToken(claim.token).standalone_epoch() >= self.cfg.epoch {
            return Err(self.refuse(Status::Einval));
        }
        // With a session key, a grant or ticket is restored only with its proof: a client that
        // really was registered could otherwise claim a lock it never held (`proof.rs`).
        if let Some((key, mac)) = &self.session_key
            && claim.held != Held::Reference
        {
            let subject = GrantSubject {
                client: raw,
                kind: claim.kind,
                held: claim.held,
                // A standalone server's locks are all in partition 0.
                partition: 0,
                epoch: claim.proof.epoch,
                token: claim.token,
                ticket: claim.ticket,
                name: claim.name,
            };
            if claim.proof.epoch >= u32::from(self.cfg.epoch)
                || !proves(key, *mac, &subject, &claim.proof)
            {
                return Err(self.refuse(Status::Einval));
            }
        }
        let had_ref = self
            .find_lock(claim.name)
            .is_some_and(|l| self.t.lock_refs.get(slot, l) != 0);
        let id = self
            .get_lock_for(slot, claim.kind, claim.name, now_ms)
            .map_err(|s| self.refuse(s))?;
        let lock = id.index();
        // Claims are idempotent: a batch re-sent after a lost echo merges nothing twice.
        let held = self.recorded_hold(slot, lock);
        let wanted = GrantState::from_held(claim.held);
        if !held.is_none() && held == wanted {
            return Ok(id);
        }
        // Tokens never go backwards, whatever the claim's fate.
        self.next_token = self.next_token.max(claim.token + 1);
        match self.merge_claim(lock, me, claim, now_ms) {
            Ok(hold) => {
                if !hold.is_none() {
                    self.progress.locks_restored += 1;
                    self.stats.bump(Counter::RecoveryLocksRestored);
                    self.t.lock_holds.set(slot, lock, hold.bits());
                    let cell = &mut self.t.lock_cells[lock as usize];
                    cell.fence = cell.fence.max(claim.token);
                    // A restored grant's copy of the block is the failed server's (nobody
                    // else could write while it was held): the newest valid one offered
                    // wins, and a lock nobody offers one for stays invalid.
                    if hold.grant_mode().is_some()
                        && let Some(offered) = &claim.value
                    {
                        let _ = self.t.lock_values[lock as usize].reclaim(offered);
                    }
                }
                Ok(id)
            }
            Err(s) => {
                // A refused claim leaves no reference behind that the client cannot see.
                if !had_ref {
                    self.drop_lock_ref(slot, id);
                }
                Err(self.refuse(s))
            }
        }
    }

    /// The id of the lock `claim` names if the server already holds for client `slot` exactly
    /// what the claim says (a reference, or a grant or ticket of that kind): a repeated claim.
    pub(super) fn restored(&self, slot: u32, claim: &LockClaim<'_>) -> Option<LockId> {
        let lock = self.find_lock(claim.name)?;
        let state = SlotState(self.t.lock_meta[lock as usize].state);
        if state.kind() != claim.kind || self.t.lock_refs.get(slot, lock) == 0 {
            return None;
        }
        (self.recorded_hold(slot, lock) == GrantState::from_held(claim.held))
            .then(|| LockId::new(lock, state.generation()))
    }

    /// Applies the merge table above to lock slot `lock`; returns what the client now holds.
    pub(super) fn merge_claim(
        &mut self,
        lock: u32,
        me: ClientId,
        c: &LockClaim<'_>,
        now_ms: u64,
    ) -> Result<GrantState, Status> {
        let cell = &mut self.t.lock_cells[lock as usize];
        let until = deadline(now_ms, c.remaining_ms);
        let acquired = now_ms.saturating_sub(c.age_ms as u64);
        match (c.kind, c.held) {
            (_, Held::Reference) => Ok(GrantState::None),
            (LockKind::Atomic, Held::Exclusive) => {
                let w = atomic::AtomicWord::from_bits(cell.word);
                // Whoever claimed it first keeps it (module doc).
                if c.remaining_ms == 0 || (w.is_held(now_ms) && w.owner() != me.get()) {
                    return Err(Status::Fail);
                }
                cell.word = w
                    .with_owner(me.get())
                    .with_expiry_ms(until.max(w.expiry_ms()))
                    .into_bits();
                Ok(GrantState::Exclusive)
            }
            (LockKind::Rw, Held::Exclusive) => {
                let w = rw::RwWord::from_bits(cell.word);
                // Whoever claimed it first keeps it (module doc). The simulator's first find;
                // `MergeClaimOwner` drops the owner check to prove its seed still finds it.
                let taken = w.owner() != 0 && w.owner() != me.get();
                if w.readers() != 0 || (taken && !crate::mutated!(MergeClaimOwner)) {
                    return Err(Status::Fail);
                }
                cell.word = rw::RwWord::new()
                    .with_owner(me.get())
                    .with_since_ms(acquired)
                    .into_bits();
                Ok(GrantState::Exclusive)
            }
            (LockKind::Rw, Held::Shared) => {
                let w = rw::RwWord::from_bits(cell.word);
                if w.owner() != 0 {
                    return Err(Status::Fail);
                }
                let since = if w.readers() == 0 {
                    acquired
                } else {
                    w.since_ms().min(acquired)
                };
                cell.word = w
                    .with_readers(w.readers() + 1)
                    .with_since_ms(since)
                    .into_bits();
                Ok(GrantState::Shared)
            }
            // A fair grant that ran out may have been preempted and handed on: restored, an
            // extend would revive it under an older token than its successor's (the simulator's
            // fencing rule found it; `FairClaimExpired` puts it back). As for an atomic one.
            (LockKind::Fair, Held::Exclusive | Held::Shared)
                if c.remaining_ms == 0 && !crate::mutated!(FairClaimExpired) =>
            {
                Err(Status::Fail)
            }
            (LockKind::Fair, held) => {
                let mut s = fair::FairLock {
                    word: fair::FairWord::from_bits(cell.word),
                    owner: cell.ext,
                };
                let hold = merge_fair(&mut s, me, held, c, until)?;
                cell.word = s.word.into_bits();
                cell.ext = s.owner;
                Ok(hold)
            }
            // Atomic locks have no shared mode and only fair locks have tickets.
            (LockKind::Atomic, Held::Shared | Held::Ticketed(_))
            | (LockKind::Rw, Held::Ticketed(_)) => Err(Status::Einval),
        }
    }
}

/// Whether a client may re-claim locks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ClaimWindow {
    /// It re-registered while the server recovers and has not said `reinit_done`: claims merge.
    Open,
    /// It re-registered during this server's recovery, which is over for it: a claim only
    /// learns the id of what was restored for it.
    Late,
    /// It never re-registered into this server's recovery: its records are this server's, and
    /// a claim is refused whole.
    Closed,
}

/// `b` if it is later than `a` in ticket order, else `a`.
fn later(a: u16, b: u16) -> u16 {
    if fair::ticket_before(a, b) { b } else { a }
}

/// `b` if it is earlier than `a` in ticket order, else `a`.
fn earlier(a: u16, b: u16) -> u16 {
    if fair::ticket_before(b, a) { b } else { a }
}

/// The serving counter `ns` once a reader holding or queued with shared ticket `ts` is merged
/// into `w` (no writer holds it).
///
/// `ns` counts the shared grants completed, and every reader's unlock moves it on by one, so
/// it must not be past any outstanding shared ticket: it goes back to the oldest claimed. Left
/// where the first claim put it (a newer reader's ticket, say), it runs past `ms` once the
/// readers have unlocked, `ms − ns` wraps to "queue full", and every first attempt on the lock
/// fails for good. Found by `check_invariants` in the simulator; `FairClaimServing` puts the
/// bug back.
fn serving_readers(w: fair::FairWord, ts: u16) -> u16 {
    if crate::mutated!(FairClaimServing) {
        return w.ns();
    }
    earlier(w.ns(), ts)
}

fn merge_fair(
    s: &mut fair::FairLock,
    me: ClientId,
    held: Held,
    c: &LockClaim<'_>,
    until: u64,
) -> Result<GrantState, Status> {
    let (tx, ts) = (c.ticket.exclusive, c.ticket.shared);
    // Counters compare only within half their range, and the old server's may be anywhere in
    // it: the first claim on a lock this server has not seen positions an empty queue at its
    // ticket, and later claims (from the same old lock, so close by) merge against that.
    if s.owner == 0 && s.word.into_bits() == 0 {
        s.word = fair::FairWord::new()
            .with_nx(tx)
            .with_mx(tx)
            .with_ns(ts)
            .with_ms(ts);
    }
    let w = s.word;
    let timeout = until.max(w.timeout_ms());
    match held {
        Held::Exclusive => {
            // The holder is served at (tx, ts): nothing may hold it, and no merged claim may
            // already have moved the serving counters past it.
            if s.owner != 0
                || w.rcnt() != 0
                || fair::ticket_before(tx, w.nx())
                || fair::ticket_before(ts, w.ns())
            {
                return Err(Status::Fail);
            }
            s.owner = me.get();
            s.word = w
                .with_nx(tx)
                .with_ns(ts)
                .with_mx(later(w.mx(), tx.wrapping_add(1)))
                .with_ms(later(w.ms(), ts))
                .with_timeout_ms(timeout);
            Ok(GrantState::Exclusive)
        }
        Held::Shared => {
            let nx = later(w.nx(), tx);
            if s.owner != 0 || nx != tx || w.rcnt() >= FAIR_READERS_MAX {
                return Err(Status::Fail);
            }
            s.word = w
                .with_nx(nx)
                .with_ns(serving_readers(w, ts))
                .with_mx(later(w.mx(), nx))
                .with_ms(later(w.ms(), ts.wrapping_add(1)))
                .with_rcnt(w.rcnt() + 1)
                .with_timeout_ms(timeout);
            Ok(GrantState::Shared)
        }
        Held::Ticketed(mode) => {
            let (mx, ms) = match mode {
                Mode::Exclusive => (later(w.mx(), tx.wrapping_add(1)), later(w.ms(), ts)),
                Mode::Shared => (later(w.mx(), tx), later(w.ms(), ts.wrapping_add(1))),
            };
            let ns = match mode {
                Mode::Shared if s.owner == 0 => serving_readers(w, ts),
                _ => w.ns(),
            };
            s.word = w.with_mx(mx).with_ms(ms).with_ns(ns);
            Ok(GrantState::ticketed(mode))
        }
        Held::Reference => Ok(GrantState::None),
    }
}
