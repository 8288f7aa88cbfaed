//! The client's life with its server: registering (and re-registering after a failure),
//! heartbeats, the server's counters, and leaving. Everything here is one control exchange
//! ([`Client::control`]); lock references are `refs.rs`'s, re-claims after a failover
//! `recovery.rs`'s.

use std::time::{Duration, Instant};

use dlock_core::proto::{
    CONTROL_FRAME_MAX, CONTROL_HEADER_LEN, ControlHeader, ControlRequest, ControlRequestFrame,
    ControlResponse, LockFlags, MsgType, PROTO_VERSION, decode_control_response,
    encode_control_request,
};
use dlock_core::server::Counter;
use dlock_core::{ClientId, Status};

use super::link::Link;
use super::{Client, Connection, Endpoint, Error, LocalLock, Op};

impl<C: Connection> Client<C> {
    /// Registers (`word` 0) or re-registers (`word`: this client's id) with `body`, and binds
    /// the data path the reply names.
    pub(super) fn register(
        &mut self,
        op: Op,
        word: u32,
        body: ControlRequest<'_>,
    ) -> Result<(), Error> {
        let reply = self.control(op, word, body)?;
        let ControlResponse::Init(init) = reply else {
            return Err(op.err(Status::BadResponse));
        };
        self.session = init.session;
        self.id = ClientId::new(init.client).ok_or_else(|| op.err(Status::BadResponse))?;
        self.version = init.version;
        self.recovering = init.recovering;
        self.epoch = init.epoch;
        self.lease = Duration::from_millis(init.lease_ms.into());
        self.revoke_timeout_told_ms = init.revoke_timeout_ms;
        self.link
            .attach(init.client, init.slot, init.session)
            .map_err(|e| op.io(e))
    }

    /// Re-registers with the same id over new connections after a network error or a server
    /// failover (`client_reinit`); keeps the local lock state. Returns whether to re-claim
    /// (then call [`Client::update_all_locks`] and [`Client::reinit_done`]): the server is
    /// recovering, or it was when this client re-registered before and the re-claim has not
    /// completed since (a reply lost, say). The server answers such a late re-claim with the
    /// ids of what it restored for this client, so none of it is forgotten; until then the
    /// records carry the failed server's ids, and `get_lock` answers `NotReady`. A server that
    /// cannot be reached is `NotReady`, with the I/O error as the source.
    ///
    /// When it is, no grant is certain until `update_all_locks` has answered: the replacement
    /// may start serving without this client's claims (its recovery deadline passed, or it did
    /// not expect this client) and grant the locks to others; the claims are then refused and
    /// the records forgotten. Act on a lock again only once it has been re-claimed. A client
    /// that was silent for longer than its lease claims nothing when it re-registers with a
    /// replacement: the old server may have freed its grants before it died. (Resuming its
    /// registration with the recovering server it already re-claimed from, it keeps them: that
    /// server still holds what it restored, whatever a recovering server's `NotReady`s did to
    /// the client's own count of its lease.)
    pub fn reinit(&mut self) -> Result<bool, Error> {
        let op = Op::Reinit;
        // Read before the registration below renews it. (`ClientLeaseLapse` puts back the bug
        // the simulator found, for the test that proves its seed still finds it.)
        let lapsed = self.lease_lapsed() && !dlock_core::mutated!(ClientLeaseLapse);
        self.link
            .reconnect()
            .map_err(|e| op.io_as(Status::NotReady, e))?;
        // Revokes on the old connections are lost: every cached grant counts as revoked, and
        // the next `poll_events` says so (`dlock_core::manager::trust`, rule 2;
        // `ReconnectKeepsTrust` puts back a client that forgets it, for the simulator's seed).
        if !dlock_core::mutated!(ReconnectKeepsTrust) {
            self.trust.broken();
        }
        self.pending = None;
        self.pipeline.clear();
        for e in self.locks.iter_mut() {
            e.busy = false;
        }
        let lease_ms = self.cfg.lease_ms();
        let session = self.session;
        let body = ControlRequest::ClientReinit {
            min_version: super::SERVER_VERSION_MIN,
            lease_ms,
            session,
        };
        self.register(op, self.id.get(), body)?;
        // A server that still knows this client hands its session back; a replacement that
        // took it back in recovery mints a new one. Only a replacement can lack our grants.
        let resumed = self.session == session;
        if self.recovering {
            self.reclaim = true;
            // Objects do not survive a failover; the caller re-creates and re-gets them.
            self.objects.clear();
            for e in self.locks.iter_mut() {
                // Silent longer than the lease: the old server may have freed our grants and
                // given them to others before it died. Claiming them would tell the new one we
                // held them all along; they are lost instead (the locks stay referenced).
                let lost = lapsed && !resumed;
                // A cached grant counts as revoked (its revokes may have been lost with the
                // connection), and a revoked grant may have lapsed on the old server and been
                // granted to another since: it is not re-claimed either (`manager::trust`,
                // rule 3). Its holder's cache hears of it as an overflow and asks again. A grant
                // the server marked plain (`LocalLock::plain`) never lapses by the revoke
                // timeout, so rule 3 does not apply: it is re-claimed as any plain grant is, and
                // its give-back, pending since it was granted, goes out as before (so a re-claim
                // the new server answers cached is still given back).
                let cached = e.local.ask.contains(LockFlags::CACHEABLE) && !e.local.plain;
                if lost || cached {
                    e.local = forgotten(&e.local);
                }
            }
        }
        Ok(self.recovering || self.reclaim)
    }

