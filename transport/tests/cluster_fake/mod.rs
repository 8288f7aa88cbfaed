//! A deterministic in-process fake of a dlock cluster's servers, for the thin client's tests.
//!
//! Every frame is a real one: requests are decoded and replies encoded with `dlock-core`'s
//! `proto`, and maps are made by the coordinator's own `cluster::assign` and sent in
//! `Map::encode`'s bytes, chunked as `GetMap` says. What the servers do is kept as small as the
//! tests need: a lock has one exclusive holder, a grant carries a token and a recognisable
//! proof, a server serves a partition only at the epoch the shared map gives its owner, and
//! every join, claim and `ReclaimDone` is logged for the test to check. Knobs make a server
//! answer `NotReady`, refuse chosen claims, lose a re-claim reply, keep answering
//! `PartitionMoved`, send a map that does not decode, or vanish. Each connection keeps the
//! servers' control-connection rule (`dlock_core::server::ControlConn`): bound to the client
//! its registration or join registered, it is closed by a frame that names anyone else.

use std::collections::{HashMap, HashSet};
use std::io;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use dlock_core::cluster::{Map, Member, Partitions, ServerId, assign, partition_of};
use dlock_core::proto::{
    Batch, BatchEntry, Command, CommandResult, ControlHeader, ControlRequest, ControlResponse,
    Held, InitReply, LockOp, MapChunk, PROOF_LEN, PartitionStatus, begin_data_response,
    decode_control_request, decode_data_request, encode_control_response, finish_data_proofs,
    put_data_proof, put_data_result,
};
use dlock_core::server::{ControlAdmission, ControlConn};
use dlock_core::{GrantProof, LockKind, Session, Status};
use dlock_transport::client::Connection;
use dlock_transport::client::cluster::Dial;

/// A claim a server was sent, as it was sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeenClaim {
    pub server: u32,
    pub name: Vec<u8>,
    pub held: Held,
    pub token: u64,
    pub proof: GrantProof,
}

/// What the fake servers saw, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Seen {
    Join {
        server: u32,
        client: u32,
    },
    Claim(SeenClaim),
    ReclaimDone {
        server: u32,
        partition: u16,
        epoch: u32,
    },
    /// A `ReclaimDones` message, before the `ReclaimDone` of each partition it names.
    ReclaimDones {
        server: u32,
        partitions: usize,
    },
    Unlock {
        server: u32,
        name: Vec<u8>,
    },
    Heartbeat {
        server: u32,
    },
}

#[derive(Debug, Default)]
struct Server {
    /// Lock ids here by name, and names by id.
    ids: HashMap<Vec<u8>, u32>,
    names: HashMap<u32, (LockKind, Vec<u8>)>,
    /// Object ids here by name, and names by id.
    objects: HashMap<Vec<u8>, u32>,
    object_names: HashMap<u32, Vec<u8>>,
    clients: HashSet<u32>,
    next_lock: u32,
    /// Data commands to answer `NotReady` before serving.
    not_ready: u32,
    /// Answer `PartitionMoved` to every request for a partition, whatever the map says.
    always_moved: bool,
    /// Claims of these names are answered with the status beside them.
    refuse_claims: HashMap<Vec<u8>, Status>,
    /// The next `BatchUpdateLocks` is taken but its reply lost (the connection fails).
    lose_claim_reply: bool,
    /// `ReclaimDone`s (protocol 5) to take before one whose reply is lost (the connection
    /// fails); `None`: none is lost.
    lose_done_reply_after: Option<u32>,
    /// Every request fails as if the server were gone.
    dead: bool,
    /// Answer `GetMap` with bytes that do not decode.
    garbage_map: bool,
    /// The protocol version it registers clients at: 5 (no `ReclaimDones`) unless set.
    version: Option<u8>,
}

#[derive(Debug)]
struct State {
    map: Box<Map>,
    servers: HashMap<u32, Server>,
    /// Sessions by client id (minted "under the cluster key": any server checks them).
    sessions: HashMap<u32, Session>,
    /// Holders by lock name, cluster-wide (a moved partition's grants move with their claims).
    holders: HashMap<Vec<u8>, (u32, u64)>,
    /// Counter values by name, cluster-wide: a new owner starts a counter where the old one's
    /// persisted mark says (here: exactly where it was).
    values: HashMap<Vec<u8>, u64>,
    next_client: u32,
    next_token: u64,
    /// The lease every server grants.
    lease_ms: u32,
    seen: Vec<Seen>,
}

