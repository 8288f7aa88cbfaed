//! Cached grants in the data path: the revoke decision (`manager::revoke`) run before an
//! acquisition's word step.
//!
//! An acquisition on a lock that may have cached holders ([`LockManagerCell::cached`]) scans the
//! lock's column of the holds grid up to the client table's high-water mark and judges each
//! holder (`manager::revoke::judge`):
//!
//! | holder's action   | what the server does here                                                   |
//! |-------------------|-----------------------------------------------------------------------------|
//! | `Revoke`          | marks the grant revoking (`with_revoke_sent`: at most one outstanding per holder and lock), writes a revoke into the holder's event ring, stamps the lock's `revoke_sent_ms`, and cuts the holder's parked wait short if it asked (below) |
//! | `RevokeAt(due)`   | nothing now; `due` becomes the lock's `retry_at_ms`, so a parked request is retried when the minimum hold ends (and sends the revoke then; a grant made less than two contention windows after the lock's `contended_ms` has none, `manager::contention::hold_ms`, and is revoked at once); a request that does not wait leaves the revoke due there (`deferred_revoke`), and the server's timer sends it ([`Server::poll_waiters`]); the request is counted in `min_hold_conflicts` (once per request, not per retry or timer pass) |
//! | `AwaitGiveBack`   | nothing now; the lapse time becomes the lock's `retry_at_ms`                 |
//! | `Lapse`           | releases the grant as an expired lease would (`release_grant`, which invalidates an exclusive holder's value block; the command's caller retries the lock's waiters after it, never inside it) |
//! | `Blocks`, on a contended lock | cuts the holder's parked wait short if it asked, as a revoke would (below) |
//! | the others        | nothing                                                                     |
//!
//! Then the lock word decides, as for any acquisition. A conflicting cached grant is a grant in
//! the word too, so the word refuses (or queues, or the waiter parks) exactly where the
//! verdict says `Wait` or `Refuse(Fail)`: running it keeps each kind's own answer to a busy lock
//! — a fair first attempt still takes its ticket, as the reference's does — and a trylock
//! without a wait is answered at once while its revokes still go out (`NOQUEUEBAST`). What the
//! verdict adds is whether a grant the word makes is *cached* — exactly when the request asked
//! (`CACHEABLE`): the reply does not say, so the holder must be able to count on it — and
//! whether it is wanted already (a revoke outstanding or due, or somebody parked on the lock),
//! in which case the parked requests are retried when its minimum hold ends, and revoke it.
//!
//! A holder blocked in a wait on the server cannot read the revoke until its wait ends: a
//! worker parked on one lock while another worker waits for a lock the first one caches would
//! hold it until one of the two waits ran out (or its own slice of a sliced wait did). So a
//! revoke also ends the holder's parked request when that request carries
//! [`LockFlags::WAKE_ON_REVOKE`]: its deadline becomes the past, and the waiters' next poll —
//! in the same turn of the data loop — answers it `Etimeout` (or grants it, if the lock came
//! free meanwhile). The caller loops: it reads its revokes, gives back, and waits again. A
//! request without the flag waits as before (a plain `lock()` keeps its promise to wait out
//! its whole wait). The Linux DLM has no such rule because its blocking ASTs run on a thread
//! of their own; a dlock client reads its events on the thread that called it.
//!
//! A lock a conflict revoked within the contention window (`manager::contention`) grants a
//! request that asks for a cached grant *plain*, and tells its holder: in the grant's result
//! (`CommandResult::plain`) at protocol 8, else by a revoke for that grant sent at once
//! (`tell_plain_grant`): the holder gives it back when its users are done,
//! which is the unlock a plain user sends. Such a holder may be parked on another lock before it
//! read the notice (a stream delivers events after the turn's replies), and then nothing would
//! wake it: a conflicting request that finds a plain holder on a contended lock ends that
//! holder's parked wait if it asked for [`LockFlags::WAKE_ON_REVOKE`], as a revoke would. A
//! holder that owed nothing pays one more wait; a plain `lock()` is never cut. A holder of
//! protocol 8 read its grant's mark with the grant, and is not woken.
//!
//! Any other plain grant to a request that asked for a cached one is marked or told the same
//! way: one the word made over a holder the verdict saw in the way, because the word took that
//! holder's grant over (an atomic lock's expired one) or preempted it (a fair lock's timeout).
//! The client counts an unmarked grant as cached, and no revoke would ever ask it back.
//!
//! On a lock with no cached holder the scan is skipped unless the lock is contended and a
//! client below protocol 8 is registered (the server counts them, `Server::old_clients`): that
//! is the one case where the scan still has work, a holder to wake, so acquiring a fought-over
//! lock costs no pass over the client table. Then a cacheable request is cached when nobody
//! else is parked on it, or granted plain with a mark or notice if the lock is contended. A
//! scan that finds no cached holder left clears the lock's mark. A flood of cacheable requests
//! holds no more than the holds grid holds: a cached grant is a grant, in the same tables,
//! under the same per-client waiter slot.

