//! Frame-level entry points: bytes in, bytes out.
//!
//! A transport hands the server a whole frame (it knows the length from the header) and a reply
//! buffer; the server decodes, checks the protocol version, runs the request through the typed
//! methods and encodes the reply. A frame whose header cannot be read gets no reply: the
//! function returns the decode error and the transport closes the connection. A frame with a
//! readable header but a bad body gets an error reply (`Einval`) that echoes its message id.
//!
//! Binding a connection to a client id is the transport's job: after `ClientInit` it checks
//! that every later control frame on that connection carries the id it was given (the
//! reference drops a connection that lies), then calls in here.

use super::data::{Reply, names_partition_epoch};
use super::waiters::{Disposition, MessageMeta};
use super::{Counter, Rejoin, Server};
use crate::config::BATCH_MAX;
use crate::ids::{ClientId, GrantProof, Peer, Session};
use crate::manager::retain::Role;
use crate::manager::value::ValueRead;
use crate::proto::{
    BatchEntries, BatchEntry, CLUSTER_VERSIONS, Command, CommandResult, ControlHeader,
    ControlRequest, ControlResponse, DataFrame, DataRequest, DecodeError, EncodeError, FLAG_PROOFS,
    FLAG_VALUES, InitReply, PROTO_VERSION_REVOKE_TIMEOUT, SERVER_VERSIONS, VersionRange,
    begin_data_response, data_message_len, decode_control_request, encode_control_response,
    finish_data_proofs, finish_value_replies, negotiate, peek_control_header, peek_data_frame,
    put_command_result, put_data_proof, put_data_result, put_value_reply,
};
use crate::status::Status;

/// Why a frame got no reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameError {
    /// The frame could not be read far enough to answer it; close the connection.
    Malformed(DecodeError),
    /// The reply buffer is too small (transports size it with `CONTROL_FRAME_MAX` and
    /// `DATA_RESPONSE_MAX`, so this is a transport bug).
    Reply(EncodeError),
}

impl From<EncodeError> for FrameError {
    fn from(e: EncodeError) -> Self {
        FrameError::Reply(e)
    }
}

/// Whether a non-init frame's version is one a server speaking `versions` speaks.
#[inline]
fn version_spoken(versions: VersionRange, v: u8) -> bool {
    (versions.min..=versions.max).contains(&v)
}

impl<'r> Server<'r> {
    /// The protocol versions this server speaks: a cluster server only those that carry the
    /// partition epoch and `PartitionMoved` (`CLUSTER_VERSIONS`).
    #[inline]
    pub(super) fn versions(&self) -> VersionRange {
        if self.is_cluster() {
            CLUSTER_VERSIONS
        } else {
            SERVER_VERSIONS
        }
    }

    /// Handles one control frame `req` and writes the reply into `out`; returns its length.
    /// For a local client, exempt from the per-peer cap ([`Server::handle_control_from`]).
    pub fn handle_control(
        &mut self,
        req: &[u8],
        out: &mut [u8],
        now_ms: u64,
    ) -> Result<usize, FrameError> {
        self.handle_control_from(Peer::EXEMPT, req, out, now_ms)
    }

    /// [`Server::handle_control`] for a frame that came from `peer`: a registration it makes
    /// counts toward that peer's cap (`peers.rs`).
    pub fn handle_control_from(
        &mut self,
        peer: Peer,
        req: &[u8],
        out: &mut [u8],
        now_ms: u64,
    ) -> Result<usize, FrameError> {
        self.control_frame((peer, Role::Client), req, out, now_ms)
            .map(|(len, _)| len)
    }

    /// [`Server::handle_control_from`] for a sender the transport gave `role` (its
    /// configuration names it a recoverer, or not): only a recoverer's `RecoveryDone` and
    /// `ListRetained` are served.
    pub fn handle_control_as(
        &mut self,
        (peer, role): (Peer, Role),
        req: &[u8],
        out: &mut [u8],
        now_ms: u64,
    ) -> Result<usize, FrameError> {
        self.control_frame((peer, role), req, out, now_ms)
            .map(|(len, _)| len)
    }

