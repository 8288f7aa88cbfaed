//! The fair lock's transitions against a plain model of the reference, its queue order under
//! random client sequences, and the server's guards row by row.

use super::*;
use proptest::prelude::*;
use std::collections::BTreeSet;
use std::string::String;
use std::vec::Vec;

const EX: Mode = Mode::Exclusive;
const SH: Mode = Mode::Shared;
const FAIL: (Status, Effect) = (Status::Fail, Effect::None);

fn c(id: u32) -> ClientId {
    ClientId::new(id).unwrap()
}

fn t(exclusive: u16, shared: u16) -> Ticket {
    Ticket { exclusive, shared }
}

fn won(mode: Mode, preempted: bool) -> (Status, Effect) {
    (Status::Success, granted(mode, preempted))
}

fn waits(ticket: Ticket) -> (Status, Effect) {
    (Status::Eagain, Effect::Queued(ticket))
}

fn freed(mode: Mode) -> (Status, Effect) {
    (Status::Success, Effect::Released(mode))
}

/// The reference model: the reference's fields as plain integers, no bit packing.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Model {
    nx: u16,
    ns: u16,
    mx: u16,
    ms: u16,
    rms: u16,
    rflag: bool,
    rcnt: u8,
    timeout: u64,
    owner: u32,
}

/// A model with these counters and `rms == ns`, nothing held, timeout 0.
fn at(nx: u16, ns: u16, mx: u16, ms: u16) -> Model {
    let mut m = Model::default();
    (m.nx, m.ns, m.mx, m.ms, m.rms) = (nx, ns, mx, ms, ns);
    m
}

impl Model {
    fn with(mut self, change: impl FnOnce(&mut Model)) -> Model {
        change(&mut self);
        self
    }
}

#[derive(Clone, Copy, Debug)]
enum Op {
    First(u32, Mode, u32),
    Retry(u32, Mode, Ticket, u32),
    Unlock(u32, Mode, Ticket),
    Extend(u32, Mode, Ticket, u32),
}

/// `(b − a) mod 2^16`, computed without wrapping arithmetic.
fn dist(a: u16, b: u16) -> u32 {
    (b as u32 + 0x1_0000 - a as u32) % 0x1_0000
}

fn before(a: u16, b: u16) -> bool {
    (1..0x8000).contains(&dist(a, b))
}

fn model_apply(m: Model, op: Op, now: u64) -> (Model, Status, Effect) {
    let mut n = m;
    let voided = |ts: u16| m.rflag && before(ts, m.rms);
    let may_act = |who: u32| m.owner == who || m.owner == 0;
    // A normal grant: a writer owns the lock, a reader joins; the timeout only grows.
    let grant = |n: &mut Model, who: u32, mode: Mode, exp: u32| {
        if mode == EX {
            (n.owner, n.timeout) = (who, now + exp as u64);
        } else {
            (n.rcnt, n.timeout) = (n.rcnt + 1, n.timeout.max(now + exp as u64));
        }
        granted(mode, false)
    };
    let effect = match op {
        Op::First(..) if dist(m.nx, m.mx) >= 0x7FFF || dist(m.ns, m.ms) >= 0x7FFF => {
            return (m, Status::Fail, Effect::None);
        }
        Op::First(who, mode, exp) => {
            let ready = (mode == EX && m.ns == m.ms) || (mode == SH && m.rcnt < 63);
            n.mx = m.mx.wrapping_add((mode == EX) as u16);
            n.ms = m.ms.wrapping_add((mode == SH) as u16);
            if !(m.owner == 0 && m.nx == m.mx && ready) {
                return (n, Status::Eagain, Effect::Queued(t(m.mx, m.ms)));
            }
            grant(&mut n, who, mode, exp)
        }
        Op::Retry(who, mode, tk, exp) => {
            let (tx, ts) = (tk.exclusive, tk.shared);
            let ts_passed = (mode == EX && before(ts, m.ns)) || (mode == SH && voided(ts));
            if before(tx, m.nx) || ts_passed {
                return (m, Status::Fail, Effect::None);
            }
            let ready = (mode == EX && ts == m.ns) || (mode == SH && m.rcnt < 63);
            if m.owner == 0 && tx == m.nx && ready {
                grant(&mut n, who, mode, exp)
            } else if now > m.timeout {
                (n.nx, n.ns, n.rms, n.rflag) = (tx, ts, ts, true);
                n.timeout = now + exp as u64;
                (n.rcnt, n.owner) = if mode == EX { (0, who) } else { (1, 0) };
                granted(mode, true)
            } else {
                return (m, Status::Eagain, Effect::Queued(tk));
            }
        }
        Op::Unlock(who, EX, tk) if may_act(who) && (m.nx, m.ns) == (tk.exclusive, tk.shared) => {
            (n.nx, n.owner, n.rflag) = (m.nx.wrapping_add(1), 0, false);
            n.timeout = now + HANDOFF_MS as u64;
            Effect::Released(EX)
        }
        Op::Unlock(_, SH, tk)
            if m.owner == 0 && !voided(tk.shared) && m.nx == tk.exclusive && m.rcnt > 0 =>
        {
            (n.ns, n.rcnt) = (m.ns.wrapping_add(1), m.rcnt - 1);
            if n.rcnt == 0 {
                n.timeout = now + HANDOFF_MS as u64;
            }
            n.rflag &= dist(n.rms, n.ns) < 50;
            Effect::Released(SH)
        }
        Op::Extend(who, mode, tk, exp)
            if may_act(who)
                && tk.exclusive == m.nx
                && !voided(tk.shared)
                && (mode == SH || tk.shared == m.ns) =>
        {
            if exp != 0 {
                n.timeout = m.timeout.max(now + exp as u64);
            }
            Effect::Extended
        }
        Op::Unlock(..) | Op::Extend(..) => return (m, Status::Fail, Effect::None),
    };
    (n, Status::Success, effect)
}

