//! The faults the model simulator injects beside the network's: client crashes and pauses,
//! clock jumps, server crashes, and the compound faults of the seed's plan.

use dlock_core::server::Server;

use super::client::{self, Phase};
use super::{Flow, TICK_MS, World};

impl World<'_> {
    /// Maybe one fault; `Some(Crashed)` when the server crashed.
    pub(super) fn inject_fault(&mut self, srv: &mut Server<'_>) -> Result<Option<Flow>, String> {
        let p = self.plan;
        let due = self.crash_at.is_some_and(|t| self.now >= t);
        if due || self.rng.chance(p.server_crash_ppm) {
            self.crash_server(srv);
            return Ok(Some(Flow::Crashed));
        }
        if self.rng.chance(p.jump_ppm) {
            self.faults.clock_jumps += 1;
            self.clock_offset += self.rng.range(50, 2_500);
        }
        if self.rng.chance(p.pause_ppm) {
            let i = self.rng.index(self.clients.len());
            let beyond = self.rng.below(2) == 0;
            self.pause(i, beyond);
        }
        if self.rng.chance(p.crash_ppm) {
            let i = self.rng.index(self.clients.len());
            self.crash_client(i);
        }
        Ok(None)
    }

    /// Client `i` stops (GC, a VM freeze, SIGSTOP), `beyond` its lease or within half of it.
    /// A client holding locks that stops past its lease may take the server down with it
    /// (`lapse_then_crash`): the server expires it, others take its locks, and the server
    /// crashes before the client wakes.
    pub(super) fn pause(&mut self, i: usize, beyond: bool) {
        let c = &self.clients[i];
        if c.phase == Phase::Dead {
            return;
        }
        let lease = u64::from(c.lease_ms.max(100));
        let holding = c.locks.iter().flatten().any(|l| l.used_mode().is_some());
        let d = if beyond {
            self.faults.pauses_beyond_lease += 1;
            self.rng.range(lease + 1, 3 * lease)
        } else {
            self.rng.range(10, lease / 2)
        };
        self.faults.pauses += 1;
        let mut until = self.now.max(c.paused_until) + d;
        if beyond
            && holding
            && self.crash_at.is_none()
            && let Some(extra) = self.plan.lapse_then_crash(&mut self.rng, &mut self.faults)
        {
            let crash = self.now + lease + 2 * TICK_MS + extra;
            self.crash_at = Some(crash);
            until = until.max(crash + self.rng.range(1, 200));
        }
        self.clients[i].paused_until = until;
    }

    /// Client `i` crashes: it sends nothing more and reads nothing; the server learns of it
    /// only if its transport sees the link drop (half the time).
    fn crash_client(&mut self, i: usize) {
        let now = self.server_now();
        let c = &self.clients[i];
        if c.phase == Phase::Dead {
            return;
        }
        if c.locks.iter().flatten().any(|l| l.used_mode().is_some()) {
            self.faults.crashes_holding += 1;
        } else if matches!(&c.pending, Some(p) if matches!(p.out, client::Out::Data { wait_ms, .. } if wait_ms > 0))
        {
            self.faults.crashes_waiting += 1;
        } else {
            self.faults.crashes_other += 1;
        }
        let (id, lease, link) = (c.id, c.lease_ms, c.link);
        if self.oracle.trace {
            eprintln!("tick {now}: sim client {i} ({id:x?}) crashes");
        }
        let c = &mut self.clients[i];
        c.phase = Phase::Dead;
        c.pending = None;
        c.heartbeat = None;
        if let Some(id) = id {
            // Whether the server still knows it is for the check that it expires it.
            self.dead[i] = Some((id, now, lease));
        }
        if let Some(link) = link
            && self.rng.below(2) == 0
        {
            self.net.break_link(link);
        }
    }

    /// The server process dies: its region, sockets and everything in flight are gone. Every
    /// client notices after a while and re-registers with the replacement, which expects as
    /// many clients as were registered (an operator's count, dead ones included).
    pub(super) fn crash_server(&mut self, srv: &Server<'_>) {
        self.faults.server_crashes += 1;
        self.crash_at = None;
        self.expected = srv.usage().clients;
        self.epoch += 1;
        self.net.clear();
        self.oracle.new_incarnation();
        // A dead client is not registered with the replacement: nothing of it to expire.
        self.dead.iter_mut().for_each(|d| *d = None);
        for c in &mut self.clients {
            c.link = None;
            c.connected = false;
            c.pending = None;
            c.heartbeat = None;
            c.notice_at = self.now + self.rng.range(1, 300);
            match c.phase {
                Phase::Initing => c.phase = Phase::Idle,
                Phase::Deiniting => c.forget_all(),
                _ => {}
            }
        }
    }
}
