//! The servers the cluster client talks to: registering once, joining each other server with
//! the same `(id, session)` when it is first needed, one control exchange with a server, and
//! refreshing the map after a `PartitionMoved`.

use std::io;
use std::time::{Duration, Instant};

use dlock_core::Status;
use dlock_core::cluster::{Map, ServerId};
use dlock_core::proto::{
    CONTROL_FRAME_MAX, ControlHeader, ControlRequest, ControlRequestFrame, ControlResponse,
    PROTO_VERSION, PROTO_VERSION_CLUSTER_MIN, decode_control_response, encode_control_request,
};

use super::{ClusterLink, Dial, Identity, Member, fetch, garbage};
use crate::client::Connection;

/// Whether a reply with `status` says the server does not know the client (its lease there
/// lapsed, or it was removed): the server ran nothing of the request.
pub(super) fn forgets_client(status: Status) -> bool {
    matches!(
        status,
        Status::ClientNotInit | Status::ClientRemovedByServer
    )
}

/// Whether a reply with `status` shows the server holds the client's registration (its lease
/// then runs from the request's send), as the single-server client's `renews_lease`, and not
/// `PartitionMoved` either: a server that fenced itself answers that to everyone, and the old
/// owner of a moved partition answering it says nothing about grants it may have freed while
/// the client was silent (the lease-lapse rule of a re-claim reads this record).
pub(super) fn renews_lease(status: Status) -> bool {
    !matches!(
        status,
        Status::ClientNotInit
            | Status::ClientRemovedByServer
            | Status::NotReady
            | Status::PartitionMoved
    )
}

impl<D: Dial> ClusterLink<D> {
    /// Registers with the first server of the map that answers the client's `ClientInit`
    /// (its header `h`, `min_version` and `lease_ms`, as [`route_control`] decoded them: at
    /// the link's own versions, [`at_cluster_min`]) and binds its data path. The reply
    /// goes back to the client unchanged: id, session, lease and version are that server's,
    /// and the same for all.
    ///
    /// [`route_control`]: ClusterLink::route_control
    pub(super) fn register(
        &mut self,
        h: ControlHeader,
        min_version: u8,
        lease_ms: u32,
        reply: &mut [u8],
        deadline: Instant,
    ) -> io::Result<usize> {
        let init = &at_cluster_min(h, min_version, lease_ms)?;
        let mut last = garbage("the cluster map names no server");
        let servers: Vec<(ServerId, u64, Vec<u8>)> = self
            .map
            .servers()
            .iter()
            .map(|e| (e.id(), e.incarnation(), e.address().to_vec()))
            .collect();
        for (id, incarnation, address) in servers {
            let sent = Instant::now();
            let attempt = self.cfg.dial.dial(&address, deadline).and_then(|mut conn| {
                let m = conn.control(init, reply, Some(deadline))?;
                Ok((conn, m))
            });
            let (mut conn, m) = match attempt {
                Ok(x) => x,
                Err(e) => {
                    last = e;
                    continue;
                }
            };
            let frame = decode_control_response(&reply[..m])
                .map_err(|_| garbage("a registration reply is malformed"))?;
            let ControlResponse::Init(r) = frame.body else {
                // A refusal: the client reads its status.
                return Ok(m);
            };
            conn.attach(r.client, r.slot, r.session)?;
            self.identity = Some(Identity {
                id: r.client,
                session: r.session,
                lease_ms: r.lease_ms,
            });
            self.members.insert(
                id,
                Member {
                    conn,
                    incarnation,
                    registered: true,
                    version: r.version,
                    lease_ms: r.lease_ms,
                    heard: Some(sent),
                    since: sent,
                    broken: false,
                },
            );
            return Ok(m);
        }
        Err(last)
    }