/// The fake cluster, shared by the test and every connection.
#[derive(Clone, Debug)]
pub struct Fake(Arc<Mutex<State>>);

pub const PARTITIONS: u16 = 8;

pub fn address(server: u32) -> Vec<u8> {
    format!("fake:{server}").into_bytes()
}

impl Fake {
    /// A cluster of `servers` (ids 1..), partitions spread by `assign`.
    pub fn new(servers: &[u32]) -> Fake {
        Fake::with_partitions(PARTITIONS, servers)
    }

    /// A cluster of `partitions` partitions.
    pub fn with_partitions(partitions: u16, servers: &[u32]) -> Fake {
        let state = State {
            map: Box::new(Map::new(Partitions::new(partitions).unwrap())),
            servers: servers.iter().map(|&s| (s, Server::default())).collect(),
            sessions: HashMap::new(),
            holders: HashMap::new(),
            values: HashMap::new(),
            next_client: 0x100,
            next_token: 0,
            lease_ms: 60_000,
            seen: Vec::new(),
        };
        let fake = Fake(Arc::new(Mutex::new(state)));
        fake.members(servers);
        fake
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.0.lock().unwrap()
    }

    /// The coordinator writes a new map for these live members (incarnation = id).
    pub fn members(&self, live: &[u32]) {
        let mut st = self.state();
        let addresses: Vec<Vec<u8>> = live.iter().map(|&s| address(s)).collect();
        let members: Vec<Member<'_>> = live
            .iter()
            .zip(&addresses)
            .map(|(&s, a)| Member {
                id: ServerId::new(s).unwrap(),
                incarnation: u64::from(s),
                address: a,
                draining: false,
            })
            .collect();
        let mut next = Box::new(Map::new(st.map.partitions()));
        assign(&st.map, &members, &[], &mut next).unwrap();
        st.map = next;
        for &s in live {
            st.servers.entry(s).or_default();
        }
    }

    /// Server `server` registers and joins clients at protocol `version` (6: it takes
    /// `ReclaimDones`).
    pub fn speak(&self, server: u32, version: u8) {
        self.state().servers.entry(server).or_default().version = Some(version);
    }

    /// Every server grants `lease_ms` from now on.
    pub fn set_lease_ms(&self, lease_ms: u32) {
        self.state().lease_ms = lease_ms;
    }

    pub fn map_version(&self) -> u64 {
        self.state().map.version()
    }

    /// The owner and epoch of `name`'s partition.
    pub fn owner_of(&self, name: &[u8]) -> (u32, u32) {
        let st = self.state();
        let o = st
            .map
            .owner(partition_of(name, st.map.partitions()))
            .unwrap();
        (o.server.unwrap().get(), o.epoch)
    }

    /// A name (`prefix` and a number) whose partition `server` owns.
    pub fn name_on(&self, server: u32, prefix: &str) -> Vec<u8> {
        (0..)
            .map(|i| format!("{prefix}{i}").into_bytes())
            .find(|n| self.owner_of(n).0 == server)
            .unwrap()
    }

    pub fn partition(&self, name: &[u8]) -> u16 {
        let st = self.state();
        partition_of(name, st.map.partitions())
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.state().seen.clone()
    }

    pub fn holder(&self, name: &[u8]) -> Option<u32> {
        self.state().holders.get(name).map(|h| h.0)
    }

    pub fn with_server(&self, server: u32, f: impl FnOnce(&mut FakeServerKnobs<'_>)) {
        let mut st = self.state();
        let s = st.servers.get_mut(&server).unwrap();
        f(&mut FakeServerKnobs(s));
    }
}

/// The knobs of one fake server.
pub struct FakeServerKnobs<'a>(&'a mut Server);

