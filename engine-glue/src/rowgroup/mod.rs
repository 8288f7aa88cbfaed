//! Row-group locks: a transaction's set of `(table, row group)` keys, each held shared or
//! exclusive, taken in one global order so that transactions never deadlock on each other.
//!
//! This module owns one worker's [`RowGroupLocks`]: its [`Client`] (a client instance is
//! single-threaded), the cache of lock names it resolved, the keys of the open transaction with
//! their fencing tokens, and the lease watch. It talks to the server only through the client's
//! public API and touches no other module's state.
//!
//! # Keys and locks
//!
//! A [`RowGroup`] is the reader-writer lock named `b"rg/" ++ table (LE u32) ++ group (LE u64)`
//! (15 bytes, fixed length, so no two keys share a name). RW locks because a row group is read
//! by many transactions and written by one; names resolve to lock ids once per client
//! (`batch_get_lock`, 31 at a time) and stay cached up to [`RowGroupConfig::names_max`].
//!
//! # Acquisition order
//!
//! [`Txn::acquire`] sorts its keys by `(table, group)` and takes them in that order, 31 at a
//! time with `batch_trylock`. At the first refused key it gives back whatever the same batch
//! granted after it, then waits for that key alone with the server-side blocking `lock()`, then
//! goes on. (Caching, a key whose neighbours in the order are all cached is waited for at once,
//! with no trylock first, and a wait ends early at a revoke of a key the worker caches, to be
//! answered and resumed: `cache.rs`.) So a transaction only ever waits for a key while holding
//! keys smaller than it; a
//! cycle of waits would need a key smaller than itself, hence there is none. Keys an earlier
//! call of the same transaction took can break that rule when a later call asks for a smaller
//! key, so a key below the largest one already held is tried but never waited for: it fails at
//! once with `Fail` (the transaction should abort and retry with its keys in one call).
//!
//! # Re-entrancy
//!
//! | held      | asked     | result                                        |
//! |-----------|-----------|-----------------------------------------------|
//! | nothing   | m         | taken (or the call fails)                     |
//! | Shared    | Shared    | nothing to do                                 |
//! | Exclusive | either    | nothing to do                                 |
//! | Shared    | Exclusive | `Einval`, and nothing in the call is taken    |
//!
//! Upgrades are refused because the RW lock has none: giving up the shared grant to ask for the
//! exclusive one would let another writer change the row group the transaction has read, and
//! two shared holders waiting to upgrade would wait for each other forever. A transaction that
//! may write a row group asks for it exclusively from the start. Within one call a key asked
//! twice is asked once, in the stronger mode.
//!
//! # All or nothing
//!
//! With [`AcquireOptions::all_or_nothing`] a failed call leaves none of the keys *it* asked for
//! held (keys of earlier calls stay). Without waiting, each batch carries the batch command's
//! own all-or-nothing flag, so the server undoes a failed batch itself and the batches already
//! taken are unlocked; with waiting, a failed wait unlocks everything the call took. Without the
//! option a failed call keeps the keys before the failing one in key order.
//!
//! # Leases
//!
//! RW grants have no expiry on the server: they end on unlock or when the server declares the
//! holding client dead because it was silent for longer than its lease. So the lease of every
//! key is the client's lease, one per worker, and keeping it is one heartbeat, which renews all
//! keys at once (the lock-extend command refuses RW locks, and per-key leases would cost a
//! batch per 31 keys to say the same thing). [`RowGroupLocks::keep_leases`] heartbeats once more
//! than half the lease has passed since the last renewal; the engine calls it at least every
//! quarter lease, also between transactions (an idle client is declared dead all the same).
//!
//! When a heartbeat fails, or the server answers any request with a status that means the
//! registration is gone ([`is_fatal`]), every held key is lost: the `on_lost` callback is called
//! at once for each with its (now stale) fencing token, [`Txn::lost`] lists them,
//! [`Txn::token`] stops returning them, and [`Txn::commit`] fails. The report is conservative: a
//! transport failure counts as a loss although the server may still hold the keys, never the
//! reverse. A `RowGroupLocks` whose client is gone stays refused ([`RowGroupLocks::health`]);
//! the engine builds a new one with a new client.

mod acquire;
mod cache;
mod keymap;
mod txn;

use std::fmt;
use std::time::{Duration, Instant};

use dlock_core::config::BATCH_MAX;
use dlock_core::manager::cache::ServerOp;
use dlock_core::manager::{CachedLock, Demotion, Payback};
use dlock_core::{ClientId, Config, FencingToken, LockId, Mode, Status};
use dlock_transport::client::link::Link;
use dlock_transport::client::{Client, Connection};
use keymap::KeyMap;
pub use txn::Txn;

