//! Cached RW locks: grants an engine keeps after its local users are done, re-used locally,
//! and given back when the server asks (MANAGER-SPEC §5; the server's side is
//! `dlock_core::server`'s `revokes.rs`).
//!
//! A [`CachedLocks`] is one client registration whose RW locks are asked for as *cacheable*
//! ([`Client::set_cacheable`]). The first guard of a lock asks the server; dropping the last
//! guard keeps the grant (no message), and the next guard in a mode the grant covers is handed
//! out locally (no message). When another client asks for a conflicting mode, the server sends
//! this one a revoke (once its minimum hold is over); the handle reads it whenever it looks at
//! its connection — every call that takes a guard, and [`Revokes::try_recv`], the channel the
//! engine polls — and acts on it itself. While it holds no grant on the server and owes no
//! give-back, the look waits as long as the client's trust bound allows (`State::pump`).
//!
//! The rules are `dlock_core::manager::cache`'s
//! [`CachedLock`](dlock_core::manager::CachedLock), one record per lock, which this module
//! drives (its module doc has the tables; the simulators can reach it there). In short:
//!
//! | a revoke wanting | local guards                 | the handle                                           |
//! |------------------|------------------------------|------------------------------------------------------|
//! | anything         | (lock not held, or held under a newer grant) | ignores it (a stale or foreign revoke)  |
//! | exclusive        | none                         | gives the lock back now (an unlock)                  |
//! | exclusive        | some                         | takes no new guard; the last guard's drop gives it back |
//! | shared           | readers or none (held exclusive) | downgrades now: its readers go on under the shared grant |
//! | shared           | a writer                     | downgrades when the writer's guard drops             |
//!
//! Every revoke acted on is also told to the engine ([`Revoked`]), so that it can hurry the
//! users in the way; an event-ring overflow is [`Revoked::All`] and revokes every cached lock.
//! What a lock protects must be written back before its last guard drops, as before any
//! unlock: the give-back may follow at once.
//!
//! The client's calls go through one mutex (the registration is one client, used by one
//! caller at a time on the wire): a guard's drop that gives a lock back sends its message with
//! it held, and a waiting call waits on the server in slices of [`WAIT_SLICE`], looking at its
//! events and letting go of the mutex between them, so that a revoke is acted on while a
//! thread of the handle waits for another lock (two engines each waiting for the lock the
//! other caches would otherwise wait until their revokes lapsed). Its locks are asked for with
//! `WAKE_ON_REVOKE` ([`Client::set_wake_on_revoke`]), so a revoke that comes while the slice
//! is parked on the server ends the slice at once rather than at its end.
//!
//! A holder that does not look at its connection does not see its revokes, and loses the
//! grant at the server's revoke timeout (the client's lease by default) as if its lease ran
//! out: poll [`Revokes::try_recv`] from the engine's loop. Users that outlive a revoke by the
//! client's lease are warned about (`tracing`): their grant is gone.
//!
//! A handle names its lock by its place in the table of handles, not by id: after a failover
//! the client's re-claim files its records under the ids the replacement gave them
//! ([`Client::renumberings`]), and the handles follow by name, so a guard never takes whatever
//! lock inherited its lock's old id.
//!
//! Revokes that may have been lost come as [`Revoked::All`] too ([`Client::poll_events`],
//! `dlock_core::manager::trust`): after a reconnection or a failover (whose recovery re-claims
//! no cached grant), and, over TCP or RDMA, when no data request was answered within the revoke
//! timeout ([`ClientConfig::revoke_timeout`], the lease by default) — a revoke still on its way
//! may have lapsed. Every cached lock is then given back and asked for again at its next guard.
//!
//! This module owns the handle ([`CachedLocks`]) and the engine's channel ([`Revokes`]); the
//! rest lives beside it, each part in its own module:
//!
//! - `rwlock`: [`CachedRwLock`], a guard taken locally or from the server, and the wait;
//! - `guard`: the guards, released locally at drop, a value block set, a downgrade in place;
//! - `state`: the bookkeeping — the entries, their ids following a failover, the watch list,
//!   the count of engaged entries;
//! - `look`: the look at the connection — revokes and overflows acted on, owed ops sent again;
//! - `exchange`: one lock's exchange with the server — acquisitions, give-backs and downgrades
//!   sent, their replies handed to the record;
//! - `drive`, `notices`, `wait`: the send loop, the notice queue and the sliced wait, which the
//!   C ABI's cached locks and the row-group cache share.

mod drive;
mod exchange;
mod guard;
mod look;
mod notices;
mod rwlock;
mod state;
mod wait;

use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

