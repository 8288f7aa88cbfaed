//! Client registration, liveness and cleanup (control path).
//!
//! A client is registered with a random non-zero 31-bit id, a 128-bit session secret (both from
//! the server's [`Entropy`](super::Entropy), so nothing a client sees predicts another's) and
//! a lease the server grants: what the client asked for, within
//! `[CLIENT_LEASE_MIN_MS, client_lease_max_ms]`. Any request renews the
//! lease; a client silent for longer is declared dead by [`Server::tick`] and everything it held
//! — lock grants of every kind (RW too, unlike the reference), tickets, lock references, object
//! references and object ownership — is released, exactly as a graceful `client_deinit` does. A
//! client whose connection the transport reports lost is marked abnormal: it keeps its locks
//! until its lease ends or it re-registers, and it is the first evicted when the table is full
//! (the reference's eviction rule).

use super::{Counter, Server, client_tag};
use crate::ids::{ClientId, LockId, LockKind, Mode, Peer, Session, Ticket};
use crate::manager::GrantState;
use crate::manager::retain::{AtDeparture, Departure, at_departure};
use crate::status::Status;
use crate::table::{ClientEntry, ClientState};
use crate::word::{atomic, fair, rw};

/// Candidate ids drawn per registration. One collides with a registered id with a chance of
/// `clients / 2^31` (below 1 in 2 million at 1,000 clients); all four, below 1 in 10^25.
const ID_CANDIDATES: usize = 4;

/// A client that comes back under the id it has: what [`Server::client_reinit_from`] and a
/// cluster join (a client another server of the cluster registered) are given.
#[derive(Clone, Copy, Debug)]
pub struct Rejoin<'s> {
    /// The id it has.
    pub raw: u32,
    /// The protocol version negotiated now.
    pub version: u8,
    /// The lease it asks for (as at `client_init`).
    pub lease_ms: u32,
    /// The registration's secret it holds.
    pub session: &'s Session,
}

impl<'r> Server<'r> {
    /// Registers a new client (`client_init`) that speaks protocol `version` and asked for
    /// `lease_ms` (0 = the server's default). Evicts an abnormal client if the table is full.
    pub fn client_init(
        &mut self,
        version: u8,
        lease_ms: u32,
        now_ms: u64,
    ) -> Result<ClientId, Status> {
        self.client_init_from(Peer::EXEMPT, version, lease_ms, now_ms)
    }

    /// [`Server::client_init`] for a client that came from `peer`, within its per-peer cap
    /// (`peers.rs`).
    pub fn client_init_from(
        &mut self,
        peer: Peer,
        version: u8,
        lease_ms: u32,
        now_ms: u64,
    ) -> Result<ClientId, Status> {
        self.stats.bump(Counter::ControlRequests);
        if self.recovering > 0 {
            return Err(self.refuse(Status::NotReady));
        }
        let id = self.fresh_client_id().ok_or(Status::ServerNoResource)?;
        self.register(id, peer, ClientState::Active, version, lease_ms, now_ms)?;
        Ok(id)
    }

    /// Re-registers client `raw` after a lost connection or a server failover (`client_reinit`).
    ///
    /// On a serving server the entry must still exist (else `ClientRemovedByServer`: the lease
    /// ran out and its locks are gone) and `session` must be the registration's secret (else
    /// `Einval`); its abnormal mark is cleared. On a recovering server the
    /// entry is created with the old id in the recovering state, ready for `update_lock` claims:
    /// with a session key (`set_session_key`) only if `session` was minted for this id under
    /// it (else `Einval`, counted in `sessions_refused`). Without a key the id is taken at its
    /// word, as the reference does: anyone who can reach a recovering server can then claim an
    /// id and its locks, so a server that may replace another should share its key.
    pub fn client_reinit(
        &mut self,
        raw: u32,
        version: u8,
        lease_ms: u32,
        session: &Session,
        now_ms: u64,
    ) -> Result<ClientId, Status> {
        let back = Rejoin {
            raw,
            version,
            lease_ms,
            session,
        };
        self.client_reinit_from(Peer::EXEMPT, back, now_ms)
    }