/// A row group of a table: the unit a transaction locks. Keys order by `(table, group)`, the
/// global acquisition order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RowGroup {
    /// The table.
    pub table: u32,
    /// The row group within the table.
    pub group: u64,
}

impl RowGroup {
    /// The prefix of every row-group lock name; other users of the server must not name their
    /// locks with it.
    pub const NAME_PREFIX: [u8; 3] = *b"rg/";
    /// Length of a row-group lock name: the prefix, the table, the group.
    pub const NAME_LEN: usize = 3 + 4 + 8;

    /// The key of `group` in `table`.
    #[inline]
    pub const fn new(table: u32, group: u64) -> Self {
        RowGroup { table, group }
    }

    /// The name of this key's lock on the server.
    #[inline]
    pub fn lock_name(self) -> [u8; Self::NAME_LEN] {
        let mut name = [0; Self::NAME_LEN];
        name[..3].copy_from_slice(&Self::NAME_PREFIX);
        name[3..7].copy_from_slice(&self.table.to_le_bytes());
        name[7..].copy_from_slice(&self.group.to_le_bytes());
        name
    }
}

/// Settings of one worker's row-group locks. The client's lease is the one the server granted
/// it ([`Client::lease`]): locks are taken for that long, and heartbeats go out when half of it
/// has passed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RowGroupConfig {
    /// Lock names kept resolved. When a call needs more, the names no transaction holds are
    /// released on the server first (the server's lock table is shared by every client).
    pub names_max: usize,
    /// Keep the keys of ended transactions as cached grants, take them again locally, and give
    /// them back when another worker wants them (`cache.rs`). Off by default: a worker then
    /// holds keys between transactions, which only pays when its transactions come back to
    /// the same row groups.
    pub cached: bool,
}

impl RowGroupConfig {
    /// 4,096 names.
    pub const DEFAULT: RowGroupConfig = RowGroupConfig {
        names_max: 4_096,
        cached: false,
    };

    /// Keeps up to `names_max` names resolved.
    pub const fn with_names_max(mut self, names_max: usize) -> Self {
        self.names_max = names_max;
        self
    }

    /// Caches grants between transactions (`on`): see [`RowGroupConfig::cached`].
    pub const fn with_cached(mut self, on: bool) -> Self {
        self.cached = on;
        self
    }

    /// `Einval` for a cache smaller than a batch.
    pub fn validate(&self) -> Result<(), Status> {
        if self.names_max < BATCH_MAX {
            return Err(Status::Einval);
        }
        Ok(())
    }
}

impl Default for RowGroupConfig {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// How one [`Txn::acquire`] call behaves when a key is busy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AcquireOptions {
    /// How long the whole call may wait for busy keys; zero fails at the first busy key.
    pub wait: Duration,
    /// On failure, release every key this call took (see the module doc).
    pub all_or_nothing: bool,
}

impl AcquireOptions {
    /// Never wait; keep what was taken on failure.
    pub const NO_WAIT: AcquireOptions = AcquireOptions {
        wait: Duration::ZERO,
        all_or_nothing: false,
    };

    /// Wait up to `wait` in all; keep what was taken on failure.
    #[inline]
    pub const fn wait(wait: Duration) -> Self {
        AcquireOptions {
            wait,
            all_or_nothing: false,
        }
    }

    /// The same, but a failed call keeps nothing it took.
    #[inline]
    pub const fn all_or_nothing(self) -> Self {
        AcquireOptions {
            all_or_nothing: true,
            ..self
        }
    }
}

/// Whether `s` means this client's registration, and with it every grant, is gone or in doubt:
/// the server forgot the client, the server is recovering from a failover (grants must be
/// re-claimed), or the transport failed (the client cannot know what the server did).
#[inline]
pub const fn is_fatal(s: Status) -> bool {
    matches!(
        s,
        Status::ClientNotInit
            | Status::ClientRemovedByServer
            | Status::BadResponse
            | Status::NotReady
    )
}

/// Called once per key the moment it is found lost, with the grant's fencing token.
type OnLost = Box<dyn FnMut(RowGroup, FencingToken) + Send>;

/// Says which keys a caching worker keeps between transactions (`cache.rs`).
type CacheFilter = Box<dyn Fn(RowGroup) -> bool + Send>;