    /// [`Server::handle_control_from`], with the client a successful `ClientInit` or
    /// `ClientReinit` registered, so a transport learns of it without reading the reply.
    pub(super) fn control_frame(
        &mut self,
        (peer, role): (Peer, Role),
        req: &[u8],
        out: &mut [u8],
        now_ms: u64,
    ) -> Result<(usize, Option<ClientId>), FrameError> {
        let (header, is_response) = peek_control_header(req).map_err(FrameError::Malformed)?;
        if is_response {
            return Err(FrameError::Malformed(DecodeError::UnknownType(
                header.msg.response_code(),
            )));
        }
        let reply = |status: Status| ControlHeader {
            word: status as u16 as u32,
            ..header
        };
        let frame = match decode_control_request(req) {
            Ok(f) => f,
            Err(e) => {
                self.stats.bump(Counter::ControlRequests);
                let status = self.refuse(e.status());
                let empty = ControlResponse::Empty;
                return Ok((encode_control_response(&reply(status), &empty, out)?, None));
            }
        };
        let is_init = matches!(
            frame.body,
            ControlRequest::ClientInit { .. }
                | ControlRequest::ClientReinit { .. }
                | ControlRequest::ClientJoin { .. }
        );
        // A frame of a version before the message existed cannot carry it (a version-5
        // `ReclaimDones`) — refused as a version this server does not speak.
        let too_old = matches!(frame.body, ControlRequest::ReclaimDones(_))
            && header.version < crate::proto::PROTO_VERSION_RECLAIM_DONES;
        if too_old || !is_init && !version_spoken(self.versions(), header.version) {
            self.stats.bump(Counter::ControlRequests);
            let status = self.refuse(Status::ProtoVersionNegotiationFail);
            let empty = ControlResponse::Empty;
            return Ok((encode_control_response(&reply(status), &empty, out)?, None));
        }
        if let ControlRequest::GetMap { offset } = frame.body {
            // Answered here: the reply borrows the server's encoded map.
            self.stats.bump(Counter::ControlRequests);
            let written = match self.map_chunk(offset) {
                Ok(chunk) => {
                    let body = ControlResponse::MapChunk(chunk);
                    encode_control_response(&reply(Status::Success), &body, out)?
                }
                Err(s) => {
                    let s = self.refuse(s);
                    encode_control_response(&reply(s), &ControlResponse::Empty, out)?
                }
            };
            return Ok((written, None));
        }
        if let ControlRequest::ReclaimDones(dones) = frame.body {
            // Its reply borrows a buffer of up to 255 statuses: written there, not returned.
            let written = self.reclaim_dones_frame(&header, &dones, out, now_ms)?;
            return Ok((written, None));
        }
        if let ControlRequest::ListRetained(q) = frame.body {
            // Its reply borrows lock names from the tables: written here, not returned.
            let written = self.list_retained_frame(role, &header, q, out)?;
            return Ok((written, None));
        }
        let mut entries = [BatchEntry {
            id: 0,
            status: Status::Success,
        }; BATCH_MAX];
        let counters = self.stats().0;
        let at = (peer, role);
        let result = self.control_request(at, &header, frame.body, &mut entries, &counters, now_ms);
        let registered = match &result {
            Ok(ControlResponse::Init(init)) => ClientId::new(init.client),
            _ => None,
        };
        let written = match result {
            Ok(body) => encode_control_response(&reply(Status::Success), &body, out)?,
            // A cluster server's refusal of a partition it does not serve carries its map
            // version, so the client knows how new a map to fetch.
            Err(Status::PartitionMoved) => {
                let map_version = self.map_version().unwrap_or(0);
                let body = ControlResponse::PartitionMoved { map_version };
                encode_control_response(&reply(Status::PartitionMoved), &body, out)?
            }
            Err(status) => encode_control_response(&reply(status), &ControlResponse::Empty, out)?,
        };
        Ok((written, registered))
    }

