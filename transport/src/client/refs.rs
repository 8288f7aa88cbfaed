//! Lock references: a client names a lock once (`get_lock`) and uses its id until it lets it go
//! (`release_lock`). This file owns those control calls and the client's view of its records;
//! what is done with a referenced lock is `locks.rs`'s.

use std::collections::HashMap;

use dlock_core::proto::{Batch, BatchEntry, ControlRequest, ControlResponse};
use dlock_core::{LockId, LockKind, Status};

use super::table::Entry;
use super::{Client, Connection, Error, LocalLock, Op, batch_count};

impl<C: Connection> Client<C> {
    /// Creates or joins the lock `name` of `kind` (`get_lock`).
    pub fn get_lock(&mut self, kind: LockKind, name: &[u8]) -> Result<LockId, Error> {
        let op = Op::GetLock;
        // A recovering server answers NotReady; records with a failed server's ids could be
        // confused with the ids of this one.
        if self.recovering || self.reclaim {
            return Err(op.err(Status::NotReady));
        }
        let reply = self.control(op, self.id.get(), ControlRequest::GetLock { kind, name })?;
        let ControlResponse::Lock { lock } = reply else {
            return Err(op.err(Status::BadResponse));
        };
        let id = LockId::from_raw(lock).ok_or_else(|| op.err(Status::BadResponse))?;
        self.track(id, kind, name);
        Ok(id)
    }

    fn track(&mut self, id: LockId, kind: LockKind, name: &[u8]) {
        self.locks.get_or_insert_with(id, || Entry {
            local: LocalLock::new(id, kind),
            name: name.into(),
            busy: false,
        });
    }

    /// `get_lock` for 1 to 31 names (`Einval` for none or more); each entry succeeds or fails
    /// on its own.
    pub fn batch_get_lock(
        &mut self,
        names: &[(LockKind, &[u8])],
    ) -> Result<Vec<Result<LockId, Status>>, Error> {
        let op = Op::BatchGetLock;
        batch_count(op, names.len())?;
        if self.recovering || self.reclaim {
            return Err(op.err(Status::NotReady));
        }
        let body = ControlRequest::BatchGetLock(Batch::from_slice(names));
        let ControlResponse::Entries(entries) = self.control(op, self.id.get(), body)? else {
            return Err(op.err(Status::BadResponse));
        };
        let got: Vec<BatchEntry> = entries.iter().collect();
        let mut out = Vec::with_capacity(got.len());
        for (e, &(kind, name)) in got.iter().zip(names) {
            out.push(match (e.status, LockId::from_raw(e.id)) {
                (Status::Success, Some(id)) => {
                    self.track(id, kind, name);
                    Ok(id)
                }
                (Status::Success, None) => Err(Status::BadResponse),
                (s, _) => Err(s),
            });
        }
        Ok(out)
    }

    /// Drops this client's reference to `id` (`release_lock`); refused while locked or ticketed,
    /// and (`Easync`) while an operation on it is in flight.
    pub fn release_lock(&mut self, id: LockId) -> Result<(), Error> {
        let op = Op::ReleaseLock;
        self.releasable(&id).map_err(|s| op.err(s))?;
        let body = ControlRequest::ReleaseLock { lock: id.raw() };
        self.control(op, self.id.get(), body)?;
        self.locks.remove(id);
        Ok(())
    }

    /// Whether this client may drop its reference to `id`: it has one, the lock is neither held
    /// nor ticketed, and no operation on it is in flight (an asynchronous request or a pipelined
    /// batch: its reply must find the record).
    fn releasable(&self, id: &LockId) -> Result<(), Status> {
        let e = self.locks.get(*id).ok_or(Status::LockNotGet)?;
        e.local.releasable()?;
        if e.busy || self.pending.is_some_and(|p| p.lock == *id) {
            return Err(Status::Easync);
        }
        Ok(())
    }

    /// `release_lock` for 1 to 31 ids (`Einval` for none or more, as in the reference, even
    /// when no id could be released and nothing would be sent); each entry on its own.
    pub fn batch_release_lock(&mut self, ids: &[LockId]) -> Result<Vec<Result<(), Status>>, Error> {
        let op = Op::BatchReleaseLock;
        batch_count(op, ids.len())?;
        let eligible: Vec<u32> = ids
            .iter()
            .filter(|id| self.releasable(id).is_ok())
            .map(|id| id.raw())
            .collect();
        let mut statuses: HashMap<u32, Status> = HashMap::new();
        if !eligible.is_empty() {
            let body = ControlRequest::BatchReleaseLock(Batch::from_slice(&eligible));
            let ControlResponse::Entries(entries) = self.control(op, self.id.get(), body)? else {
                return Err(op.err(Status::BadResponse));
            };
            for (e, raw) in entries.iter().zip(&eligible) {
                statuses.insert(*raw, e.status);
            }
        }
        Ok(ids
            .iter()
            .map(|id| {
                self.releasable(id)?;
                match statuses.get(&id.raw()) {
                    Some(Status::Success) => {
                        self.locks.remove(*id);
                        Ok(())
                    }
                    Some(&s) => Err(s),
                    None => Err(Status::BadResponse),
                }
            })
            .collect())
    }

    /// The lock ids this client holds references to, with their local state.
    pub fn locks(&self) -> impl Iterator<Item = (&LockId, &LocalLock)> {
        self.locks.iter().map(|e| (&e.local.id, &e.local))
    }

    /// This client's record of lock `id`, if it holds a reference to it: one indexed lookup,
    /// where [`Client::locks`] scans them all.
    pub fn local_lock(&self, id: LockId) -> Option<&LocalLock> {
        self.locks.get(id).map(|e| &e.local)
    }

    /// The id this client's record of lock `name` of `kind` has now, if it holds a reference
    /// to it (a scan of the records, for use after [`Client::renumberings`] changed).
    pub fn lock_id(&self, kind: LockKind, name: &[u8]) -> Option<LockId> {
        self.locks
            .iter()
            .find(|e| e.local.kind == kind && *e.name == *name)
            .map(|e| e.local.id)
    }

    /// How many times a failover's re-claim ([`Client::update_all_locks`]) filed this client's
    /// records under the ids a replacement server gave them. A replacement numbers its locks
    /// afresh, so an id kept from before names another lock, or none: whoever keeps ids beside
    /// the client looks them up again by name ([`Client::lock_id`]) when this changes.
    pub fn renumberings(&self) -> u64 {
        self.renumberings
    }
}