    /// The member `server` as the map has it now, joined: opened and joined with the client's
    /// registration if it is new, restarted (another incarnation) or its connection failed.
    pub(super) fn member(
        &mut self,
        server: ServerId,
        deadline: Instant,
    ) -> io::Result<&mut Member<D::Conn>> {
        let entry = self
            .map
            .server(server)
            .ok_or_else(|| garbage("the cluster map names an owner it has no address for"))?;
        let incarnation = entry.incarnation();
        let fresh = self
            .members
            .get(&server)
            .is_some_and(|m| m.registered && !m.broken && m.incarnation == incarnation);
        if !fresh {
            // The address is copied only to join: `join` needs the link, which holds the map.
            let address = entry.address().to_vec();
            self.lose_lapsed_grants(server, incarnation);
            let joined = self.join(&address, incarnation, deadline)?;
            self.members.insert(server, joined);
        }
        Ok(self.members.get_mut(&server).expect("inserted above"))
    }

    /// Before `server` (at `incarnation`, the one the client was registered with) is joined
    /// again: if it forgot the client (it said so) or may have (the lease it granted ran out
    /// by the client's count), it freed the client's grants when it declared the client dead,
    /// and the join registers the client afresh. Those grants are lost: the records at that
    /// server forget them (the references stay; one the server freed is got again at its
    /// `LockNotGet`). This is the lease-lapse rule of `Client::reinit` (the cluster join cannot
    /// tell a resumed registration from a new one): otherwise the join's fresh lease hid the
    /// lapse from the rule a re-claim reads (`reclaim.rs`), and the next owner of the
    /// partition was offered, with its old proof, a grant the server had freed and perhaps
    /// given to another client. A grant the server still held is unlocked all the same: the
    /// client's unlock goes out with the reference.
    fn lose_lapsed_grants(&mut self, server: ServerId, incarnation: u64) {
        let gone = self.members.get(&server).is_some_and(|m| {
            m.incarnation == incarnation && (!m.registered || self.lapsed(server, Instant::now()))
        });
        if gone {
            let lost = self.routes.lose_grants_at(server, incarnation);
            if lost > 0 {
                tracing::debug!(%server, lost, "dlock: grants lost with a lapsed registration");
            }
        }
    }

    /// A new connection to the server at `address`, joined with the client's registration
    /// (`ClientJoin`: the id in the header word, the session in the body).
    fn join(
        &mut self,
        address: &[u8],
        incarnation: u64,
        deadline: Instant,
    ) -> io::Result<Member<D::Conn>> {
        let me = self
            .identity
            .ok_or_else(|| garbage("a server was needed before the client registered"))?;
        // A silent server is not waited on past the link's patience, to open a connection as
        // to answer (the caller looks at the map again).
        let until = self.patient(deadline);
        let mut conn = self.cfg.dial.dial(address, until)?;
        // The oldest version a cluster server speaks: a server of protocol 5 (before
        // `ReclaimDones`) is joined too, and told its `ReclaimDone`s one at a time.
        let body = ControlRequest::ClientJoin {
            min_version: PROTO_VERSION_CLUSTER_MIN,
            lease_ms: me.lease_ms,
            session: me.session,
        };
        let sent = Instant::now();
        let mut reply = vec![0u8; CONTROL_FRAME_MAX];
        let message_id = self.next_message_id();
        let m = exchange(
            &mut conn,
            (message_id, PROTO_VERSION),
            me.id,
            body,
            &mut reply,
            until,
        )?;
        let frame = decode_control_response(&reply[..m])
            .map_err(|_| garbage("a join reply is malformed"))?;
        match (frame.header.status(), frame.body) {
            (Some(Status::Success), ControlResponse::Init(r)) if r.client == me.id => {
                conn.attach(r.client, r.slot, r.session)?;
                Ok(Member {
                    conn,
                    incarnation,
                    registered: true,
                    version: r.version,
                    lease_ms: r.lease_ms,
                    heard: Some(sent),
                    since: sent,
                    broken: false,
                })
            }
            (Some(Status::Success), _) => Err(garbage("a join reply names another client")),
            (Some(s), _) => Err(io::Error::other(format!(
                "the server at {:?} refused to join the client: {s:?}",
                String::from_utf8_lossy(address)
            ))),
            (None, _) => Err(garbage("a join reply carries no status")),
        }
    }