fn apply(s: FairLock, op: Op, now: u64) -> Outcome<FairLock> {
    match op {
        Op::First(who, mode, exp) => try_lock(s, c(who), mode, exp, now),
        Op::Retry(who, mode, tk, exp) => try_ticket(s, c(who), mode, tk, exp, now),
        Op::Unlock(who, mode, tk) => unlock(s, c(who), mode, tk, now),
        Op::Extend(who, mode, tk, exp) => extend(s, c(who), mode, tk, exp, now),
    }
}

// Test-only helpers that thread one lock state through a scenario.
impl FairLock {
    /// Applies `op`, keeps the state it leaves, and returns status and effect.
    fn step(&mut self, op: Op, now: u64) -> (Status, Effect) {
        let out = apply(*self, op, now);
        *self = out.state;
        (out.status, out.effect)
    }

    /// Runs a script of (operation, tick, expected status and effect).
    fn run(&mut self, script: &[(Op, u64, (Status, Effect))]) {
        for &(op, now, want) in script {
            assert_eq!(self.step(op, now), want, "{op:?} at {now}");
        }
    }
}

/// Packs the model by hand from the layout table in the module doc, so comparing against
/// it also checks that the bitfield puts every field where the table says.
fn to_lock(m: Model) -> FairLock {
    let bits = m.nx as u128
        | (m.ns as u128) << 16
        | (m.mx as u128) << 32
        | (m.ms as u128) << 48
        | (m.rms as u128) << 64
        | (m.rflag as u128) << 80
        | (m.rcnt as u128) << 81
        | (m.timeout as u128) << 88;
    FairLock {
        word: FairWord::from_bits(bits),
        owner: m.owner,
    }
}

/// The category of an outcome: the operation, the status and the effect without a ticket.
fn kind(op: Op, status: Status, effect: Effect) -> String {
    let op = format!("{op:?}");
    let op = &op[..op.find('(').unwrap()];
    let effect = match effect {
        Effect::Granted { mode, preempted } => format!("{mode:?}/{preempted}"),
        Effect::Queued(_) => String::from("Queued"),
        e => format!("{e:?}"),
    };
    format!("{op}:{status:?}:{effect}")
}

