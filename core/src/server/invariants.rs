//! The server's own consistency check over the lock manager's state, for tests and the
//! simulators: what the data path relies on and no single transition can see whole.

use super::Server;
use crate::manager::GrantState;
use crate::table::ClientState;

impl Server<'_> {
    /// Checks, over every client slot up to the high-water mark and every lock:
    ///
    /// - every holds entry is one of the fifteen [`GrantState`]s (no `CorruptGrant`);
    /// - a retaining (dead) client's row holds only grants marked retain-on-death;
    /// - a lock with a cached grant has its manager cell's mark set, so the revoke decision
    ///   scans it (a cached holder the scan skipped would never be revoked).
    ///
    /// The first broken rule is returned; `Ok` costs a scan of the holds grid.
    pub fn check_invariants(&self) -> Result<(), &'static str> {
        for slot in 0..self.t.client_free.high_water() {
            let retaining = self.t.clients[slot as usize].client_state() == ClientState::Retaining;
            let mut from = 0;
            while let Some((lock, bits)) = self.t.lock_holds.next_in_row(slot, from) {
                from = lock + 1;
                let state =
                    GrantState::from_bits(bits).map_err(|_| "a holds entry is no grant state")?;
                if retaining && !state.retains() {
                    return Err("a dead client keeps a grant it did not ask to retain");
                }
                if state.is_cached() && self.t.lock_manager[lock as usize].cached == 0 {
                    return Err("a cached grant on a lock not marked as having one");
                }
            }
        }
        Ok(())
    }
}