/// One key of the open transaction.
#[derive(Clone, Copy, Debug)]
struct Held {
    key: RowGroup,
    id: LockId,
    mode: Mode,
    token: FencingToken,
    /// How many times the server's grant was taken again from the cache (`manager::Demotion`).
    reuses: u32,
    /// The core's record of the grant, the transaction its local user (`cache.rs`): whether
    /// a revoke asked for it back, and what to send for it.
    rec: CachedLock,
    /// A downgrade a revoke asked for during the transaction that the server did not answer:
    /// sent again at its end.
    owed: Option<ServerOp>,
    /// Its transaction outlived a revoke by the lease: warned once.
    warned: bool,
    /// Never cached, decided when it was taken from what the server was asked: asked for
    /// plain (its name was not cacheable then, `Name::cacheable`), or granted plain though
    /// asked for cached (a contended lock, protocol 8). The server never revokes it, so no
    /// revoke need be read for it (`caches_nothing`); its unlock rides the transaction's batch
    /// unlock (`cache.rs`).
    never_cached: bool,
    /// The cache filter kept the key when it was taken (`caches`): a grant it no longer keeps
    /// goes back at the transaction's end, though the server may revoke it until then.
    kept: bool,
}

/// A name resolved on the server.
#[derive(Clone, Copy, Debug)]
struct Name {
    id: LockId,
    /// Its acquisitions ask for cacheable grants (`Client::set_cacheable`): what the filter
    /// said at the last acquisition that could change it (`acquire.rs`, `ask_cacheable`).
    /// What the server was asked, not the filter's answer now, says whether a grant of it is
    /// cached.
    cacheable: bool,
}

/// One worker's row-group locks: owns its client, one transaction open at a time. The client
/// is one server's (a [`Link`]) or, with feature `cluster`, a cluster's
/// (`EmbeddedServer::cluster_client`): the locks and their order are the same either way.
pub struct RowGroupLocks<C: Connection = Link> {
    client: Client<C>,
    cfg: RowGroupConfig,
    /// Names resolved on the server (each is a lock reference this client holds).
    names: KeyMap<RowGroup, Name>,
    /// The open transaction's keys, sorted by key between calls.
    held: Vec<Held>,
    /// The open transaction's keys found lost, with their stale tokens.
    lost: Vec<(RowGroup, FencingToken)>,
    /// The status that ended the client's registration.
    dead: Option<Status>,
    /// When the server last renewed the lease on our word (a heartbeat's success).
    renewed_at: Instant,
    on_lost: Option<OnLost>,
    /// The current call's keys, sorted; kept to reuse its allocation.
    todo: Vec<acquire::Want>,
    /// The current call's held readers that become writers, with their records after (`plan`);
    /// kept to reuse its allocation.
    writers: Vec<(usize, CachedLock)>,
    /// Grants kept after their transaction ended (`cache.rs`), by key.
    cache: KeyMap<RowGroup, cache::Cached>,
    /// The key of each resolved name's lock id, to find a revoked lock's key in one look.
    ids: KeyMap<LockId, RowGroup>,
    /// Cached keys with a give-back or downgrade the server did not answer (`cache.rs`).
    owed: Vec<RowGroup>,
    /// Events read off the connection (kept for its capacity).
    events: Vec<dlock_core::proto::Event>,
    /// The give-backs an overflow asks of cached keys (kept for its capacity, `cache.rs`).
    overflowed: Vec<(RowGroup, ServerOp)>,
    /// Keys taken from the cache, with no message.
    cache_hits: u64,
    /// Which keys are cached (`None`: every key).
    cache_filter: Option<CacheFilter>,
    /// Keys whose cached grants were revoked before they were reused twice, let go plain for their
    /// next few uses (`manager::Demotion`; a key is dropped once it is cached again).
    contended: KeyMap<RowGroup, Demotion>,
    /// What this worker's cached grants did lately: when most were asked back before they
    /// paid, fresh grants are let go plain (`manager::Payback`).
    payback: Payback,
}

impl<C: Connection> fmt::Debug for RowGroupLocks<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RowGroupLocks")
            .field("client", &self.client.id())
            .field("cfg", &self.cfg)
            .field("names", &self.names.len())
            .field("held", &self.held.len())
            .field("lost", &self.lost)
            .field("dead", &self.dead)
            .field("renewed_at", &self.renewed_at)
            .field("on_lost", &self.on_lost.is_some())
            .field("cache", &self.cache.len())
            .field("cache_hits", &self.cache_hits)
            .finish()
    }
}