#[test]
fn every_state_and_operation_matches_the_model() {
    let now = 10_000;
    let idle = at(10, 20, 10, 20);
    let shapes = [
        idle,
        idle.with(|m| (m.mx, m.owner) = (11, 1)), // exclusive held
        idle.with(|m| (m.ms, m.rcnt) = (21, 1)),  // one reader
        idle.with(|m| (m.ms, m.rcnt) = (83, 63)), // 63 readers
        idle.with(|m| (m.mx, m.owner) = (12, 1)), // exclusive held, one exclusive queued
        idle.with(|m| (m.mx, m.ms, m.owner) = (11, 21, 1)), // one shared queued
        idle.with(|m| (m.mx, m.ms, m.owner, m.rflag) = (12, 22, 1, true)), // after preemption
        idle.with(|m| (m.ns, m.ms, m.rcnt, m.rflag) = (22, 25, 1, true)), // 2 unlocks later
        idle.with(|m| (m.mx, m.owner) = (10 + QUEUE_MAX, 1)), // exclusive queue full
        idle.with(|m| (m.ms, m.rcnt) = (20 + QUEUE_MAX, 1)), // shared queue full
    ];
    let mut seen = BTreeSet::new();
    for shape in shapes {
        // Each shape with a live and with an expired timeout.
        for timeout in [now + 500, now - 1] {
            let m = Model { timeout, ..shape };
            let mut ops = Vec::new();
            for (who, mode) in [(1, EX), (2, EX), (1, SH), (2, SH)] {
                ops.extend([Op::First(who, mode, 300), Op::First(who, mode, 0)]);
                // Passed, current and future tickets, and one just before `rms`.
                let ns = [m.ns.wrapping_sub(1), m.ns, m.ns + 1, m.rms.wrapping_sub(1)];
                for tx in [m.nx.wrapping_sub(1), m.nx, m.nx + 1] {
                    for tk in ns.map(|ts| t(tx, ts)) {
                        ops.extend([Op::Retry(who, mode, tk, 300), Op::Unlock(who, mode, tk)]);
                        ops.extend([0, 900].map(|exp| Op::Extend(who, mode, tk, exp)));
                    }
                }
            }
            for op in ops {
                let (m2, status, effect) = model_apply(m, op, now);
                let out = apply(to_lock(m), op, now);
                assert_eq!((out.status, out.effect), (status, effect), "{m:?} {op:?}");
                assert_eq!(out.state, to_lock(m2), "{m:?} {op:?}");
                seen.insert(kind(op, status, effect));
            }
        }
    }
    // Every kind of outcome was reached, and no other (an unlock never queues, say).
    let expected = "First:Success:Exclusive/false First:Success:Shared/false \
        First:Eagain:Queued First:Fail:None Retry:Success:Exclusive/false \
        Retry:Success:Exclusive/true Retry:Success:Shared/false Retry:Success:Shared/true \
        Retry:Eagain:Queued Retry:Fail:None Unlock:Success:Released(Exclusive) \
        Unlock:Success:Released(Shared) Unlock:Fail:None Extend:Success:Extended \
        Extend:Fail:None";
    assert_eq!(seen, expected.split(' ').map(String::from).collect());
}

#[test]
fn ticket_before_is_half_range_mod_2_16() {
    assert!(ticket_before(1, 2) && !ticket_before(2, 1) && !ticket_before(7, 7));
    assert!(ticket_before(0xFFFF, 0) && !ticket_before(0, 0xFFFF));
    assert!(ticket_before(0, 0x7FFF) && !ticket_before(0, 0x8000));
}

#[test]
fn fair_lock_grants_in_ticket_order() {
    let mut s = FairLock::default();
    assert_eq!(s.step(Op::First(1, EX, 1_000), 0), won(EX, false));
    let holders = [
        (1, EX, t(0, 0)),
        (2, EX, t(1, 0)),
        (3, SH, t(2, 0)),
        (4, EX, t(2, 1)),
    ];
    for &(who, mode, ticket) in &holders[1..] {
        assert_eq!(s.step(Op::First(who, mode, 1_000), 0), waits(ticket));
    }
    for (i, &(who, mode, ticket)) in holders.iter().enumerate() {
        let now = 10 * i as u64 + 10;
        // Later tickets wait, both before and after the next one claims its turn.
        for claimed in [false, true] {
            if claimed && i > 0 {
                let retry = Op::Retry(who, mode, ticket, 1_000);
                assert_eq!(s.step(retry, now), won(mode, false));
            }
            for &(later, mode, ticket) in &holders[i + 1..] {
                let retry = Op::Retry(later, mode, ticket, 1_000);
                assert_eq!(s.step(retry, now), waits(ticket), "{later} on {who}'s turn");
            }
        }
        assert_eq!(s.step(Op::Unlock(who, mode, ticket), now), freed(mode));
    }
    assert!(s.is_idle());
}