    /// [`Server::client_reinit`] for a client that came from `peer`: an entry it creates on a
    /// recovering server counts toward that peer's cap (`peers.rs`); a resumed registration
    /// keeps the peer it was counted under.
    pub fn client_reinit_from(
        &mut self,
        peer: Peer,
        back: Rejoin<'_>,
        now_ms: u64,
    ) -> Result<ClientId, Status> {
        self.stats.bump(Counter::ControlRequests);
        let id = ClientId::new(back.raw).ok_or_else(|| self.refuse(Status::Einval))?;
        if let Some(slot) = self.client_slot(back.raw) {
            // Resuming a live registration needs its secret: an id alone is guessable.
            if !self.t.clients[slot as usize].session.matches(back.session) {
                self.stats.bump(Counter::SessionsRefused);
                return Err(self.refuse(Status::Einval));
            }
            self.resume_client(slot, back.version, now_ms);
            self.t.clients[slot as usize].flags |= ClientEntry::REINITING;
            return Ok(id);
        }
        self.recovery_clock(now_ms);
        if self.recovering == 0 {
            return Err(self.refuse(Status::ClientRemovedByServer));
        }
        if let Some((key, mac)) = &self.session_key
            && !back.session.is_minted_for(key, *mac, back.raw)
        {
            self.stats.bump(Counter::SessionsRefused);
            return Err(self.refuse(Status::Einval));
        }
        let slot = self.register(
            id,
            peer,
            ClientState::Recovering,
            back.version,
            back.lease_ms,
            now_ms,
        )?;
        self.t.clients[slot as usize].flags = ClientEntry::REINITING | ClientEntry::RECOVERED;
        self.progress.reregistered += 1;
        self.stats.bump(Counter::RecoveryReregistered);
        Ok(id)
    }

    /// The client finished re-syncing (`client_reinit_done`) after a `client_reinit`. When the
    /// last expected client is done, the server starts serving.
    ///
    /// Without a `client_reinit` before it (since the last `reinit_done`) there is nothing to
    /// finish: `Einval`, as the reference refuses it (-1), and nothing changes — in particular a
    /// stray call cannot count towards the clients a recovering server waits for.
    pub fn reinit_done(&mut self, raw: u32, now_ms: u64) -> Result<(), Status> {
        self.stats.bump(Counter::ControlRequests);
        let slot = self
            .client_slot(raw)
            .ok_or_else(|| self.refuse(Status::ClientNotInit))?;
        let c = &mut self.t.clients[slot as usize];
        c.last_seen_ms = now_ms;
        if !c.has(ClientEntry::REINITING) {
            return Err(self.refuse(Status::Einval));
        }
        c.flags &= !ClientEntry::REINITING;
        if c.client_state() == ClientState::Recovering {
            c.state = ClientState::Active as u8;
            self.progress.done += 1;
            self.stats.bump(Counter::RecoveryDone);
            self.recovering = self.recovering.saturating_sub(1);
            if self.recovering == 0 {
                self.end_recovery();
            }
        }
        Ok(())
    }

    /// Graceful exit (`client_deinit`): releases everything the client held and frees its entry
    /// (the reference leaks the client's references until restart).
    ///
    /// A recovering server answers `NotReady` and keeps the client, as it answers every request
    /// but re-registration in that window (the reference does the same): the locks it is
    /// rebuilding from the clients' claims must not change under them, and a client that
    /// re-registered is one the recovery counts on.
    pub fn client_deinit(&mut self, raw: u32, now_ms: u64) -> Result<(), Status> {
        self.stats.bump(Counter::ControlRequests);
        if self.recovering > 0 {
            if let Some(slot) = self.client_slot(raw) {
                // Alive, even if it must wait: as `serving_client` renews it.
                self.t.clients[slot as usize].last_seen_ms = now_ms;
            }
            return Err(self.refuse(Status::NotReady));
        }
        let slot = self
            .client_slot(raw)
            .ok_or_else(|| self.refuse(Status::ClientNotInit))?;
        self.remove_client(slot, Departure::Deinit, now_ms);
        self.stats.bump(Counter::ClientsDeinit);
        Ok(())
    }

