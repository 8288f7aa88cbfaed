//! Distributed atomic objects: the reference's lifecycle.

use super::*;

#[test]
fn objects_follow_the_reference_lifecycle() {
    let mut s = TestServer::new(&small());
    let a = s.client(0);
    let b = s.client(0);
    let id = s.object_create(a.get(), b"csn", 1_000, 60, 0).unwrap();
    assert_eq!(
        s.object_create(a.get(), b"csn", 0, 60, 0),
        Err(Status::ObjectAlreadyCreated)
    );
    assert_eq!(
        s.object_create(b.get(), b"csn", 0, 60, 0),
        Err(Status::ObjectAlreadyExisted)
    );
    assert_eq!(
        s.object_get(b.get(), b"nope", 60, 0),
        Err(Status::ObjectNotCreate)
    );
    let faa = |id: ObjectId, add| {
        Command::Object(ObjectCommand {
            op: ObjectOp::Faa,
            object: id.raw(),
            a: add,
            b: 0,
            partition_epoch: 0,
        })
    };
    // Creating is not a reference: the creator must get it too.
    assert_eq!(s.run(a, faa(id, 1), 0).status, Status::ObjectNotGet);
    let (gid, cell) = s.object_get(b.get(), b"csn", 60, 0).unwrap();
    assert_eq!((gid, cell), (id, id.index()));
    assert_eq!(s.run(b, faa(id, 5), 0).aux, 1_000);
    let cas = |expect, new| {
        Command::Object(ObjectCommand {
            op: ObjectOp::Cas,
            object: id.raw(),
            a: expect,
            b: new,
            partition_epoch: 0,
        })
    };
    let miss = s.run(b, cas(1_000, 7), 0);
    assert_eq!(
        (miss.status, miss.aux),
        (Status::ObjectCasFailed, 1_005),
        "CAS returns the observed value"
    );
    let hit = s.run(b, cas(1_005, 7), 0);
    assert_eq!((hit.status, hit.aux), (Status::Success, 1_005));
    let snap = Command::Object(ObjectCommand {
        op: ObjectOp::Snapshot,
        object: id.raw(),
        a: 0,
        b: 0,
        partition_epoch: 0,
    });
    assert_eq!(s.run(b, snap, 0).aux, 7);
    assert_eq!(
        s.object_destroy(b.get(), id.raw(), 0),
        Err(Status::ObjectInvalidOwner)
    );
    // Deferred: b still references it within the lease.
    assert_eq!(s.object_destroy(a.get(), id.raw(), 0), Ok(()));
    assert_eq!(
        s.object_destroy(a.get(), id.raw(), 0),
        Err(Status::ObjectAlreadyDestroyed)
    );
    assert_eq!(
        s.object_get(a.get(), b"csn", 60, 0),
        Err(Status::ObjectAlreadyDestroyed)
    );
    assert_eq!(s.usage().objects, 1);
    s.object_release(b.get(), id.raw(), 0).unwrap();
    assert_eq!(s.usage().objects, 0);
    assert_eq!(s.run(b, snap, 0).status, Status::ObjectNotGet);
}
