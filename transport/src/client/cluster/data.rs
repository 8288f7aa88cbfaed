//! Data messages over the cluster: each of the client's messages (a *flight*) is split per
//! server, its commands' ids turned into the servers' own and stamped with their partitions'
//! epochs; `replies.rs` gathers the replies and gives them back as one reply to the client's
//! message.
//!
//! A command refused by a partition check (`PartitionMoved`, `NotReady`) was not executed, so
//! it is sent again, after a map refresh (and the re-claims it calls for) or a pause, while the
//! call's deadline lasts. An all-or-nothing message over several servers goes run by run in
//! the global order (partition, then name); a run that fails releases what the runs before it
//! took, and the client is told `Eagain` for those, as a server tells it for the commands of an
//! all-or-nothing message it undid.

use std::io;
use std::time::{Duration, Instant};

use dlock_core::Status;
use dlock_core::cluster::ServerId;
use dlock_core::proto::{
    Command, CommandResult, DataHeader, FLAG_ALL_OR_NOTHING, LockCommand, LockOp, ObjectCommand,
    PROOF_LEN, decode_data_request, encode_data_request,
};

use super::control::PAUSE_MIN;
use super::reclaim::OWED_WAIT;
use super::{ClusterLink, Dial, garbage};
use crate::client::{Connection, Decision, LocalLock, LocalState, Request};

/// How many of the client's messages may await their replies at once (a [`Mux`]'s depth).
///
/// [`Mux`]: crate::client::Mux
pub(super) const DEPTH: usize = 4;

/// Most flights kept at once. The client has at most [`DEPTH`] messages awaiting replies; the
/// rest are messages it gave up on (a timeout), whose replies nobody will ask for: the oldest
/// are dropped, as a connection drops a late reply.
const FLIGHTS_MAX: usize = 64;

/// One of the client's data messages on its way through the cluster.
///
/// Its lists are kept from one message to the next (`ClusterLink::spare`: a flight answered is
/// put back, and the next message takes it), as are its parts' (`spent`): a data command on
/// its way allocates nothing once the lists have their sizes (issue 19; `tests/tests/
/// zero_alloc_cluster.rs`). Before, each message built its flight and its parts from fresh
/// lists and copied the client's message: a dozen allocations and more per command.
#[derive(Debug)]
pub(super) struct Flight {
    /// The client's message, as it sent it (cluster ids), to echo in the reply.
    pub request: Vec<u8>,
    pub header: DataHeader,
    pub commands: Vec<Command>,
    pub all_or_nothing: bool,
    pub results: Vec<Option<(CommandResult, [u8; PROOF_LEN])>>,
    /// The link's record's request for each lock command (`None`: the record did not decide
    /// to send what the client sent, and learns nothing from the reply).
    pub shadow: Vec<Option<Request>>,
    /// The epoch each command was last sent with: the epoch of a grant's proof.
    pub epochs: Vec<u32>,
    /// The server each command was last sent to (the first to ask for a newer map).
    pub sent_to: Vec<Option<ServerId>>,
    /// Messages sent and not answered yet.
    pub parts: Vec<Part>,
    /// Parts answered, kept for their lists.
    pub spent: Vec<Part>,
    /// All-or-nothing: the run being answered; the routed commands in the global order
    /// (`order`), cut into runs ending at `ends`, of which `runs_sent` went out; and the
    /// commands earlier runs took.
    pub current: Vec<usize>,
    pub order: Vec<usize>,
    pub ends: Vec<usize>,
    pub runs_sent: usize,
    pub taken: Vec<usize>,
    /// The commands to send (the routed ones, or the refused ones), a list kept for reuse.
    pub scratch: Vec<usize>,
    pub pause: Duration,
}