    /// A heartbeat: renews the lease.
    pub fn heartbeat(&mut self, raw: u32, now_ms: u64) -> Result<(), Status> {
        self.stats.bump(Counter::ControlRequests);
        self.serving_client(raw, now_ms)
            .map(drop)
            .map_err(|s| self.refuse(s))
    }

    /// The transport lost the client's connection: mark it abnormal (its locks stay held until
    /// its lease ends or it re-registers).
    pub fn client_disconnected(&mut self, raw: u32, now_ms: u64) {
        if let Some(slot) = self.client_slot(raw) {
            // Nobody is left to receive a parked request's reply; a grant in it is released.
            self.cancel_parked(raw, now_ms);
            let c = &mut self.t.clients[slot as usize];
            if c.client_state() == ClientState::Active {
                c.state = ClientState::Abnormal as u8;
            }
        }
    }

    /// Declares dead every client whose lease has run out and releases what it held. Call it
    /// periodically (every few hundred milliseconds is plenty); returns how many died.
    pub fn tick(&mut self, now_ms: u64) -> u32 {
        self.recovery_clock(now_ms);
        self.cluster_tick(now_ms);
        let mut died = 0;
        for slot in 0..self.t.client_free.high_water() {
            let c = self.t.clients[slot as usize];
            // A client with a parked request (or its reply not yet delivered) is waiting on
            // us, not silent.
            // A retaining slot is dead already: it has no lease to run out.
            if matches!(c.client_state(), ClientState::Free | ClientState::Retaining)
                || self.t.waiters[slot as usize].state != crate::table::WaiterState::Free as u8
            {
                continue;
            }
            if c.lease_over(now_ms) {
                if c.client_state() == ClientState::Recovering && self.recovering > 0 {
                    // It will not finish recovery: stop waiting for it (the reference waits
                    // forever).
                    self.give_up_on(1);
                }
                self.remove_client(slot, Departure::Died, now_ms);
                self.stats.bump(Counter::ClientsExpired);
                died += 1;
            }
        }
        died
    }

    /// The server starts serving: clients that re-registered beyond the expected number and
    /// have not finished re-syncing become ordinary clients (their further claims are refused;
    /// the locks they did not re-claim are lost to them, as for a claim that failed).
    pub(super) fn end_recovery(&mut self) {
        for slot in 0..self.t.client_free.high_water() {
            let c = &mut self.t.clients[slot as usize];
            if c.client_state() == ClientState::Recovering {
                c.state = ClientState::Active as u8;
            }
        }
    }

    /// The slot and session secret of registered client `raw`, for the registration's reply.
    pub fn client_session(&self, raw: u32) -> Option<(u32, Session)> {
        let slot = self.client_slot(raw)?;
        Some((slot, self.t.clients[slot as usize].session))
    }

    /// The slot of registered client `raw`.
    #[inline]
    pub fn client_slot_of(&self, raw: u32) -> Option<u32> {
        self.client_slot(raw)
    }

    /// A transport binding a second channel (a data connection, a queue pair) to client `raw`:
    /// its slot if `session` is the registration's secret. A wrong secret is counted
    /// ([`Counter::SessionsRefused`]), so guessing shows in the stats.
    pub fn authenticate(&mut self, raw: u32, session: &Session) -> Option<u32> {
        match self.client_slot(raw) {
            Some(slot) if self.t.clients[slot as usize].session.matches(session) => Some(slot),
            _ => {
                self.stats.bump(Counter::SessionsRefused);
                None
            }
        }
    }

    /// Whether client `raw` is registered (in any state).
    pub fn is_registered(&self, raw: u32) -> bool {
        self.client_slot(raw).is_some()
    }

    /// Counts a refusal and hands the status back.
    #[inline]
    pub(super) fn refuse(&mut self, s: Status) -> Status {
        self.stats.count_status(s);
        s
    }

