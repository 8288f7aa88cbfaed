//! A [`super::CachedLocks`]' bookkeeping, under its one mutex: the entry of each lock (the
//! core's record and what the guards read), the handles that name the locks by place and
//! follow them by name through a failover's renumbering, the watch list each look visits, and
//! the count of engaged entries that lets a look wait while nothing is held. It sends nothing
//! itself but the references a handle takes: the exchanges are `exchange`'s, the looks `look`'s.

use dlock_core::manager::CachedLock;
use dlock_core::manager::cache::ServerOp;
use dlock_core::manager::value::{ValueBlock, ValueRead};
use dlock_core::proto::Event;
use dlock_core::table::EVENT_RING_LEN;
use dlock_core::{FencingToken, LockId, LockKind, Status};

use super::{Notices, Revoked};
use crate::client::error::Error;
use crate::client::{Client, Connection, IdMap};

pub(super) struct State<C: Connection> {
    pub(super) client: Client<C>,
    /// Per lock, under the id the client's record has now (revokes name it). Hashed by the
    /// client's fixed id hasher, not a randomly keyed one: an overflow gives the idle locks back
    /// and a renumbering rebuilds the watch list in the map's order, which is then the same on
    /// every run with the same ids, so the real-client simulator replays a seed exactly.
    pub(super) entries: IdMap<LockId, Entry>,
    /// Per handle ([`CachedRwLock::key`](super::CachedRwLock::key)): its lock's name and the id it
    /// has now. A failover renumbers locks ([`Client::renumberings`]); the ids follow by name
    /// (`follow_renumbering`).
    pub(super) handles: Vec<Handle>,
    /// The client's [`Client::renumberings`] when the ids last followed.
    pub(super) renumberings: u64,
    /// What the engine has not read yet.
    pub(super) notices: Notices<Revoked>,
    /// The locks each look must visit: a give-back owed, or a revoke waiting for the local
    /// users (to warn once it is overdue). Every other entry is left alone.
    pub(super) watch: Vec<LockId>,
    /// Events read off the connection, before they are acted on (kept for its capacity).
    pub(super) events: Vec<Event>,
    /// Guards handed out with no message, for tests and the engine's own accounting.
    pub(super) local_hits: u64,
    /// Threads waiting on [`Shared::changed`](super::Shared::changed): a dropped guard wakes them
    /// only if there are any, since a notify with no waiter is still a system call (std's futex
    /// condvar).
    pub(super) waiters: u32,
    /// The entries that are [`Entry::engaged`]. While there are none and nothing is watched,
    /// a look at the events may wait as long as the client's trust bound holds (`pump`).
    pub(super) engaged: usize,
}

/// One lock's cached grant: the core's record, and what the guards read.
#[derive(Clone, Copy, Debug)]
pub(super) struct Entry {
    pub(super) cache: CachedLock,
    pub(super) token: FencingToken,
    /// The block the grant came with, or the last one a local writer set.
    pub(super) value: Option<ValueRead>,
    /// A block a local writer set, written to the server with the give-back or downgrade.
    pub(super) staged: Option<ValueBlock>,
    /// A give-back or downgrade the server did not answer: sent again at the next look.
    pub(super) owed: Option<ServerOp>,
    /// The status the owed op's last send failed with: what a guard that must wait for it
    /// is told (the connection's failure, not "busy").
    pub(super) failed: Status,
    /// Users outlived a revoke past the lease: warned once.
    pub(super) warned: bool,
    /// In [`State::watch`] (a flag, not a search of the list: an overflow watches every lock).
    pub(super) watched: bool,
    /// Counted in [`State::engaged`]: the record holds a grant (or gives one back) on the
    /// server, or a give-back is owed. Set by [`State::settle`] after every exchange with the
    /// server, the only place where a record comes to hold something or stops holding it.
    pub(super) engaged: bool,
}

impl Entry {
    const fn new() -> Self {
        Entry {
            cache: CachedLock::new(LockKind::Rw),
            token: FencingToken(0),
            value: None,
            staged: None,
            owed: None,
            failed: Status::Success,
            warned: false,
            watched: false,
            engaged: false,
        }
    }

    /// Whether the server may send a revoke this entry must hear ([`Entry::engaged`]).
    fn engages(&self) -> bool {
        self.cache.held().is_some() || self.cache.giving_back() || self.owed.is_some()
    }
}

/// A cached lock's name and current id (`State::handles`).
#[derive(Debug)]
pub(super) struct Handle {
    pub(super) name: Box<[u8]>,
    pub(super) id: LockId,
    /// A failover's re-claim forgot the client's reference (the replacement refused it): the
    /// next use asks for the lock again.
    pub(super) forgotten: bool,
    /// Counts the forgettings: a guard from before one belongs to a grant that is gone, and
    /// must not release the users of the grant taken afresh (`State::current_of`).
    pub(super) generation: u64,
}

