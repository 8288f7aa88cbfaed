//! The hand-off's decisions, one claim each, with the invariants checked after every change.

use std::sync::Arc as StdArc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Wake, Waker};

use super::*;

const A: u32 = 1;
const B: u32 = 2;
const C: u32 = 3;

/// A scheduler with clients `ids` attached, and their bells.
fn sched(ids: &[u32]) -> (Sched, Vec<Arc<Bell>>) {
    let mut s = Sched::new(64, Arc::new(Bell::default()));
    let bells = ids
        .iter()
        .map(|&id| {
            let bell = Arc::new(Bell::default());
            s.attach(id, Arc::clone(&bell));
            bell
        })
        .collect();
    s.check();
    (s, bells)
}

/// `client` sends message `id` as ticket `id`; whether it must write the queue itself.
fn send(s: &mut Sched, client: u32, id: u16) -> bool {
    assert!(s.expect(client, u64::from(id), id));
    let write = s.enqueue(&[id as u8]);
    s.check();
    write
}

/// One step of `client` waiting for ticket `id` (deadline not passed).
fn step(s: &mut Sched, client: u32, id: u16) -> (Step, Duties) {
    let mut reply = [0u8; 8];
    let r = s.step(client, u64::from(id), &mut reply, false, false);
    s.check();
    r
}

/// The reply to `client`'s message `id` is read; returns the bells and tasks to wake.
fn file(s: &mut Sched, client: u32, id: u16) -> (usize, usize) {
    let mut wakes = Wakes::new();
    assert!(wakes.room());
    s.file(client, id, &[7], &mut wakes);
    s.check();
    (wakes.bells_n, wakes.tasks_n)
}

fn is_caller(succ: &Option<Successor>, bell: &Arc<Bell>) -> bool {
    matches!(succ, Some(Successor::Caller(b)) if Arc::ptr_eq(b, bell))
}

#[test]
fn the_first_waiter_reads_and_the_next_sleeps() {
    let (mut s, _) = sched(&[A, B]);
    assert!(send(&mut s, A, 1), "nobody pending: the sender writes");
    assert!(send(&mut s, B, 2));
    assert_eq!(step(&mut s, A, 1).0, Step::Lead);
    assert_eq!(s.reader(), Reader::Caller(A));
    assert_eq!(step(&mut s, B, 2).0, Step::Park);
}

#[test]
fn a_filed_reply_wakes_its_sleeping_caller_once_and_counts_it_pending() {
    let (mut s, _) = sched(&[A, B]);
    send(&mut s, A, 1);
    send(&mut s, B, 2);
    s.queue.clear(); // written
    let _ = step(&mut s, A, 1);
    let _ = step(&mut s, B, 2);
    assert_eq!(file(&mut s, B, 2), (1, 0), "B's bell rung");
    assert_eq!(
        file(&mut s, B, 2),
        (0, 0),
        "a reply nobody awaits wakes nobody"
    );
    let (st, duties) = step(&mut s, B, 2);
    assert_eq!(st, Step::Took(1));
    assert!(!duties.flush && duties.successor.is_none());
}

#[test]
fn callers_woken_together_queue_and_the_last_back_writes_the_burst() {
    let (mut s, _) = sched(&[A, B, C]);
    for (c, id) in [(A, 1), (B, 2), (C, 3)] {
        send(&mut s, c, id);
    }
    s.queue.clear(); // written
    let _ = step(&mut s, A, 1);
    let _ = step(&mut s, B, 2);
    let _ = step(&mut s, C, 3);
    file(&mut s, B, 2);
    file(&mut s, C, 3);
    // B comes back first, takes its reply and sends again: C is still to come back.
    let (st, duties) = step(&mut s, B, 2);
    assert_eq!(st, Step::Took(1));
    assert!(!duties.flush);
    assert!(!send(&mut s, B, 4), "queued for the burst");
    let (st, duties) = step(&mut s, C, 3);
    assert_eq!(st, Step::Took(1));
    assert!(duties.flush, "the last back writes B's request");
    assert!(
        send(&mut s, C, 5),
        "nobody left to come back: C writes its own"
    );
}

