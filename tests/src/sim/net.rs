//! The one network model both simulators run on: links between a client process and the
//! server, each carrying a control and a data channel, and every message on them a value with
//! a delivery time, in one queue ordered by (time, send order).
//!
//! A link stands for what a client has open to its server: the control connection and the
//! data connection (or mailbox) bound to it. Each channel delivers each way in order and
//! exactly once, as TCP and a mailbox lane do, so a message is never delivered before one sent
//! earlier on the same channel in the same direction; delays (most short, some long) reorder
//! messages across links and channels only. A loss is what TCP makes of one: the link breaks,
//! both ends notice (the server through [`Net::take_broken`], the client on its next read or
//! write), and everything still in flight on it is gone. A server crash breaks every link.
//! Requests are never duplicated — no dlock transport can, and the server does not
//! deduplicate (a repeated unlock or FAA is a second operation); a data reply may be, which a
//! client must recognise by its message id and drop.
//!
//! The data channel can also break alone ([`Net::break_stream`]), as a data connection does
//! while its control connection lives on: what is in flight on it is gone, it carries nothing
//! more, and the server learns of it through [`Net::take_broken_streams`]; the link breaks
//! whole when its client closes it.
//!
//! Which faults a run has and how often is the seed's [`FaultPlan`];
//! the counts of those injected go to [`Faults`].

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::rng::Rng;
use super::swarm::{FaultPlan, Faults};

/// A link's index; links are never reused, so an index names one connection for good.
pub type LinkId = usize;

/// The channel a message travels on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Channel {
    Control,
    Data,
}

/// Which way a message goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Dir {
    ToServer,
    ToClient,
}

/// One message in flight.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Message {
    /// Simulated time of delivery (ms).
    pub at: u64,
    /// Send order: equal times deliver in it.
    pub seq: u64,
    pub link: LinkId,
    pub channel: Channel,
    pub dir: Dir,
    pub bytes: Vec<u8>,
}

/// One link's state.
#[derive(Debug)]
struct Link {
    alive: bool,
    /// The simulated process at the client's end.
    owner: usize,
    /// When the last message sent on each (channel, direction) is delivered: a later one is
    /// delivered no earlier.
    last: [[u64; 2]; 2],
    /// The data channel broke alone ([`Net::break_stream`]).
    stream_broken: bool,
}

/// Links and the messages in flight on them.
#[derive(Debug, Default)]
pub struct Net {
    queue: BinaryHeap<Reverse<Message>>,
    seq: u64,
    links: Vec<Link>,
    /// Links broken by a loss since the last [`Net::take_broken`].
    broken: Vec<LinkId>,
    /// Links whose data channel broke alone since the last [`Net::take_broken_streams`].
    streams_broken: Vec<LinkId>,
}

impl Net {
    /// Opens a link for process `owner`.
    pub fn open(&mut self, owner: usize) -> LinkId {
        self.links.push(Link {
            alive: true,
            owner,
            last: [[0; 2]; 2],
            stream_broken: false,
        });
        self.links.len() - 1
    }

    /// Whether `link` is still up.
    pub fn is_alive(&self, link: LinkId) -> bool {
        self.links.get(link).is_some_and(|l| l.alive)
    }

    /// Whether `link`'s data channel is up (the link is, and its stream did not break alone).
    pub fn stream_up(&self, link: LinkId) -> bool {
        self.links
            .get(link)
            .is_some_and(|l| l.alive && !l.stream_broken)
    }

    /// Whether `channel` of `link` carries messages.
    fn carries(&self, link: LinkId, channel: Channel) -> bool {
        match channel {
            Channel::Control => self.is_alive(link),
            Channel::Data => self.stream_up(link),
        }
    }

    /// The process at the client's end of `link`.
    pub fn owner(&self, link: LinkId) -> usize {
        self.links[link].owner
    }

