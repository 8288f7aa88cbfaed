//! The counter object an allocator fetches its values from, and the calls it makes on it.

use std::fmt;
use std::time::Instant;

use dlock_core::{ObjectId, Status};
use dlock_transport::client::{Cas, Client, Connection};

use super::IdConfig;

/// The object calls an allocator makes, over a client of any connection: one server's
/// ([`Client`] over a `Link`) or a cluster's (`Client<ClusterLink<_>>`, feature `cluster`).
/// The allocators stay one type whichever it is, at the price of an indirect call per round
/// trip, which is nothing beside the round trip.
pub(super) trait CounterClient: Send + fmt::Debug {
    fn create(&mut self, name: &[u8], init: u64, lease_s: u32) -> Result<(), Status>;
    fn get(&mut self, name: &[u8], lease_s: u32) -> Result<ObjectId, Status>;
    fn faa(&mut self, id: ObjectId, add: u64) -> Result<u64, Status>;
    fn cas(&mut self, id: ObjectId, expected: u64, new: u64) -> Result<Cas, Status>;
    fn snapshot(&mut self, id: ObjectId) -> Result<u64, Status>;
}

impl<C: Connection + Send> CounterClient for Client<C> {
    fn create(&mut self, name: &[u8], init: u64, lease_s: u32) -> Result<(), Status> {
        self.atomic64_create(name, init, lease_s)
            .map(drop)
            .map_err(Status::from)
    }

    fn get(&mut self, name: &[u8], lease_s: u32) -> Result<ObjectId, Status> {
        Ok(self.atomic64_get(name, lease_s)?)
    }

    fn faa(&mut self, id: ObjectId, add: u64) -> Result<u64, Status> {
        Ok(self.atomic64_faa(id, add)?)
    }

    fn cas(&mut self, id: ObjectId, expected: u64, new: u64) -> Result<Cas, Status> {
        Ok(self.atomic64_cas(id, expected, new)?)
    }

    fn snapshot(&mut self, id: ObjectId) -> Result<u64, Status> {
        Ok(self.atomic64_snapshot(id)?)
    }
}

/// The counter object and the client that reaches it.
#[derive(Debug)]
pub(super) struct Counter {
    pub(super) client: Box<dyn CounterClient>,
    pub(super) object: ObjectId,
    renewed: Instant,
}

impl Counter {
    /// Creates or joins the counter and moves it forward to at least `floor`.
    pub(super) fn open(
        mut client: Box<dyn CounterClient>,
        cfg: &IdConfig,
        floor: u64,
    ) -> Result<Counter, Status> {
        // Another client (here or in another process) may have created it first; either way
        // the value it holds stands, and `advance_to` below only moves it forward.
        match client.create(&cfg.name, floor, cfg.object_lease_s()) {
            Ok(_) | Err(Status::ObjectAlreadyCreated | Status::ObjectAlreadyExisted) => {}
            Err(s) => return Err(s),
        }
        let object = client.get(&cfg.name, cfg.object_lease_s())?;
        let mut counter = Counter {
            client,
            object,
            renewed: Instant::now(),
        };
        counter.advance_to(floor)?;
        Ok(counter)
    }

    /// Moves the counter to at least `floor`, never back (a concurrent fetch-and-add only moves
    /// it further, so the loop ends).
    fn advance_to(&mut self, floor: u64) -> Result<(), Status> {
        let mut seen = self.client.snapshot(self.object)?;
        while seen < floor {
            let cas = self.client.cas(self.object, seen, floor)?;
            if cas.swapped {
                break;
            }
            seen = cas.observed;
        }
        Ok(())
    }

    /// Renews the client's and the object's leases when `renew_every` has passed: one-sided
    /// atomics never reach the server, which would otherwise declare the client dead.
    pub(super) fn renew_if_due(
        &mut self,
        cfg: &IdConfig,
        mark: u64,
        now: Instant,
    ) -> Result<(), Status> {
        if now.duration_since(self.renewed) < cfg.renew_every {
            return Ok(());
        }
        let object = self.client.get(&cfg.name, cfg.object_lease_s())?;
        if object != self.object {
            // The object was freed and created again behind our back (every reference to it
            // lapsed). Continue above everything this allocator may have handed out.
            self.object = object;
            self.advance_to(mark)?;
        }
        self.renewed = now;
        Ok(())
    }
}
