//! Lock sets: several locks taken in as few messages as the batch limit allows, held by one
//! [`GuardSet`] and unlocked together.
//!
//! The set owns a handle on each lock rather than borrowing it, so it is `'static` and can go
//! to async code as it is: a handle is one reference-count increment, nothing next to the round
//! trip that took the lock. A set counts one way: by the entries asked for, in the caller's
//! order ([`GuardSet::len`], [`GuardSet::token`], [`GuardSet::tokens`]).

use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use dlock_core::config::BATCH_MAX;
use dlock_core::{FencingToken, LockId, LockKind, Mode, Status};

use super::acquire::forgotten;
use super::kinds::Named;
use super::{AtomicLock, Connection, Error, FairLock, Locks, Op, RwLock, lease_ms};
use crate::client::link::Link;

/// How [`Locks::try_lock_all`] takes a set: all or nothing, or each lock on its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SetMode {
    /// Every lock is granted, or the call fails and none stays held.
    AllOrNothing,
    /// Each lock is granted, or refused because it is busy, on its own; the set holds those
    /// granted. A refusal for any other reason (the client unknown to the server, a full table,
    /// a lock invalid for this client) fails the call, as it would fail the next one.
    PerItem,
}

/// One lock of a set and the mode to take it in: an [`AtomicLock`] (exclusive, the only mode
/// it has), or an [`RwLock`] or [`FairLock`] with a [`Mode`]. Made with `.into()`, or by
/// passing those to [`Locks::try_lock_all`] as they are.
pub struct SetEntry<'a, C: Connection = Link> {
    lock: &'a Arc<Named<C>>,
    mode: Mode,
}

impl<'a, C: Connection> From<&'a AtomicLock<C>> for SetEntry<'a, C> {
    fn from(lock: &'a AtomicLock<C>) -> Self {
        SetEntry {
            lock: &lock.0,
            mode: Mode::Exclusive,
        }
    }
}

impl<'a, C: Connection> From<(&'a RwLock<C>, Mode)> for SetEntry<'a, C> {
    fn from((lock, mode): (&'a RwLock<C>, Mode)) -> Self {
        SetEntry {
            lock: &lock.0,
            mode,
        }
    }
}

impl<'a, C: Connection> From<(&'a FairLock<C>, Mode)> for SetEntry<'a, C> {
    fn from((lock, mode): (&'a FairLock<C>, Mode)) -> Self {
        SetEntry {
            lock: &lock.0,
            mode,
        }
    }
}

impl<C: Connection> fmt::Debug for SetEntry<'_, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SetEntry")
            .field("lock", self.lock)
            .field("mode", &self.mode)
            .finish()
    }
}

/// Grants of several locks, released together when dropped ([`Locks::try_lock_all`]).
///
/// ```
/// # use dlock_core::Config;
/// # use dlock_transport::runtime::{ServerConfig, ServerHandle};
/// # let server = ServerHandle::start(ServerConfig::new(Config {
/// #     locks_max: 64, clients_max: 4, objects_max: 4, ..Config::default()
/// # }))?;
/// use std::time::Duration;
/// use dlock_core::Mode;
/// use dlock_transport::client::{ClientConfig, Endpoint, Locks, SetEntry, SetMode};
///
/// let (a, b) = (
///     Locks::connect(ClientConfig::new(Endpoint::embedded(&server)))?,
///     Locks::connect(ClientConfig::new(Endpoint::embedded(&server)))?,
/// );
/// let (xid, table, queue) = (a.atomic("xid")?, a.rw("t1")?, a.fair("q")?);
/// let busy = b.rw("t1")?.try_write()?;
/// let lease = Duration::from_secs(5);
/// // Kinds mix in one set: an atomic lock as it is, the others with a mode.
/// let entries: [SetEntry; 3] = [(&xid).into(), (&table, Mode::Shared).into(), (&queue, Mode::Exclusive).into()];
/// let mut set = a.try_lock_all(entries, lease, SetMode::PerItem)?;
/// // Counted by entry, in the order asked: the table is the one refused.
/// assert_eq!(set.len(), 3);
/// let granted: Vec<bool> = set.tokens().map(|t| t.is_some()).collect();
/// assert_eq!(granted, [true, false, true]);
/// set.extend(Duration::from_secs(30))?; // leases of the atomic and fair grants
/// set.unlock()?; // or drop it
/// # drop((busy, xid, table, queue, a, b));
/// # server.stop();
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[must_use = "dropping a guard set unlocks at once"]
pub struct GuardSet<C: Connection = Link> {
    locks: Locks<C>,
    /// Every lock asked for, in the caller's order, with its mode and its grant's token when
    /// granted.
    entries: Vec<(Arc<Named<C>>, Mode, Option<FencingToken>)>,
    /// Cleared once unlocked explicitly.
    armed: bool,
}