    pub(super) fn register(
        &mut self,
        id: ClientId,
        peer: Peer,
        state: ClientState,
        version: u8,
        lease_ms: u32,
        now_ms: u64,
    ) -> Result<u32, Status> {
        let slot = match self.peer_room(peer, now_ms)? {
            Some(s) => s,
            None => match self.t.client_free.pop() {
                Some(s) => s,
                None => self
                    .evict_abnormal(now_ms)
                    .ok_or_else(|| self.refuse(Status::ServerNoResource))?,
            },
        };
        if lease_ms > self.cfg.client_lease_max_ms {
            self.stats.bump(Counter::LeasesCapped);
        }
        let lease_ms = self.cfg.grant_lease_ms(lease_ms);
        let session = self.fresh_session(id);
        self.t.clients[slot as usize] = ClientEntry {
            id: id.get(),
            state: state as u8,
            version,
            lease_ms,
            last_seen_ms: now_ms,
            session,
            peer: peer.tag(),
            ..ClientEntry::default()
        };
        self.old_clients += u32::from(counts_as_old(&self.t.clients[slot as usize]));
        self.t.client_index.insert(client_tag(id), slot);
        self.stats.bump(Counter::ClientsRegistered);
        Ok(slot)
    }

    /// Frees the first evictable abnormal client's entry (releasing what it held) and returns
    /// its slot ([`Server::evictable`]).
    fn evict_abnormal(&mut self, now_ms: u64) -> Option<u32> {
        for slot in 0..self.t.client_free.high_water() {
            if !self.evictable(slot, now_ms) {
                continue;
            }
            self.remove_client(slot, Departure::Died, now_ms);
            self.stats.bump(Counter::ClientsEvicted);
            // A client that kept retained grants keeps its slot (as retaining): try the next.
            if let Some(free) = self.t.client_free.pop() {
                return Some(free);
            }
        }
        None
    }

    /// Whether client slot `slot` may be evicted to make room: it is abnormal (its connection
    /// is gone) and either holds no grant or its lease has run out.
    ///
    /// The reference evicts the first abnormal client whatever it holds. A holder whose
    /// connection broke may not know it yet (a worker between calls), and it believes its
    /// grants until its lease ends; freeing them earlier would let a second holder in beside
    /// it. So a holder waits for its lease, and a registration that finds only such clients is
    /// refused `ServerNoResource` — for at most a lease, which the server caps. Found by the
    /// real-client simulator (seed `0x71f04e299ea32de`). One row of the holds grid per
    /// candidate: registrations reach this only with the table full.
    pub(super) fn evictable(&self, slot: u32, now_ms: u64) -> bool {
        let c = &self.t.clients[slot as usize];
        c.client_state() == ClientState::Abnormal
            && (self.t.lock_holds.next_in_row(slot, 0).is_none() || c.lease_over(now_ms))
    }

    /// A random id no registered client has, or `None` if every candidate drawn collides.
    ///
    /// A cluster server puts the low 8 bits of its server id in the id's top 8 (of 31) bits
    /// and draws the other 23: a client keeps its id on every server it joins, so two servers
    /// must not mint the same one. Servers whose ids differ in their low 8 bits never do; two
    /// that share them collide with a chance of one in 2^23 per pair of registrations alive at
    /// once, and a join that meets one is refused (`ServerNoResource`) rather than served.
    pub(super) fn fresh_client_id(&mut self) -> Option<ClientId> {
        let mut bytes = [0u8; 4 * ID_CANDIDATES];
        (self.entropy)(&mut bytes);
        let prefix = self.cluster.as_ref().map(|c| (c.me.get() & 0xFF) << 23);
        bytes.chunks_exact(4).find_map(|b| {
            let drawn = u32::from_le_bytes([b[0], b[1], b[2], b[3]]) >> 1; // 31 bits
            let raw = match prefix {
                Some(top) => top | drawn & 0x7F_FFFF,
                None => drawn,
            };
            // Nor a dead one's that retains grants: `recovery_done` names it by its id.
            ClientId::new(raw)
                .filter(|_| self.client_slot(raw).is_none() && self.retaining_slot(raw).is_none())
        })
    }

