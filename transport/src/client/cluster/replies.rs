//! The replies to the cluster client's data messages: gathered from each server, the
//! commands a partition check refused sent again while the deadline lasts, the runs of an
//! all-or-nothing message moved on or undone, the link's records updated, and one reply
//! written for the client's message (`data.rs` sends).

use std::io;
use std::task::Waker;
use std::time::Instant;

use dlock_core::cluster::ServerId;
use dlock_core::proto::{
    Command, CommandResult, DATA_RESPONSE_MAX, DataHeader, PROOF_LEN, begin_data_response,
    decode_data_request, decode_data_response, finish_data_proofs, put_command_result,
    put_data_proof,
};
use dlock_core::{GrantProof, Status};

use super::data::{Flight, decide, unrun};
use super::members::{forgets_client, renews_lease};
use super::{ClusterLink, Dial, garbage};
use crate::client::{Connection, Decision, LocalLock};

/// How a caller waits for a flight's replies.
#[derive(Clone, Copy, Debug)]
pub(super) enum Wait<'a> {
    /// Only looks at what has arrived.
    Look,
    /// Waits until this instant.
    Until(Instant),
    /// Looks, and has this waker woken when a reply may have arrived (a future's poll).
    Poll(&'a Waker),
}

impl<D: Dial> ClusterLink<D> {
    /// Moves flight `ticket` on: reads the replies that have come (waiting as `wait` says),
    /// sends again what a partition check refused, and when every command is answered writes
    /// the client's reply into `reply`. The retries wait (a map refresh, a pause) whatever
    /// `wait` says: they are rare, and a future that met one is woken when it is done.
    pub(super) fn drive(
        &mut self,
        ticket: u64,
        reply: &mut [u8],
        wait: Wait<'_>,
    ) -> io::Result<Option<usize>> {
        let mut flight = self.flights.remove(&ticket).ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidInput, "no such message in flight")
        })?;
        // A caller without a deadline (a look, a poll) gives the retries the link's timeout,
        // counted from the first call that finds something to retry on.
        let retry_by = match wait {
            Wait::Until(deadline) => deadline,
            Wait::Look | Wait::Poll(_) => Instant::now() + self.cfg.timeout,
        };
        loop {
            match self.gather(&mut flight, wait) {
                Ok(true) => {}
                Ok(false) => {
                    self.flights.insert(ticket, flight);
                    return Ok(None);
                }
                Err(e) => return Err(e),
            }
            let more = if flight.all_or_nothing {
                self.next_run(&mut flight, retry_by)?
            } else {
                self.retry_refused(&mut flight, retry_by)?
            };
            if !more {
                let len = self.finish(&flight, reply);
                self.keep(flight);
                return len.map(Some);
            }
        }
    }

    /// Reads every outstanding part's reply into `flight`; false when one has not come.
    ///
    /// A wait with a deadline waits one patience at a time: a reply overdue by more makes the
    /// link ask the other servers for the map ([`Self::left_the_map`]), and a part whose
    /// server the map no longer names is given up ([`Self::give_up`]). Otherwise a frozen
    /// owner — its connections open, nothing answered — held the call until its deadline,
    /// and the next call with it, however soon the cluster gave its partitions to others.
    pub(super) fn gather(&mut self, flight: &mut Flight, wait: Wait<'_>) -> io::Result<bool> {
        let mut buf = [0u8; DATA_RESPONSE_MAX];
        let patience = self.patience();
        while let Some(part) = flight.parts.first() {
            let member = self
                .members
                .get_mut(&part.server)
                .filter(|m| !m.broken)
                .ok_or_else(|| {
                    io::Error::new(
                        io::ErrorKind::ConnectionAborted,
                        "the server's connection failed",
                    )
                })?;
            let got = match wait {
                Wait::Look => member.conn.try_recv_data(part.ticket, &mut buf),
                Wait::Until(d) => {
                    let slice = d.min(Instant::now() + patience);
                    match member.conn.recv_data(part.ticket, &mut buf, Some(slice)) {
                        Ok(None) if slice < d => {
                            let (server, sent) = (part.server, part.sent);
                            if sent.elapsed() >= patience && self.left_the_map(server, d) {
                                self.give_up(flight);
                            }
                            continue;
                        }
                        got => got,
                    }
                }
                Wait::Poll(waker) => member.conn.poll_recv_data(part.ticket, &mut buf, waker),
            };
            let len = match got {
                Ok(Some(len)) => len,
                Ok(None) => return Ok(false),
                Err(e) => {
                    member.broken = true;
                    return Err(e);
                }
            };
            let r = decode_data_response(&buf[..len])
                .map_err(|_| garbage("a data reply is malformed"))?;
            if r.header().message_id != part.message_id {
                continue; // a late reply to a message given up on
            }
            if r.len() != part.idx.len() {
                return Err(garbage("a data reply answers another message"));
            }
            // A reply to a message sent before the current registration speaks of an
            // earlier one, which was forgotten already.
            let current = part.sent >= member.since;
            let mut renewed = false;
            let mut forgot = false;
            let mut forgotten = Vec::new();
            for (j, &i) in part.idx.iter().enumerate() {
                let got = r.result(j);
                let sent = part.commands[j].id();
                if got.id != sent
                    || got.kind != flight.commands[i].kind_code()
                    || got.op != flight.commands[i].op_code()
                {
                    return Err(garbage("a data reply answers other commands"));
                }
                renewed |= renews_lease(got.result.status);
                forgot |= forgets_client(got.result.status);
                if got.result.status == Status::LockNotGet
                    && let Command::Lock(c) = flight.commands[i]
                {
                    forgotten.push((c.lock, sent));
                }
                flight.results[i] = Some((got.result, r.proof_mac(j)));
            }
            if renewed {
                member.heard = member.heard.max(Some(part.sent));
            }
            let server = part.server;
            let done = flight.parts.remove(0);
            flight.spent.push(done);
            if forgot && current {
                self.forget_registration(server);
            }
            for (lock, server_lock) in forgotten {
                self.forget_reference(lock, server, server_lock);
            }
        }
        Ok(true)
    }

    /// Whether `server`, whose reply is overdue past the link's patience, has left the map:
    /// asks another server the client joined for the map's version (each within the patience,
    /// over the connection it has: a probe opens none) and follows a newer map. `server` has
    /// left when the map no longer names it at the incarnation the client joined. With no
    /// other server joined, or none answering, nothing is learned here: the client's next
    /// heartbeat reads the map from any server (`check_map`). A probe opens no connection
    /// because every overdue reply probes — under a load that slows every server, a
    /// thousand clients dialling each other server twice a second would only add to it.
    fn left_the_map(&mut self, server: ServerId, deadline: Instant) -> bool {
        let Some(incarnation) = self.members.get(&server).map(|m| m.incarnation) else {
            return true;
        };
        let seen = self.joined_map_version(Some(server), deadline);
        if let Some((other, v)) = seen
            && v > self.map.version()
        {
            self.follow_map_without(Some(other), Some(server), deadline);
        }
        self.map.server(server).map(|e| e.incarnation()) != Some(incarnation)
    }

    /// Gives up the flight's first part, whose server left the map while its reply was
    /// overdue: the server is not waited on again (its connection is opened afresh should it
    /// come back), and the part's commands read `PartitionMoved`, so that they are sent again
    /// to their partitions' new owners while the deadline lasts. Sending them again is safe
    /// although the server may have run them before it went silent: it left the map because
    /// its etcd lease ran out, so it fenced itself before the new owner's first grant (the
    /// timing argument); a grant it made unseen is held by no one the new owner knows of,
    /// an unlock it ran unseen is undone by the re-claim of the grant and done again, and a
    /// fetch-and-add run twice leaves a gap (allowed), never a repeat.
    fn give_up(&mut self, flight: &mut Flight) {
        let part = flight.parts.remove(0);
        tracing::debug!(server = %part.server, "dlock: a silent server left the map; its commands go to the new owners");
        if let Some(m) = self.members.get_mut(&part.server) {
            m.broken = true;
        }
        let moved = CommandResult {
            aux: self.map.version(),
            ..CommandResult::status(Status::PartitionMoved)
        };
        for &i in &part.idx {
            flight.results[i] = Some((moved, [0; PROOF_LEN]));
        }
        flight.spent.push(part);
    }

    /// `server` answered `LockNotGet` for its lock `server_lock`, the reference of cluster
    /// lock `lock`: it holds no reference of the client's under that id, hence no grant either
    /// (a lapsed lease, say: the server declared the client dead, freed what it held, and the
    /// client joined it again as a new registration). If the route still names that reference
    /// it is stale: the grant its record may show is lost, and the reference is taken again by
    /// name before the next use (`current_route`). Before, the route kept the forgotten id, and
    /// every use of the lock read `LockNotGet` for good. Only the server's own answer drops a
    /// reference: a registration the client merely thinks lapsed may still hold it.
    fn forget_reference(&mut self, lock: u32, server: ServerId, server_lock: u32) {
        let Some(r) = self.routes.get_mut(lock) else {
            return;
        };
        if r.server != server || r.server_lock != Some(server_lock) {
            return;
        }
        tracing::debug!(lock = ?r.name, %server, "dlock: the server forgot the lock's reference; got again at the next use");
        r.record = LocalLock::new(r.record.id, r.record.kind);
        r.server_lock = None;
    }

    /// Per-item messages: sends again what a server refused without running it (a partition
    /// check, or a server that forgot the client), while `deadline` lasts; false when the
    /// flight is answered.
    fn retry_refused(&mut self, flight: &mut Flight, deadline: Instant) -> io::Result<bool> {
        let mut refused = std::mem::take(&mut flight.scratch);
        refused.clear();
        refused.extend(
            (0..flight.commands.len())
                .filter(|&i| flight.results[i].is_some_and(|(r, _)| unrun(r.status))),
        );
        if Instant::now() < deadline {
            self.after_forgotten(flight, &mut refused);
        } else {
            refused.clear();
        }
        if refused.is_empty() {
            for i in 0..flight.commands.len() {
                self.apply(flight, i);
            }
            flight.scratch = refused;
            return Ok(false);
        }
        self.wait_for_owner(flight, &refused, deadline);
        for &i in &refused {
            flight.results[i] = None;
        }
        self.send_set(flight, &refused, deadline)?;
        flight.scratch = refused;
        Ok(true)
    }

    /// Of the commands `refused`, those answered `ClientNotInit` or `ClientRemovedByServer`
    /// were about a registration the server forgot, with every grant and reference the client
    /// had there (`forget_registration` reset the link's records): an acquisition is decided
    /// again from its record and sent again (its reference got again by name, at a server
    /// joined again); anything else (an unlock, an extend, a downgrade) was about a grant the
    /// server freed, and is answered `LockNotGet` here, as a server answers a command naming
    /// a reference it forgot. Keeps in `refused` the commands to send again, in place.
    fn after_forgotten(&mut self, flight: &mut Flight, refused: &mut Vec<usize>) {
        refused.retain(|&i| self.sent_again(flight, i));
    }

    /// [`Self::after_forgotten`] for command `i`: whether it is sent again.
    fn sent_again(&mut self, flight: &mut Flight, i: usize) -> bool {
        let forgot = flight.results[i].is_some_and(|(r, _)| forgets_client(r.status));
        let lock = match flight.commands[i] {
            Command::Lock(l) if forgot => l,
            _ => return true,
        };
        match self.routes.get_mut(lock.lock) {
            Some(r) if lock.op.acquires() => {
                flight.shadow[i] = decide(&mut r.record, &lock);
                true
            }
            _ => {
                flight.shadow[i] = None;
                flight.results[i] =
                    Some((CommandResult::status(Status::LockNotGet), [0; PROOF_LEN]));
                false
            }
        }
    }

    /// All-or-nothing: after the current run's reply, sends it again (refused by a check),
    /// the next run (it succeeded), or gives back what earlier runs took (it failed). False
    /// when the flight is answered.
    fn next_run(&mut self, flight: &mut Flight, deadline: Instant) -> io::Result<bool> {
        let status = |f: &Flight, i: usize| f.results[i].map_or(Status::Einval, |(r, _)| r.status);
        let run = &flight.current;
        if run.iter().all(|&i| status(flight, i) == Status::Success) {
            for k in 0..flight.current.len() {
                self.apply(flight, flight.current[k]);
            }
            flight.taken.extend_from_slice(&flight.current);
            if !flight.next_run() {
                return Ok(false);
            }
            let next = std::mem::take(&mut flight.current);
            self.send_set(flight, &next, deadline)?;
            flight.current = next;
            return Ok(true);
        }
        let checked = run.iter().any(|&i| unrun(status(flight, i)));
        let granted = run.iter().any(|&i| status(flight, i) == Status::Success);
        if checked && !granted && Instant::now() < deadline {
            let mut run = std::mem::take(&mut flight.current);
            self.after_forgotten(flight, &mut run);
            self.wait_for_owner(flight, &run, deadline);
            for &i in &run {
                flight.results[i] = None;
            }
            self.send_set(flight, &run, deadline)?;
            flight.current = run;
            return Ok(true);
        }
        // The run failed, and the server undid it; undo the runs before it.
        self.release(flight, deadline);
        let undone = Some((CommandResult::status(Status::Eagain), [0; PROOF_LEN]));
        for &i in &flight.taken {
            flight.results[i] = undone;
        }
        for &i in &flight.order[flight.runs_left_from()..] {
            flight.results[i] = undone;
        }
        flight.taken.clear();
        flight.runs_sent = flight.ends.len();
        Ok(false)
    }

    /// Before sending `refused` again: refresh the map if one of them moved (and re-claim
    /// what moved); otherwise, or if the map had not changed yet, pause.
    fn wait_for_owner(&mut self, flight: &mut Flight, refused: &[usize], deadline: Instant) {
        let moved_at = refused.iter().find_map(|&i| match flight.results[i] {
            Some((r, _)) if r.status == Status::PartitionMoved => flight.sent_to[i],
            _ => None,
        });
        let followed = moved_at.is_some() && self.follow_map(moved_at, deadline);
        if !followed {
            flight.pause = self.retry_pause(flight.pause, deadline);
        }
    }

    /// Gives back the grants earlier runs of a failed all-or-nothing message took.
    fn release(&mut self, flight: &mut Flight, deadline: Instant) {
        let mut unlocks = Vec::new();
        for &i in &flight.taken {
            let id = flight.commands[i].id();
            if let Some(r) = self.routes.get_mut(id)
                && let Decision::Send(req) = r.record.unlock()
            {
                unlocks.push(req);
            }
        }
        if unlocks.is_empty() {
            return;
        }
        let commands: Vec<Command> = unlocks.iter().map(|r| Command::Lock(r.command())).collect();
        let header = DataHeader {
            flags: 0,
            ..flight.header
        };
        let mut undo = Flight::empty();
        undo.reset(header, commands.into_iter());
        for (shadow, req) in undo.shadow.iter_mut().zip(unlocks) {
            *shadow = Some(req);
        }
        let all: Vec<usize> = (0..undo.commands.len()).collect();
        let done = self
            .send_set(&mut undo, &all, deadline)
            .and_then(|()| self.gather(&mut undo, Wait::Until(deadline)));
        match done {
            Ok(true) => {
                for i in 0..undo.commands.len() {
                    self.apply(&undo, i);
                }
            }
            Ok(false) => {
                tracing::warn!("dlock: an all-or-nothing batch's undo was not answered in time")
            }
            Err(e) => {
                tracing::warn!(error = %e, "dlock: an all-or-nothing batch could not be undone; its grants last until their leases end")
            }
        }
    }

    /// Keeps the lists of `flight`, answered, for a message to come (a flight is made anew
    /// only while more are out at once than ever before, up to the client's depth).
    fn keep(&mut self, flight: Flight) {
        if self.spare.len() < super::data::DEPTH {
            self.spare.push(flight);
        }
    }

    /// Applies command `i`'s answer to the link's record of its lock.
    fn apply(&mut self, flight: &Flight, i: usize) {
        let (Some(req), Some((res, mac))) = (flight.shadow[i], flight.results[i]) else {
            return;
        };
        let now = self.now_ms();
        if let Some(r) = self.routes.get_mut(flight.commands[i].id()) {
            let proof = GrantProof {
                epoch: flight.epochs[i],
                mac,
            };
            // The link's record keeps no value block (the client's own record does): a
            // partition's re-claim offers none, and the new owner marks the block invalid.
            let _ = r.record.apply(&req, &res, proof, None, now);
        }
    }

    /// The client's reply to `flight`, in `reply`.
    fn finish(&self, flight: &Flight, reply: &mut [u8]) -> io::Result<usize> {
        let req =
            decode_data_request(&flight.request).map_err(|_| garbage("the message changed"))?;
        let bad = |_| io::Error::new(io::ErrorKind::InvalidInput, "a reply did not encode");
        let mut len = begin_data_response(&req, reply).map_err(bad)?;
        let n = flight.commands.len();
        let mut first = true;
        for (i, c) in flight.commands.iter().enumerate() {
            let (res, mac) = flight.results[i]
                .unwrap_or((CommandResult::status(Status::BadResponse), [0; PROOF_LEN]));
            put_command_result(reply, i, c, &res).map_err(bad)?;
            if mac != [0; PROOF_LEN] {
                put_data_proof(reply, n, i, &mac, first).map_err(bad)?;
                first = false;
            }
        }
        if !first {
            len = finish_data_proofs(reply, n).map_err(bad)?;
        }
        Ok(len)
    }
}
