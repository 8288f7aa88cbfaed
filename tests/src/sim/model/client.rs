//! A simulated client: the real per-lock decision code ([`LocalLock`]) driven by a random
//! workload, with the registration, heartbeat and failover protocol the transport's `Client`
//! follows (`reinit`, `update_all_locks`, `reinit_done`).

use dlock_core::{LockId, LockKind, Mode, ObjectId, Session};
use dlock_transport::client::{LocalLock, LocalState, Request};

use crate::sim::net::LinkId;

/// What a client is doing with its registration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Not registered: registers when it next acts.
    Idle,
    /// `ClientInit` sent.
    Initing,
    /// Registered; runs the workload.
    Ready,
    /// `ClientReinit` sent after a lost connection or server.
    Reiniting,
    /// Re-claiming its locks with a recovering server (`BatchUpdateLocks` chunks).
    Claiming,
    /// `ReinitDone` sent.
    Finishing,
    /// `ClientDeinit` sent.
    Deiniting,
    /// Crashed: never acts again; the slot may be reborn as a new client.
    Dead,
}

/// One lock the client obtained, with the real client record.
#[derive(Clone, Debug)]
pub struct SimLock {
    /// Index into the world's lock names.
    pub name: usize,
    pub local: LocalLock,
    /// An unlock of the current grant was sent: the engine stopped using the lock, whatever the
    /// reply (a lost reply leaves the record locked; only an unlock retry may follow).
    pub releasing: bool,
    /// The token of a grant the client re-claimed across a server incarnation it missed
    /// (`oracle::beliefs` says why the fencing rule skips it).
    pub unfenced: Option<u64>,
    /// The lock manager's side of the grant, when it is cached.
    pub cache: Cache,
}

/// A cached grant as the client keeps it (`dlock_core::manager::cache` has the rules).
#[derive(Clone, Copy, Debug, Default)]
pub struct Cache {
    /// The server holds the grant cached for this client: it was asked `CACHEABLE`.
    pub cached: bool,
    /// No local user: released locally, still held on the server.
    pub parked: bool,
    /// A revoke (or a lost link or event, which may have carried one) arrived: no new local
    /// user, and the grant goes back once its user is done.
    pub revoked: bool,
    /// The client ignores the revoke: it stops using the grant and never gives it back, so the
    /// server lapses it at the revoke timeout.
    pub ignoring: bool,
    /// Every revoke received for the grant wants the lock shared: an exclusive RW grant is
    /// downgraded in place rather than given back (`LockOp::Downgrade`), and stays cached.
    pub wants_shared: bool,
}

impl SimLock {
    /// A record of a lock the client obtained, holding nothing.
    pub fn new(name: usize, local: LocalLock) -> Self {
        SimLock {
            name,
            local,
            releasing: false,
            unfenced: None,
            cache: Cache::default(),
        }
    }

    /// The mode the client believes it holds the lock in, if any: it uses it, or it keeps it
    /// cached without a user (a cached holder is a holder), until a revoke.
    pub fn used_mode(&self) -> Option<Mode> {
        if self.releasing || self.cache.revoked {
            return None;
        }
        self.local.state.held_mode()
    }

    /// Whether a revoked cached grant is owed back now: nobody uses it and the client does not
    /// ignore the revoke.
    pub fn give_back_due(&self) -> bool {
        let c = self.cache;
        c.cached && c.revoked && c.parked && !c.ignoring && !self.releasing
    }

    /// Whether the fencing rule applies to the grant the record holds.
    pub fn fenced(&self) -> bool {
        self.unfenced != Some(self.local.token.0)
    }

    /// The last tick at which the grant is valid by the client's own reckoning.
    pub fn grant_until(&self) -> u64 {
        match self.local.kind {
            LockKind::Rw => u64::MAX,
            LockKind::Atomic | LockKind::Fair => {
                self.local.granted_at_ms + u64::from(self.local.expire_ms)
            }
        }
    }
}

/// The record index of a forged claim in [`Ctl::Claims`]: no record stands behind it.
pub const FORGED: usize = usize::MAX;

/// One item of an outstanding data message.
#[derive(Clone, Copy, Debug)]
pub enum Item {
    /// A lock command decided by record `rec`, flagged `CACHEABLE` if `cacheable`.
    Lock {
        rec: usize,
        req: Request,
        cacheable: bool,
    },
    /// An object command on object `obj` (index into the client's objects).
    Object { obj: usize },
}

/// An outstanding control request.
#[derive(Clone, Debug)]
pub enum Ctl {
    Init,
    Reinit,
    /// Claims for these records (indices into `locks`), in order; [`FORGED`] marks a claim of
    /// a lock the client never held.
    Claims(Vec<usize>),
    Done,
    Deinit,
    GetLock(Vec<usize>),
    Release(usize),
    ObjectCreate(usize),
    ObjectGet(usize),
    /// The recoverer lists retained locks.
    ListRetained,
    /// `recovery_done` for this dead client (from the recoverer, or a client without the role).
    RecoveryDone(u32),
}

/// The request a client waits for.
#[derive(Clone, Debug)]
pub enum Out {
    Control(Ctl),
    /// A data message: its items, whether it waits on the server, and the wait.
    Data {
        items: Vec<Item>,
        wait_ms: u32,
        /// Sent all-or-nothing: a reply that is not every item granted means the server undid
        /// the whole message, and none of it is applied.
        all_or_nothing: bool,
    },
}