#[test]
fn expired_holder_is_preempted_by_waiting_ticket() {
    for mode in [EX, SH] {
        let mut s = FairLock::default();
        let tk = t(1, 0);
        s.run(&[
            (Op::First(1, EX, 100), 0, won(EX, false)),
            (Op::First(2, mode, 500), 0, waits(tk)),
            // At the expiry tick itself the holder's grant still stands.
            (Op::Retry(2, mode, tk, 500), 100, waits(tk)),
            (Op::Retry(2, mode, tk, 500), 101, won(mode, true)),
        ]);
        assert_eq!(s.owner, if mode == EX { 2 } else { 0 });
        assert!(s.word.rflag() && s.word.nx() == 1 && s.word.timeout_ms() == 601);
        // The evicted holder finds out only when its extend or unlock fails.
        s.run(&[
            (Op::Extend(1, EX, t(0, 0), 100), 102, FAIL),
            (Op::Unlock(1, EX, t(0, 0)), 102, FAIL),
            (Op::Unlock(2, mode, tk), 103, freed(mode)),
        ]);
    }
}

#[test]
fn abandoned_ticket_is_skipped_after_handoff_window() {
    let mut s = to_lock(at(4, 0, 4, 0));
    let window_end = 100 + HANDOFF_MS as u64;
    s.run(&[
        (Op::First(1, EX, 500), 0, won(EX, false)),
        (Op::First(2, EX, 500), 0, waits(t(5, 0))),
        (Op::First(3, EX, 500), 0, waits(t(6, 0))),
        // Client 2 drops ticket 5 without telling the server; client 1 unlocks at 100.
        (Op::Unlock(1, EX, t(4, 0)), 100, freed(EX)),
        (Op::Retry(3, EX, t(6, 0), 500), window_end, waits(t(6, 0))),
        (
            Op::Retry(3, EX, t(6, 0), 500),
            window_end + 1,
            won(EX, true),
        ),
        (Op::Retry(2, EX, t(5, 0), 500), window_end + 2, FAIL),
    ]);
    assert_eq!((s.word.nx(), s.owner), (6, 3));
}

#[test]
fn passed_ticket_is_refused() {
    // After an exclusive preemption at (3, 7): exclusive tickets before 3 are passed, and so
    // are shared tickets before 7 while `rflag` is set.
    let preempted = at(3, 7, 5, 9).with(|m| (m.rflag, m.owner, m.timeout) = (true, 1, 50));
    // Without `rflag`, a shared ticket behind `ns` is not passed: readers finish out of order.
    let reset = preempted.with(|m| (m.rflag, m.owner) = (false, 0));
    for (m, op, want) in [
        (preempted, Op::Retry(2, EX, t(2, 9), 100), FAIL),
        (preempted, Op::Retry(2, EX, t(4, 6), 100), FAIL),
        (preempted, Op::Retry(2, SH, t(2, 9), 100), FAIL),
        (preempted, Op::Retry(2, SH, t(3, 6), 100), FAIL),
        (preempted, Op::Retry(2, SH, t(3, 7), 100), waits(t(3, 7))),
        (reset, Op::Retry(2, SH, t(3, 6), 100), won(SH, false)),
    ] {
        assert_eq!(to_lock(m).step(op, 10), want, "{m:?} {op:?}");
    }
}

#[test]
fn sixty_fourth_reader_queues() {
    let mut s = FairLock::default();
    for who in 1..=63 {
        s.run(&[(Op::First(who, SH, 1_000), 0, won(SH, false))]);
    }
    s.run(&[
        (Op::First(64, SH, 1_000), 0, waits(t(0, 63))),
        (Op::Retry(64, SH, t(0, 63), 1_000), 1, waits(t(0, 63))),
        (Op::Unlock(1, SH, t(0, 0)), 2, freed(SH)),
        (Op::Retry(64, SH, t(0, 63), 1_000), 3, won(SH, false)),
    ]);
    assert_eq!(s.word.rcnt(), FAIR_READERS_MAX);
}

