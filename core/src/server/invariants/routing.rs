//! [`Server::check_routing`]: the per-slot routing state a transport hands in agrees with the
//! waiter table.
//!
//! | state     | what must agree                                                                 |
//! |-----------|---------------------------------------------------------------------------------|
//! | routes    | a parked request (waiting, or decided and not yet handed out) has a route for its reply; one back over a stream answers that request's message id, on the connection that speaks for the slot |
//!
//! A route with no parked request behind it is allowed: a client removed with a request parked
//! leaves its route until the slot's next registration, and a reply decided for it goes nowhere
//! ([`Route::deliver`](crate::server::Route::deliver) reads the route only when a reply comes).

use super::super::Server;
use super::Violation;
use crate::server::{Route, Routing};
use crate::table::WaiterState;

impl Server<'_> {
    /// Checks `routing`, the state [`Server::dispatch`] and its kin keep for this server,
    /// against the waiter table (module doc); the first slot that disagrees, if any. Only for
    /// a transport that routes every data message through [`Server::dispatch`]: requests run
    /// by [`Server::handle_data`] park with no route.
    pub fn check_routing(&self, routing: &Routing<'_>) -> Result<(), Violation> {
        let t = &self.t;
        for slot in 0..t.client_free.high_water() {
            let w = &t.waiters[slot as usize];
            if w.state == WaiterState::Free as u8 {
                continue;
            }
            let bad = match routing.route(slot) {
                Route::None => true,
                Route::Stream {
                    conn,
                    generation,
                    message_id,
                } => {
                    let b = routing.binding(slot);
                    message_id != w.message_id || (b.conn, b.generation) != (conn, generation)
                }
                Route::Mailbox { .. } | Route::QueuePair => false,
            };
            if bad {
                return Err(Violation::Route { slot });
            }
        }
        Ok(())
    }
}