    /// Sends `bytes` on `link` at `now` with the plan's faults: a delay drawn from `plan`,
    /// maybe a loss (the link breaks), maybe a duplicate of a data reply. Returns the delivery
    /// time, or `None` if the message is gone.
    #[allow(clippy::too_many_arguments)]
    pub fn send(
        &mut self,
        link: LinkId,
        channel: Channel,
        dir: Dir,
        bytes: Vec<u8>,
        now: u64,
        rng: &mut Rng,
        plan: &FaultPlan,
        faults: &mut Faults,
    ) -> Option<u64> {
        if !self.carries(link, channel) {
            return None;
        }
        if rng.chance(plan.loss_ppm) {
            faults.messages_lost += 1;
            self.break_link(link);
            return None;
        }
        let delay = plan.delay(rng, faults);
        if dir == Dir::ToClient && channel == Channel::Data && rng.chance(plan.dup_ppm) {
            faults.replies_duplicated += 1;
            let at = self.send_after(link, channel, dir, bytes.clone(), now + delay);
            let again = plan.delay(rng, faults);
            self.send_after(link, channel, dir, bytes, at.max(now + again));
            return Some(at);
        }
        Some(self.send_after(link, channel, dir, bytes, now + delay))
    }

    /// Sends `bytes` on `link` to arrive at `at` (or later, behind what the channel already
    /// carries), with no fault drawn: for a delay a compound fault chose. Returns the
    /// delivery time.
    pub fn send_after(
        &mut self,
        link: LinkId,
        channel: Channel,
        dir: Dir,
        bytes: Vec<u8>,
        at: u64,
    ) -> u64 {
        let last = &mut self.links[link].last[channel as usize][dir as usize];
        let at = at.max(*last);
        *last = at;
        self.seq += 1;
        self.queue.push(Reverse(Message {
            at,
            seq: self.seq,
            link,
            channel,
            dir,
            bytes,
        }));
        at
    }

    /// Puts a message back for delivery at `until` (its receiver is paused), keeping its place
    /// before everything sent after it on its channel.
    pub fn hold(&mut self, m: Message, until: u64) {
        let last = &mut self.links[m.link].last[m.channel as usize][m.dir as usize];
        *last = (*last).max(until);
        self.queue.push(Reverse(Message { at: until, ..m }));
    }

    /// The next message due at or before `now` on a link that is up.
    pub fn pop_due(&mut self, now: u64) -> Option<Message> {
        while self.queue.peek().is_some_and(|Reverse(m)| m.at <= now) {
            let Reverse(m) = self.queue.pop()?;
            if self.carries(m.link, m.channel) {
                return Some(m);
            }
        }
        None
    }

    /// When the next message is due, if any is in flight.
    pub fn next_at(&self) -> Option<u64> {
        self.queue.peek().map(|Reverse(m)| m.at)
    }

    /// Messages in flight (some may be on links that broke since).
    pub fn len(&self) -> usize {
        self.queue.len()
    }

    /// Whether nothing is in flight.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Breaks `link` (a reset, a loss, or its client closing it); what is in flight on it is
    /// gone. The server learns of it from [`Net::take_broken`].
    pub fn break_link(&mut self, link: LinkId) {
        if let Some(l) = self.links.get_mut(link)
            && l.alive
        {
            l.alive = false;
            self.broken.push(link);
        }
    }

    /// Breaks `link`'s data channel alone (module doc); what is in flight on it is gone. The
    /// server learns of it from [`Net::take_broken_streams`]; false if it was down already.
    pub fn break_stream(&mut self, link: LinkId) -> bool {
        if !self.stream_up(link) {
            return false;
        }
        self.links[link].stream_broken = true;
        self.streams_broken.push(link);
        true
    }

    /// The links whose data channel broke alone since the last call.
    pub fn take_broken_streams(&mut self) -> Vec<LinkId> {
        std::mem::take(&mut self.streams_broken)
    }

    /// How many links were ever opened (each keeps its index).
    pub fn links(&self) -> usize {
        self.links.len()
    }

    /// The links broken since the last call, for the server's side to notice.
    pub fn take_broken(&mut self) -> Vec<LinkId> {
        std::mem::take(&mut self.broken)
    }

    /// The server crashed: every link is down and everything in flight is gone. Nothing is
    /// reported broken: there is no server left to notice.
    pub fn clear(&mut self) {
        self.queue.clear();
        self.broken.clear();
        self.streams_broken.clear();
        for l in &mut self.links {
            l.alive = false;
        }
    }
}