impl FakeServerKnobs<'_> {
    pub fn not_ready(&mut self, n: u32) {
        self.0.not_ready = n;
    }
    pub fn always_moved(&mut self, on: bool) {
        self.0.always_moved = on;
    }
    /// Claims of `name` are answered `Fail` (the grant is gone).
    pub fn refuse_claim(&mut self, name: &[u8]) {
        self.refuse_claim_with(name, Status::Fail);
    }
    /// Claims of `name` are answered `status`.
    pub fn refuse_claim_with(&mut self, name: &[u8], status: Status) {
        self.0.refuse_claims.insert(name.to_vec(), status);
    }
    /// Claims are taken again, whatever was refused before.
    pub fn take_claims(&mut self) {
        self.0.refuse_claims.clear();
    }
    pub fn lose_claim_reply(&mut self) {
        self.0.lose_claim_reply = true;
    }
    /// The `ReclaimDone` (protocol 5) after the next `taken` is taken but its reply lost.
    pub fn lose_done_reply_after(&mut self, taken: u32) {
        self.0.lose_done_reply_after = Some(taken);
    }
    pub fn dead(&mut self, on: bool) {
        self.0.dead = on;
    }
    pub fn garbage_map(&mut self) {
        self.0.garbage_map = true;
    }
}

/// Dials fake servers by their `fake:N` address.
#[derive(Clone, Debug)]
pub struct FakeDial(pub Fake);

impl Dial for FakeDial {
    type Conn = FakeConn;

    fn dial(&mut self, address: &[u8], _deadline: Instant) -> io::Result<FakeConn> {
        let text = std::str::from_utf8(address).unwrap();
        let server: u32 = text.strip_prefix("fake:").unwrap().parse().unwrap();
        if self.0.state().servers.get(&server).is_none_or(|s| s.dead) {
            return Err(io::ErrorKind::ConnectionRefused.into());
        }
        Ok(FakeConn {
            fake: self.0.clone(),
            server,
            replies: HashMap::new(),
            next: 0,
            role: ControlConn::Unbound,
            closed: false,
        })
    }
}

/// One connection to one fake server.
#[derive(Debug)]
pub struct FakeConn {
    fake: Fake,
    server: u32,
    replies: HashMap<u64, Vec<u8>>,
    next: u64,
    /// Whom the connection speaks for, as a real server keeps it.
    role: ControlConn,
    /// The server closed it (a frame its rule refuses).
    closed: bool,
}

fn gone() -> io::Error {
    io::Error::new(io::ErrorKind::ConnectionReset, "the fake server is gone")
}

fn closed() -> io::Error {
    io::Error::new(
        io::ErrorKind::ConnectionReset,
        "the fake server closed the connection: a frame named a client it does not speak for",
    )
}

impl Connection for FakeConn {
    fn reconnect(&mut self) -> io::Result<()> {
        Ok(())
    }

    fn control(&mut self, req: &[u8], reply: &mut [u8], _: Option<Instant>) -> io::Result<usize> {
        let mut st = self.fake.state();
        if st.servers[&self.server].dead {
            return Err(gone());
        }
        if self.closed {
            return Err(closed());
        }
        let frame = decode_control_request(req).expect("the client sent a valid frame");
        if self.role.admit(frame.header.msg, frame.header.word) == ControlAdmission::Close {
            self.closed = true;
            return Err(closed());
        }
        let (status, body) = st.control(self.server, frame.header.word, frame.body)?;
        if let Body::Plain(ControlResponse::Init(r)) = &body {
            self.role = ControlConn::Bound(r.client);
        }
        let header = ControlHeader {
            word: status as u32,
            ..frame.header
        };
        // `body` may borrow the encoded map; encode before the state goes.
        let n = match body {
            Body::Plain(b) => encode_control_response(&header, &b, reply),
            Body::Map {
                version,
                bytes,
                offset,
            } => {
                let chunk = MapChunk::of(version, &bytes, offset).unwrap();
                encode_control_response(&header, &ControlResponse::MapChunk(chunk), reply)
            }
            Body::Entries(e) => encode_control_response(
                &header,
                &ControlResponse::Entries(Batch::from_slice(&e)),
                reply,
            ),
            Body::Statuses(s) => encode_control_response(
                &header,
                &ControlResponse::PartitionStatuses(Batch::from_slice(&s)),
                reply,
            ),
        };
        Ok(n.unwrap())
    }

    fn attach(&mut self, _: u32, _: u32, _: Session) -> io::Result<()> {
        Ok(())
    }

    fn depth(&self) -> usize {
        4
    }