impl<C: Connection> RowGroupLocks<C> {
    /// Row-group locks over `client`, whose lease counts as renewed now (it just registered).
    /// `Einval` for a client registered with no lease (none is ever granted less than 100 ms),
    /// and for caching over a client whose connection carries no revokes (a cluster client:
    /// `Client::carries_events`).
    pub fn new(client: Client<C>, cfg: RowGroupConfig) -> Result<Self, Status> {
        cfg.validate()?;
        if client.lease() < Duration::from_millis(Config::CLIENT_LEASE_MIN_MS.into()) {
            return Err(Status::Einval);
        }
        // A cache needs the server's revokes (`Client::set_cacheable`): a cluster's routing
        // link carries none.
        if cfg.cached && !client.carries_events() {
            return Err(Status::Einval);
        }
        Ok(RowGroupLocks {
            client,
            cfg,
            names: KeyMap::with_capacity_and_hasher(cfg.names_max, Default::default()),
            held: Vec::new(),
            lost: Vec::new(),
            dead: None,
            renewed_at: Instant::now(),
            on_lost: None,
            todo: Vec::new(),
            writers: Vec::new(),
            cache: KeyMap::default(),
            ids: KeyMap::with_capacity_and_hasher(cfg.names_max, Default::default()),
            owed: Vec::new(),
            events: Vec::with_capacity(dlock_core::table::EVENT_RING_LEN + 1),
            overflowed: Vec::new(),
            cache_hits: 0,
            cache_filter: None,
            contended: KeyMap::default(),
            payback: Payback::NEW,
        })
    }

    /// Registers the callback told about every lost key, at once, with its fencing token.
    pub fn set_on_lost(&mut self, f: impl FnMut(RowGroup, FencingToken) + Send + 'static) {
        self.on_lost = Some(Box::new(f));
    }

    /// With caching on, keeps only the keys `f` accepts between transactions (by default
    /// every key): an engine whose workers own ranges of row groups caches its own range and
    /// gives back at once the keys of others, which their owners would soon revoke (each
    /// bounce of a key between two workers costs a revoke and its give-back; keys revoked
    /// before they were reused are demoted anyway, `cache.rs`).
    ///
    /// `f` may be replaced between transactions, and may read state that changes (ranges that
    /// move when the engine rebalances): it is asked again at every acquisition of a key, and
    /// the key's name is asked for as cacheable, or not, accordingly before the request goes
    /// out. Whether a grant is cached then follows what the server was asked for it, recorded
    /// per name, never the filter's answer after: a key asked for plain is unlocked at its
    /// transaction's end even if the filter now keeps it (the server would never revoke it,
    /// and other workers would wait for it as long as this one kept it), and a cached grant the
    /// filter no longer keeps is still read revokes for until its transaction's end gives it
    /// back. This beats fixing the answer per name and re-flagging the resolved names here: a
    /// filter reading moving ranges is followed with no call, and no name is re-flagged while
    /// a grant of it is cached (the client reads the flag as what the grant it holds is, for
    /// its overflow reports and failover re-claims): a name keeps asking for cacheable grants
    /// until its cached grant has gone back.
    pub fn set_cache_filter(&mut self, f: impl Fn(RowGroup) -> bool + Send + 'static) {
        self.cache_filter = Some(Box::new(f));
    }

    /// Whether caching keeps `key` between transactions (unless it is demoted, `cache.rs`):
    /// the filter's answer now, asked once per key per acquisition (`acquire.rs`, `resolve`).
    fn caches(&self, key: RowGroup) -> bool {
        self.cfg.cached && self.cache_filter.as_ref().is_none_or(|f| f(key))
    }