    /// One control exchange of `body` with `server` (joined first if need be); the reply is in
    /// `reply`. A connection that fails is opened again at the next use. A server that no
    /// longer knows the client (its lease lapsed there, and the server declared it dead) is
    /// joined again and asked once more: it refused the request without running it. What the
    /// client had there is gone with the registration ([`Self::forget_registration`]). Before,
    /// the member stayed marked registered, and every request to that server read
    /// `ClientNotInit` for good.
    pub(super) fn control_with(
        &mut self,
        server: ServerId,
        body: ControlRequest<'_>,
        reply: &mut [u8],
        deadline: Instant,
    ) -> io::Result<usize> {
        let m = self.control_once(server, body, reply, deadline)?;
        if !self.forgot_client(server, &reply[..m]) {
            return Ok(m);
        }
        self.control_once(server, body, reply, deadline)
    }

    /// Whether `server`'s reply `reply` says it does not know the client (`ClientNotInit`,
    /// `ClientRemovedByServer`); the registration there is then forgotten
    /// ([`Self::forget_registration`]).
    fn forgot_client(&mut self, server: ServerId, reply: &[u8]) -> bool {
        let status = decode_control_response(reply)
            .ok()
            .and_then(|f| f.header.status());
        let forgot = status.is_some_and(forgets_client);
        if forgot {
            self.forget_registration(server);
        }
        forgot
    }

    /// `server` said it does not know the client: it declared the client dead (its lease ran
    /// out there) and freed everything the client held there, grants and references alike.
    /// The member is joined again at its next use; the records filed under it lose their
    /// grants (lost: the client's next unlock of one is not a success) and their references,
    /// which are got again by name at the lock's or object's next use. Only the server's own
    /// word drops a reference: a registration the client merely thinks lapsed may still hold
    /// them (`lose_lapsed_grants`).
    pub(super) fn forget_registration(&mut self, server: ServerId) {
        let Some(m) = self.members.get_mut(&server) else {
            return;
        };
        m.registered = false;
        let incarnation = m.incarnation;
        let lost = self.routes.forget_at(server, incarnation);
        self.objects.forget_at(server, incarnation);
        tracing::debug!(%server, lost, "dlock: the server forgot the client; joined again at the next use");
    }

    /// [`Self::control_with`], once.
    fn control_once(
        &mut self,
        server: ServerId,
        body: ControlRequest<'_>,
        reply: &mut [u8],
        deadline: Instant,
    ) -> io::Result<usize> {
        let id = self.identity.map_or(0, |me| me.id);
        let message_id = self.next_message_id();
        let member = self.member(server, deadline)?;
        let sent = Instant::now();
        let at = (message_id, member.version);
        match exchange(&mut member.conn, at, id, body, reply, deadline) {
            Ok(m) => {
                let status = decode_control_response(&reply[..m])
                    .ok()
                    .and_then(|f| f.header.status());
                if status.is_some_and(renews_lease) {
                    member.heard = member.heard.max(Some(sent));
                }
                Ok(m)
            }
            Err(e) => {
                member.broken = true;
                Err(e)
            }
        }
    }

    /// Whether `server` may have declared the client dead: nothing it answered was sent within
    /// the lease it granted (the lease-lapse rule of `Client::reinit`). A server never talked
    /// to held nothing of the client's.
    pub(super) fn lapsed(&self, server: ServerId, now: Instant) -> bool {
        self.members.get(&server).is_some_and(|m| match m.heard {
            Some(heard) => now > heard + Duration::from_millis(m.lease_ms.into()),
            None => true,
        })
    }