use super::{Counter, Server};
use crate::ids::{ClientId, LockId, Mode};
use crate::manager::contention::{contended, grant_as, hold_ms};
use crate::manager::revoke::{Holder, HolderAction, Request, Verdict, judge};
use crate::manager::{Answer, GrantAs, GrantState};
use crate::proto::{Event, LockCommand, LockFlags};
use crate::table::{ClientState, LockManagerCell, SlotState, WaiterState};

/// What the revoke decision left for the word step.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Revoked {
    /// A grant the word makes may be recorded as cached.
    pub(super) cached: bool,
    /// The request asked for a cached grant on a contended lock (`manager::contention`): a
    /// grant the word makes counts as a contended grant (`Counter::ContendedGrants`). Whether
    /// the holder is told its grant is plain does not read it: every cacheable request not
    /// recorded cached is (`CommandResult::plain` at protocol 8, else a revoke for it at once,
    /// `tell_plain_grant`), an atomic takeover or a fair preemption too.
    pub(super) contended: bool,
    /// Someone wants the lock already (`Verdict::wanted`): a cached grant's minimum hold
    /// ends in a retry of the parked requests, which revokes it.
    pub(super) wanted: bool,
    /// A holder's grant lapsed and was released: the lock's waiters may now get it.
    pub(super) lapsed: bool,
    /// A conflicting cached holder is still inside its minimum hold (`RevokeAt`): the request
    /// is refused or parked until the hold ends (`Counter::MinHoldConflicts`, which the
    /// callers count once per request: `Server::count_min_hold`).
    pub(super) held: bool,
}

