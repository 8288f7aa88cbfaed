//! `umo_atomic64` objects: 64-bit cells on the server for global transaction ids and CSNs.
//!
//! Creating, getting, releasing and destroying an object is a control exchange. Changing one
//! is a data operation, done the cheapest way the data path allows: one-sided atomics on the
//! region's object cell over shared memory, one-sided verbs over RDMA (as the reference does
//! with NIC atomics), a data command through [`Client::round_trip`] over TCP. Their futures
//! are `futures.rs`'s.

use dlock_core::proto::{
    Command, CommandResult, ControlRequest, ControlResponse, ObjectCommand, ObjectOp,
};
use dlock_core::{ObjectId, Status};

use super::{Client, Connection, Error, Op};
use crate::sync::Ordering;

/// What a compare-and-swap saw.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cas {
    /// Whether the swap happened.
    pub swapped: bool,
    /// The value found (the expected value when it swapped).
    pub observed: u64,
}

impl<C: Connection> Client<C> {
    /// Creates the object `name` with `init` and a lease in seconds (`umo_atomic64_create`).
    pub fn atomic64_create(
        &mut self,
        name: &[u8],
        init: u64,
        lease_s: u32,
    ) -> Result<ObjectId, Error> {
        let op = Op::ObjectCreate;
        let body = ControlRequest::ObjectCreate {
            name,
            init,
            lease_s,
        };
        match self.control(op, self.id.get(), body)? {
            ControlResponse::Object { object } => {
                ObjectId::from_raw(object).ok_or_else(|| op.err(Status::BadResponse))
            }
            _ => Err(op.err(Status::BadResponse)),
        }
    }

    /// Takes a reference to object `name` (`umo_atomic64_get`).
    pub fn atomic64_get(&mut self, name: &[u8], lease_s: u32) -> Result<ObjectId, Error> {
        let op = Op::ObjectGet;
        let body = ControlRequest::ObjectGet { name, lease_s };
        let ControlResponse::ObjectRef { object, cell } = self.control(op, self.id.get(), body)?
        else {
            return Err(op.err(Status::BadResponse));
        };
        let id = ObjectId::from_raw(object).ok_or_else(|| op.err(Status::BadResponse))?;
        if self
            .link
            .object_cells()
            .is_some_and(|c| cell as usize >= c.len())
        {
            return Err(op.err(Status::BadResponse));
        }
        self.objects.insert(id, cell);
        Ok(id)
    }

    /// Drops the reference (`umo_atomic64_release`).
    pub fn atomic64_release(&mut self, id: ObjectId) -> Result<(), Error> {
        let op = Op::ObjectRelease;
        self.objects
            .get(&id)
            .ok_or_else(|| op.err(Status::ObjectNotGet))?;
        let body = ControlRequest::ObjectRelease { object: id.raw() };
        self.control(op, self.id.get(), body)?;
        self.objects.remove(&id);
        Ok(())
    }

    /// Destroys the object (`umo_atomic64_destroy`; owner only, deferred while referenced).
    pub fn atomic64_destroy(&mut self, id: ObjectId) -> Result<(), Error> {
        let body = ControlRequest::ObjectDestroy { object: id.raw() };
        self.control(Op::ObjectDestroy, self.id.get(), body)?;
        self.objects.remove(&id);
        Ok(())
    }

    /// Fetch-and-add: returns the value before the add (`umo_atomic64_faa`). Global
    /// transaction ids are this on one object (`dlock-engine-glue`'s `TxnIdAllocator` leases
    /// ranges of them so most ids need no round trip at all).
    ///
    /// ```
    /// # use dlock_core::Config;
    /// # use dlock_transport::runtime::{ServerConfig, ServerHandle};
    /// # let server = ServerHandle::start(ServerConfig::new(Config {
    /// #     locks_max: 64, clients_max: 4, objects_max: 4, ..Config::default()
    /// # }))?;
    /// use dlock_transport::client::{Client, ClientConfig, Endpoint};
    ///
    /// let mut client = Client::connect(ClientConfig::new(Endpoint::embedded(&server)))?;
    /// client.atomic64_create(b"xid", 100, 60)?; // initial value, lease in seconds
    /// let xid = client.atomic64_get(b"xid", 60)?;
    /// assert_eq!(client.atomic64_faa(xid, 1)?, 100);
    /// assert_eq!(client.atomic64_faa(xid, 1)?, 101);
    /// # client.deinit()?;
    /// # server.stop();
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn atomic64_faa(&mut self, id: ObjectId, add: u64) -> Result<u64, Error> {
        let op = Op::Faa;
        value(op, self.object_op(op, id, ObjectOp::Faa, add, 0)?)
    }