    /// Fetches the map again, from `first` (the server that said the partition moved), then
    /// from every other server the client knows but `skip` (one gone silent), and adopts it if
    /// it is newer than the cached one and of the same cluster shape. Each server is given
    /// the link's patience, not the whole deadline: a frozen one must not keep the client
    /// from the others. Returns whether the map changed.
    pub(super) fn refresh(
        &mut self,
        first: Option<ServerId>,
        skip: Option<ServerId>,
        deadline: Instant,
    ) -> bool {
        let mut order: Vec<ServerId> = first.into_iter().collect();
        order.extend(self.map.servers().iter().map(|e| e.id()));
        order.retain(|&s| Some(s) != skip);
        let mut message_id = self.message_id;
        let mut found: Option<Box<Map>> = None;
        let me = self.identity.map_or(0, |i| i.id);
        for server in order {
            let deadline = self.patient(deadline);
            let got = match self.members.get_mut(&server) {
                Some(m) if !m.broken => {
                    let speaks_for = if m.registered { me } else { 0 };
                    let got = fetch::fetch_map(&mut m.conn, speaks_for, deadline, &mut message_id);
                    // A connection that failed a read is opened again at its next use.
                    m.broken |= got.is_err();
                    got
                }
                _ => match self.map.server(server).map(|e| e.address().to_vec()) {
                    Some(address) => {
                        self.cfg.dial.dial(&address, deadline).and_then(|mut c| {
                            fetch::fetch_map(&mut c, 0, deadline, &mut message_id)
                        })
                    }
                    None => continue,
                },
            };
            match got {
                Ok(map) if map.partitions() != self.map.partitions() => {
                    tracing::warn!(
                        %server,
                        "refused a cluster map with another partition count than the client's"
                    );
                }
                Ok(map) if map.version() > self.map.version() => {
                    found = Some(map);
                    break;
                }
                Ok(_) => {}
                Err(e) => tracing::debug!(%server, error = %e, "no map from this server"),
            }
        }
        for seed in self.cfg.seeds.clone() {
            if found.is_some() {
                break;
            }
            let deadline = self.patient(deadline);
            if let Ok(map) = self
                .cfg
                .dial
                .dial(&seed, deadline)
                .and_then(|mut c| fetch::fetch_map(&mut c, 0, deadline, &mut message_id))
                && map.partitions() == self.map.partitions()
                && map.version() > self.map.version()
            {
                found = Some(map);
            }
        }
        self.message_id = message_id;
        match found {
            Some(map) => {
                tracing::debug!(
                    from = self.map.version(),
                    to = map.version(),
                    "cluster map refreshed"
                );
                self.map = map;
                true
            }
            None => false,
        }
    }
}

/// The client's `ClientInit` (header `h`) at the link's own versions, the ones its joins ask
/// for ([`ClusterLink::member`]): up to [`PROTO_VERSION`], whatever the header names (a
/// `ClientConfig::version_max` the client was given), and down to the oldest version a
/// cluster server speaks (`PROTO_VERSION_CLUSTER_MIN`) rather than the client's own minimum:
/// the registration's server may be of protocol 5, before `ReclaimDones`, which the link then
/// does without. Registering at the cap and joining the other servers at the link's own
/// versions had what a holder is told depend on which server registered it; a cluster client
/// registers at its own versions everywhere, as `version_max` says.
fn at_cluster_min(h: ControlHeader, min_version: u8, lease_ms: u32) -> io::Result<Vec<u8>> {
    let body = ControlRequest::ClientInit {
        min_version: min_version.min(PROTO_VERSION_CLUSTER_MIN),
        lease_ms,
    };
    let mut out = vec![0u8; CONTROL_FRAME_MAX];
    let header = ControlHeader {
        version: PROTO_VERSION,
        ..h
    };
    let frame = ControlRequestFrame { header, body };
    let n = encode_control_request(&frame, &mut out).map_err(|_| {
        io::Error::new(io::ErrorKind::InvalidInput, "a registration did not encode")
    })?;
    out.truncate(n);
    Ok(out)
}

/// Encodes `body` from client `id` with `(message_id, version)` in its header and exchanges
/// it over `conn`; the reply's length. A reply that does not answer this request is
/// `InvalidData`.
pub(super) fn exchange<C: Connection>(
    conn: &mut C,
    (message_id, version): (u16, u8),
    id: u32,
    body: ControlRequest<'_>,
    reply: &mut [u8],
    deadline: Instant,
) -> io::Result<usize> {
    let header = ControlHeader {
        version,
        msg: body.msg_type(),
        message_id,
        word: id,
    };
    let mut req = vec![0u8; CONTROL_FRAME_MAX];
    let n = encode_control_request(&ControlRequestFrame { header, body }, &mut req)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a request did not encode"))?;
    let m = conn.control(&req[..n], reply, Some(deadline))?;
    let frame = decode_control_response(&reply[..m])
        .map_err(|_| garbage("a control reply is malformed"))?;
    if frame.header.message_id != message_id || frame.header.msg != header.msg {
        return Err(garbage("a control reply answers another request"));
    }
    Ok(m)
}
