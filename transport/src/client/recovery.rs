//! After a failover: re-claiming every lock this client knows from the replacement server
//! (`update_all_locks`), each grant or ticket with the proof the failed server gave it.
//! Re-registering is `control.rs`'s ([`Client::reinit`]); what a record may claim is decided by
//! the record itself ([`LocalLock::claim`](super::LocalLock::claim), in `dlock-core`).

use dlock_core::proto::{Batch, BatchEntry, ControlRequest, ControlResponse, LockClaim};
use dlock_core::{LockId, Status};

use super::table::Entry;
use super::{BATCH, Client, Connection, Error, Op, local};

impl<C: Connection> Client<C> {
    /// After a failover (`reinit` said the server recovers): re-claims every lock this client
    /// knows, in batches of 31, each grant or ticket with the proof the failed server gave it,
    /// and takes the new ids the server gives them. A lock whose claim the server refuses (or
    /// whose record is in a state no claim can describe) is forgotten: the server does not
    /// hold it for this client (as a `Fail` would say). On an error every record keeps its old
    /// id (claims the server already took are filed under the new ids only once all are
    /// answered); call again after the next `reinit` — the server takes a repeated claim as a
    /// no-op, and even after its recovery ended it answers a repeated claim of what it restored
    /// with the lock's id. A server this client did not re-register into while it recovered
    /// refuses the call whole (`Einval`, the reference's -1): nothing is claimed and every
    /// record kept, since that server holds them under the ids they have.
    pub fn update_all_locks(&mut self) -> Result<(), Error> {
        let now = self.now_ms();
        // Every record leaves the table and comes back under its new id: the new server numbers
        // its locks afresh, so renaming in place could file one record over another not yet
        // renamed.
        let mut records = self.locks.drain().into_iter();
        // Re-claimed records, with their old ids: filed under the new ids only once every chunk
        // is answered, so an error can put every record back under the id it had.
        let mut done: Vec<(Entry, LockId)> = Vec::new();
        loop {
            let chunk: Vec<(Entry, local::Claim)> = records
                .by_ref()
                .filter_map(|e| {
                    let claim = e.local.claim(now);
                    if claim.is_none() {
                        tracing::warn!(lock = %e.local.id, "lock record inconsistent; not re-claimed");
                    }
                    Some((e, claim?))
                })
                .take(BATCH)
                .collect();
            if chunk.is_empty() {
                break;
            }
            let entries = match self.claim(&chunk) {
                Ok(entries) => entries,
                Err(e) => {
                    self.restore(done, chunk.into_iter().map(|(e, _)| e).chain(records));
                    return Err(e);
                }
            };
            for ((mut e, _), answer) in chunk.into_iter().zip(entries) {
                if let (Status::Success, Some(new)) = (answer.status, LockId::from_raw(answer.id)) {
                    let old = e.local.id;
                    e.local.id = new;
                    done.push((e, old));
                }
            }
        }
        for (e, _) in done {
            if let Some(other) = self.locks.insert(e) {
                tracing::warn!(lock = %other.local.id, name = ?other.name, "two locks re-claimed under one id");
            }
        }
        self.renumberings += 1;
        self.recovering = false;
        self.reclaim = false;
        Ok(())
    }

    /// Sends one batch of claims; the server's answer to each, in order.
    fn claim(&mut self, chunk: &[(Entry, local::Claim)]) -> Result<Vec<BatchEntry>, Error> {
        let op = Op::UpdateAllLocks;
        let claims: Vec<LockClaim<'_>> = chunk
            .iter()
            .map(|(e, c)| LockClaim {
                kind: e.local.kind,
                held: c.held,
                name: &e.name,
                old_lock: e.local.id.raw(),
                word: e.local.word,
                ticket: c.ticket,
                remaining_ms: c.remaining_ms,
                age_ms: c.age_ms,
                token: c.token,
                proof: c.proof,
                value: c.value,
            })
            .collect();
        let body = ControlRequest::BatchUpdateLocks(Batch::from_slice(&claims));
        match self.control(op, self.id.get(), body)? {
            ControlResponse::Entries(e) if e.len() == chunk.len() => Ok(e.iter().collect()),
            _ => Err(op.err(Status::BadResponse)),
        }
    }

    /// After a failed re-claim: puts every record back under the id it had when
    /// `update_all_locks` started (`done`: re-claimed ones, with that id), so that none is lost
    /// to an id the new server reused.
    fn restore(&mut self, done: Vec<(Entry, LockId)>, rest: impl Iterator<Item = Entry>) {
        let back = done.into_iter().map(|(mut e, old)| {
            e.local.id = old;
            e
        });
        for e in back.chain(rest) {
            self.locks.insert(e);
        }
    }
}
