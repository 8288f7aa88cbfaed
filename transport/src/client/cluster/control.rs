//! The client's control requests over the cluster: registration to one server, lock names
//! routed to their partition's owner (with the handle filed under a cluster id), references
//! released where they live, heartbeats and leaving sent to every server the client joined.

use std::io;
use std::time::{Duration, Instant};

use dlock_core::cluster::{ServerId, partition_of};
use dlock_core::proto::{
    Batch, BatchEntry, CONTROL_FRAME_MAX, ControlHeader, ControlRequest, ControlResponse, MsgType,
    decode_control_request, decode_control_response, encode_control_response,
};
use dlock_core::{LockKind, Status};

use super::routes::{Route, Routes};
use super::{ClusterLink, Dial, fetch, garbage};
use crate::client::LocalLock;

/// The first pause before a request refused `NotReady` (or `PartitionMoved` by a map that did
/// not change yet) is sent again; it doubles up to [`PAUSE_MAX`].
pub(super) const PAUSE_MIN: Duration = Duration::from_millis(2);
/// The longest pause between two retries.
pub(super) const PAUSE_MAX: Duration = Duration::from_millis(100);

/// What one attempt at a routed control request came to.
enum Attempt {
    /// The reply is final (a success or a refusal the client reads): its length.
    Done(usize),
    /// Refused by a partition check (`PartitionMoved`, `NotReady`): the reply's length.
    Retry(usize),
}