impl Flight {
    /// A flight without lists yet.
    pub fn empty() -> Flight {
        Flight {
            request: Vec::new(),
            header: DataHeader {
                version: 0,
                count: 0,
                message_id: 0,
                client: 0,
                flags: 0,
            },
            commands: Vec::new(),
            all_or_nothing: false,
            results: Vec::new(),
            shadow: Vec::new(),
            epochs: Vec::new(),
            sent_to: Vec::new(),
            parts: Vec::new(),
            spent: Vec::new(),
            current: Vec::new(),
            order: Vec::new(),
            ends: Vec::new(),
            runs_sent: 0,
            taken: Vec::new(),
            scratch: Vec::new(),
            pause: PAUSE_MIN,
        }
    }

    /// Empties the flight for a message with `header` and `commands`, keeping its lists.
    pub fn reset(&mut self, header: DataHeader, commands: impl Iterator<Item = Command>) {
        self.request.clear();
        self.header = header;
        self.all_or_nothing = header.flags & FLAG_ALL_OR_NOTHING != 0;
        self.commands.clear();
        self.commands.extend(commands);
        let n = self.commands.len();
        self.results.clear();
        self.results.resize(n, None);
        self.shadow.clear();
        self.shadow.resize(n, None);
        self.epochs.clear();
        self.epochs.resize(n, 0);
        self.sent_to.clear();
        self.sent_to.resize(n, None);
        self.spent.append(&mut self.parts);
        self.current.clear();
        self.order.clear();
        self.ends.clear();
        self.runs_sent = 0;
        self.taken.clear();
        self.scratch.clear();
        self.pause = PAUSE_MIN;
    }

    /// All-or-nothing: puts the next run in `current`; false when every run went out.
    pub fn next_run(&mut self) -> bool {
        let Some(&end) = self.ends.get(self.runs_sent) else {
            return false;
        };
        let start = self.runs_left_from();
        self.current.clear();
        self.current.extend_from_slice(&self.order[start..end]);
        self.runs_sent += 1;
        true
    }

    /// All-or-nothing: where the runs not sent yet begin in `order`.
    pub fn runs_left_from(&self) -> usize {
        self.runs_sent
            .checked_sub(1)
            .and_then(|k| self.ends.get(k))
            .copied()
            .unwrap_or(0)
    }
}

/// One message to one server.
#[derive(Debug)]
pub(super) struct Part {
    pub server: ServerId,
    pub ticket: u64,
    pub message_id: u16,
    /// The flight's commands it carries, in order, and those commands as they were sent (the
    /// server's ids, the epochs).
    pub idx: Vec<usize>,
    pub commands: Vec<Command>,
    pub sent: Instant,
}

/// A client's command made ready for its server, or answered without one.
enum Addressed {
    To(ServerId, Command),
    Answer(Status),
}

/// Whether a partition check refused the command (it was not executed: send it again).
pub(super) fn refused_by_check(status: Status) -> bool {
    matches!(status, Status::PartitionMoved | Status::NotReady)
}

/// Whether the server ran nothing of a command answered `status`, so that it may be sent
/// again: a partition check refused it ([`refused_by_check`]), or the server does not know
/// the client (`replies.rs`: joined again first, and only acquisitions are sent again).
pub(super) fn unrun(status: Status) -> bool {
    refused_by_check(status) || super::members::forgets_client(status)
}