    /// Compare-and-swap; unlike the reference, the value found is returned too.
    pub fn atomic64_cas(&mut self, id: ObjectId, expected: u64, new: u64) -> Result<Cas, Error> {
        let op = Op::Cas;
        cas_outcome(op, self.object_op(op, id, ObjectOp::Cas, expected, new)?)
    }

    /// Reads the current value (`umo_atomic64_get_snapshot`).
    pub fn atomic64_snapshot(&mut self, id: ObjectId) -> Result<u64, Error> {
        let op = Op::Snapshot;
        value(op, self.object_op(op, id, ObjectOp::Snapshot, 0, 0)?)
    }

    /// One object operation, done where the data path allows (see the module doc); the
    /// result as the server (or the cell) gave it.
    pub(super) fn object_op(
        &mut self,
        op: Op,
        id: ObjectId,
        kind: ObjectOp,
        a: u64,
        b: u64,
    ) -> Result<CommandResult, Error> {
        let cell = *self
            .objects
            .get(&id)
            .ok_or_else(|| op.err(Status::ObjectNotGet))?;
        #[cfg(feature = "rdma")]
        if let Some(qp) = self.link.rdma_objects() {
            return super::rdma::object_op(qp, cell, kind, a, b).map_err(|e| op.io(e));
        }
        if let Some(cells) = self.link.object_cells() {
            return Ok(one_sided(&cells[cell as usize], kind, a, b));
        }
        let cmd = Command::Object(ObjectCommand {
            op: kind,
            object: id.raw(),
            a,
            b,
            // A standalone server's (the cluster client names the partition's epoch).
            partition_epoch: 0,
        });
        let deadline = self.link.now() + self.cfg.timeout;
        self.round_trip(op, &[cmd], &[], 0, deadline)?;
        Ok(self.inbox.results[0])
    }
}

/// An object operation on a cell of the region, one-sided, as the reference's NIC atomics:
/// AcqRel/Acquire for the same reasons the server's message path uses them (the cell may
/// publish a client's own memory).
fn one_sided(c: &crate::sync::AtomicU64, kind: ObjectOp, a: u64, b: u64) -> CommandResult {
    match kind {
        ObjectOp::Faa => ok(c.fetch_add(a, Ordering::AcqRel)),
        ObjectOp::Cas => match c.compare_exchange(a, b, Ordering::AcqRel, Ordering::Acquire) {
            Ok(v) => ok(v),
            Err(v) => CommandResult {
                status: Status::ObjectCasFailed,
                word: 0,
                aux: v,
                plain: false,
            },
        },
        ObjectOp::Snapshot => ok(c.load(Ordering::Acquire)),
    }
}

/// A successful object operation's result carrying `aux` (the value before, or found).
pub(super) const fn ok(aux: u64) -> CommandResult {
    CommandResult {
        status: Status::Success,
        word: 0,
        aux,
        plain: false,
    }
}

/// The value an FAA or a snapshot returned, or the status that refused it.
pub(super) fn value(op: Op, r: CommandResult) -> Result<u64, Error> {
    r.status.ok().map(|()| r.aux).map_err(|s| op.err(s))
}

/// A CAS result as the API reports it: swapped or not, with the value found.
pub(super) fn cas_outcome(op: Op, r: CommandResult) -> Result<Cas, Error> {
    match r.status {
        Status::Success | Status::ObjectCasFailed => Ok(Cas {
            swapped: r.status == Status::Success,
            observed: r.aux,
        }),
        s => Err(op.err(s)),
    }
}