    fn send_data(&mut self, req: &[u8]) -> io::Result<u64> {
        let mut st = self.fake.state();
        if st.servers[&self.server].dead || self.closed {
            return Err(gone());
        }
        let out = st.data(self.server, req);
        self.next += 1;
        self.replies.insert(self.next, out);
        Ok(self.next)
    }

    fn try_recv_data(&mut self, ticket: u64, reply: &mut [u8]) -> io::Result<Option<usize>> {
        if self.fake.state().servers[&self.server].dead {
            return Err(gone());
        }
        Ok(self.replies.remove(&ticket).map(|r| {
            reply[..r.len()].copy_from_slice(&r);
            r.len()
        }))
    }

    fn recv_data(
        &mut self,
        ticket: u64,
        reply: &mut [u8],
        _: Option<Instant>,
    ) -> io::Result<Option<usize>> {
        self.try_recv_data(ticket, reply)
    }
}

enum Body {
    Plain(ControlResponse<'static>),
    Map {
        version: u64,
        bytes: Vec<u8>,
        offset: u32,
    },
    Entries(Vec<BatchEntry>),
    Statuses(Vec<PartitionStatus>),
}

const EMPTY: Body = Body::Plain(ControlResponse::Empty);

impl State {
    fn moved(&self) -> (Status, Body) {
        let map_version = self.map.version();
        (
            Status::PartitionMoved,
            Body::Plain(ControlResponse::PartitionMoved { map_version }),
        )
    }

    /// Whether `server` serves `name`'s partition at `epoch` (`None`: any epoch).
    fn serves(&self, server: u32, name: &[u8], epoch: Option<u32>) -> bool {
        let o = self
            .map
            .owner(partition_of(name, self.map.partitions()))
            .unwrap();
        !self.servers[&server].always_moved
            && o.server.map(ServerId::get) == Some(server)
            && epoch.is_none_or(|e| e == o.epoch)
    }

    fn lock_id(&mut self, server: u32, kind: LockKind, name: &[u8]) -> u32 {
        let s = self.servers.get_mut(&server).unwrap();
        if let Some(&id) = s.ids.get(name) {
            return id;
        }
        // Ids differ per server (and from the client's cluster ids) on purpose.
        s.next_lock += 1;
        let id = server * 1000 + s.next_lock;
        s.ids.insert(name.to_vec(), id);
        s.names.insert(id, (kind, name.to_vec()));
        id
    }

    fn object_id(&mut self, server: u32, name: &[u8]) -> u32 {
        let s = self.servers.get_mut(&server).unwrap();
        if let Some(&id) = s.objects.get(name) {
            return id;
        }
        s.next_lock += 1;
        let id = server * 1000 + s.next_lock;
        s.objects.insert(name.to_vec(), id);
        s.object_names.insert(id, name.to_vec());
        id
    }

    /// Fetch-and-add and snapshot on a counter.
    fn object(&mut self, server: u32, o: &dlock_core::proto::ObjectCommand) -> (Status, u64) {
        let Some(name) = self.servers[&server].object_names.get(&o.object).cloned() else {
            return (Status::ObjectNotGet, 0);
        };
        if !self.serves(server, &name, Some(o.partition_epoch)) {
            return (Status::PartitionMoved, self.map.version());
        }
        let v = self.values.get_mut(&name).unwrap();
        let before = *v;
        if o.op == dlock_core::proto::ObjectOp::Faa {
            *v += o.a;
        }
        (Status::Success, before)
    }

    fn init(&self, server: u32, client: u32, session: Session) -> Body {
        let version = self.servers.get(&server).and_then(|s| s.version);
        Body::Plain(ControlResponse::Init(InitReply {
            client,
            version: version.unwrap_or(5),
            recovering: false,
            epoch: 0,
            lease_ms: self.lease_ms,
            objects_max: 0,
            slot: 0,
            session,
            revoke_timeout_ms: 0,
        }))
    }