impl<D: Dial> ClusterLink<D> {
    /// Takes the client's message `req` and sends it on; its ticket.
    pub(super) fn start_flight(&mut self, req: &[u8]) -> io::Result<u64> {
        let decoded = decode_data_request(req).map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                "the client sent a malformed message",
            )
        })?;
        let mut flight = self.spare.pop().unwrap_or_else(Flight::empty);
        flight.reset(decoded.header(), decoded.commands());
        flight.request.extend_from_slice(req);
        let mut routed = std::mem::take(&mut flight.scratch);
        for (i, c) in flight.commands.iter().enumerate() {
            match c {
                Command::Lock(l) => match self.routes.get_mut(l.lock) {
                    Some(r) => {
                        flight.shadow[i] = decide(&mut r.record, l);
                        routed.push(i);
                    }
                    None => {
                        flight.results[i] =
                            Some((CommandResult::status(Status::Einval), [0; PROOF_LEN]))
                    }
                },
                // Objects are routed at send time (`objects.rs`); no record follows them.
                Command::Object(_) => routed.push(i),
                // A join is a transport's own, never the client's.
                Command::Join(_) => {
                    flight.results[i] =
                        Some((CommandResult::status(Status::Einval), [0; PROOF_LEN]));
                }
            }
        }
        let deadline = Instant::now() + self.cfg.timeout;
        if flight.all_or_nothing {
            self.runs(&mut flight, &routed);
            if flight.next_run() {
                let run = std::mem::take(&mut flight.current);
                self.send_set(&mut flight, &run, deadline)?;
                flight.current = run;
            }
        } else {
            self.send_set(&mut flight, &routed, deadline)?;
        }
        flight.scratch = routed;
        while self.flights.len() >= FLIGHTS_MAX {
            let oldest = *self.flights.keys().min().expect("not empty");
            self.flights.remove(&oldest);
        }
        self.next_ticket += 1;
        self.flights.insert(self.next_ticket, flight);
        Ok(self.next_ticket)
    }

    /// Puts the commands `idx` of an all-or-nothing message in the global order (partition,
    /// then name) in `flight.order`, cut into runs of consecutive commands whose partitions one
    /// server owns (`flight.ends`). Sorted by the names where the routes keep them, in place:
    /// the sort copied every name before.
    fn runs(&self, flight: &mut Flight, idx: &[usize]) {
        // Only lock commands come in all-or-nothing messages (the client sends objects one by
        // one); anything else sorts last, in its own run.
        let commands = &flight.commands;
        let key = |i: usize| match commands[i] {
            Command::Lock(c) => self
                .routes
                .get(c.lock)
                .map_or((u16::MAX, &[][..]), |r| (r.partition, r.name.as_slice())),
            _ => (u16::MAX, &[][..]),
        };
        let order = &mut flight.order;
        order.clear();
        order.extend_from_slice(idx);
        // Ties (none between two routed locks) in the message's order, as a stable sort has
        // them; an unstable sort, because a stable one allocates beyond 20 commands.
        order.sort_unstable_by(|&a, &b| (key(a), a).cmp(&(key(b), b)));
        flight.ends.clear();
        let mut last = None;
        for (k, &i) in order.iter().enumerate() {
            let owner = self.map.owner(key(i).0).and_then(|o| o.server);
            if k > 0 && last != Some(owner) {
                flight.ends.push(k);
            }
            last = Some(owner);
        }
        if !order.is_empty() {
            flight.ends.push(order.len());
        }
        flight.runs_sent = 0;
    }

    /// Sends the commands `idx` of `flight`, one message per server, each lock addressed by
    /// its id there and its partition's epoch now.
    pub(super) fn send_set(
        &mut self,
        flight: &mut Flight,
        idx: &[usize],
        deadline: Instant,
    ) -> io::Result<()> {
        // The parts of this sending, one per server, from `first` on.
        let first = flight.parts.len();
        for &i in idx {
            let addressed = match self.addressed_reachable(flight.commands[i], deadline) {
                Ok(a) => a,
                Err(e) => {
                    // Nothing of this sending went out: none of its parts is awaited.
                    let unsent = flight.parts.drain(first..);
                    flight.spent.extend(unsent);
                    return Err(e);
                }
            };
            let (server, command) = match addressed {
                Addressed::To(server, command) => (server, command),
                Addressed::Answer(status) => {
                    flight.results[i] = Some((CommandResult::status(status), [0; PROOF_LEN]));
                    continue;
                }
            };
            flight.epochs[i] = command.partition_epoch();
            flight.sent_to[i] = Some(server);
            let k = match flight.parts[first..]
                .iter()
                .position(|p| p.server == server)
            {
                Some(k) => first + k,
                None => {
                    let mut part = flight.spent.pop().unwrap_or_else(|| Part {
                        server,
                        ticket: 0,
                        message_id: 0,
                        idx: Vec::new(),
                        commands: Vec::new(),
                        sent: Instant::now(),
                    });
                    part.server = server;
                    part.idx.clear();
                    part.commands.clear();
                    flight.parts.push(part);
                    flight.parts.len() - 1
                }
            };
            flight.parts[k].idx.push(i);
            flight.parts[k].commands.push(command);
        }
        let flags = flight.header.flags & FLAG_ALL_OR_NOTHING;
        for k in first..flight.parts.len() {
            let sent = self.send_part(flight, k, flags, deadline);
            if sent.is_err() {
                // Parts not sent are not awaited.
                let unsent = flight.parts.drain(k..);
                flight.spent.extend(unsent);
                return sent;
            }
        }
        Ok(())
    }

    /// Sends part `k` of `flight` to its server, its message's flags `flags`.
    fn send_part(
        &mut self,
        flight: &mut Flight,
        k: usize,
        flags: u32,
        deadline: Instant,
    ) -> io::Result<()> {
        let message_id = self.next_message_id();
        let header = DataHeader {
            message_id,
            flags,
            ..flight.header
        };
        let part = &mut flight.parts[k];
        let mut buf = [0u8; dlock_core::proto::DATA_MESSAGE_MAX];
        let n = encode_data_request(&header, &part.commands, &mut buf)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a message did not encode"))?;
        let member = self.member(part.server, deadline)?;
        part.sent = Instant::now();
        part.ticket = member
            .conn
            .send_data(&buf[..n])
            .inspect_err(|_| member.broken = true)?;
        part.message_id = message_id;
        Ok(())
    }

    /// [`Self::addressed`], at a server the client can reach: when the owner's connection
    /// cannot be opened (a server killed, whose partitions the cluster is about to give to
    /// others), the map is fetched again from the other servers and `c` addressed anew,
    /// pausing between tries, while `deadline` lasts. Nothing was sent to the unreachable
    /// server, so sending `c` elsewhere cannot execute it twice; the partitions that moved are
    /// re-claimed on the way (`follow_map`). Without this a client whose
    /// owner died kept dialling it: nothing else refreshes the map when no server is left to
    /// answer `PartitionMoved`.
    fn addressed_reachable(&mut self, c: Command, deadline: Instant) -> io::Result<Addressed> {
        let mut pause = super::control::PAUSE_MIN;
        loop {
            let addressed = self.addressed(c, deadline)?;
            let Addressed::To(server, _) = addressed else {
                return Ok(addressed);
            };
            match self.member(server, deadline) {
                Ok(_) => return Ok(addressed),
                Err(e) if Instant::now() >= deadline => return Err(e),
                Err(e) => {
                    tracing::debug!(%server, error = %e, "owner unreachable: map fetched again");
                    if !self.follow_map(None, deadline) {
                        pause = self.retry_pause(pause, deadline);
                    }
                }
            }
        }
    }

    /// The client's command `c` as its server takes it: with the server's id and the
    /// partition's epoch, or answered here.
    fn addressed(&mut self, c: Command, deadline: Instant) -> io::Result<Addressed> {
        Ok(match c {
            Command::Lock(l) => match self.current_route(l.lock, deadline)? {
                Some((server, lock, partition_epoch)) => Addressed::To(
                    server,
                    Command::Lock(LockCommand {
                        lock,
                        partition_epoch,
                        ..l
                    }),
                ),
                // The grant this command is about was refused at a re-claim: gone.
                None => Addressed::Answer(Status::Fail),
            },
            Command::Object(o) => match self.current_object(o.object, deadline)? {
                Ok((server, object, partition_epoch)) => Addressed::To(
                    server,
                    Command::Object(ObjectCommand {
                        object,
                        partition_epoch,
                        ..o
                    }),
                ),
                Err(status) => Addressed::Answer(status),
            },
            Command::Join(_) => Addressed::Answer(Status::Einval),
        })
    }

    /// Where the lock with cluster id `lock` is now: (server, its id there, epoch), after
    /// following the map (a re-claim if its partition changed owner, a new reference if its
    /// re-claim was refused); `None` when its grant was refused at a re-claim and not taken
    /// again.
    fn current_route(
        &mut self,
        lock: u32,
        deadline: Instant,
    ) -> io::Result<Option<(ServerId, u32, u32)>> {
        let partition = self
            .routes
            .get(lock)
            .map(|r| r.partition)
            .ok_or_else(|| garbage("no route"))?;
        self.rehome_partition(partition, deadline);
        // The new owner serves once its old clients said `ReclaimDone`: this one's first. Paid
        // within `OWED_WAIT`, not the command's deadline: a debt refused at another server
        // (one still applying its map) must not hold every command until its deadline; what
        // is refused again is paid at the next retry pause or heartbeat.
        if self.owes_dones() {
            self.pay_dones(deadline.min(Instant::now() + OWED_WAIT));
        }
        let r = self.routes.get(lock).ok_or_else(|| garbage("no route"))?;
        let Some(server_lock) = r.server_lock else {
            let held =
                r.record.state != LocalState::Initialized && r.record.state != LocalState::Unlocked;
            if held {
                return Ok(None);
            }
            return self.resolve_again(lock, deadline);
        };
        Ok(Some((r.server, server_lock, r.epoch)))
    }

    /// Takes the reference of a lock whose re-claim was refused again (`GetLock` at its owner).
    fn resolve_again(
        &mut self,
        lock: u32,
        deadline: Instant,
    ) -> io::Result<Option<(ServerId, u32, u32)>> {
        let (kind, name, partition) = {
            let r = self.routes.get(lock).ok_or_else(|| garbage("no route"))?;
            (r.record.kind, r.name.clone(), r.partition)
        };
        let owner = self.map.owner(partition).copied().unwrap_or_default();
        let Some(server) = owner.server else {
            return Ok(None);
        };
        let mut reply = vec![0u8; dlock_core::proto::CONTROL_FRAME_MAX];
        let body = dlock_core::proto::ControlRequest::GetLock { kind, name: &name };
        let m = self.control_with(server, body, &mut reply, deadline)?;
        let frame = dlock_core::proto::decode_control_response(&reply[..m])
            .map_err(|_| garbage("a GetLock reply is malformed"))?;
        let dlock_core::proto::ControlResponse::Lock { lock: server_lock } = frame.body else {
            return Ok(None);
        };
        let incarnation = self.map.server(server).map_or(0, |e| e.incarnation());
        let r = self
            .routes
            .get_mut(lock)
            .ok_or_else(|| garbage("no route"))?;
        r.server = server;
        r.incarnation = incarnation;
        r.epoch = owner.epoch;
        r.server_lock = Some(server_lock);
        Ok(Some((server, server_lock, owner.epoch)))
    }
}

/// The link's record's request for the client's command `c`: the client decided `c` from its
/// own record of the same lock, which the link's follows (where the two could differ — a grant
/// the link saw lost — the link's record is first brought to what the client's command says).
pub(super) fn decide(record: &mut LocalLock, c: &LockCommand) -> Option<Request> {
    let mode = c.op.mode();
    let decision = match c.op {
        LockOp::TryExclusive
        | LockOp::TryShared
        | LockOp::TicketExclusive
        | LockOp::TicketShared => {
            if record.state.held_mode().is_some() {
                record.state = LocalState::Initialized;
                record.refs = 0;
            }
            record.trylock(mode, c.expire_ms, c.wait_ms)
        }
        LockOp::ExtendExclusive | LockOp::ExtendShared => record.extend(mode, c.expire_ms),
        LockOp::UnlockExclusive | LockOp::UnlockShared => {
            record.refs = record.refs.min(1);
            record.unlock()
        }
        LockOp::Downgrade => record.downgrade(),
    };
    match decision {
        Decision::Send(req) => Some(req),
        Decision::Answer(_) => None,
    }
}