impl<C: Connection> State<C> {
    /// The bookkeeping of a handle on `client`, with nothing cached yet.
    pub(super) fn new(client: Client<C>) -> Self {
        State {
            client,
            entries: IdMap::default(),
            handles: Vec::new(),
            renumberings: 0,
            notices: Notices::new(Revoked::All),
            watch: Vec::new(),
            events: Vec::with_capacity(EVENT_RING_LEN + 1),
            local_hits: 0,
            waiters: 0,
            engaged: 0,
        }
    }

    /// Takes a reference to the RW lock `name` for the cache (cacheable, its waits ended by a
    /// revoke: the handle's module doc) and makes its entry; its id.
    pub(super) fn reference(&mut self, name: &[u8]) -> Result<LockId, Error> {
        let id = self.client.get_lock(LockKind::Rw, name)?;
        self.client.set_cacheable(id, true)?;
        // A waiting call ends its slice when this client is revoked (the handle's module doc).
        self.client.set_wake_on_revoke(id, true)?;
        self.entries.entry(id).or_insert(Entry::new());
        Ok(id)
    }

    /// After a failover's re-claim filed the client's records under a replacement's ids
    /// ([`Client::renumberings`]): every handle's id and entry follow their lock by name. A
    /// replacement numbers its locks afresh, so an id kept from before names another lock of
    /// the client, or none: a guard taken under it would hold the wrong lock. One comparison
    /// when nothing changed; run before any id is used or any event read.
    pub(super) fn follow_renumbering(&mut self) {
        let now = self.client.renumberings();
        if now == self.renumberings {
            return;
        }
        self.renumberings = now;
        if !self.entries.is_empty() {
            // The failover re-claimed no cached grant (the handle's module doc), and the notices
            // the engine has not read name ids from before.
            self.notices.renumbered();
        }
        let mut before = std::mem::take(&mut self.entries);
        for h in &mut self.handles {
            // A handle forgotten at an earlier failover keeps an id from before it, which the
            // replacement may have given another lock: that entry is not this handle's.
            let entry = if h.forgotten {
                None
            } else {
                before.remove(&h.id)
            };
            match self.client.lock_id(LockKind::Rw, &h.name) {
                Some(id) => {
                    self.entries.insert(id, entry.unwrap_or(Entry::new()));
                    (h.id, h.forgotten) = (id, false);
                }
                None if h.forgotten => {}
                None => {
                    h.forgotten = true;
                    h.generation += 1;
                }
            }
        }
        // The watch list named the old ids: it is rebuilt from the entries that still owe a
        // message or wait for their users (a renumbering is rare; the scan is fine there), and
        // the count of engaged entries from those kept (a forgotten handle's went with it).
        self.watch.clear();
        self.engaged = 0;
        for (&id, e) in &mut self.entries {
            e.watched = e.owed.is_some() || e.cache.revoke().is_some();
            if e.watched {
                self.watch.push(id);
            }
            self.engaged += usize::from(e.engaged);
        }
    }

    /// The id handle `key`'s lock has now; a forgotten reference is taken again.
    pub(super) fn id_of(&mut self, key: usize) -> Result<LockId, Error> {
        self.follow_renumbering();
        if self.handles[key].forgotten {
            let name = self.handles[key].name.clone();
            let id = self.reference(&name)?;
            (self.handles[key].id, self.handles[key].forgotten) = (id, false);
        }
        Ok(self.handles[key].id)
    }

    /// The id handle `key`'s lock has now, if the client still holds a reference to it.
    pub(super) fn current(&mut self, key: usize) -> Option<LockId> {
        self.follow_renumbering();
        let h = &self.handles[key];
        (!h.forgotten).then_some(h.id)
    }

    /// The id handle `key`'s lock has now, if a guard taken at `generation` still stands on
    /// its grant: not after a failover forgot the reference (the lock may be taken afresh
    /// since, its users none of that guard's).
    pub(super) fn current_of(&mut self, key: usize, generation: u64) -> Option<LockId> {
        let id = self.current(key)?;
        (self.handles[key].generation == generation).then_some(id)
    }

    /// Visits `id` at every look from now on (the doc of [`State::watch`]).
    pub(super) fn watch(&mut self, id: LockId) {
        if let Some(e) = self.entries.get_mut(&id)
            && !e.watched
        {
            e.watched = true;
            self.watch.push(id);
        }
    }

    /// Counts `id`'s entry in [`State::engaged`] if it [engages](Entry::engaged) now, after an
    /// exchange with the server.
    pub(super) fn settle(&mut self, id: LockId) {
        let Some(e) = self.entries.get_mut(&id) else {
            return;
        };
        let now = e.engages();
        if now != e.engaged {
            e.engaged = now;
            if now {
                self.engaged += 1;
            } else {
                self.engaged -= 1;
            }
        }
    }
}
