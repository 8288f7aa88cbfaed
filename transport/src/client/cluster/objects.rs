//! `umo_atomic64` objects over the cluster: an object lives in its name's partition
//! (`CLUSTER-SPEC` §6), so creating and getting one go to that partition's owner, and the
//! client gets a cluster object id for the handle `(name, partition, server, server's id)`.
//!
//! Objects are not re-claimed: after a move, the next use of an object gets it again by name
//! from the new owner (`ObjectGet`, with the lease it was got with). A counter's new owner
//! starts it above the high-water mark its old owner persisted, so FAA goes on without a
//! repeat; any other object's value is lost with its owner, and the new owner answers the
//! get with the status it has for a name it does not know (the caller re-creates it).

use std::io;
use std::time::Instant;

use dlock_core::cluster::{ServerId, partition_of};
use dlock_core::ids::{GENERATION_MAX, SLOT_INDEX_LIMIT};
use dlock_core::proto::{
    CONTROL_FRAME_MAX, ControlHeader, ControlRequest, ControlResponse, decode_control_response,
};
use dlock_core::{ObjectId, Status};

use super::control::{answer, rewrite_id};
use super::{ClusterLink, Dial, garbage};
use crate::client::IdMap;

/// One object the client created or got.
#[derive(Clone, Debug)]
pub(super) struct ObjectRoute {
    name: Vec<u8>,
    partition: u16,
    server: ServerId,
    incarnation: u64,
    epoch: u32,
    server_object: u32,
    /// The lease it was got with, to get it again from a new owner.
    lease_s: u32,
    /// The server forgot the client, and `server_object` with it: got again by name.
    forgotten: bool,
}

/// The object routes by cluster object id.
#[derive(Debug, Default)]
pub(super) struct ObjectRoutes {
    by_id: IdMap<u32, ObjectRoute>,
    next: u32,
}

impl ObjectRoutes {
    fn insert(&mut self, route: ObjectRoute) -> u32 {
        let id = loop {
            self.next = self.next.wrapping_add(1);
            let index = self.next % SLOT_INDEX_LIMIT;
            let generation = 1 + (self.next / SLOT_INDEX_LIMIT) % GENERATION_MAX;
            let id = ObjectId::new(index, generation).raw();
            if !self.by_id.contains_key(&id) {
                break id;
            }
        };
        self.by_id.insert(id, route);
        id
    }

    /// Marks the objects got at `server` at `incarnation` to be got again by name: the server
    /// said it does not know the client, and released what the client had got there.
    pub fn forget_at(&mut self, server: ServerId, incarnation: u64) {
        for r in self.by_id.values_mut() {
            if (r.server, r.incarnation) == (server, incarnation) {
                r.forgotten = true;
            }
        }
    }

    pub fn clear(&mut self) {
        self.by_id.clear();
    }
}

/// What an object request found at the owner.
enum Found {
    /// The owner's object id (and cell, for a get).
    Object(u32, u32),
    /// A final answer for the client (a refusal): the reply's length.
    Answer(usize),
}

impl<D: Dial> ClusterLink<D> {
    /// `ObjectCreate` or `ObjectGet` (`body`) of `name` at its partition's owner, retried
    /// within `deadline` while a partition check refuses it; the route is filed and the client
    /// answered with its cluster id.
    pub(super) fn object_by_name(
        &mut self,
        h: ControlHeader,
        body: ControlRequest<'_>,
        name: &[u8],
        lease_s: u32,
        reply: &mut [u8],
        deadline: Instant,
    ) -> io::Result<usize> {
        let partition = partition_of(name, self.map.partitions());
        let (server, incarnation, epoch, found) =
            self.object_at_owner(partition, body, reply, deadline)?;
        let (server_object, cell) = match found {
            Found::Object(id, cell) => (id, cell),
            Found::Answer(m) => return rewrite_id(reply, m, h),
        };
        let id = self.objects.insert(ObjectRoute {
            name: name.to_vec(),
            partition,
            server,
            incarnation,
            epoch,
            server_object,
            lease_s,
            forgotten: false,
        });
        let body = match body {
            ControlRequest::ObjectCreate { .. } => ControlResponse::Object { object: id },
            _ => ControlResponse::ObjectRef { object: id, cell },
        };
        answer(h, Status::Success, body, reply)
    }

