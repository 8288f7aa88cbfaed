//! A failover through the C ABI: two C clients re-sync with a recovering replacement, one of
//! them asks to leave before the other is back, and the lifecycle calls a client may only make
//! in recovery are refused outside it — as a C engine ported from the reference would drive
//! them. (Its own test binary: the server and client registries are process-wide.)

use dlock_engine_glue::dlock_core::Status;
use dlock_engine_glue::ffi::types::*;
use dlock_engine_glue::ffi::{client, locks, ops, server};

#[path = "common/failover.rs"]
mod failover;
use failover::{LOOPBACK, first_server_and_client, server_cfg};

#[test]
fn a_c_client_keeps_its_id_and_locks_when_a_recovering_server_refuses_its_deinit() {
    let (mut c1, mut c2, mut lock_id) = (0, 0, 0);
    let name = b"orders/rg-1";
    let desc = lock_desc {
        p_desc: name.as_ptr().cast(),
        len: name.len() as u32,
        lock_type: DLOCK_ATOMIC,
        lease_time: 0,
    };
    let mut st = lock_state::from_word(0);
    // SAFETY: `first_server_and_client` makes the binary's first C-ABI call; pointers to live
    // locals of the right types; the strings outlive the calls.
    unsafe {
        let (first, port) = first_server_and_client(&mut c1);
        assert_eq!(client::client_init(&mut c2, LOOPBACK.as_ptr()), 0);
        assert_eq!(locks::get_lock(c1, &desc, &mut lock_id), 0);
        let req = lock_request {
            lock_id,
            lock_op: LOCK_EXCLUSIVE,
            expire_time: 60,
        };
        assert_eq!(ops::trylock(c1, &req, (&raw mut st).cast()), 0);
        // Not re-initialising, and not recovering: both refused with the reference's -1,
        // nothing forgotten.
        assert_eq!(client::client_reinit_done(c1), -1);
        assert_eq!(locks::update_all_locks(c1), -1);
        assert_eq!(
            ops::unlock(c1, lock_id, (&raw mut st).cast()),
            0,
            "the record survived the refused update_all_locks"
        );
        assert_eq!(ops::trylock(c1, &req, (&raw mut st).cast()), 0);

        assert_eq!(server::server_stop(first), 0);
        let mut second = 0;
        assert_eq!(
            server::server_start(&server_cfg(port, 2, 2), &mut second),
            0
        );
        assert_eq!(client::client_reinit(c1, std::ptr::null()), 0);
        assert_eq!(locks::update_all_locks(c1), 0);
        assert_eq!(client::client_reinit_done(c1), 0);
        // c2 is not back: the server still recovers and refuses the deinit, keeping c1.
        assert_eq!(client::client_deinit(c1), Status::NotReady.code());
        assert_eq!(
            client::client_heartbeat(c1, 5),
            Status::NotReady.code(),
            "c1's id is still known here (an unknown id would be DLOCK_EINVAL)"
        );
        assert_eq!(client::client_reinit(c2, std::ptr::null()), 0);
        assert_eq!(locks::update_all_locks(c2), 0);
        assert_eq!(client::client_reinit_done(c2), 0);
        assert_eq!(client::client_heartbeat(c1, 5), 0, "serving, c1 registered");
        assert_eq!(client::client_deinit(c1), 0);
        assert_eq!(
            client::client_deinit(c1),
            -1,
            "an unknown id, as the reference"
        );
        // c1's deinit released the lock it had re-claimed.
        let mut id2 = 0;
        assert_eq!(locks::get_lock(c2, &desc, &mut id2), 0);
        let req2 = lock_request {
            lock_id: id2,
            ..req
        };
        assert_eq!(ops::trylock(c2, &req2, (&raw mut st).cast()), 0);
        assert_eq!(client::client_deinit(c2), 0);
        client::dclient_lib_deinit();
        assert_eq!(server::server_stop(second), 0);
        server::dserver_lib_deinit();
    }
}