impl<D: Dial> ClusterLink<D> {
    /// Answers the client's control frame `req` into `reply` (module doc of `cluster`).
    pub(super) fn route_control(
        &mut self,
        req: &[u8],
        reply: &mut [u8],
        deadline: Instant,
    ) -> io::Result<usize> {
        let frame = decode_control_request(req).map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                "the client sent a malformed request",
            )
        })?;
        let h = frame.header;
        match frame.body {
            ControlRequest::ClientInit {
                min_version,
                lease_ms,
            } => self.register(h, min_version, lease_ms, reply, deadline),
            ControlRequest::Heartbeat | ControlRequest::ClientDeinit => {
                self.everywhere(h, frame.body, reply, deadline)
            }
            ControlRequest::GetLock { kind, name } => self.get_lock(h, kind, name, reply, deadline),
            ControlRequest::ReleaseLock { lock } => self.release_lock(h, lock, reply, deadline),
            ControlRequest::BatchGetLock(names) => {
                let names: Vec<(LockKind, &[u8])> = names.iter().collect();
                let one = ControlHeader {
                    msg: MsgType::GetLock,
                    ..h
                };
                self.one_by_one(h, names.len(), reply, deadline, |link, i, r, d| {
                    let (kind, name) = names[i];
                    link.get_lock(one, kind, name, r, d)
                })
            }
            ControlRequest::BatchReleaseLock(ids) => {
                let ids: Vec<u32> = ids.iter().collect();
                let one = ControlHeader {
                    msg: MsgType::ReleaseLock,
                    ..h
                };
                self.one_by_one(h, ids.len(), reply, deadline, |link, i, r, d| {
                    link.release_lock(one, ids[i], r, d)
                })
            }
            ControlRequest::Stats => {
                let home = self.home().ok_or_else(|| garbage("not registered"))?;
                let m = self.control_with(home, frame.body, reply, deadline)?;
                rewrite_id(reply, m, h)
            }
            ControlRequest::ObjectCreate { name, lease_s, .. }
            | ControlRequest::ObjectGet { name, lease_s } => {
                self.object_by_name(h, frame.body, name, lease_s, reply, deadline)
            }
            ControlRequest::ObjectRelease { object } => {
                self.object_by_id(h, object, false, reply, deadline)
            }
            ControlRequest::ObjectDestroy { object } => {
                self.object_by_id(h, object, true, reply, deadline)
            }
            _ => answer(h, Status::Einval, ControlResponse::Empty, reply),
        }
    }

    /// The server the client registered with first (any joined one would do for `Stats`).
    fn home(&self) -> Option<dlock_core::cluster::ServerId> {
        self.joined().into_iter().next()
    }

    /// Sends `body` to every server the client registered with that the map still names (in
    /// the same incarnation: one that left owns nothing of the client's, and its lease no
    /// longer matters); `Success` when all said so, else the first refusal. A server that
    /// does not answer within the link's patience fails the call, once the others were sent
    /// it. A heartbeat first checks the map's version, so that a
    /// client learns of a move (and re-claims) within a heartbeat even in partitions it is not
    /// using, and does not count on a server that left; then it pays the re-claims and
    /// `ReclaimDone`s a new owner did not take yet (`reclaim.rs`).
    fn everywhere(
        &mut self,
        h: ControlHeader,
        body: ControlRequest<'_>,
        reply: &mut [u8],
        deadline: Instant,
    ) -> io::Result<usize> {
        let heartbeat = matches!(body, ControlRequest::Heartbeat);
        if heartbeat {
            self.check_map(deadline);
        }
        let gone: Vec<_> = self
            .members
            .iter()
            .filter(|(id, m)| {
                self.map
                    .server(**id)
                    .is_none_or(|e| e.incarnation() != m.incarnation)
            })
            .map(|(id, _)| *id)
            .collect();
        for id in gone {
            self.members.remove(&id);
        }
        let mut servers: Vec<_> = self.members.keys().copied().collect();
        servers.sort_unstable();
        let mut status = Status::Success;
        let mut failed = None;
        for server in servers {
            // Each server within the link's patience, and a failed one does not keep the
            // message from the others: a frozen server held every heartbeat (and the thread
            // that sends it) for the whole deadline while the cluster took its partitions.
            let until = self.patient(deadline);
            let m = match self.control_with(server, body, reply, until) {
                Ok(m) => m,
                Err(e) => {
                    tracing::debug!(%server, error = %e, "dlock: not reached");
                    failed.get_or_insert(e);
                    continue;
                }
            };
            let s = decode_control_response(&reply[..m])
                .ok()
                .and_then(|f| f.header.status())
                .ok_or_else(|| garbage("a reply carries no status"))?;
            if status == Status::Success {
                status = s;
            }
        }
        if heartbeat {
            self.pay_owed(deadline);
        }
        if let Some(e) = failed {
            return Err(e);
        }
        if matches!(body, ControlRequest::ClientDeinit) && status == Status::Success {
            self.routes.clear();
            self.objects.clear();
            self.members.clear();
        }
        answer(h, status, ControlResponse::Empty, reply)
    }

    /// Asks the servers the client joined, in turn, for their map's version (one `GetMap`
    /// chunk) until one answers, and follows a newer map; when none answers (the only one
    /// died, say), fetches the map from any server of the map or a seed. Failures are logged:
    /// the next heartbeat asks again.
    fn check_map(&mut self, deadline: Instant) {
        let seen = self.joined_map_version(None, deadline);
        match seen {
            Some((server, v)) if v > self.map.version() => {
                self.follow_map(Some(server), deadline);
            }
            Some(_) => {}
            None => {
                self.follow_map(None, deadline);
            }
        }
    }

    /// Asks the servers the client joined but `skip`, in turn, each within the link's patience
    /// and over the connection it has (none is opened), for their map's version (one `GetMap`
    /// chunk); the first to answer and its version. One that fails is marked broken.
    pub(super) fn joined_map_version(
        &mut self,
        skip: Option<ServerId>,
        deadline: Instant,
    ) -> Option<(ServerId, u64)> {
        let mut message_id = self.message_id;
        let mut seen = None;
        // Every server joined holds the client's registration on this connection.
        let me = self.identity.map_or(0, |i| i.id);
        for server in self.joined() {
            if Some(server) == skip {
                continue;
            }
            let until = self.patient(deadline);
            let Some(m) = self.members.get_mut(&server) else {
                continue;
            };
            match fetch::map_version(&mut m.conn, me, until, &mut message_id) {
                Ok(v) => {
                    seen = Some((server, v));
                    break;
                }
                Err(e) => {
                    m.broken = true;
                    tracing::debug!(%server, error = %e, "dlock: map version not read");
                }
            }
        }
        self.message_id = message_id;
        seen
    }

    /// A batch of names or ids, entry by entry (each may live on another server): `entry(i)`
    /// answers entry `i` as its single request would be answered; the batch's reply lists
    /// each entry's id and status. Each entry succeeds or fails on its own, as in a batch to
    /// one server; a transport failure fails the call.
    fn one_by_one(
        &mut self,
        h: ControlHeader,
        n: usize,
        reply: &mut [u8],
        deadline: Instant,
        mut entry: impl FnMut(&mut Self, usize, &mut [u8], Instant) -> io::Result<usize>,
    ) -> io::Result<usize> {
        let mut one = vec![0u8; CONTROL_FRAME_MAX];
        let mut entries = Vec::with_capacity(n);
        for i in 0..n {
            let m = entry(self, i, &mut one, deadline)?;
            let frame = decode_control_response(&one[..m])
                .map_err(|_| garbage("an entry's answer is malformed"))?;
            let status = frame.header.status().unwrap_or(Status::BadResponse);
            let id = match frame.body {
                ControlResponse::Lock { lock } => lock,
                _ => 0,
            };
            entries.push(BatchEntry { id, status });
        }
        let body = ControlResponse::Entries(Batch::from_slice(&entries));
        answer(h, Status::Success, body, reply)
    }

    /// `GetLock` at the owner of the name's partition; the handle is filed under a cluster id,
    /// which is what the client gets.
    fn get_lock(
        &mut self,
        h: ControlHeader,
        kind: LockKind,
        name: &[u8],
        reply: &mut [u8],
        deadline: Instant,
    ) -> io::Result<usize> {
        if let Some(id) = self.routes.by_name(kind, name) {
            return answer(
                h,
                Status::Success,
                ControlResponse::Lock { lock: id },
                reply,
            );
        }
        let body = ControlRequest::GetLock { kind, name };
        let mut pause = PAUSE_MIN;
        loop {
            let partition = partition_of(name, self.map.partitions());
            let owner = self.map.owner(partition).copied().unwrap_or_default();
            let attempt = match owner.server {
                Some(server) => {
                    let m = self.control_with(server, body, reply, deadline)?;
                    let frame = decode_control_response(&reply[..m])
                        .map_err(|_| garbage("a GetLock reply is malformed"))?;
                    match (frame.header.status(), frame.body) {
                        (Some(Status::Success), ControlResponse::Lock { lock }) => {
                            let incarnation =
                                self.map.server(server).map_or(0, |e| e.incarnation());
                            let id = self.routes.insert(Route {
                                name: name.to_vec(),
                                partition,
                                server,
                                incarnation,
                                epoch: owner.epoch,
                                server_lock: Some(lock),
                                record: LocalLock::new(Routes::unfiled(), kind),
                            });
                            return answer(
                                h,
                                Status::Success,
                                ControlResponse::Lock { lock: id },
                                reply,
                            );
                        }
                        (Some(Status::PartitionMoved | Status::NotReady), _) => Attempt::Retry(m),
                        _ => Attempt::Done(m),
                    }
                }
                None => Attempt::Retry(answer(
                    h,
                    Status::PartitionMoved,
                    moved(self.map.version()),
                    reply,
                )?),
            };
            match attempt {
                Attempt::Done(m) => return rewrite_id(reply, m, h),
                Attempt::Retry(m) if Instant::now() >= deadline => return rewrite_id(reply, m, h),
                Attempt::Retry(_) => {
                    if !self.follow_map(owner.server, deadline) {
                        pause = self.retry_pause(pause, deadline);
                    }
                }
            }
        }
    }

    /// `ReleaseLock` of a cluster id, at the server the lock lives on now.
    fn release_lock(
        &mut self,
        h: ControlHeader,
        lock: u32,
        reply: &mut [u8],
        deadline: Instant,
    ) -> io::Result<usize> {
        let mut pause = PAUSE_MIN;
        loop {
            let Some(route) = self.routes.get(lock) else {
                return answer(h, Status::Einval, ControlResponse::Empty, reply);
            };
            let (server, server_lock) = (route.server, route.server_lock);
            let Some(server_lock) = server_lock else {
                // The server refused this lock's re-claim: it holds no reference to give back.
                self.routes.remove(lock);
                return answer(h, Status::Success, ControlResponse::Empty, reply);
            };
            let body = ControlRequest::ReleaseLock { lock: server_lock };
            let m = self.control_with(server, body, reply, deadline)?;
            let status = decode_control_response(&reply[..m])
                .ok()
                .and_then(|f| f.header.status())
                .ok_or_else(|| garbage("a ReleaseLock reply carries no status"))?;
            match status {
                Status::Success => {
                    self.routes.remove(lock);
                    return rewrite_id(reply, m, h);
                }
                // The server holds no reference of the client's under that id (it declared the
                // client dead and freed what it held): nothing is left to give back there.
                Status::LockNotGet => {
                    self.routes.remove(lock);
                    return answer(h, Status::Success, ControlResponse::Empty, reply);
                }
                Status::PartitionMoved | Status::NotReady if Instant::now() < deadline => {
                    if !self.follow_map(Some(server), deadline) {
                        pause = self.retry_pause(pause, deadline);
                    }
                }
                _ => return rewrite_id(reply, m, h),
            }
        }
    }

    /// Sleeps `pause` (never past `deadline`); the next pause.
    pub(super) fn pause(&self, pause: Duration, deadline: Instant) -> Duration {
        let left = deadline.saturating_duration_since(Instant::now());
        std::thread::sleep(pause.min(left));
        (pause * 2).min(PAUSE_MAX)
    }
}

/// The body of a `PartitionMoved` answer.
pub(super) fn moved(map_version: u64) -> ControlResponse<'static> {
    ControlResponse::PartitionMoved { map_version }
}

/// Writes the link's own answer to the request with header `h`.
pub(super) fn answer(
    h: ControlHeader,
    status: Status,
    body: ControlResponse<'_>,
    reply: &mut [u8],
) -> io::Result<usize> {
    let header = ControlHeader {
        word: status as u32,
        ..h
    };
    encode_control_response(&header, &body, reply)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "an answer did not encode"))
}

/// A server's reply in `reply[..m]` (to the link's own message id) re-addressed to the
/// client's request `h`.
pub(super) fn rewrite_id(reply: &mut [u8], m: usize, h: ControlHeader) -> io::Result<usize> {
    let mut copy = [0u8; CONTROL_FRAME_MAX];
    copy[..m].copy_from_slice(&reply[..m]);
    let frame =
        decode_control_response(&copy[..m]).map_err(|_| garbage("a control reply is malformed"))?;
    let header = ControlHeader {
        message_id: h.message_id,
        ..frame.header
    };
    encode_control_response(&header, &frame.body, reply)
        .map_err(|_| garbage("a control reply did not encode again"))
}