pub(super) fn try_lock_all<'a, C: Connection + 'a, E: Into<SetEntry<'a, C>>>(
    locks: &Locks<C>,
    entries: impl IntoIterator<Item = E>,
    lease: Duration,
    set_mode: SetMode,
) -> Result<GuardSet<C>, Error> {
    let op = Op::BatchTryLock;
    let lease_ms = lease_ms(op, lease)?;
    let mut set = GuardSet {
        locks: locks.clone(),
        entries: Vec::new(),
        armed: true,
    };
    let mut ids = HashSet::new();
    for e in entries.into_iter().map(Into::into) {
        if !locks.same(&e.lock.locks) || !ids.insert(e.lock.id) {
            return Err(op.err(Status::Einval));
        }
        set.entries.push((Arc::clone(e.lock), e.mode, None));
    }
    let all_or_nothing = set_mode == SetMode::AllOrNothing;
    // Declared after the set, so that on an early return the turn goes first (giving the
    // client back) and the set's drop then unlocks what was granted.
    let mut turn = locks.turn();
    turn.settle();
    // The status to blame if something was refused.
    let mut refused: Option<Status> = None;
    // A guard of this handle holding a lock in a conflicting mode makes it busy; the server
    // would not see the conflict (it is the same client).
    let asked: Vec<usize> = (0..set.entries.len())
        .filter(|&i| {
            let (lock, mode, _) = &set.entries[i];
            let free = !turn.conflicts(lock.id, *mode);
            if !free {
                blame(&mut refused, Status::Fail);
            }
            free
        })
        .collect();
    if all_or_nothing && refused.is_some() {
        return Err(op.err(Status::Fail));
    }
    // A grant left behind by an unlock that never reached the server is given back first
    // (see `Turn::stale`).
    for &i in &asked {
        let id = set.entries[i].0.id;
        if turn.stale(id) {
            forgotten(turn.client().unlock(id))?;
        }
    }
    let mut requests = [(NO_LOCK, Mode::Exclusive, 0); BATCH_MAX];
    let mut out = [Err(Status::Einval); BATCH_MAX];
    for chunk in asked.chunks(BATCH_MAX) {
        let n = chunk.len();
        for (r, &i) in requests.iter_mut().zip(chunk) {
            let (lock, mode, _) = &set.entries[i];
            // An RW grant has no lease on the server (see `acquire::Ask`).
            let lease_ms = if lock.kind == LockKind::Rw {
                u32::MAX
            } else {
                lease_ms
            };
            *r = (lock.id, *mode, lease_ms);
        }
        // On an error the set's drop unlocks the messages granted before this one.
        turn.client()
            .batch_trylock(&requests[..n], all_or_nothing, &mut out[..n])?;
        for (r, &i) in out[..n].iter().zip(chunk) {
            let (lock, mode, token) = &mut set.entries[i];
            match *r {
                Ok(grant) => {
                    turn.hold(lock.id, *mode);
                    *token = Some(grant.token);
                }
                // A fair lock refused per item keeps its ticket, as after a fair `try_write`.
                Err(s) => blame(&mut refused, s),
            }
        }
        if all_or_nothing && refused.is_some() {
            break;
        }
    }
    drop(turn);
    match refused {
        // The set's drop unlocks the messages granted before the refused one.
        Some(s) if all_or_nothing => Err(op.err(s)),
        // Not busy: a set that hid it (say, every entry refused because the server no longer
        // knows this client) would read as "all busy" to a caller who should reconnect.
        Some(s) if !op.err(s).is_would_block() => Err(op.err(s)),
        _ => Ok(set),
    }
}

