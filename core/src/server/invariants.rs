//! [`Server::check_invariants`]: a read-only check that the tables agree with one another.
//!
//! The state machine keeps many facts twice — a lock's reference count and its column of
//! reference bits, an RW lock's reader count and its readers' holds, a waiter's state and its
//! place on a FIFO — and a transition that updates one place and not the other answers every
//! request correctly until, much later, something reads the other. The simulators call this
//! after every step, so such a bug stops the run at the step that made it, named.
//!
//! | tables              | what must agree                                                        |
//! |---------------------|------------------------------------------------------------------------|
//! | free lists          | the free and the live slots partition the slots handed out: each slot below the high-water mark is one or the other, listed at most once |
//! | indexes             | the name indexes and the client index map exactly the live slots, each under its key's tag (a name's keyed hash, an id's mix), and no key twice |
//! | clients             | a free entry is blank; a live one has an id and a valid state, nobody re-syncs on a serving server, its reference counts are its reference bits; no peer beyond its cap |
//! | references          | a live lock is referenced, and its count (an object's too) is the number of bits in its column; bits only of live clients on live slots |
//! | holds               | only with a reference; shared grants on RW and fair locks only, tickets on fair locks only; a dead (retaining) client's only grants marked retain-on-death; a cached grant only on a lock whose manager cell is marked as having one |
//! | lock words          | an owner in a word (atomic, RW, fair) is a registered client whose hold is exclusive; an RW or fair exclusive hold is the word's owner; a lock's shared holds are its reader count (`readers`, `rcnt`); no readers beside an owner; fair counters in order (`nx` not after `mx`, `ns` not after `ms`) |
//! | fences              | each live lock's last fencing token is below the server's next token |
//! | waiters             | the waiting and ready counts match the table; a waiting request is on its own lock's FIFO once, a FIFO holds only those and ends; a parked request is its slot's client's; a free waiter is blank; a queued fair retry holds a ticket the lock issued |
//! | objects             | a live object's owner is registered (or none); a destroyed one is still referenced (it would have been freed); a free slot is blank |
//!
//! [`Server::check_routing`] checks the per-slot routing state a transport keeps through the
//! core ([`Routing`](crate::server::Routing)) against the waiter table (`routing.rs`).
//!
//! An atomic lock's exclusive hold may name a grant that expired and was taken over: the word
//! then names the new owner, and `current_hold` drops the stale hold on its client's next
//! command. RW locks never expire and fair locks forget preempted holders at once, so their
//! exclusive holds must be the word's owner exactly.
//!
//! Counting every column of a bit grid would cost clients × locks. Each count is instead
//! checked as a weighted sum — `Σ count(l)·w(l)` against `Σ w(l)` over the set bits, `w` a
//! 64-bit mix of the index — which a difference in any count changes except with probability
//! 2^-64; only when the sums differ are the columns counted, to name the slot. A free list is
//! checked the same way. So a check is one pass over the used part of each table, up to the
//! high-water marks (a slot never handed out was never written). It allocates nothing and
//! changes nothing: a broken invariant is a bug, reported as the first [`Violation`] found.

use super::Server;
use crate::ids::{LockId, LockKind, Mode};
use crate::manager::GrantState;
use crate::table::index::{Index, hash_name, mix32};
use crate::table::{
    ClientEntry, ClientState, FreeList, ObjectMeta, SlotState, Waiter, WaiterState,
};
use crate::word::{atomic, fair, rw};

/// What the checks read of a holds-grid entry: the mode of a grant (plain, cached or retained
/// alike: each is a holder), a ticket, or nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Hold {
    None,
    Exclusive,
    Shared,
    Ticketed,
}

impl Hold {
    /// The entry `bits` reads as; `None` for bits no grant state has.
    fn of(bits: u8) -> Option<Hold> {
        let state = GrantState::from_bits(bits).ok()?;
        Some(match (state.grant_mode(), state.ticket_mode()) {
            (Some(Mode::Exclusive), _) => Hold::Exclusive,
            (Some(Mode::Shared), _) => Hold::Shared,
            (None, Some(_)) => Hold::Ticketed,
            (None, None) => Hold::None,
        })
    }
}

mod routing;
mod violation;
pub use violation::{Table, Violation};