    /// A `ClientInit` (`session` `None`), a `ClientReinit` (`Some((session, false))`) or a
    /// `ClientJoin` (`Some((session, true))`) of `header.word` from `peer`: the version
    /// negotiated, then the registration.
    fn registration(
        &mut self,
        peer: Peer,
        header: &ControlHeader,
        min_version: u8,
        lease_ms: u32,
        session: Option<(&Session, bool)>,
        now_ms: u64,
    ) -> Result<ControlResponse<'static>, Status> {
        let client_range = VersionRange {
            min: min_version,
            max: header.version,
        };
        let v = negotiate(client_range, self.versions()).map_err(|s| self.refuse(s))?;
        let back = |session| Rejoin {
            raw: header.word,
            version: v,
            lease_ms,
            session,
        };
        let registered = match session {
            Some((session, true)) => self.client_join(peer, back(session), now_ms),
            Some((session, false)) => self.client_reinit_from(peer, back(session), now_ms),
            None => self.client_init_from(peer, v, lease_ms, now_ms),
        };
        registered.map(|id| self.init_reply(id.get(), v))
    }

    /// Runs control request `body` from `peer` (its header `header`), whose reply may borrow
    /// `entries` and `counters`.
    fn control_request<'e>(
        &mut self,
        (peer, role): (Peer, Role),
        header: &ControlHeader,
        body: ControlRequest<'_>,
        entries: &'e mut [BatchEntry; BATCH_MAX],
        counters: &'e [u64],
        now_ms: u64,
    ) -> Result<ControlResponse<'e>, Status> {
        let client = header.word;
        match body {
            ControlRequest::ClientInit {
                min_version,
                lease_ms,
            } => self.registration(peer, header, min_version, lease_ms, None, now_ms),
            ControlRequest::ClientReinit {
                min_version,
                lease_ms,
                session,
            } => {
                let session = Some((&session, false));
                self.registration(peer, header, min_version, lease_ms, session, now_ms)
            }
            ControlRequest::ClientDeinit => self
                .client_deinit(client, now_ms)
                .map(|()| ControlResponse::Empty),
            ControlRequest::Heartbeat => self
                .heartbeat(client, now_ms)
                .map(|()| ControlResponse::Empty),
            ControlRequest::ReinitDone => self
                .reinit_done(client, now_ms)
                .map(|()| ControlResponse::Empty),
            ControlRequest::Stats => {
                self.stats.bump(Counter::ControlRequests);
                Ok(ControlResponse::Counters(
                    crate::proto::Counters::from_slice(counters),
                ))
            }
            ControlRequest::GetLock { kind, name } => self
                .get_lock(client, kind, name, now_ms)
                .map(|id| ControlResponse::Lock { lock: id.raw() }),
            ControlRequest::ReleaseLock { lock } => self
                .release_lock(client, lock, now_ms)
                .map(|()| ControlResponse::Empty),
            ControlRequest::ObjectCreate {
                name,
                init,
                lease_s,
            } => self
                .object_create(client, name, init, lease_s, now_ms)
                .map(|id| ControlResponse::Object { object: id.raw() }),
            ControlRequest::ObjectGet { name, lease_s } => self
                .object_get(client, name, lease_s, now_ms)
                .map(|(id, cell)| ControlResponse::ObjectRef {
                    object: id.raw(),
                    cell,
                }),
            ControlRequest::ObjectRelease { object } => self
                .object_release(client, object, now_ms)
                .map(|()| ControlResponse::Empty),
            ControlRequest::ObjectDestroy { object } => self
                .object_destroy(client, object, now_ms)
                .map(|()| ControlResponse::Empty),
            ControlRequest::BatchGetLock(batch) => {
                self.batch(client, now_ms, entries, batch.len(), |s, slot, i| {
                    let (kind, name) = batch.get(i).unwrap_or((crate::LockKind::Atomic, &[]));
                    s.get_lock_for(slot, kind, name, now_ms).map(|id| id.raw())
                })
            }
            ControlRequest::BatchReleaseLock(ids) => {
                self.batch(client, now_ms, entries, ids.len(), |s, slot, i| {
                    let id = ids.get(i).unwrap_or(0);
                    s.release_lock_for(slot, id).map(|()| id)
                })
            }
            ControlRequest::BatchUpdateLocks(claims) => self
                .update_locks(client, &claims, entries, now_ms)
                .map(ControlResponse::Entries),
            ControlRequest::ClientJoin {
                min_version,
                lease_ms,
                session,
            } => {
                let session = Some((&session, true));
                self.registration(peer, header, min_version, lease_ms, session, now_ms)
            }
            ControlRequest::ReclaimDone { partition, epoch } => self
                .reclaim_done(client, partition, epoch, now_ms)
                .map(|()| ControlResponse::Empty),
            // Answered in `control_frame` (its reply borrows the map); a standalone server
            // answers it `Einval`: it has no map.
            ControlRequest::GetMap { .. } => Err(self.refuse(Status::Einval)),
            ControlRequest::RecoveryDone { dead } => self
                .recovery_done(role, dead, now_ms)
                .map(|locks| ControlResponse::Released { locks }),
            // `control_frame` answers them before they get here.
            ControlRequest::ListRetained(_) | ControlRequest::ReclaimDones(_) => {
                Err(self.refuse(Status::Einval))
            }
            // The transport answers a drain (it alone knows the peer and the membership); one
            // that reaches the state machine came some other way and is refused.
            ControlRequest::Drain => Err(self.refuse(Status::Einval)),
        }
    }

    fn init_reply(&self, client: u32, version: u8) -> ControlResponse<'static> {
        let (slot, session) = self
            .client_session(client)
            .unwrap_or((0, crate::ids::Session::NONE));
        let lease_ms = self
            .t
            .clients
            .get(slot as usize)
            .map_or(self.cfg.client_lease_ms, |c| c.lease_ms);
        ControlResponse::Init(InitReply {
            client,
            version,
            recovering: self.recovering > 0,
            // Epochs are per partition in a cluster: the map carries them.
            epoch: if self.is_cluster() { 0 } else { self.cfg.epoch },
            lease_ms,
            objects_max: self.cfg.objects_max,
            slot,
            session,
            // An older client requires the word zero, and its revokes lapse at its lease.
            revoke_timeout_ms: match version >= PROTO_VERSION_REVOKE_TIMEOUT {
                true => self.cfg.timing.revoke_timeout_for(lease_ms, version),
                false => 0,
            },
        })
    }

    /// Runs a control batch of `n` entries for a serving client: each entry's outcome is
    /// recorded on its own (the reference's batches are per item).
    fn batch<'e>(
        &mut self,
        client: u32,
        now_ms: u64,
        entries: &'e mut [BatchEntry; BATCH_MAX],
        n: usize,
        mut one: impl FnMut(&mut Self, u32, usize) -> Result<u32, Status>,
    ) -> Result<ControlResponse<'e>, Status> {
        self.stats.bump(Counter::ControlRequests);
        let slot = self
            .serving_client(client, now_ms)
            .map_err(|s| self.refuse(s))?;
        for (i, e) in entries.iter_mut().enumerate().take(n) {
            *e = match one(self, slot, i) {
                Ok(id) => BatchEntry {
                    id,
                    status: Status::Success,
                },
                Err(status) => BatchEntry {
                    id: 0,
                    status: self.refuse(status),
                },
            };
        }
        Ok(ControlResponse::Entries(BatchEntries::from_slice(
            &entries[..n],
        )))
    }

    /// Answers data message `msg` without executing it: every command gets `status`. For a
    /// message a transport will not let run (one naming a client its connection does not speak
    /// for) or runs itself (a join). The sender learns nothing else.
    pub(super) fn answer_frame(
        &mut self,
        msg: DataFrame<'_>,
        out: &mut [u8],
        status: Status,
    ) -> Result<usize, FrameError> {
        let msg = msg.decode().map_err(|e| {
            self.stats.bump(Counter::Einval);
            FrameError::Malformed(e)
        })?;
        answer(&msg, out, status)
    }

    /// Handles one data message `req` and writes the reply into `out`; returns its length, or 0
    /// when the message is a waiting trylock that was parked (its reply will come from
    /// [`Server::take_replies`]). A transport that decides who may send what goes through
    /// [`Server::dispatch`] instead, which applies the rules of `route` around the same steps.
    pub fn handle_data(
        &mut self,
        req: &[u8],
        out: &mut [u8],
        now_ms: u64,
    ) -> Result<usize, FrameError> {
        let msg = peek_data_frame(req).map_err(|e| {
            self.stats.bump(Counter::Einval);
            FrameError::Malformed(e)
        })?;
        let found = self.client_slot(msg.header().client);
        self.execute_frame(found, msg, out, now_ms)
    }

    /// Executes data message `msg` for its client, registered in slot `found` (`None`: not
    /// registered) — the header read and the client found once, by the caller — and writes the
    /// reply into `out`: [`Server::handle_data`]'s contract.
    pub(super) fn execute_frame(
        &mut self,
        found: Option<u32>,
        msg: DataFrame<'_>,
        out: &mut [u8],
        now_ms: u64,
    ) -> Result<usize, FrameError> {
        // Each command is parsed once, here, and read back from this array.
        let mut commands = [Command::NONE; BATCH_MAX];
        let msg = msg.decode_into(&mut commands).map_err(|e| {
            self.stats.bump(Counter::Einval);
            FrameError::Malformed(e)
        })?;
        let header = msg.header();
        let n = msg.len();
        if !self.is_cluster() && names_partition_epoch(&commands[..n]) {
            // Refused whole, as the bytes were when they were reserved (`data.rs`).
            self.stats.bump(Counter::Einval);
            return Err(FrameError::Malformed(DecodeError::BadField));
        }
        let mut len = begin_data_response(&msg, out)?;
        let values = msg.wants_values();
        let proof_flag = if self.session_key.is_some() {
            FLAG_PROOFS
        } else {
            0
        };
        let value_flag = if values { FLAG_VALUES } else { 0 };
        if out.len() < data_message_len(n, proof_flag | value_flag, true) {
            // A keyed server may add a proof trailer, and a request that asks for value blocks
            // gets a value trailer: the transport must size `out` for both.
            return Err(FrameError::Reply(EncodeError::BufferTooSmall));
        }
        if values {
            // Decided before anything runs, so that proofs land after it; entries of commands
            // that were not granted stay zero ("not present").
            put_value_reply(out, n, 0, None, true)?;
            len = finish_value_replies(out, n)?;
        }
        // `begin_data_response` checked that `out` holds the whole reply (and the check above
        // its trailers), so no write can fail.
        let mut reply = FrameReply {
            out,
            n,
            commands: &commands,
            proofs: false,
        };
        if version_spoken(self.versions(), header.version) {
            let meta = MessageMeta {
                version: header.version,
                message_id: header.message_id,
                flags: header.flags,
            };
            // The decoder bounds the count to 1..=31, so the message is never refused whole.
            let done = self.execute_with(
                (header.client, found),
                meta,
                n,
                (|i| commands[i], |i| msg.value_block(i)),
                &mut reply,
                now_ms,
            );
            if done == Ok(Disposition::Deferred) {
                return Ok(0);
            }
        } else {
            let status = self.refuse(Status::ProtoVersionNegotiationFail);
            (0..n).for_each(|i| {
                reply.reply(i, &CommandResult::status(status), &GrantProof::NONE, None)
            });
        }
        if reply.proofs {
            len = finish_data_proofs(reply.out, n)?;
        }
        Ok(len)
    }
}