#[test]
fn queue_limit_refuses_with_fail() {
    // Client 9 holds exclusive ticket 0, so first attempts queue until the limit.
    let held = at(0, 0, 1, 0).with(|m| (m.owner, m.timeout) = (9, 100));
    let ex_full = held.with(|m| m.mx = QUEUE_MAX - 1);
    let sh_full = held.with(|m| m.ms = QUEUE_MAX - 1);
    for (m, mode, ticket) in [
        (ex_full, EX, t(QUEUE_MAX - 1, 0)),
        (sh_full, SH, t(1, QUEUE_MAX - 1)),
    ] {
        let mut s = to_lock(m);
        s.run(&[(Op::First(1, mode, 10), 0, waits(ticket))]);
        let full = s;
        s.run(&[
            (Op::First(2, EX, 10), 0, FAIL),
            (Op::First(2, SH, 10), 0, FAIL),
        ]);
        assert_eq!(s, full);
    }
}

#[test]
fn counters_wrap_mod_2_16() {
    let top = 0xFFFE;
    let mut s = to_lock(at(top, top, top, top));
    let tickets = [t(top, top), t(0xFFFF, top), t(0, top), t(1, top)];
    s.run(&[(Op::First(1, EX, 100), 0, won(EX, false))]);
    for (who, &tk) in (2..=4).zip(&tickets[1..]) {
        s.run(&[(Op::First(who, EX, 100), 0, waits(tk))]);
    }
    for (who, pair) in (1..=3).zip(tickets.windows(2)) {
        s.run(&[
            (Op::Unlock(who, EX, pair[0]), 1, freed(EX)),
            (Op::Retry(who + 1, EX, pair[1], 100), 1, won(EX, false)),
            // The ticket just served is behind `nx` now, across the wrap too.
            (Op::Retry(who, EX, pair[0], 100), 1, FAIL),
        ]);
    }
    s.run(&[(Op::Unlock(4, EX, t(1, top)), 2, freed(EX))]);
    assert!(s.is_idle() && s.word.nx() == 2);
}

#[test]
fn extend_in_both_modes() {
    let extended = (Status::Success, Effect::Extended);
    let writer = to_lock(at(1, 3, 2, 3).with(|m| (m.owner, m.timeout) = (1, 500)));
    let readers = to_lock(at(1, 3, 1, 5).with(|m| (m.rcnt, m.timeout) = (2, 500)));
    for (s, op, want, timeout) in [
        (writer, Op::Extend(1, EX, t(1, 3), 1_000), extended, 1_100),
        (writer, Op::Extend(1, EX, t(1, 3), 10), extended, 500), // never shortens
        (writer, Op::Extend(1, EX, t(1, 3), 0), extended, 500),  // only validates
        (writer, Op::Extend(2, EX, t(1, 3), 1_000), FAIL, 500),  // not the owner
        (writer, Op::Extend(1, EX, t(1, 2), 1_000), FAIL, 500),  // not the current ticket
        (readers, Op::Extend(2, SH, t(1, 4), 1_000), extended, 1_100),
        (readers, Op::Extend(2, SH, t(0, 4), 1_000), FAIL, 500),
    ] {
        let mut s = s;
        assert_eq!(s.step(op, 100), want, "{op:?}");
        assert_eq!(s.word.timeout_ms(), timeout, "{op:?}");
    }
    let far = extend(writer, c(1), EX, t(1, 3), u32::MAX, TIMEOUT_MS_MAX - 5).state;
    assert_eq!(far.word.timeout_ms(), TIMEOUT_MS_MAX, "clamped to 40 bits");
}

#[test]
fn failed_ops_return_the_current_word() {
    let m = at(1, 3, 3, 4).with(|m| (m.rflag, m.owner, m.timeout) = (true, 1, 900));
    let full = m.with(|m| m.mx = QUEUE_MAX + 1);
    for (m, op) in [
        (full, Op::First(2, EX, 100)),
        (m, Op::Retry(2, EX, t(0, 3), 100)),
        (m, Op::Retry(2, SH, t(2, 2), 100)),
        (m, Op::Unlock(2, EX, t(1, 3))),
        (m, Op::Unlock(2, SH, t(1, 3))),
        (m, Op::Extend(1, EX, t(1, 2), 100)),
    ] {
        let out = apply(to_lock(m), op, 1_000);
        assert_eq!((out.status, out.effect), FAIL, "{op:?}");
        assert_eq!(out.state, to_lock(m), "{op:?}");
    }
}