    /// A new session secret for `id`: minted under the session key when there is one.
    fn fresh_session(&mut self, id: ClientId) -> Session {
        let s = match &self.session_key {
            Some((key, mac)) => {
                let mut nonce = [0u8; 8];
                (self.entropy)(&mut nonce);
                Session::minted(key, *mac, id.get(), nonce)
            }
            None => {
                let mut s = Session::NONE;
                (self.entropy)(&mut s.0);
                s
            }
        };
        // All zeros from a working source has a chance of 2^-128: this is a source that fills
        // nothing, and serving with it would hand every client the same secret.
        assert!(!s.is_none(), "the entropy source returned no entropy");
        s
    }

    /// Releases everything client `slot` held and frees its entry; `how` it left decides the
    /// grants it asked to be retained (`manager::retain`): a death keeps them, held by the dead
    /// client, whose entry then stays, retaining, out of the client index and off the free list
    /// until a recoverer's `recovery_done` (`retained.rs`).
    pub(super) fn remove_client(&mut self, slot: u32, how: Departure, now_ms: u64) {
        let entry = self.t.clients[slot as usize];
        let Some(me) = ClientId::new(entry.id) else {
            return;
        };
        // A parked request goes with its client: the slot's next owner must not inherit it.
        self.cancel_waiter(slot);
        let kept = self.release_all_holds(slot, me, how, now_ms);
        self.release_all_lock_refs(slot);
        self.release_all_objects(slot, me, now_ms);
        self.t.client_index.remove(client_tag(me), slot);
        if kept > 0 {
            let c = &mut self.t.clients[slot as usize];
            c.state = ClientState::Retaining as u8;
            c.session = Session::NONE;
            self.retaining += 1;
            self.stats.add(Counter::LocksRetained, kept.into());
            return;
        }
        self.free_client_slot(slot);
    }

    /// Resumes client slot `slot`'s live registration at protocol `version`
    /// ([`ClientEntry::resume`]), keeping the count of clients below protocol 8 true: a
    /// client may come back at another version than it registered with.
    pub(super) fn resume_client(&mut self, slot: u32, version: u8, now_ms: u64) {
        let c = &mut self.t.clients[slot as usize];
        let was_old = counts_as_old(c);
        c.resume(version, now_ms);
        self.old_clients = self.old_clients - u32::from(was_old) + u32::from(counts_as_old(c));
    }

    /// Frees client slot `slot` for its next client: an empty entry and an empty event ring
    /// (events for the last client mean nothing to the next).
    pub(super) fn free_client_slot(&mut self, slot: u32) {
        self.old_clients -= u32::from(counts_as_old(&self.t.clients[slot as usize]));
        self.t.clients[slot as usize] = ClientEntry::default();
        if let Some(ring) = self.t.event_rings.ring(slot) {
            ring.clear();
        }
        self.t.client_free.push(slot);
    }

    /// Gives up every grant and ticket of client `slot`, as the client itself would by
    /// unlocking, except the grants a death retains (`how`): those stay in the holds grid as
    /// retained grants and in the lock words. Returns how many were kept.
    fn release_all_holds(&mut self, slot: u32, me: ClientId, how: Departure, now_ms: u64) -> u32 {
        let mut from = 0;
        let mut kept = 0;
        while let Some((lock, bits)) = self.t.lock_holds.next_in_row(slot, from) {
            from = lock + 1;
            // A code no state has was a grant nobody can name: nothing to give back here.
            let state = GrantState::from_bits(bits).unwrap_or(GrantState::None);
            if let AtDeparture::Retain(retained) = at_departure(state, how) {
                self.t.lock_holds.set(slot, lock, retained.bits());
                if retained.grant_mode() == Some(Mode::Exclusive) {
                    // Its holder may have changed what the block describes without writing it.
                    self.t.lock_values[lock as usize].grant_lost(Mode::Exclusive);
                }
                kept += 1;
                continue;
            }
            self.release_grant(slot, me, lock, state.grant_mode(), now_ms);
            self.wake_slot_waiters(lock, now_ms);
        }
        kept
    }

    /// Retries the requests parked on lock slot `lock`, after a release that did not come from
    /// a lock command (whose caller retries them itself).
    pub(super) fn wake_slot_waiters(&mut self, lock: u32, now_ms: u64) {
        if self.waiting > 0 {
            let generation =
                crate::table::SlotState(self.t.lock_meta[lock as usize].state).generation();
            self.wake_waiters(LockId::new(lock, generation).raw(), now_ms);
        }
    }