    fn control(
        &mut self,
        server: u32,
        word: u32,
        body: ControlRequest<'_>,
    ) -> io::Result<(Status, Body)> {
        Ok(match body {
            ControlRequest::GetMap { offset } => {
                let mut bytes = vec![0u8; dlock_core::cluster::MAP_ENCODED_MAX];
                let n = self.map.encode(&mut bytes).unwrap();
                bytes.truncate(n);
                if self.servers[&server].garbage_map {
                    bytes[0] ^= 0xff; // the magic no longer matches
                }
                let version = self.map.version();
                (
                    Status::Success,
                    Body::Map {
                        version,
                        bytes,
                        offset,
                    },
                )
            }
            ControlRequest::ClientInit { .. } => {
                self.next_client += 1;
                let client = self.next_client;
                let session = Session([client as u8; 16]);
                self.sessions.insert(client, session);
                self.servers
                    .get_mut(&server)
                    .unwrap()
                    .clients
                    .insert(client);
                (Status::Success, self.init(server, client, session))
            }
            ControlRequest::ClientJoin { session, .. } => {
                if self.sessions.get(&word) != Some(&session) {
                    return Ok((Status::ClientNotInit, EMPTY));
                }
                self.servers.get_mut(&server).unwrap().clients.insert(word);
                self.seen.push(Seen::Join {
                    server,
                    client: word,
                });
                (Status::Success, self.init(server, word, session))
            }
            _ if !self.servers[&server].clients.contains(&word) => (Status::ClientNotInit, EMPTY),
            ControlRequest::Heartbeat => {
                self.seen.push(Seen::Heartbeat { server });
                (Status::Success, EMPTY)
            }
            ControlRequest::GetLock { kind, name } => {
                if !self.serves(server, name, None) {
                    return Ok(self.moved());
                }
                let lock = self.lock_id(server, kind, name);
                (Status::Success, Body::Plain(ControlResponse::Lock { lock }))
            }
            ControlRequest::ReleaseLock { .. } => (Status::Success, EMPTY),
            ControlRequest::ObjectCreate { name, init, .. } => {
                if !self.serves(server, name, None) {
                    return Ok(self.moved());
                }
                if self.values.contains_key(name) {
                    return Ok((Status::ObjectAlreadyExisted, EMPTY));
                }
                self.values.insert(name.to_vec(), init);
                let object = self.object_id(server, name);
                (
                    Status::Success,
                    Body::Plain(ControlResponse::Object { object }),
                )
            }
            ControlRequest::ObjectGet { name, .. } => {
                if !self.serves(server, name, None) {
                    return Ok(self.moved());
                }
                if !self.values.contains_key(name) {
                    return Ok((Status::ObjectNotCreate, EMPTY));
                }
                let object = self.object_id(server, name);
                (
                    Status::Success,
                    Body::Plain(ControlResponse::ObjectRef { object, cell: 0 }),
                )
            }
            ControlRequest::BatchUpdateLocks(claims) => {
                let mut entries = Vec::new();
                for c in claims.iter() {
                    self.seen.push(Seen::Claim(SeenClaim {
                        server,
                        name: c.name.to_vec(),
                        held: c.held,
                        token: c.token,
                        proof: c.proof,
                    }));
                    if let Some(&status) = self.servers[&server].refuse_claims.get(c.name) {
                        // Refused for good, the grant goes; a passing refusal keeps it.
                        if !matches!(status, Status::NotReady | Status::PartitionMoved) {
                            self.holders.remove(c.name);
                        }
                        entries.push(BatchEntry { id: 0, status });
                        continue;
                    }
                    let id = self.lock_id(server, c.kind, c.name);
                    if c.held == Held::Exclusive {
                        self.holders.insert(c.name.to_vec(), (word, c.token));
                    }
                    entries.push(BatchEntry {
                        id,
                        status: Status::Success,
                    });
                }
                let s = self.servers.get_mut(&server).unwrap();
                if std::mem::take(&mut s.lose_claim_reply) {
                    return Err(gone());
                }
                (Status::Success, Body::Entries(entries))
            }
            ControlRequest::ReclaimDone { partition, epoch } => {
                self.seen.push(Seen::ReclaimDone {
                    server,
                    partition,
                    epoch,
                });
                let s = self.servers.get_mut(&server).unwrap();
                match s.lose_done_reply_after {
                    Some(0) => {
                        s.lose_done_reply_after = None;
                        return Err(gone());
                    }
                    Some(n) => s.lose_done_reply_after = Some(n - 1),
                    None => {}
                }
                (Status::Success, EMPTY)
            }
            ControlRequest::ReclaimDones(dones)
                if self.servers.get(&server).and_then(|s| s.version) >= Some(6) =>
            {
                self.seen.push(Seen::ReclaimDones {
                    server,
                    partitions: dones.len(),
                });
                let mut statuses = Vec::new();
                for d in dones.iter() {
                    self.seen.push(Seen::ReclaimDone {
                        server,
                        partition: d.partition,
                        epoch: d.epoch,
                    });
                    statuses.push(PartitionStatus {
                        partition: d.partition,
                        status: Status::Success,
                    });
                }
                (Status::Success, Body::Statuses(statuses))
            }
            _ => (Status::Einval, EMPTY),
        })
    }