/// Notes `s` as the reason a lock was refused, unless a better one is known: in an undone
/// all-or-nothing message the entries that had worked say `Eagain`, so any other status is the
/// real reason; and a status that is not "busy" says more than one that is.
fn blame(refused: &mut Option<Status>, s: Status) {
    let busy = |s: Status| Op::BatchTryLock.err(s).is_would_block();
    if refused.is_none_or(|r| r == Status::Eagain || (busy(r) && !busy(s))) {
        *refused = Some(s);
    }
}

/// Fills unused request slots; never sent.
const NO_LOCK: LockId = LockId::new(0, 1);

impl<C: Connection> GuardSet<C> {
    /// How many locks were asked for.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no lock was asked for.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether every lock asked for was granted (always, for an all-or-nothing set).
    pub fn is_complete(&self) -> bool {
        self.entries.iter().all(|(_, _, t)| t.is_some())
    }

    /// The token of the `i`-th lock asked for; `None` when it was not granted (or `i` is out of
    /// range).
    pub fn token(&self, i: usize) -> Option<FencingToken> {
        self.entries.get(i).and_then(|&(_, _, t)| t)
    }

    /// Each lock's token in the order asked for, `None` where it was not granted.
    pub fn tokens(&self) -> impl Iterator<Item = Option<FencingToken>> + '_ {
        self.entries.iter().map(|&(_, _, t)| t)
    }

    /// Extends every grant to at least `lease` from now (31 per message); RW grants by renewing
    /// the client's lease. Returns the first error; the other grants are extended all the same.
    pub fn extend(&mut self, lease: Duration) -> Result<(), Error> {
        let lease_ms = dlock_core::time::duration_to_ms(lease);
        let leased: Vec<(LockId, Mode, u32)> = self
            .granted()
            .filter(|(l, _)| l.kind != LockKind::Rw)
            .map(|(l, mode)| (l.id, mode, lease_ms))
            .collect();
        let has_rw = self.granted().any(|(l, _)| l.kind == LockKind::Rw);
        let mut turn = self.locks.turn();
        turn.settle();
        let mut first: Option<Error> = None;
        let mut out = [Err(Status::Einval); BATCH_MAX];
        for chunk in leased.chunks(BATCH_MAX) {
            let n = chunk.len();
            let failed = match turn.client().batch_lock_extend(chunk, &mut out[..n]) {
                Err(e) => Some(e),
                Ok(()) => out[..n]
                    .iter()
                    .find_map(|r| r.err())
                    .map(|s| Op::BatchExtend.err(s)),
            };
            first = first.or(failed);
        }
        if has_rw && let Err(e) = turn.client().heartbeat() {
            first = first.or(Some(e));
        }
        first.map_or(Ok(()), Err)
    }

    /// Unlocks every grant now and waits for the answers; returns the first error (every grant
    /// is given up all the same).
    pub fn unlock(mut self) -> Result<(), Error> {
        self.armed = false;
        let ids: Vec<LockId> = self.granted().map(|(l, _)| l.id).collect();
        if ids.is_empty() {
            return Ok(());
        }
        let mut turn = self.locks.turn();
        turn.settle();
        let mut first = None;
        let mut out = [Err(Status::Einval); BATCH_MAX];
        for chunk in ids.chunks(BATCH_MAX) {
            chunk.iter().for_each(|&id| turn.unhold(id));
            let n = chunk.len();
            let failed = match turn.client().batch_unlock(chunk, &mut out[..n]) {
                Err(e) => Some(e),
                Ok(()) => out[..n]
                    .iter()
                    .find_map(|r| r.err())
                    .map(|s| Op::BatchUnlock.err(s)),
            };
            first = first.or(failed);
        }
        first.map_or(Ok(()), Err)
    }

    fn granted(&self) -> impl Iterator<Item = (&Arc<Named<C>>, Mode)> + '_ {
        self.entries
            .iter()
            .filter_map(|(l, mode, t)| t.map(|_| (l, *mode)))
    }
}

impl<C: Connection> Drop for GuardSet<C> {
    fn drop(&mut self) {
        if self.armed {
            // A set writes no value blocks (its entries have no `set_value`).
            let ids: Vec<_> = self.granted().map(|(l, _)| (l.id, None)).collect();
            if !ids.is_empty() {
                self.locks.let_go(ids);
            }
        }
    }
}

impl<C: Connection> fmt::Debug for GuardSet<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GuardSet")
            .field("len", &self.len())
            .field("tokens", &self.tokens().collect::<Vec<_>>())
            .finish()
    }
}