/// An outstanding request with what its reply must echo.
#[derive(Clone, Debug)]
pub struct Pending {
    pub out: Out,
    pub message_id: u16,
    /// Server tick at send.
    pub sent_at: u64,
}

/// A simulated client.
#[derive(Clone, Debug)]
pub struct SimClient {
    pub phase: Phase,
    pub id: Option<u32>,
    pub session: Session,
    /// The epoch of the server it registered with last (its grants' proofs carry it).
    pub epoch: u16,
    /// Its records still carry a failed server's ids: it re-registered with a recovering
    /// server and has not finished re-claiming (see `Client::reinit`).
    pub reclaim: bool,
    pub lease_ms: u32,
    /// Whether the client has a connection it trusts (cleared when it breaks, set by a
    /// registration reply). Beliefs of a disconnected client do not count: it knows its
    /// connection is gone and an engine stops using the locks until the client re-registers.
    pub connected: bool,
    /// Its link to the server (`None` once it broke, until it reconnects).
    pub link: Option<LinkId>,
    /// When a client that lost its server notices (and starts a reinit).
    pub notice_at: u64,
    /// Acts again only from this tick (a pause: GC, VM freeze, SIGSTOP).
    pub paused_until: u64,
    /// Server tick at the send of the last request the server answered knowing this client:
    /// the server's lease runs from no earlier than that.
    pub lease_anchor: u64,
    /// Server tick at the send of the last data request answered on its current link: every
    /// revoke sent before the server read it has arrived (a channel delivers in order), so a
    /// cached grant cannot lapse unknown before this plus the revoke timeout.
    pub data_anchor: u64,
    pub locks: Vec<Option<SimLock>>,
    pub objects: Vec<(usize, ObjectId)>,
    /// Last value seen per object (for the CAS expected value).
    pub last_value: Vec<u64>,
    pub pending: Option<Pending>,
    pub heartbeat: Option<Pending>,
    pub next_message_id: u16,
    /// How many locks this client likes to keep references to.
    pub appetite: usize,
}

impl SimClient {
    /// A client that has not registered yet.
    pub fn new(appetite: usize) -> Self {
        SimClient {
            phase: Phase::Idle,
            id: None,
            session: Session::NONE,
            epoch: 0,
            reclaim: false,
            lease_ms: 0,
            connected: false,
            link: None,
            notice_at: 0,
            paused_until: 0,
            lease_anchor: 0,
            data_anchor: 0,
            locks: Vec::new(),
            objects: Vec::new(),
            last_value: Vec::new(),
            pending: None,
            heartbeat: None,
            next_message_id: 1,
            appetite,
        }
    }

    /// Whether the client believes it may use its locks at `now`: alive, connected and within
    /// the lease the server runs from its last answered request.
    pub fn trusts_lease(&self, now: u64) -> bool {
        // While it re-claims from a recovering server a client holds nothing for sure: the
        // server may start serving without its claims (the deadline passed, or it was not among
        // the clients expected) and grant them to others, which it learns when its claims are
        // refused. `Client::reinit`'s docs tell applications the same (seed 0x9377aa5bc1e333f).
        // A client leaving (`Deiniting`) has stopped using its locks: the server may release
        // them before the reply comes.
        self.phase != Phase::Dead
            && self.phase != Phase::Claiming
            && self.phase != Phase::Deiniting
            && self.connected
            && now <= self.lease_anchor + u64::from(self.lease_ms)
    }

    /// The record of lock name `name`, if the client has one.
    pub fn record_of(&self, name: usize) -> Option<&SimLock> {
        self.locks.iter().flatten().find(|l| l.name == name)
    }

    /// The record index that has lock id `id`.
    pub fn rec_with_id(&self, id: LockId) -> Option<usize> {
        self.locks
            .iter()
            .position(|l| l.as_ref().is_some_and(|l| l.local.id == id))
    }

    /// Records that exist.
    pub fn live_records(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.locks.len()).filter(|&i| self.locks[i].is_some())
    }

    /// Every cached grant counts as revoked: the client may have missed a revoke (its link
    /// broke with events on it, or its event ring overflowed).
    pub fn revoke_all_cached(&mut self) {
        self.data_anchor = 0;
        for l in self.locks.iter_mut().flatten() {
            l.cache.revoked |= l.cache.cached;
        }
    }

    /// Forgets every lock and object (the server no longer knows this client).
    pub fn forget_all(&mut self) {
        self.locks.clear();
        self.objects.clear();
        self.last_value.clear();
        self.pending = None;
        self.heartbeat = None;
        self.id = None;
        self.session = Session::NONE;
        self.reclaim = false;
        self.phase = Phase::Idle;
    }

    /// Next message id.
    pub fn message_id(&mut self) -> u16 {
        let id = self.next_message_id;
        self.next_message_id = self.next_message_id.wrapping_add(1).max(1);
        id
    }
}

/// Whether a record may start a new lock operation (not waiting to unlock a lost reply's grant).
pub fn idle_for_trylock(l: &SimLock) -> bool {
    !l.releasing
}

/// Whether a record holds nothing and may be released.
pub fn releasable(l: &SimLock) -> bool {
    matches!(
        l.local.state,
        LocalState::Initialized | LocalState::Unlocked
    ) && !l.releasing
}