    /// Gives up client `slot`'s hold on lock slot `lock` (a grant in `granted`, or a ticket
    /// when `None`) as the client itself would by unlocking, without retrying the lock's
    /// waiters: a caller that is not in the middle of another request's lock command follows
    /// it with [`Self::wake_slot_waiters`]. One that is (a lapsed revoke) leaves them to its
    /// own caller, which retries them once the command is done: retrying them inside it
    /// re-entered the command (a parked request being retried was retried again inside its
    /// own retry, granted, and then answered a second time, `AlreadyLocked`, which left the
    /// waiter counts wrong).
    pub(super) fn release_grant(
        &mut self,
        slot: u32,
        me: ClientId,
        lock: u32,
        granted: Option<Mode>,
        now_ms: u64,
    ) {
        self.t.lock_holds.set(slot, lock, GrantState::None.bits());
        let kind = crate::table::SlotState(self.t.lock_meta[lock as usize].state).kind();
        if granted == Some(Mode::Exclusive)
            && super::locks::exclusive_owner(kind, &self.t.lock_cells[lock as usize]) == me.get()
            && !crate::mutated!(DeadWriterKeepsValue)
        {
            // Gone without an unlock that could have written it (death or deinit): the
            // block may no longer describe what the holder left behind.
            self.t.lock_values[lock as usize].grant_lost(Mode::Exclusive);
        }
        let cell = &mut self.t.lock_cells[lock as usize];
        match (kind, granted) {
            (_, None) => {}
            (LockKind::Atomic, _) => {
                let o = atomic::unlock(atomic::AtomicWord::from_bits(cell.word), me);
                cell.word = o.state.into_bits();
            }
            (LockKind::Rw, Some(Mode::Exclusive)) => {
                let o = rw::unlock_exclusive(rw::RwWord::from_bits(cell.word), me);
                cell.word = o.state.into_bits();
            }
            (LockKind::Rw, Some(Mode::Shared)) => {
                let o = rw::unlock_shared(rw::RwWord::from_bits(cell.word), true);
                cell.word = o.state.into_bits();
            }
            (LockKind::Fair, Some(mode)) => {
                let s = fair::FairLock {
                    word: fair::FairWord::from_bits(cell.word),
                    owner: cell.ext,
                };
                // A live grant is always at the serving ticket: exclusive at (nx, ns), shared
                // at nx with a shared ticket that was not voided (preemptions clear the holds
                // they void, so `rms` is a ticket that is never "passed").
                let ticket = Ticket {
                    exclusive: s.word.nx(),
                    shared: match mode {
                        Mode::Exclusive => s.word.ns(),
                        Mode::Shared => s.word.rms(),
                    },
                };
                let o = fair::unlock(s, me, mode, ticket, now_ms);
                cell.word = o.state.word.into_bits();
                cell.ext = o.state.owner;
            }
        }
    }

    /// Drops every lock reference of client `slot`, freeing locks nobody references any more,
    /// except the references of locks it still holds (a dead client's retained grants): the
    /// lock, its name and its word stay until `recovery_done`.
    pub(super) fn release_all_lock_refs(&mut self, slot: u32) {
        let mut from = 0;
        while let Some((lock, _)) = self.t.lock_refs.next_in_row(slot, from) {
            from = lock + 1;
            if self.t.lock_holds.get(slot, lock) != GrantState::None.bits() {
                continue;
            }
            let meta = self.t.lock_meta[lock as usize];
            let id = LockId::new(lock, crate::table::SlotState(meta.state).generation());
            self.drop_lock_ref(slot, id);
        }
    }
}

/// Whether client entry `c` counts in [`Server`]'s `old_clients`: a registration (of any
/// state but free) below protocol 8, which reads a contended grant's notice from its event
/// ring and so may need waking from a parked wait to read it (`revokes.rs`).
#[inline]
pub(super) fn counts_as_old(c: &ClientEntry) -> bool {
    c.client_state() != ClientState::Free && !c.reads_plain_grants()
}