use dlock_core::{LockId, Mode};

pub use drive::{Driven, SENDS_MAX, SENDS_TOTAL_MAX, drive_op, send_op};
pub use guard::{CachedReadGuard, CachedWriteGuard};
pub use look::warn_overdue;
pub use notices::{NOTICES_MAX, Notices};
pub use rwlock::CachedRwLock;
pub use wait::{WAIT_SLICE, wait_sliced};

use self::state::{Handle, State};
use super::error::Error;
use super::link::Link;
use super::{Client, ClientConfig, Connection};

/// What the engine is told through [`Revokes::try_recv`]: flush what a lock protects, it is
/// being given back (now, or when its last guard drops).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Revoked {
    /// Another client wants `lock` in mode `wanted`.
    Lock { lock: LockId, wanted: Mode },
    /// Revokes were lost (the event ring, or this queue, overflowed): every cached lock is
    /// being given back.
    All,
}

/// A handle on one registration for cached RW locks (module doc). Cheap to clone; the clones
/// share the registration.
pub struct CachedLocks<C: Connection = Link> {
    shared: Arc<Shared<C>>,
}

impl<C: Connection> Clone for CachedLocks<C> {
    fn clone(&self) -> Self {
        CachedLocks {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<C: Connection> std::fmt::Debug for CachedLocks<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CachedLocks").finish_non_exhaustive()
    }
}

struct Shared<C: Connection> {
    state: Mutex<State<C>>,
    /// Signalled when a guard drops or a lock is given back.
    changed: Condvar,
}

impl CachedLocks<Link> {
    /// Registers a new client instance and wraps it.
    pub fn connect(cfg: ClientConfig) -> Result<CachedLocks, Error> {
        Client::connect(cfg).map(CachedLocks::new)
    }
}

impl<C: Connection> CachedLocks<C> {
    /// Wraps a registered client.
    pub fn new(client: Client<C>) -> CachedLocks<C> {
        CachedLocks {
            shared: Arc::new(Shared {
                state: Mutex::new(State::new(client)),
                changed: Condvar::new(),
            }),
        }
    }

    /// The cached RW lock `name` (created on the server if it does not exist), its grants
    /// asked for as cacheable.
    pub fn rw(&self, name: impl AsRef<[u8]>) -> Result<CachedRwLock<C>, Error> {
        let name = name.as_ref();
        let mut st = self.state();
        st.follow_renumbering();
        let id = st.reference(name)?;
        // Room for a look that watches every lock (an overflow), made here rather than there.
        let n = st.entries.len().saturating_sub(st.watch.len());
        st.watch.reserve(n);
        let key = match st.handles.iter().position(|h| *h.name == *name) {
            Some(key) => {
                // A handle a failover forgot has its reference again, under this id.
                (st.handles[key].id, st.handles[key].forgotten) = (id, false);
                key
            }
            None => {
                let name = name.into();
                st.handles.push(Handle {
                    name,
                    id,
                    forgotten: false,
                    generation: 0,
                });
                st.handles.len() - 1
            }
        };
        Ok(CachedRwLock {
            locks: self.clone(),
            key,
        })
    }

    /// The channel of revoke notices the engine polls.
    pub fn revokes(&self) -> Revokes<C> {
        Revokes {
            locks: self.clone(),
        }
    }

    /// Guards handed out locally, with no message to the server.
    pub fn local_hits(&self) -> u64 {
        self.state().local_hits
    }

    /// Runs `f` on the client (stats, objects), with every give-back due already sent. Do not
    /// unlock the cached locks through it.
    pub fn with_client<R>(&self, f: impl FnOnce(&mut Client<C>) -> R) -> R {
        let mut st = self.state();
        let r = f(&mut st.client);
        // A failover's re-claim made through it renumbers the locks.
        st.follow_renumbering();
        r
    }

    fn state(&self) -> MutexGuard<'_, State<C>> {
        self.shared
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// The channel of revoke notices of a [`CachedLocks`]: the engine polls it to learn which locks
/// to flush (the handle gives them back itself).
#[derive(Debug)]
pub struct Revokes<C: Connection = Link> {
    locks: CachedLocks<C>,
}

impl<C: Connection> Revokes<C> {
    /// The next notice, without waiting: reads what the server sent meanwhile (and gives back
    /// what is due) first. `Ok(None)` when there is none.
    pub fn try_recv(&self) -> Result<Option<Revoked>, Error> {
        let mut st = self.locks.state();
        if st.pump()? && st.waiters > 0 {
            self.locks.shared.changed.notify_all();
        }
        Ok(st.notices.pop())
    }
}