#[test]
fn a_reader_whose_reply_came_names_a_sleeper_to_read_on() {
    let (mut s, bells) = sched(&[A, B]);
    send(&mut s, A, 1);
    send(&mut s, B, 2);
    let _ = step(&mut s, A, 1);
    let _ = step(&mut s, B, 2);
    file(&mut s, A, 1);
    assert!(s.reader_done(Reader::Caller(A), 1, false));
    let next = s.resign(Reader::Caller(A));
    s.check();
    assert!(is_caller(&next, &bells[1]), "B is named");
    assert_eq!(s.reader(), Reader::Caller(B));
    assert_eq!(step(&mut s, A, 1).0, Step::Took(1));
    assert_eq!(step(&mut s, B, 2).0, Step::Lead, "B wakes as the reader");
}

#[test]
fn while_woken_callers_are_still_to_come_back_nobody_is_named_and_the_last_names_one() {
    let (mut s, bells) = sched(&[A, B, C]);
    for (c, id) in [(A, 1), (B, 2), (C, 3)] {
        send(&mut s, c, id);
    }
    let _ = step(&mut s, A, 1);
    let _ = step(&mut s, B, 2);
    let _ = step(&mut s, C, 3);
    file(&mut s, A, 1);
    file(&mut s, B, 2);
    assert!(
        s.resign(Reader::Caller(A)).is_none(),
        "B is still to come back"
    );
    s.check();
    assert_eq!(s.reader(), Reader::Vacant);
    let (_, duties) = step(&mut s, B, 2);
    assert!(
        is_caller(&duties.successor, &bells[2]),
        "the last back names C, who sleeps"
    );
    assert_eq!(s.reader(), Reader::Caller(C));
}

#[test]
fn a_woken_caller_that_waits_again_reads_when_nobody_does() {
    let (mut s, _) = sched(&[A, B, C]);
    for (c, id) in [(A, 1), (B, 2), (C, 3)] {
        send(&mut s, c, id);
    }
    let _ = step(&mut s, A, 1);
    let _ = step(&mut s, B, 2);
    let _ = step(&mut s, C, 3);
    file(&mut s, A, 1);
    file(&mut s, B, 2);
    file(&mut s, C, 3);
    let _ = s.resign(Reader::Caller(A));
    let _ = step(&mut s, B, 2);
    assert!(!send(&mut s, B, 4), "C is still to come back");
    assert_eq!(step(&mut s, B, 4).0, Step::Lead, "nobody reads: B does");
}

#[test]
fn futures_name_the_thread_when_nobody_reads_and_a_sleeper_goes_first() {
    let (mut s, bells) = sched(&[A, B]);
    let waker = Waker::from(StdArc::new(Count::default()));
    send(&mut s, A, 1);
    let mut reply = [0u8; 8];
    let (got, next) = s.poll(A, 1, &mut reply, &waker).unwrap();
    s.check();
    assert!(got.is_none() && matches!(next, Some(Successor::Thread)));
    assert_eq!(s.reader(), Reader::Thread);
    // B sleeps under the thread; A's reply leaves the thread with no task: B reads on.
    send(&mut s, B, 2);
    assert_eq!(step(&mut s, B, 2).0, Step::Park);
    assert_eq!(file(&mut s, A, 1), (0, 1), "A's task woken");
    assert!(s.reader_done(Reader::Thread, 0, false));
    assert!(is_caller(&s.resign(Reader::Thread), &bells[1]));
    s.check();
}