    /// Opens a transaction. Dropping it without [`Txn::commit`] aborts it.
    pub fn begin(&mut self) -> Txn<'_, C> {
        // Only a transaction leaked with `mem::forget` leaves keys behind.
        let _ = self.end();
        Txn { locks: self }
    }

    /// Renews the client's lease when more than half of it has passed since the last renewal
    /// (`now` is the engine's monotonic clock). `Err` when the client is gone; every key that
    /// was held is then reported lost.
    pub fn keep_leases(&mut self, now: Instant) -> Result<(), Status> {
        self.health()?;
        if now.saturating_duration_since(self.renewed_at) < self.client.lease() / 2 {
            return Ok(());
        }
        // Any failure counts: without a renewal the server will let the lease run out.
        self.client.heartbeat().map_err(|e| self.die(e.status()))?;
        self.renewed_at = now;
        self.poll_revokes().map(drop)
    }

    /// `Err(status)` once the client's registration is gone (see [`is_fatal`]).
    #[inline]
    pub fn health(&self) -> Result<(), Status> {
        self.dead.map_or(Ok(()), Err)
    }

    /// The lease the server granted this worker's client: locks are taken for this long, and
    /// [`RowGroupLocks::keep_leases`] renews it at half.
    pub fn client_lease(&self) -> Duration {
        self.client.lease()
    }

    /// The same, in the milliseconds the wire carries (the core's one rounding rule).
    pub(super) fn lease_ms(&self) -> u32 {
        dlock_core::time::duration_to_ms(self.client.lease())
    }

    /// The client's id.
    pub fn client_id(&self) -> ClientId {
        self.client.id()
    }

    /// How many lock names are resolved.
    pub fn cached_names(&self) -> usize {
        self.names.len()
    }

    /// How many grants are cached between transactions (`RowGroupConfig::cached`).
    pub fn cached_grants(&self) -> usize {
        self.cache.len()
    }

    /// How many keys transactions took from the cache, with no message.
    pub fn cache_hits(&self) -> u64 {
        self.cache_hits
    }

    /// Gives the client back (to `deinit` it, say); only possible with no transaction open.
    pub fn into_client(self) -> Client<C> {
        self.client
    }

    /// The client is gone: every held key is lost. Returns `s` for `map_err`.
    fn die(&mut self, s: Status) -> Status {
        self.dead.get_or_insert(s);
        // Cached grants went with the registration; no transaction held them.
        self.cache.clear();
        self.owed.clear();
        let mut held = std::mem::take(&mut self.held);
        for h in held.drain(..) {
            self.report_lost(h.key, h.token);
        }
        self.held = held;
        s
    }

    /// Files key `key`'s grant (token `token`) as lost and tells the engine's callback.
    fn report_lost(&mut self, key: RowGroup, token: FencingToken) {
        self.lost.push((key, token));
        if let Some(f) = self.on_lost.as_mut() {
            f(key, token);
        }
    }

    /// A status from the client: fatal ones end the registration. Returns `s`.
    fn check(&mut self, s: Status) -> Status {
        if is_fatal(s) { self.die(s) } else { s }
    }

    #[inline]
    fn find(&self, key: RowGroup) -> Result<usize, usize> {
        self.held.binary_search_by_key(&key, |h| h.key)
    }

    /// Ends the open transaction: unlocks (or, caching, keeps) every held key, forgets the
    /// lost ones.
    fn end(&mut self) -> Result<(), Status> {
        self.lost.clear();
        if self.cfg.cached && self.dead.is_none() {
            // Revokes that came during the transaction are for keys it held: not kept.
            let polled = self.poll_revokes();
            let released = self.let_go_from(0);
            return polled.and(released);
        }
        self.release_from(0)
    }

    /// Lets go of `held[from..]`: caching, into the cache (those revoked meanwhile are
    /// unlocked); otherwise unlocked.
    fn let_go_from(&mut self, from: usize) -> Result<(), Status> {
        let cached = if self.cfg.cached {
            self.cache_from(from)
        } else {
            Ok(())
        };
        let released = self.release_from(from);
        cached.and(released)
    }

    /// Unlocks `held[from..]`, 31 per message, and forgets them; the first failure is returned
    /// (a fatal one also loses the keys before `from`).
    fn release_from(&mut self, from: usize) -> Result<(), Status> {
        let from = from.min(self.held.len());
        let mut first = None;
        let mut ids = [acquire::NO_LOCK; BATCH_MAX];
        let mut out = [Err(Status::Einval); BATCH_MAX];
        let mut at = from;
        while at < self.held.len() {
            let n = (self.held.len() - at).min(BATCH_MAX);
            for (id, h) in ids.iter_mut().zip(&self.held[at..at + n]) {
                *id = h.id;
            }
            let (failed, answered) = match self.client.batch_unlock(&ids[..n], &mut out[..n]) {
                Err(e) => (Some(e.status()), false),
                Ok(()) => (out[..n].iter().find_map(|r| r.err()), true),
            };
            if answered && !failed.is_some_and(is_fatal) {
                // Cached keys' give-backs: one the server did not answer stays owed.
                for (j, r) in out[..n].iter().enumerate() {
                    self.unlocked(self.held[at + j], r.map_or_else(|s| s, |_| Status::Success));
                }
            }
            first = first.or(failed);
            if failed.is_some_and(is_fatal) {
                break;
            }
            at += n;
        }
        self.held.truncate(from);
        match first {
            None => Ok(()),
            Some(s) => Err(self.check(s)),
        }
    }
}

/// A worker's locks move between threads with their client (one thread uses them at a time).
const _: () = {
    const fn is_send<T: Send>() {}
    is_send::<RowGroupLocks>();
};