    /// Sends `body` to the owner of `partition` until it is not refused by a partition check
    /// or `deadline` passes; the owner (server, incarnation, epoch) and what it answered.
    fn object_at_owner(
        &mut self,
        partition: u16,
        body: ControlRequest<'_>,
        reply: &mut [u8],
        deadline: Instant,
    ) -> io::Result<(ServerId, u64, u32, Found)> {
        let mut pause = super::control::PAUSE_MIN;
        loop {
            let owner = self.map.owner(partition).copied().unwrap_or_default();
            let Some(server) = owner.server else {
                if Instant::now() >= deadline {
                    return Err(garbage("no server owns the object's partition"));
                }
                if !self.follow_map(None, deadline) {
                    pause = self.retry_pause(pause, deadline);
                }
                continue;
            };
            let m = self.control_with(server, body, reply, deadline)?;
            let frame = decode_control_response(&reply[..m])
                .map_err(|_| garbage("an object reply is malformed"))?;
            let incarnation = self.map.server(server).map_or(0, |e| e.incarnation());
            let found = match (frame.header.status(), frame.body) {
                (Some(Status::Success), ControlResponse::Object { object }) => {
                    Found::Object(object, 0)
                }
                (Some(Status::Success), ControlResponse::ObjectRef { object, cell }) => {
                    Found::Object(object, cell)
                }
                (Some(Status::PartitionMoved | Status::NotReady), _)
                    if Instant::now() < deadline =>
                {
                    if !self.follow_map(Some(server), deadline) {
                        pause = self.retry_pause(pause, deadline);
                    }
                    continue;
                }
                _ => Found::Answer(m),
            };
            return Ok((server, incarnation, owner.epoch, found));
        }
    }

    /// `ObjectRelease` or `ObjectDestroy` of cluster object `object`, at the server it is on;
    /// the route goes when the server took it.
    pub(super) fn object_by_id(
        &mut self,
        h: ControlHeader,
        object: u32,
        destroy: bool,
        reply: &mut [u8],
        deadline: Instant,
    ) -> io::Result<usize> {
        let Some(route) = self.objects.by_id.get(&object) else {
            return answer(h, Status::ObjectNotGet, ControlResponse::Empty, reply);
        };
        let (server, server_object) = (route.server, route.server_object);
        let body = if destroy {
            ControlRequest::ObjectDestroy {
                object: server_object,
            }
        } else {
            ControlRequest::ObjectRelease {
                object: server_object,
            }
        };
        let m = self.control_with(server, body, reply, deadline)?;
        let status = decode_control_response(&reply[..m])
            .ok()
            .and_then(|f| f.header.status());
        if status == Some(Status::Success) {
            self.objects.by_id.remove(&object);
        }
        rewrite_id(reply, m, h)
    }

    /// Where cluster object `object` is now: (server, its id there, epoch), got again by name
    /// from its partition's new owner if it moved. `Err(status)`: the status to answer the
    /// command with (the object is unknown, or the new owner does not have it).
    pub(super) fn current_object(
        &mut self,
        object: u32,
        deadline: Instant,
    ) -> io::Result<Result<(ServerId, u32, u32), Status>> {
        let Some(route) = self.objects.by_id.get(&object) else {
            return Ok(Err(Status::ObjectNotGet));
        };
        let owner = self.map.owner(route.partition).copied().unwrap_or_default();
        let incarnation = owner
            .server
            .and_then(|s| self.map.server(s))
            .map(|e| e.incarnation());
        if owner.server == Some(route.server)
            && incarnation == Some(route.incarnation)
            && !route.forgotten
        {
            let route = self
                .objects
                .by_id
                .get_mut(&object)
                .expect("looked up above");
            route.epoch = owner.epoch;
            return Ok(Ok((route.server, route.server_object, route.epoch)));
        }
        let (name, lease_s, partition) = (route.name.clone(), route.lease_s, route.partition);
        let body = ControlRequest::ObjectGet {
            name: &name,
            lease_s,
        };
        let mut reply = vec![0u8; CONTROL_FRAME_MAX];
        let (server, incarnation, epoch, found) =
            self.object_at_owner(partition, body, &mut reply, deadline)?;
        let server_object = match found {
            Found::Object(id, _) => id,
            Found::Answer(m) => {
                let status = decode_control_response(&reply[..m])
                    .ok()
                    .and_then(|f| f.header.status())
                    .unwrap_or(Status::BadResponse);
                return Ok(Err(status));
            }
        };
        let route = self
            .objects
            .by_id
            .get_mut(&object)
            .expect("looked up above");
        route.server = server;
        route.incarnation = incarnation;
        route.epoch = epoch;
        route.server_object = server_object;
        route.forgotten = false;
        Ok(Ok((server, server_object, epoch)))
    }
}