#[test]
fn a_reader_past_its_deadline_looks_once_then_times_out_and_hands_on() {
    let (mut s, bells) = sched(&[A, B]);
    send(&mut s, A, 1);
    send(&mut s, B, 2);
    let _ = step(&mut s, A, 1);
    let _ = step(&mut s, B, 2);
    let mut reply = [0u8; 8];
    assert!(s.reader_done(Reader::Caller(A), 1, true), "expired: done");
    let next = s.resign(Reader::Caller(A));
    s.check();
    assert!(is_caller(&next, &bells[1]), "B reads on");
    let (st, _) = s.step(A, 1, &mut reply, true, true);
    assert_eq!(st, Step::TimedOut);
    // Nobody reading and a deadline passed: one look first.
    let (mut s, _) = sched(&[A]);
    send(&mut s, A, 1);
    assert_eq!(s.step(A, 1, &mut reply, true, false).0, Step::Lead);
    let _ = s.resign(Reader::Caller(A));
    assert_eq!(s.step(A, 1, &mut reply, true, true).0, Step::TimedOut);
    s.check();
}

#[test]
fn a_sleeper_that_times_out_leaves_the_parked_list() {
    let (mut s, _) = sched(&[A, B]);
    send(&mut s, A, 1);
    send(&mut s, B, 2);
    let _ = step(&mut s, A, 1);
    let _ = step(&mut s, B, 2);
    let mut reply = [0u8; 8];
    assert_eq!(s.step(B, 2, &mut reply, true, false).0, Step::TimedOut);
    s.check();
    let _ = s.resign(Reader::Caller(A));
    assert_eq!(s.reader(), Reader::Vacant, "nobody left to name");
}

#[test]
fn a_closed_connection_wakes_every_sleeper_and_task_and_names_nobody() {
    let (mut s, _) = sched(&[A, B, C]);
    let waker = Waker::from(StdArc::new(Count::default()));
    for (c, id) in [(A, 1), (B, 2), (C, 3)] {
        send(&mut s, c, id);
    }
    let _ = step(&mut s, A, 1);
    let _ = step(&mut s, B, 2);
    let mut reply = [0u8; 8];
    let _ = s.poll(C, 3, &mut reply, &waker).unwrap();
    let (bells, tasks) = s.close();
    s.check();
    assert_eq!((bells.len(), tasks.len()), (1, 1));
    assert_eq!(step(&mut s, B, 2).0, Step::Lost);
    assert!(s.resign(Reader::Caller(A)).is_none());
    assert!(s.poll(C, 3, &mut reply, &waker).is_err());
    assert!(!s.expect(A, 9, 9), "nothing more is sent");
}

#[test]
fn a_detached_port_with_a_waker_is_no_longer_counted() {
    let (mut s, bells) = sched(&[A]);
    let waker = Waker::from(StdArc::new(Count::default()));
    send(&mut s, A, 1);
    let mut reply = [0u8; 8];
    let _ = s.poll(A, 1, &mut reply, &waker).unwrap();
    s.detach(A, &bells[0]);
    s.check();
    assert!(s.reader_done(Reader::Thread, 0, false), "no task left");
}

#[test]
fn wakes_have_room_for_a_burst_and_say_when_full() {
    let ids: Vec<u32> = (1..=WAKES_MAX as u32 + 1).collect();
    let (mut s, _) = sched(&ids);
    let reader = ids[0];
    send(&mut s, reader, 1);
    let _ = step(&mut s, reader, 1);
    for &c in &ids[1..] {
        send(&mut s, c, c as u16);
        assert_eq!(step(&mut s, c, c as u16).0, Step::Park);
    }
    let mut wakes = Wakes::new();
    for &c in &ids[1..] {
        assert!(wakes.room());
        s.file(c, c as u16, &[1], &mut wakes);
    }
    assert!(!wakes.room());
    s.check();
    wakes.deliver();
    assert!(wakes.room(), "delivered: empty again");
}

#[derive(Default)]
struct Count(AtomicUsize);

impl Wake for Count {
    fn wake(self: StdArc<Self>) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}
