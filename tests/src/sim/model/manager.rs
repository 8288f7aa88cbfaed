//! What simulated clients do with the lock manager's features: cached grants released and
//! re-acquired locally and given back after a revoke (or left to lapse), value blocks written
//! by exclusive unlocks, and the recoverer's `recovery_done` for dead clients' retained locks.

use dlock_core::Status;
use dlock_core::manager::retain::Role;
use dlock_core::manager::value::ValueBlock;
use dlock_core::proto::{Command, ControlRequest, ListRetained, LockFlags};
use dlock_transport::client::{Decision, LocalState};

use super::World;
use super::client::{Ctl, Item, SimLock};
use crate::sim::{Faults, Rng};

impl World<'_> {
    /// One operation on record `pick`, whose grant the server holds cached for the client
    /// (`r` the draw of [`World::lock_op`]): its user releases it locally, or a new user
    /// re-acquires it locally (no message either way); a revoked grant goes back when its user
    /// is done, and one whose revoke the client ignores is at last unlocked (and refused if it
    /// lapsed).
    pub(super) fn cached_op(&mut self, i: usize, pick: usize, r: u64) -> Result<(), String> {
        let now = self.server_now();
        let l = self.clients[i].locks[pick].as_mut().expect("picked record");
        // An atomic grant runs out as its lease says, cached or not.
        let live = l.local.state.held_mode().is_some() && now <= l.grant_until();
        let cache = &mut l.cache;
        match (cache.revoked, cache.parked) {
            (false, false) if r < 60 => {
                cache.parked = true;
                self.ops += 1;
                return Ok(());
            }
            (false, true) if r < 60 && live => {
                cache.parked = false;
                self.ops += 1;
                self.faults.local_acquires += 1;
                let name = l.name;
                return self.note_belief(i, name);
            }
            (false, true) if r < 60 => {}
            (true, false) if r < 60 => {
                cache.parked = true;
                if cache.ignoring {
                    return Ok(());
                }
            }
            (true, true) if !cache.ignoring || r < 3 => {}
            _ => return Ok(()),
        }
        self.give_back(i, pick);
        Ok(())
    }

    /// Client `i` gives record `pick`'s cached grant back (an unlock), or downgrades it in
    /// place when the revokes want the lock shared and it holds an RW lock exclusively.
    pub(super) fn give_back(&mut self, i: usize, pick: usize) {
        let l = self.clients[i].locks[pick].as_mut().expect("picked record");
        stage_value(l, &mut self.rng, &mut self.faults);
        let downgrade = l.cache.wants_shared && l.local.state == LocalState::ExclusiveLocked;
        let decision = if downgrade {
            l.local.downgrade()
        } else {
            l.local.unlock()
        };
        let Decision::Send(req) = decision else {
            return;
        };
        // A downgrade keeps the lock: its record is not released, and the revoke keeps the
        // client from using it until the reply.
        l.releasing = !downgrade;
        let item = Item::Lock {
            rec: pick,
            req,
            cacheable: false,
        };
        self.send_data(i, vec![item], &[Command::Lock(req.command())], 0);
    }

    /// The recoverer (sim client 0, `wire::role`) lists the retained locks, and the reply
    /// makes it call `recovery_done` for the first dead client listed; any other client now and
    /// then calls it for some client id it knows, which must be refused.
    pub(super) fn recovery_op(&mut self, i: usize) {
        let id = self.clients[i].id.unwrap_or(0);
        if super::wire::role(i) == Role::Recoverer {
            let body = ControlRequest::ListRetained(ListRetained {
                client: 0,
                cursor: 0,
            });
            self.send_control(i, id, body, Ctl::ListRetained);
        } else if self.rng.below(20) == 0 {
            let other = self.clients[self.rng.index(self.clients.len())].id;
            let dead = other.unwrap_or(id);
            self.faults.recoveries_refused += 1;
            let body = ControlRequest::RecoveryDone { dead };
            self.send_control(i, id, body, Ctl::RecoveryDone(dead));
        }
    }
}

/// Half the exclusive unlocks of a record that asks for value blocks write one: 32 random
/// bytes, which the oracle then expects every grant to read until the next write.
pub(super) fn stage_value(l: &mut SimLock, rng: &mut Rng, faults: &mut Faults) {
    let asks = l.local.ask.contains(LockFlags::VALUE_BLOCK);
    if asks && l.local.state == LocalState::ExclusiveLocked && rng.below(2) == 0 {
        let mut block = [0u8; 32];
        for chunk in block.chunks_mut(8) {
            chunk.copy_from_slice(&rng.next_u64().to_le_bytes());
        }
        if l.local.stage_value(ValueBlock(block)) == Status::Success {
            faults.values_written += 1;
        }
    }
}