impl Server<'_> {
    /// Runs the revoke decision for acquisition `c` by client `slot` on lock slot `lock`
    /// (module doc). Always inlined: its common case, a lock nobody caches, is one load and
    /// a branch, which a call from the data path's command loop cost more than.
    #[inline(always)]
    pub(super) fn revoke_decision(
        &mut self,
        slot: u32,
        lock: u32,
        c: &LockCommand,
        now_ms: u64,
    ) -> Revoked {
        let cacheable = c.flags.contains(LockFlags::CACHEABLE);
        let m = self.t.lock_manager[lock as usize];
        // With nobody caching the lock, the scan can only wake a plain holder below protocol 8
        // on a contended lock (module doc): without such clients registered it has no work.
        let wakes = self.old_clients != 0 && contended(&self.cfg.timing, m.contended_ms, now_ms);
        let revoked = match m.cached == 0 && !wakes {
            true => Revoked {
                cached: cacheable,
                wanted: cacheable && self.others_parked(slot, lock),
                ..Revoked::default()
            },
            false => self.revoke_scan(slot, lock, c, now_ms),
        };
        self.contention_aware(lock, revoked, now_ms)
    }

    /// Turns a cached grant on a contended lock into a plain one with a notice
    /// (`manager::contention`). Runs after the scan, whose revokes stamp the lock: a request
    /// that has just sent one is the conflict that makes the lock contended.
    #[inline]
    fn contention_aware(&self, lock: u32, revoked: Revoked, now_ms: u64) -> Revoked {
        let conflict = self.t.lock_manager[lock as usize].contended_ms;
        match grant_as(&self.cfg.timing, revoked.cached, conflict, now_ms) {
            GrantAs::Contended => Revoked {
                cached: false,
                wanted: false,
                contended: true,
                ..revoked
            },
            GrantAs::Plain | GrantAs::Cached => revoked,
        }
    }

    /// Whether a request other than client `slot`'s is parked on lock slot `lock`.
    fn others_parked(&self, slot: u32, lock: u32) -> bool {
        match self.t.lock_waiters[lock as usize] {
            0 => false,
            head => head != slot + 1 || self.t.waiters[slot as usize].next != 0,
        }
    }

    #[cold]
    fn revoke_scan(&mut self, slot: u32, lock: u32, c: &LockCommand, now_ms: u64) -> Revoked {
        let req = Request {
            kind: c.kind,
            mode: c.op.mode(),
            slot,
            waits: c.wait_ms != 0,
            cacheable: c.flags.contains(LockFlags::CACHEABLE),
            others_waiting: self.others_parked(slot, lock),
        };
        self.judge_holders(&req, lock, now_ms)
    }

    /// Judges every holder of lock slot `lock` for `req` and acts on each (module doc).
    fn judge_holders(&mut self, req: &Request, lock: u32, now_ms: u64) -> Revoked {
        let timing = self.cfg.timing;
        let cell: LockManagerCell = self.t.lock_manager[lock as usize];
        let contended = contended(&timing, cell.contended_ms, now_ms);
        let (mut verdict, mut lapsed, mut cached_left) = (Verdict::NONE, false, false);
        // A revoke sent now lapses at `now + timeout`: a parked request is retried then.
        let mut lapses_ms = u64::MAX;
        // The earliest minimum hold that ends before a holder may be revoked.
        let mut due_ms = u64::MAX;
        for other in 0..self.t.client_free.high_water() {
            let state = self.recorded_hold(other, lock);
            if state.is_none() {
                continue;
            }
            let entry = self.t.clients[other as usize];
            let h = Holder {
                slot: other,
                state,
                dead: entry.client_state() == ClientState::Retaining,
                granted_ms: cell.cached_since_ms,
                contended_ms: cell.contended_ms,
                revoke_sent_ms: cell.revoke_sent_ms,
                lease_ms: entry.lease_ms,
                version: entry.version,
            };
            let action = judge(req, &h, &timing, now_ms);
            verdict = verdict.with(&h, action);
            match action {
                HolderAction::Revoke { wanted } => {
                    self.send_revoke(other, lock, state, wanted, now_ms);
                    let timeout = timing.revoke_timeout_for(entry.lease_ms, entry.version);
                    lapses_ms = lapses_ms.min(now_ms.saturating_add(u64::from(timeout)));
                    cached_left = true;
                }
                HolderAction::Lapse => {
                    if let Some(id) = ClientId::new(entry.id) {
                        // The caller retries the lock's waiters once its command is done.
                        self.release_grant(other, id, lock, state.grant_mode(), now_ms);
                        if crate::mutated!(LapseWakesWaiters) {
                            self.wake_slot_waiters(lock, now_ms);
                        }
                        self.stats.bump(Counter::RevokesLapsed);
                        lapsed = true;
                    }
                }
                HolderAction::RevokeAt { due_ms: at } => {
                    due_ms = due_ms.min(at);
                    cached_left = true;
                }
                // A plain holder of a contended lock may hold a contended grant whose notice it
                // has not read, being parked on another lock: it is woken as a revoke would
                // wake it (module doc). One of protocol 8 read it in the grant's result and
                // has nothing to read.
                HolderAction::Blocks if contended && !entry.reads_plain_grants() => {
                    self.cut_wait_on_revoke(other, now_ms)
                }
                _ => cached_left |= state.is_cached(),
            }
        }
        let m = &mut self.t.lock_manager[lock as usize];
        if !cached_left {
            m.cached = 0;
        }
        m.retry_at_ms = match verdict.retry_at_ms().unwrap_or(u64::MAX).min(lapses_ms) {
            u64::MAX => 0,
            at => at,
        };
        // A request that does not wait leaves nobody parked to send the revoke when the hold
        // ends: the lock keeps it due, for the timer (the Linux DLM's `NOQUEUEBAST`), which
        // judges the holders again then and sends it, or finds it due still and keeps it.
        if !req.waits && due_ms != u64::MAX {
            m.deferred_revoke = deferred(req.slot, req.mode);
            self.revokes_due_ms = self.revokes_due_ms.min(due_ms);
        }
        let cached = matches!(verdict.answer(req), Answer::Grant { cached: true });
        Revoked {
            cached,
            wanted: cached && verdict.wanted(req),
            contended: false,
            lapsed,
            // A holder still inside its minimum hold is the only one that leaves a revoke due.
            held: due_ms != u64::MAX,
        }
    }

    /// Sends the revokes requests that did not wait left due by `now_ms` (`deferred_revoke`),
    /// as their retries would, and notes when the next one is due. Grants lapsed on the way
    /// wake the lock's waiters. Cold: it runs only when a trylock met a minimum hold.
    #[cold]
    pub(super) fn send_deferred_revokes(&mut self, now_ms: u64) {
        self.revokes_due_ms = u64::MAX;
        for lock in 0..self.t.lock_free.high_water() {
            let m = self.t.lock_manager[lock as usize];
            if m.deferred_revoke == 0 {
                continue;
            }
            if now_ms < m.retry_at_ms {
                self.revokes_due_ms = self.revokes_due_ms.min(m.retry_at_ms);
                continue;
            }
            let meta = SlotState(self.t.lock_meta[lock as usize].state);
            let mode = match m.deferred_revoke >> 31 {
                0 => Mode::Exclusive,
                _ => Mode::Shared,
            };
            self.t.lock_manager[lock as usize].deferred_revoke = 0;
            let req = Request {
                kind: meta.kind(),
                mode,
                slot: (m.deferred_revoke & !(1 << 31)) - 1,
                waits: false,
                cacheable: false,
                others_waiting: false,
            };
            if self.judge_holders(&req, lock, now_ms).lapsed {
                self.wake_slot_waiters(lock, now_ms);
            }
        }
    }

    /// Marks holder `other`'s cached grant on lock slot `lock` revoking and tells it so through
    /// its event ring (a full ring counts an overflow there, which makes the client re-check
    /// every lock it caches: the revoke is not lost, only coarser).
    fn send_revoke(&mut self, other: u32, lock: u32, state: GrantState, wanted: Mode, now: u64) {
        self.t
            .lock_holds
            .set(other, lock, state.with_revoke_sent().bits());
        let generation = SlotState(self.t.lock_meta[lock as usize].state).generation();
        let event = Event::Revoke {
            lock: LockId::new(lock, generation),
            wanted,
            fence: self.t.lock_cells[lock as usize].fence,
        };
        if let Some(ring) = self.t.event_rings.ring(other) {
            // A full ring counts the overflow in the ring itself, where its reader sees it.
            let _ = ring.push(&event);
        }
        self.t.lock_manager[lock as usize].revoke_sent_ms = now;
        // A conflict with a cached grant: the lock is contended from now.
        self.note_conflict(lock, now);
        self.events_pending = true;
        self.stats.bump(Counter::RevokesSent);
        self.cut_wait_on_revoke(other, now);
    }

    /// Ends the wait of client slot `other`'s parked request, if it asked for that
    /// ([`LockFlags::WAKE_ON_REVOKE`], module doc): its deadline is moved into the past and the
    /// waiters' timer set to now, so the next [`Server::poll_waiters`] decides it by the one
    /// path every expired wait takes (counted in `wait_timeouts`). Only the deadline moves and
    /// the request stays on its lock's queue, so this is safe while a queue is being walked: a
    /// parked request's retry can send revokes.
    fn cut_wait_on_revoke(&mut self, other: u32, now: u64) {
        let waiter = &mut self.t.waiters[other as usize];
        if waiter.state != WaiterState::Waiting as u8
            || !super::waiters::waiter_lock_flags(waiter.flags).contains(LockFlags::WAKE_ON_REVOKE)
        {
            return;
        }
        // `past` is strict: a deadline one tick back has passed now (at tick 0 it passes at the
        // next tick, which the timer below looks at anyway).
        waiter.deadline_ms = waiter.deadline_ms.min(now.saturating_sub(1));
        self.next_timer_ms = self.next_timer_ms.min(now);
    }

    /// Tells client slot `slot`, just granted lock slot `lock` plain though it asked for a
    /// cached grant (on a contended lock, or over a holder in its way the word took over or
    /// preempted), to give it back when its users are done. `true`: the client reads that in
    /// the grant's own result (protocol 8, `ClientEntry::reads_plain_grants`), which the
    /// caller marks. `false`: an older client, sent the notice at once: a revoke wanting
    /// exclusive (a shared holder gives back rather than keeps) that names the grant's own fence
    /// (kept by the client even when it overtakes the grant's reply). The grant is not marked
    /// revoking and the lock's times are not stamped: a plain grant has nothing to lapse, and
    /// only conflicts make a lock contended (`manager::contention`). A full ring
    /// counts an overflow, after which the client gives back every idle cached lock: the notice
    /// is coarser, not lost. A grant an all-or-nothing unit undoes afterwards leaves its notice
    /// behind, which the client ignores: it holds nothing, or a later grant with a larger token.
    #[must_use]
    pub(super) fn tell_plain_grant(&mut self, slot: u32, lock: u32) -> bool {
        if self.t.clients[slot as usize].reads_plain_grants() {
            return true;
        }
        let generation = SlotState(self.t.lock_meta[lock as usize].state).generation();
        let event = Event::Revoke {
            lock: LockId::new(lock, generation),
            wanted: Mode::Exclusive,
            fence: self.t.lock_cells[lock as usize].fence,
        };
        if let Some(ring) = self.t.event_rings.ring(slot) {
            let _ = ring.push(&event);
        }
        self.events_pending = true;
        false
    }

    /// Notes that an acquisition found lock slot `lock` held in a conflicting mode at `now_ms`
    /// (refused, or left waiting): the lock is contended from now (`manager::contention`), so a
    /// lock fought over by plain holders stays plain while the fight goes on instead of turning
    /// cacheable once per window and paying a revoke. Nothing with the rule off (window 0):
    /// the cell stays untouched, as before the rule. The stamp is never 0, which the cell
    /// reads as "no conflict": a conflict in a server's first millisecond (its clock starts at
    /// 0) makes the lock contended for one millisecond longer, the safe side (never cached
    /// early).
    #[inline]
    pub(super) fn note_conflict(&mut self, lock: u32, now_ms: u64) {
        if self.cfg.timing.contention_window_ms != 0 {
            self.t.lock_manager[lock as usize].contended_ms = now_ms.max(1);
        }
    }

    /// Records that a cached grant on lock slot `lock` was made at `now_ms`. When the lock is
    /// `wanted` already, the parked requests are retried when the grant's minimum hold ends
    /// (at once on a lock fought over just before, `manager::contention::hold_ms`): their
    /// revoke decision then asks for it back.
    #[inline]
    pub(super) fn note_cached_grant(&mut self, lock: u32, wanted: bool, now_ms: u64) {
        let m = &mut self.t.lock_manager[lock as usize];
        let hold = hold_ms(&self.cfg.timing, m.contended_ms, now_ms);
        let hold_end = now_ms.saturating_add(u64::from(hold));
        m.cached = 1;
        m.cached_since_ms = now_ms;
        if wanted && (m.retry_at_ms == 0 || hold_end < m.retry_at_ms) {
            m.retry_at_ms = hold_end;
            // The waiters' timer looks again no later than that.
            self.next_timer_ms = self.next_timer_ms.min(hold_end);
        }
    }

    /// Counts a request's attempt that met a conflicting cached grant inside its minimum hold
    /// (`Counter::MinHoldConflicts`), unless an earlier attempt of the same request met one
    /// (`met_before`: a parked request's `WAITER_MET_HOLD`): once per request. Whether the
    /// request has met one now, for the parked request's flag.
    #[inline]
    pub(super) fn count_min_hold(&mut self, note: super::data::Note, met_before: bool) -> bool {
        if note.met_hold && !met_before {
            self.stats.bump(Counter::MinHoldConflicts);
        }
        note.met_hold || met_before
    }

    /// Whether a revoke was written into some client's event ring since the last call: the
    /// transport then drains the rings of its stream clients (and wakes shared-memory ones).
    #[inline]
    pub fn take_events_pending(&mut self) -> bool {
        core::mem::take(&mut self.events_pending)
    }

    /// Client slot `slot`'s event ring (`None` past the table): the transport reads it for
    /// the client, or hands its place in the region to a shared-memory client.
    #[inline]
    pub fn event_ring(&self, slot: u32) -> Option<crate::table::EventRing<'_>> {
        self.t.event_rings.ring(slot)
    }
}

/// A lock manager cell's `deferred_revoke` for a request by client `slot` wanting `mode`.
fn deferred(slot: u32, mode: Mode) -> u32 {
    let shared = match mode {
        Mode::Exclusive => 0,
        Mode::Shared => 1 << 31,
    };
    (slot + 1) | shared
}