    /// Tells the server this client finished re-syncing (`client_reinit_done`).
    pub fn reinit_done(&mut self) -> Result<(), Error> {
        self.control(Op::ReinitDone, self.id.get(), ControlRequest::ReinitDone)
            .map(drop)
    }

    /// Leaves (`client_deinit`): the server releases everything this client held. The client
    /// is gone whatever the answer, as in the reference; to keep it when the server refuses,
    /// use [`Client::try_deinit`].
    pub fn deinit(mut self) -> Result<(), Error> {
        self.try_deinit()
    }

    /// Leaves (`client_deinit`) if the server lets it: on success the server has released
    /// everything this client held, and so has the client (its records are cleared; further
    /// calls are refused by the server). A recovering server answers `NotReady` and keeps the
    /// client and its locks: so does this client, to call again once the server serves —
    /// dropping it instead would leave the server holding its locks until its lease ends.
    pub fn try_deinit(&mut self) -> Result<(), Error> {
        self.control(Op::Deinit, self.id.get(), ControlRequest::ClientDeinit)?;
        self.locks.drain();
        self.objects.clear();
        self.pending = None;
        self.pipeline.clear();
        Ok(())
    }

    /// Renews the lease.
    pub fn heartbeat(&mut self) -> Result<(), Error> {
        self.control(Op::Heartbeat, self.id.get(), ControlRequest::Heartbeat)
            .map(drop)
    }

    /// The server's counters.
    pub fn server_stats(&mut self) -> Result<Vec<(&'static str, u64)>, Error> {
        let op = Op::ServerStats;
        let reply = self.control(op, self.id.get(), ControlRequest::Stats)?;
        named_counters(reply).map_err(|s| op.err(s))
    }
}

/// Reads a server's counters without registering: one `Stats` request on a connection of its
/// own, which the server answers without a client-table entry, so it works while the table is
/// full (`dlock stat`). Over TLS only an authenticated peer gets this far.
///
/// A connection that fails is `BAD_RESPONSE` with the I/O error as the [`Error`]'s source, for
/// TLS saying why (`Error::tls_failure`).
pub fn read_server_stats(
    endpoint: &Endpoint,
    timeout: Duration,
) -> Result<Vec<(&'static str, u64)>, Error> {
    let op = Op::ReadServerStats;
    let mut link = Link::connect(endpoint).map_err(|e| op.io(e))?;
    let header = ControlHeader {
        version: PROTO_VERSION,
        msg: MsgType::Stats,
        message_id: 1,
        word: 0,
    };
    let mut req = [0u8; CONTROL_HEADER_LEN];
    let frame = ControlRequestFrame {
        header,
        body: ControlRequest::Stats,
    };
    let n = encode_control_request(&frame, &mut req).map_err(|_| op.err(Status::Einval))?;
    let mut reply = vec![0u8; CONTROL_FRAME_MAX];
    let m = link
        .control(&req[..n], &mut reply, Some(Instant::now() + timeout))
        .map_err(|e| op.io(e))?;
    let reply = decode_control_response(&reply[..m]).map_err(|_| op.err(Status::BadResponse))?;
    match reply.header.status() {
        Some(Status::Success) => named_counters(reply.body).map_err(|s| op.err(s)),
        Some(s) => Err(op.err(s)),
        None => Err(op.err(Status::BadResponse)),
    }
}

/// A `Stats` reply's counters with their names.
fn named_counters(reply: ControlResponse<'_>) -> Result<Vec<(&'static str, u64)>, Status> {
    match reply {
        ControlResponse::Counters(c) => Ok(Counter::ALL
            .iter()
            .zip(c.iter())
            .map(|(k, v)| (k.name(), v))
            .collect()),
        _ => Err(Status::BadResponse),
    }
}

/// `local` holding nothing, as a record that lost its grant: the lock stays referenced, and
/// what its acquisitions ask for (cacheable, value blocks) is kept, so that the next grant is
/// asked for as the caller's cache expects.
fn forgotten(local: &LocalLock) -> LocalLock {
    LocalLock {
        ask: local.ask,
        ..LocalLock::new(local.id, local.kind)
    }
}