    /// Executes a data message: exclusive grants only, all-or-nothing undone on failure.
    fn data(&mut self, server: u32, req: &[u8]) -> Vec<u8> {
        let req = decode_data_request(req).expect("the client sent a valid message");
        let client = req.header().client;
        let aon = req.header().flags & dlock_core::proto::FLAG_ALL_OR_NOTHING != 0;
        let mut results = Vec::new();
        let mut granted = Vec::new();
        for c in req.commands() {
            let (status, aux) = match c {
                Command::Lock(l) => self.command(server, client, &l, &mut granted),
                Command::Object(o) => self.object(server, &o),
                Command::Join(_) => (Status::Einval, 0),
            };
            let proof = matches!(c, Command::Lock(_)) && status == Status::Success && aux != 0;
            results.push((
                CommandResult {
                    status,
                    word: 0,
                    aux,
                    plain: false,
                },
                proof,
            ));
        }
        if aon && results.iter().any(|(r, _)| r.status != Status::Success) {
            for name in granted {
                self.holders.remove(&name);
            }
            for (r, proof) in &mut results {
                if r.status == Status::Success {
                    *r = CommandResult {
                        status: Status::Eagain,
                        word: 0,
                        aux: 0,
                        plain: false,
                    };
                    *proof = false;
                }
            }
        }
        let mut out = vec![0u8; dlock_core::proto::DATA_RESPONSE_MAX];
        let mut len = begin_data_response(&req, &mut out).unwrap();
        let n = results.len();
        let mut first = true;
        for (i, (r, proof)) in results.iter().enumerate() {
            put_data_result(&req, i, r, &mut out).unwrap();
            if *proof {
                put_data_proof(&mut out, n, i, &mac(server, r.aux), first).unwrap();
                first = false;
            }
        }
        if !first {
            len = finish_data_proofs(&mut out, n).unwrap();
        }
        out.truncate(len);
        out
    }

    fn command(
        &mut self,
        server: u32,
        client: u32,
        l: &dlock_core::proto::LockCommand,
        granted: &mut Vec<Vec<u8>>,
    ) -> (Status, u64) {
        let Some((_, name)) = self.servers[&server].names.get(&l.lock).cloned() else {
            return (Status::Einval, 0);
        };
        if !self.serves(server, &name, Some(l.partition_epoch)) {
            return (Status::PartitionMoved, self.map.version());
        }
        let s = self.servers.get_mut(&server).unwrap();
        if s.not_ready > 0 {
            s.not_ready -= 1;
            return (Status::NotReady, 0);
        }
        let holder = self.holders.get(&name).copied();
        match l.op {
            LockOp::TryExclusive => match holder {
                Some((c, _)) if c != client => (Status::Eagain, 0),
                _ => {
                    self.next_token += 1;
                    let token = u64::from(l.partition_epoch) << 32 | self.next_token;
                    self.holders.insert(name.clone(), (client, token));
                    granted.push(name);
                    (Status::Success, token)
                }
            },
            LockOp::UnlockExclusive => match holder {
                Some((c, _)) if c == client => {
                    self.holders.remove(&name);
                    self.seen.push(Seen::Unlock { server, name });
                    (Status::Success, 0)
                }
                _ => (Status::Fail, 0),
            },
            LockOp::ExtendExclusive if holder.is_some_and(|h| h.0 == client) => {
                (Status::Success, 0)
            }
            _ => (Status::Fail, 0),
        }
    }
}

/// The proof a fake server gives a grant: recognisable, so a test can check a claim carries it.
pub fn mac(server: u32, token: u64) -> [u8; PROOF_LEN] {
    let mut m = [0xA5; PROOF_LEN];
    m[..4].copy_from_slice(&server.to_le_bytes());
    m[4..12].copy_from_slice(&token.to_le_bytes());
    m
}
