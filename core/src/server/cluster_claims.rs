//! Re-claims on a cluster server: a partition's new owner takes back the grants its previous
//! owner made, each proved by the MAC the previous owner issued with it, while the partition
//! recovers (`cluster.rs`). The merge rules are the standalone recovery's (`recovery.rs`); what
//! differs is who may claim and when:
//!
//! | the claim's partition here                    | answer                                        |
//! |-----------------------------------------------|-----------------------------------------------|
//! | not owned, fenced, or not at the map's epoch  | `PartitionMoved`                              |
//! | recovering                                    | merged (the lock's id) or refused (`Fail`, `Einval`) |
//! | serving                                       | the id of what was restored for this client, else `Fail` |
//!
//! Any registered client may claim (it joined this server with its cluster-wide id), but only
//! once its id is persisted (`NotReady` before): a successor must know to wait for it. A claim
//! of a grant or ticket must carry a proof for the lock's partition at an epoch below the
//! partition's current one, and a grant's token must be plausible for it
//! (`cluster::token::is_plausible_claim`); tokens the new owner issues are at the new epoch, so
//! larger than every re-claimed one without raising any counter.

use super::cluster::verdict_status;
use super::{Counter, Server};
use crate::cluster::token::is_plausible_claim;
use crate::cluster::{Class, Verdict};
use crate::ids::{ClientId, LockId, LockKind};
use crate::manager::GrantState;
use crate::proto::{Held, LockClaim};
use crate::server::proof::{GrantSubject, proves};
use crate::status::Status;

impl<'r> Server<'r> {
    /// `update_lock` on a cluster server (module doc).
    pub(super) fn cluster_claim(
        &mut self,
        raw: u32,
        claim: &LockClaim<'_>,
        now_ms: u64,
    ) -> Result<LockId, Status> {
        self.stats.bump(Counter::ControlRequests);
        let slot = self
            .client_slot(raw)
            .ok_or_else(|| self.refuse(Status::ClientNotInit))?;
        self.t.clients[slot as usize].last_seen_ms = now_ms;
        let me = ClientId::new(raw).ok_or(Status::Einval)?;
        let Some(c) = self.cluster.as_ref() else {
            return Err(self.refuse(Status::Einval));
        };
        if !super::locks::valid_name(claim.name) {
            return Err(self.refuse(Status::Einval));
        }
        let partition = crate::cluster::partition_of(claim.name, c.side.map.partitions());
        let epoch = c.epoch_of(partition);
        match c.verdict(partition, epoch, Class::Reclaim, now_ms) {
            Verdict::Serve => {}
            Verdict::ReclaimClosed => {
                return self
                    .restored(slot, claim)
                    .ok_or_else(|| self.refuse(Status::Fail));
            }
            v => {
                let (s, _) = verdict_status(v).unwrap_or((Status::Einval, 0));
                return Err(self.refuse(s));
            }
        }
        if !self.grantable_client(slot) {
            return Err(self.refuse(Status::NotReady));
        }
        if !self.claim_is_proved(raw, claim, partition, epoch) {
            return Err(self.refuse(Status::Einval));
        }
        let had_ref = self
            .find_lock(claim.name)
            .is_some_and(|l| self.t.lock_refs.get(slot, l) != 0);
        let id = self
            .lock_in(slot, claim.kind, claim.name, partition)
            .map_err(|s| self.refuse(s))?;
        let lock = id.index();
        let held = self.recorded_hold(slot, lock);
        let wanted = GrantState::from_held(claim.held);
        if !held.is_none() && held == wanted {
            return Ok(id);
        }
        match self.merge_claim(lock, me, claim, now_ms) {
            Ok(hold) => {
                if !hold.is_none() {
                    self.stats.bump(Counter::RecoveryLocksRestored);
                    self.t.lock_holds.set(slot, lock, hold.bits());
                    let cell = &mut self.t.lock_cells[lock as usize];
                    cell.fence = cell.fence.max(claim.token);
                }
                Ok(id)
            }
            Err(s) => {
                if !had_ref {
                    self.drop_lock_ref(slot, id);
                }
                Err(self.refuse(s))
            }
        }
    }

    /// Whether `claim` names a kind and hold that go together, and (for a grant or ticket) is
    /// proved under the cluster's session key for `partition` at an epoch below `epoch`, with a
    /// token an earlier owner of the partition can have issued.
    fn claim_is_proved(&self, raw: u32, claim: &LockClaim<'_>, partition: u16, epoch: u32) -> bool {
        let valid = matches!(
            (claim.kind, claim.held),
            (_, Held::Reference | Held::Exclusive)
                | (LockKind::Rw | LockKind::Fair, Held::Shared)
                | (LockKind::Fair, Held::Ticketed(_))
        );
        if !valid {
            return false;
        }
        if claim.held == Held::Reference {
            return claim.token == 0 || is_plausible_claim(claim.token, epoch);
        }
        let token_ok = match claim.held {
            // A ticket carries no token (`proof.rs`).
            Held::Ticketed(_) => claim.token == 0,
            _ => is_plausible_claim(claim.token, epoch),
        };
        let Some((key, mac)) = &self.session_key else {
            // A cluster server always has the cluster's key; without one nothing is proved.
            return false;
        };
        let subject = GrantSubject {
            client: raw,
            kind: claim.kind,
            held: claim.held,
            partition,
            epoch: claim.proof.epoch,
            token: claim.token,
            ticket: claim.ticket,
            name: claim.name,
        };
        token_ok
            && claim.proof.epoch >= 1
            && claim.proof.epoch < epoch
            && proves(key, *mac, &subject, &claim.proof)
    }
}