#[test]
fn rflag_reset_revives_a_voided_ticket_as_in_the_reference() {
    let mut s = FairLock::default();
    // Client 3 preempts past the expired writer 1 and voids client 2's earlier ticket.
    s.run(&[
        (Op::First(1, EX, 100), 0, won(EX, false)),
        (Op::First(2, SH, 100), 0, waits(t(1, 0))),
        (Op::First(3, SH, 100), 0, waits(t(1, 1))),
        (Op::Retry(3, SH, t(1, 1), 100), 101, won(SH, true)),
        (Op::Unlock(3, SH, t(1, 1)), 102, freed(SH)),
    ]);
    for ts in 2..51 {
        s.run(&[(Op::First(5, SH, 100), 103, won(SH, false))]);
        s.run(&[(Op::Unlock(5, SH, t(1, ts)), 103, freed(SH))]);
    }
    // 50 unlocks after the preemption `rflag` is clear and ticket (1, 0) counts again.
    s.run(&[
        (Op::First(4, SH, 100_000), 104, won(SH, false)),
        (Op::First(6, EX, 100_000), 104, waits(t(1, 52))),
        (Op::Retry(2, SH, t(1, 0), 100), 105, won(SH, false)),
        (Op::Unlock(2, SH, t(1, 0)), 105, freed(SH)),
        (Op::Retry(6, EX, t(1, 52), 100), 106, won(EX, false)),
    ]);
    assert_eq!(s.word.rcnt(), 1, "the writer was granted beside reader 4");
}

/// What a simulated client believes, from the replies it got.
#[derive(Clone, Copy, Debug)]
enum Belief {
    Idle,
    Queued(Mode, Ticket),
    Held {
        mode: Mode,
        ticket: Ticket,
        until: u64,
    },
}

/// A client's next move: the protocol's next step, an extend while held, or dropping a
/// ticket locally (what the reference client's unlock does while it is only queued).
#[derive(Clone, Copy, Debug)]
enum Act {
    Advance,
    Extend,
    Abandon,
}

fn act_strategy() -> impl Strategy<Value = (u32, Act, bool, u32, u64)> {
    let act = prop_oneof![6 => Just(Act::Advance), 1 => Just(Act::Extend), 1 => Just(Act::Abandon)];
    (1u32..=4, act, any::<bool>(), 0u32..4_000, 0u64..3_000)
}

/// Marks every ticket before `upto` resolved (`mark`), and tells whether all of them are.
fn resolve_before(tickets: &mut [(u16, bool)], upto: u16, mark: bool) -> bool {
    let earlier = tickets.iter_mut().filter(|e| ticket_before(e.0, upto));
    earlier.fold(true, |all, e| {
        e.1 |= mark;
        all && e.1
    })
}