/// The bytes path's [`Reply`]: each outcome written into the reply in `out`, with its trailers.
struct FrameReply<'o, 'c> {
    out: &'o mut [u8],
    /// Commands in the message.
    n: usize,
    /// The message's commands, decoded.
    commands: &'c [Command; BATCH_MAX],
    /// Whether the proof trailer has begun.
    proofs: bool,
}

impl Reply for FrameReply<'_, '_> {
    /// Always inlined into the command loop (`data::Reply` says why). The trailers are the
    /// rare case and stay out of line.
    #[inline(always)]
    fn reply(&mut self, i: usize, r: &CommandResult, p: &GrantProof, v: Option<&ValueRead>) {
        let written = put_command_result(self.out, i, &self.commands[i], r);
        debug_assert!(written.is_ok());
        if v.is_some() || !p.is_none() {
            put_trailers(self.out, self.n, i, (v, p), &mut self.proofs);
        }
    }
}

/// Writes command `i`'s value block and proof, if it has them, into the trailers of the `n`-
/// command reply in `out` (sized for both: `execute_frame` checked); `proofs` says whether the
/// proof trailer has begun.
#[cold]
fn put_trailers(
    out: &mut [u8],
    n: usize,
    i: usize,
    (value, proof): (Option<&ValueRead>, &GrantProof),
    proofs: &mut bool,
) {
    if value.is_some() {
        let written = put_value_reply(out, n, i, value, false);
        debug_assert!(written.is_ok());
    }
    if !proof.is_none() {
        let written = put_data_proof(out, n, i, &proof.mac, !*proofs);
        debug_assert!(written.is_ok());
        *proofs = true;
    }
}

/// Writes the reply to `msg` in which every command gets `status`.
pub(super) fn answer(
    msg: &DataRequest<'_>,
    out: &mut [u8],
    status: Status,
) -> Result<usize, FrameError> {
    let len = begin_data_response(msg, out)?;
    let answer = CommandResult::status(status);
    for i in 0..msg.len() {
        put_data_result(msg, i, &answer, out)?;
    }
    Ok(len)
}