/// The weight of slot `i` in the sums that stand in for per-slot counts (SplitMix64's
/// finaliser, so that no small combination of weights cancels).
#[inline]
fn weight(i: u32) -> u64 {
    let mut z = u64::from(i).wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Checks that `free` lists each slot below its high-water mark that `live` says is unused,
/// once, and nothing else.
fn check_free_list(
    free: &FreeList<'_>,
    table: Table,
    live: impl Fn(u32) -> bool,
) -> Result<(), Violation> {
    let hw = free.high_water();
    if hw > free.capacity() {
        return Err(Violation::FreeList { table, slot: hw });
    }
    let mut listed = 0u64;
    for &slot in free.free_slots() {
        if slot >= hw || live(slot) {
            return Err(Violation::FreeList { table, slot });
        }
        listed = listed.wrapping_add(weight(slot));
    }
    let (mut unused, mut n) = (0u64, 0usize);
    for slot in (0..hw).filter(|&s| !live(s)) {
        unused = unused.wrapping_add(weight(slot));
        n += 1;
    }
    if n == free.free_slots().len() && unused == listed {
        return Ok(());
    }
    // Name the slot: one unused slot not listed exactly once.
    let slot = (0..hw)
        .filter(|&s| !live(s))
        .find(|&s| free.free_slots().iter().filter(|&&f| f == s).count() != 1)
        .unwrap_or(hw);
    Err(Violation::FreeList { table, slot })
}

/// Checks that `index` maps exactly the live slots below `hw`: each found under `tag(slot)`
/// by a search for its own key (`same_key(candidate, slot)`), so no key is there twice, and
/// no entry stands for anything else.
fn check_index(
    index: &Index<'_>,
    table: Table,
    hw: u32,
    live: impl Fn(u32) -> bool,
    tag: impl Fn(u32) -> u32,
    same_key: impl Fn(u32, u32) -> bool,
) -> Result<(), Violation> {
    let mut n = 0usize;
    for slot in (0..hw).filter(|&s| live(s)) {
        n += 1;
        if index.find(tag(slot), |c| same_key(c, slot)) != Some(slot) {
            return Err(Violation::Index { table, slot });
        }
    }
    let mut entries = 0usize;
    for (t, slot) in index.entries() {
        entries += 1;
        if slot >= hw || !live(slot) || t != tag(slot) {
            return Err(Violation::Index { table, slot });
        }
    }
    if entries != n {
        return Err(Violation::Index { table, slot: hw });
    }
    Ok(())
}

/// The owner a lock word names (0: none), and its reader count.
fn owner_and_readers(kind: LockKind, cell: &crate::table::LockCell) -> (u32, u32) {
    match kind {
        LockKind::Atomic => (atomic::AtomicWord::from_bits(cell.word).owner(), 0),
        LockKind::Rw => {
            let w = rw::RwWord::from_bits(cell.word);
            (w.owner(), w.readers())
        }
        LockKind::Fair => (
            cell.ext,
            u32::from(fair::FairWord::from_bits(cell.word).rcnt()),
        ),
    }
}

/// A client's reference count that is not its number of bits.
#[cold]
fn client_refs(slot: u32, table: Table, recorded: u32, counted: u32) -> Violation {
    Violation::ClientRefs {
        slot,
        table,
        recorded,
        counted,
    }
}

/// Sums over the reference and hold bits, standing in for per-slot counts.
#[derive(Default)]
struct Sums {
    lock_refs: u64,
    shared_holds: u64,
    object_refs: u64,
}

impl Server<'_> {
    /// Checks that the tables agree with one another (the module doc lists what that means);
    /// the first broken invariant found, if any. Read-only, allocation-free, and one pass over
    /// the used part of each table.
    pub fn check_invariants(&self) -> Result<(), Violation> {
        let t = &self.t;
        check_free_list(&t.lock_free, Table::Locks, |s| self.lock_live(s))?;
        check_free_list(&t.object_free, Table::Objects, |s| self.object_live(s))?;
        check_free_list(&t.client_free, Table::Clients, |s| {
            t.clients[s as usize].id != 0
        })?;
        self.check_clients()?;
        let sums = self.check_rows()?;
        self.check_locks(&sums)?;
        self.check_objects(&sums)?;
        self.check_waiters()
    }

    fn lock_live(&self, lock: u32) -> bool {
        SlotState(self.t.lock_meta[lock as usize].state).is_live()
    }

    fn object_live(&self, object: u32) -> bool {
        SlotState(self.t.object_meta[object as usize].state).is_live()
    }

    /// The client entries on their own, the client index, and the per-peer caps.
    fn check_clients(&self) -> Result<(), Violation> {
        let t = &self.t;
        let hw = t.client_free.high_water();
        for slot in 0..hw {
            let c = &t.clients[slot as usize];
            let bad = match c.client_state() {
                ClientState::Free => *c != ClientEntry::default(),
                ClientState::Recovering => c.id == 0 || self.recovering == 0,
                ClientState::Active | ClientState::Abnormal => c.id == 0,
                // A dead client keeping retained grants until `recovery_done`.
                ClientState::Retaining => c.id == 0 || self.retaining_clients() == 0,
            };
            if bad {
                return Err(Violation::ClientEntry { slot });
            }
        }
        let counted = t.clients[..hw as usize]
            .iter()
            .filter(|c| super::clients::counts_as_old(c))
            .count() as u32;
        if counted != self.old_clients {
            return Err(Violation::OldClients {
                recorded: self.old_clients,
                counted,
            });
        }
        let clients = &*t.clients;
        check_index(
            &t.client_index,
            Table::Clients,
            hw,
            // A retaining entry has left the index: nothing may speak for a dead client.
            |s| {
                let c = &clients[s as usize];
                c.id != 0 && c.client_state() != ClientState::Retaining
            },
            // `client_tag` of the id, without re-checking it is one.
            |s| mix32(clients[s as usize].id),
            |a, b| clients[a as usize].id == clients[b as usize].id,
        )?;
        self.check_peer_caps()
    }

    /// No remote peer holds more entries than its cap (local clients are not counted). Each
    /// peer is counted at its first entry, so a table of local clients costs one pass.
    fn check_peer_caps(&self) -> Result<(), Violation> {
        let clients = &self.t.clients[..self.t.client_free.high_water() as usize];
        for (i, c) in clients.iter().enumerate() {
            if c.id == 0
                || c.peer == 0
                || clients[..i].iter().any(|o| o.id != 0 && o.peer == c.peer)
            {
                continue;
            }
            let held = clients[i..]
                .iter()
                .filter(|o| o.id != 0 && o.peer == c.peer)
                .count() as u32;
            if held > self.cfg.clients_per_peer() {
                return Err(Violation::PeerCap { peer: c.peer, held });
            }
        }
        Ok(())
    }

    /// Each client slot's rows of the three grids: bits only where they may be, the client's
    /// own counts, and exclusive holds against the lock words. Returns the weighted sums the
    /// per-slot counts are checked against.
    fn check_rows(&self) -> Result<Sums, Violation> {
        let t = &self.t;
        let mut sums = Sums::default();
        for client in 0..t.client_free.high_water() {
            let entry = &t.clients[client as usize];
            let (mut locks, mut objects) = (0u32, 0u32);
            let mut from = 0;
            while let Some((lock, _)) = t.lock_refs.next_in_row(client, from) {
                from = lock + 1;
                if entry.id == 0 || lock >= t.lock_free.high_water() || !self.lock_live(lock) {
                    let table = Table::Locks;
                    return Err(Violation::StrayRef {
                        table,
                        client,
                        slot: lock,
                    });
                }
                locks += 1;
                sums.lock_refs = sums.lock_refs.wrapping_add(weight(lock));
            }
            from = 0;
            while let Some((object, _)) = t.object_refs.next_in_row(client, from) {
                from = object + 1;
                if entry.id == 0
                    || object >= t.object_free.high_water()
                    || !self.object_live(object)
                {
                    let table = Table::Objects;
                    return Err(Violation::StrayRef {
                        table,
                        client,
                        slot: object,
                    });
                }
                objects += 1;
                sums.object_refs = sums.object_refs.wrapping_add(weight(object));
            }
            if entry.lock_refs != locks {
                return Err(client_refs(client, Table::Locks, entry.lock_refs, locks));
            }
            if entry.object_refs != objects {
                return Err(client_refs(
                    client,
                    Table::Objects,
                    entry.object_refs,
                    objects,
                ));
            }
            self.check_holds(client, entry.id, &mut sums)?;
        }
        Ok(sums)
    }

    /// Client slot `client`'s holds: each with a reference, of a kind its lock has, and an
    /// RW or fair exclusive hold the word's owner; a dead client's only grants it asked to
    /// retain; a cached grant only on a lock marked as having one.
    fn check_holds(&self, client: u32, id: u32, sums: &mut Sums) -> Result<(), Violation> {
        let t = &self.t;
        let retaining = t.clients[client as usize].client_state() == ClientState::Retaining;
        let mut from = 0;
        while let Some((lock, bits)) = t.lock_holds.next_in_row(client, from) {
            from = lock + 1;
            if t.lock_refs.get(client, lock) == 0 {
                return Err(Violation::Hold { client, lock });
            }
            if let Ok(state) = GrantState::from_bits(bits) {
                if retaining && !state.retains() {
                    return Err(Violation::Retained { client, lock });
                }
                // The revoke decision scans only marked locks: a cached holder on an unmarked
                // one would never be asked to give it back.
                if state.is_cached() && t.lock_manager[lock as usize].cached == 0 {
                    return Err(Violation::Cached { client, lock });
                }
            }
            let kind = SlotState(t.lock_meta[lock as usize].state).kind();
            let (owner, _) = owner_and_readers(kind, &t.lock_cells[lock as usize]);
            match (kind, Hold::of(bits)) {
                // A stale atomic hold (module doc).
                (LockKind::Atomic, Some(Hold::Exclusive))
                | (LockKind::Fair, Some(Hold::Ticketed)) => {}
                (LockKind::Rw | LockKind::Fair, Some(Hold::Exclusive)) if owner != id => {
                    return Err(Violation::Owner {
                        lock,
                        owner,
                        client,
                    });
                }
                (LockKind::Rw | LockKind::Fair, Some(Hold::Exclusive)) => {}
                (LockKind::Rw | LockKind::Fair, Some(Hold::Shared)) => {
                    sums.shared_holds = sums.shared_holds.wrapping_add(weight(lock));
                }
                (_, None | Some(Hold::None | Hold::Shared | Hold::Ticketed)) => {
                    return Err(Violation::Hold { client, lock });
                }
            }
        }
        Ok(())
    }

    /// The lock slots: names and index, reference counts, words against holds, fences.
    fn check_locks(&self, sums: &Sums) -> Result<(), Violation> {
        let t = &self.t;
        let hw = t.lock_free.high_water();
        let names = &*t.lock_names;
        let key = self.name_key;
        check_index(
            &t.lock_index,
            Table::Locks,
            hw,
            |s| self.lock_live(s),
            // The stored hash, checked against the name below.
            |s| names[s as usize].hash,
            |a, b| names[a as usize].name() == names[b as usize].name(),
        )?;
        let (mut refs, mut readers) = (0u64, 0u64);
        for lock in 0..hw {
            let meta = &t.lock_meta[lock as usize];
            if !self.lock_live(lock) {
                if meta.refs != 0 || t.lock_waiters[lock as usize] != 0 {
                    return Err(Violation::FreeList {
                        table: Table::Locks,
                        slot: lock,
                    });
                }
                continue;
            }
            let name = &names[lock as usize];
            if name.name().is_empty() || name.hash != hash_name(key, name.name()) {
                return Err(Violation::Index {
                    table: Table::Locks,
                    slot: lock,
                });
            }
            if meta.refs == 0 {
                let table = Table::Locks;
                return Err(Violation::Refs {
                    table,
                    slot: lock,
                    recorded: 0,
                    counted: 0,
                });
            }
            refs = refs.wrapping_add(weight(lock).wrapping_mul(u64::from(meta.refs)));
            readers = readers.wrapping_add(self.check_word(lock)?);
        }
        if refs != sums.lock_refs {
            return Err(self.refs_violation(Table::Locks));
        }
        if readers != sums.shared_holds {
            return Err(self.readers_violation());
        }
        Ok(())
    }

    /// Lock `lock`'s word on its own and against its owner's hold, and its fence; returns the
    /// lock's weighted reader count.
    fn check_word(&self, lock: u32) -> Result<u64, Violation> {
        let t = &self.t;
        let cell = &t.lock_cells[lock as usize];
        let kind = SlotState(t.lock_meta[lock as usize].state).kind();
        let (owner, readers) = owner_and_readers(kind, cell);
        if owner != 0 {
            // A dead client's retained grant still owns the word.
            let slot = self
                .client_slot(owner)
                .or_else(|| self.retaining_slot(owner));
            let held = slot.map(|c| {
                let hold = Hold::of(t.lock_holds.get(c, lock));
                (c, hold == Some(Hold::Exclusive))
            });
            let client = held.map_or(u32::MAX, |(c, _)| c);
            if !held.is_some_and(|(_, exclusive)| exclusive) {
                return Err(Violation::Owner {
                    lock,
                    owner,
                    client,
                });
            }
            if readers != 0 {
                return Err(Violation::Word {
                    lock,
                    word: cell.word,
                    owner,
                });
            }
        }
        if kind == LockKind::Fair {
            let w = fair::FairWord::from_bits(cell.word);
            if fair::ticket_before(w.mx(), w.nx()) || fair::ticket_before(w.ms(), w.ns()) {
                return Err(Violation::Word {
                    lock,
                    word: cell.word,
                    owner,
                });
            }
        }
        if cell.fence >= self.next_token {
            let (fence, next) = (cell.fence, self.next_token);
            return Err(Violation::Fence { lock, fence, next });
        }
        Ok(weight(lock).wrapping_mul(u64::from(readers)))
    }

    /// Names the first slot of `table` whose reference count is not its column's count (the
    /// weighted sums said one is).
    #[cold]
    fn refs_violation(&self, table: Table) -> Violation {
        let t = &self.t;
        let clients = t.client_free.high_water();
        let (grid, hw) = match table {
            Table::Objects => (&t.object_refs, t.object_free.high_water()),
            _ => (&t.lock_refs, t.lock_free.high_water()),
        };
        let recorded = |slot: u32| match table {
            Table::Objects => t.object_meta[slot as usize].refs,
            _ => t.lock_meta[slot as usize].refs,
        };
        (0..hw)
            .map(|slot| {
                let counted = (0..clients).filter(|&c| grid.get(c, slot) != 0).count() as u32;
                let recorded = recorded(slot);
                Violation::Refs {
                    table,
                    slot,
                    recorded,
                    counted,
                }
            })
            .find(|v| matches!(v, Violation::Refs { recorded, counted, .. } if recorded != counted))
            .unwrap_or(Violation::Refs {
                table,
                slot: hw,
                recorded: 0,
                counted: 0,
            })
    }

    /// Names the first lock whose reader count is not its number of shared holds.
    #[cold]
    fn readers_violation(&self) -> Violation {
        let t = &self.t;
        let clients = t.client_free.high_water();
        let hw = t.lock_free.high_water();
        (0..hw)
            .filter(|&l| self.lock_live(l))
            .map(|lock| {
                let kind = SlotState(t.lock_meta[lock as usize].state).kind();
                let (_, recorded) = owner_and_readers(kind, &t.lock_cells[lock as usize]);
                let counted = (0..clients)
                    .filter(|&c| Hold::of(t.lock_holds.get(c, lock)) == Some(Hold::Shared))
                    .count() as u32;
                Violation::Readers { lock, recorded, counted }
            })
            .find(|v| matches!(v, Violation::Readers { recorded, counted, .. } if recorded != counted))
            .unwrap_or(Violation::Readers { lock: hw, recorded: 0, counted: 0 })
    }

    /// The object slots: names and index, owners, reference counts.
    fn check_objects(&self, sums: &Sums) -> Result<(), Violation> {
        let t = &self.t;
        let hw = t.object_free.high_water();
        let names = &*t.object_names;
        let key = self.name_key;
        check_index(
            &t.object_index,
            Table::Objects,
            hw,
            |s| self.object_live(s),
            |s| names[s as usize].hash,
            |a, b| names[a as usize].name() == names[b as usize].name(),
        )?;
        let mut refs = 0u64;
        for object in 0..hw {
            let meta = &t.object_meta[object as usize];
            let state = SlotState(meta.state);
            let name = &names[object as usize];
            let bad = if state.is_live() {
                name.name().is_empty()
                    || name.hash != hash_name(key, name.name())
                    || (meta.owner != 0 && self.client_slot(meta.owner).is_none())
                    || (state.is_destroyed() && meta.refs == 0)
            } else {
                *meta
                    != ObjectMeta {
                        state: meta.state,
                        ..ObjectMeta::default()
                    }
            };
            if bad {
                return Err(Violation::Object { object });
            }
            refs = refs.wrapping_add(weight(object).wrapping_mul(u64::from(meta.refs)));
        }
        if refs != sums.object_refs {
            return Err(self.refs_violation(Table::Objects));
        }
        Ok(())
    }

    /// The waiter table against the counts and the FIFOs.
    fn check_waiters(&self) -> Result<(), Violation> {
        let t = &self.t;
        let clients = t.client_free.high_water();
        let (mut waiting, mut ready) = (0u32, 0u32);
        for slot in 0..clients {
            let w = &t.waiters[slot as usize];
            let mine = w.client != 0 && w.client == t.clients[slot as usize].id;
            let bad = match w.state {
                // Blank: no client, lock or link left behind.
                s if s == WaiterState::Free as u8 => w.client != 0 || w.lock != 0 || w.next != 0,
                s if s == WaiterState::Ready as u8 => {
                    ready += 1;
                    !mine || w.next != 0
                }
                s if s == WaiterState::Waiting as u8 => {
                    waiting += 1;
                    !mine || !self.ticket_issued(slot, w)
                }
                _ => true,
            };
            if bad {
                return Err(Violation::Waiter { slot });
            }
        }
        if (waiting, ready) != (self.waiting, self.ready) {
            return Err(Violation::WaiterCounts {
                waiting: self.waiting,
                ready: self.ready,
                counted_waiting: waiting,
                counted_ready: ready,
            });
        }
        let mut queued = 0u32;
        for lock in 0..t.lock_free.high_water() {
            let mut link = t.lock_waiters[lock as usize];
            let mut len = 0u32;
            while link != 0 {
                let w = link - 1;
                let on_lock = LockId::from_raw(t.waiters.get(w as usize).map_or(0, |w| w.lock))
                    .is_some_and(|id| id.index() == lock);
                len += 1;
                if w >= clients
                    || t.waiters[w as usize].state != WaiterState::Waiting as u8
                    || !on_lock
                    || len > clients
                {
                    return Err(Violation::Queue { lock });
                }
                link = t.waiters[w as usize].next;
            }
            queued += len;
        }
        // Every waiting request is on its own lock's FIFO (and on no other), and each at most
        // once: so there are exactly as many links as waiting requests.
        if queued != waiting {
            let slot = (0..clients)
                .find(|&w| t.waiters[w as usize].state == WaiterState::Waiting as u8)
                .unwrap_or(clients);
            return Err(Violation::Waiter { slot });
        }
        Ok(())
    }

    /// Whether waiting request `w` of client slot `slot`, if it retries a fair ticket the
    /// client still holds, holds one the lock issued (before `mx`/`ms` in its own mode, not
    /// after them in the other).
    fn ticket_issued(&self, slot: u32, w: &Waiter) -> bool {
        let retry = w.op & 0xF;
        let exclusive = retry == crate::proto::LockOp::TicketExclusive as u8;
        if w.kind != LockKind::Fair as u8
            || !(exclusive || retry == crate::proto::LockOp::TicketShared as u8)
        {
            return true;
        }
        let Ok(id) = self.referenced_lock(slot, w.lock) else {
            return true;
        };
        if Hold::of(self.t.lock_holds.get(slot, id.index())) != Some(Hold::Ticketed) {
            // Voided by a preemption: the retry starts over (`restart_of_void_ticket`).
            return true;
        }
        let word = fair::FairWord::from_bits(self.t.lock_cells[id.index() as usize].word);
        let (mine, other) = if exclusive {
            ((w.tx, word.mx()), (w.ts, word.ms()))
        } else {
            ((w.ts, word.ms()), (w.tx, word.mx()))
        };
        fair::ticket_before(mine.0, mine.1) && !fair::ticket_before(other.1, other.0)
    }
}

#[cfg(test)]
mod tests;