proptest! {
    /// Four clients follow the client protocol with random timing and expiries. After every
    /// step the word equals the model; among clients holding a grant that no preemption took
    /// and that is not past their own expiry, there is at most one writer and never a writer
    /// beside a reader; `rcnt` and `owner` match the holders no preemption took; and a grant
    /// that does not preempt comes only after every earlier ticket was served or passed.
    #[test]
    fn random_client_sequences_keep_order_and_exclusion(
        base in prop_oneof![Just(0u16), 0xFFC0u16.., any::<u16>()],
        acts in proptest::collection::vec(act_strategy(), 1..300),
    ) {
        let (mut m, mut now) = (at(base, base, base, base), 0u64);
        let mut s = to_lock(m);
        // Per client id: its belief, and whether a preemption took its grant away.
        let mut clients = [(Belief::Idle, false); 5];
        // Every ticket issued, per mode, and whether it was served or passed.
        let (mut ex_tickets, mut sh_tickets) = (Vec::new(), Vec::new());
        for (who, act, exclusive, exp, dt) in acts {
            now += dt;
            let i = who as usize;
            let op = match (act, clients[i].0) {
                (Act::Advance, Belief::Idle) => {
                    Op::First(who, if exclusive { EX } else { SH }, exp)
                }
                (Act::Advance, Belief::Queued(mode, tk)) => Op::Retry(who, mode, tk, exp),
                (Act::Advance, Belief::Held { mode, ticket, .. }) => {
                    Op::Unlock(who, mode, ticket)
                }
                (Act::Extend, Belief::Held { mode, ticket, .. }) => {
                    Op::Extend(who, mode, ticket, exp)
                }
                (Act::Abandon, Belief::Queued(..)) => {
                    clients[i].0 = Belief::Idle;
                    continue;
                }
                _ => continue,
            };
            let out = apply(s, op, now);
            let (m2, status, effect) = model_apply(m, op, now);
            prop_assert_eq!((out.status, out.effect), (status, effect), "{:?}", op);
            prop_assert_eq!(out.state, to_lock(m2));
            let first = s.next_ticket();
            (s, m) = (out.state, m2);
            let (Op::First(_, mode, _) | Op::Retry(_, mode, ..) | Op::Unlock(_, mode, _)
                | Op::Extend(_, mode, ..)) = op;
            if matches!(op, Op::First(..)) && status != Status::Fail {
                match mode {
                    EX => ex_tickets.push((first.exclusive, false)),
                    SH => sh_tickets.push((first.shared, false)),
                }
            }
            match out.effect {
                Effect::Granted { preempted, .. } => {
                    let ticket = if let Op::Retry(_, _, tk, _) = op { tk } else { first };
                    if preempted {
                        for (j, other) in clients.iter_mut().enumerate() {
                            other.1 |= j != i && matches!(other.0, Belief::Held { .. });
                        }
                    }
                    let ex_done = resolve_before(&mut ex_tickets, ticket.exclusive, preempted);
                    let sh_done = resolve_before(&mut sh_tickets, ticket.shared, preempted);
                    prop_assert!(ex_done && (mode == SH || sh_done), "{:?} jumped", op);
                    let (own, list) = match mode {
                        EX => (ticket.exclusive, &mut ex_tickets),
                        SH => (ticket.shared, &mut sh_tickets),
                    };
                    list.iter_mut().filter(|e| e.0 == own).for_each(|e| e.1 = true);
                    let until = now + exp as u64;
                    clients[i] = (Belief::Held { mode, ticket, until }, false);
                }
                Effect::Queued(tk) => clients[i].0 = Belief::Queued(mode, tk),
                Effect::Downgraded => prop_assert!(false, "the fair word has no downgrade"),
                Effect::Released(_) | Effect::Extended => {
                    prop_assert!(!clients[i].1, "{:?} succeeded on a preempted grant", op);
                    match (op, &mut clients[i].0) {
                        (Op::Extend(..), Belief::Held { until, .. }) if exp != 0 => {
                            *until = (*until).max(now + exp as u64);
                        }
                        (Op::Extend(..), _) => {}
                        (_, belief) => *belief = Belief::Idle,
                    }
                }
                // A refusal resets the client, as the reference client does.
                Effect::None => clients[i] = (Belief::Idle, false),
            }
            // Holders no preemption took; `live`: and not past their own expiry either.
            let holds = |j: usize, want: Mode, live: bool| match clients[j] {
                (Belief::Held { mode, until, .. }, false) => {
                    mode == want && (!live || now <= until)
                }
                _ => false,
            };
            let count = |want, live| (1..=4).filter(|&j| holds(j, want, live)).count();
            prop_assert!(count(EX, true) <= 1);
            prop_assert!(count(EX, true) == 0 || count(SH, true) == 0);
            prop_assert_eq!(s.word.rcnt() as usize, count(SH, false));
            let owner = (1..=4).find(|&j| holds(j, EX, false)).unwrap_or(0);
            prop_assert_eq!(s.owner, owner as u32);
        }
    }
}

/// Idle means every part of the lock at rest: a holder, a reader, or a ticket queued in
/// either mode each keeps it busy.
#[test]
fn a_lock_is_idle_only_with_nothing_held_and_nothing_queued() {
    let at_rest = FairLock {
        word: FairWord::new().with_nx(7).with_mx(7).with_ns(3).with_ms(3),
        owner: 0,
    };
    assert!(at_rest.is_idle());
    let w = at_rest.word;
    for (case, busy) in [
        (
            "a writer",
            FairLock {
                owner: 1,
                ..at_rest
            },
        ),
        (
            "a reader",
            FairLock {
                word: w.with_rcnt(1),
                ..at_rest
            },
        ),
        (
            "a writer queued",
            FairLock {
                word: w.with_mx(8),
                ..at_rest
            },
        ),
        (
            "a reader queued",
            FairLock {
                word: w.with_ms(4),
                ..at_rest
            },
        ),
    ] {
        assert!(!busy.is_idle(), "{case}");
    }
}
