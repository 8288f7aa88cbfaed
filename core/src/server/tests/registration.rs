//! Registration: client ids, the client table, sessions and what a reinit or a second channel must
//! show.

use super::*;

#[test]
fn client_ids_are_random_distinct_31_bit_and_non_zero() {
    let mut s = TestServer::new(&small());
    let ids: Vec<u32> = (0..8).map(|_| s.client(0).get()).collect();
    let mut sorted = ids.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), 8);
    assert!(ids.iter().all(|&id| id != 0 && id < 1 << 31));
    assert_ne!(ids[1], ids[0] + 1, "ids are not sequential");
}

#[test]
fn reinit_of_a_live_client_needs_its_session_secret() {
    let mut s = TestServer::new(&small());
    let a = s.client(0);
    let b = s.client(0);
    let secret = s.session(a.get());
    let mut guess = secret;
    guess.0[Session::LEN - 1] ^= 1;
    // b knows its own session and a's id: neither its own secret, a near miss nor "no session"
    // resumes a.
    for wrong in [guess, s.session(b.get()), Session::NONE] {
        assert_eq!(
            s.client_reinit(a.get(), 2, 0, &wrong, 1),
            Err(Status::Einval),
            "guessing the id is not enough"
        );
    }
    assert_eq!(s.stats().get(Counter::SessionsRefused), 3);
    assert_eq!(s.client_reinit(a.get(), 2, 0, &secret, 1), Ok(a));
}

#[test]
fn a_channel_attaches_only_with_the_registrations_own_session() {
    let mut s = TestServer::new(&small());
    let a = s.client(0);
    let b = s.client(0);
    let (slot_a, secret_a) = s.client_session(a.get()).unwrap();
    assert_ne!(
        secret_a,
        s.session(b.get()),
        "every registration has its own secret"
    );
    assert_eq!(s.authenticate(a.get(), &secret_a), Some(slot_a));
    let bs = s.session(b.get());
    assert_eq!(s.authenticate(a.get(), &bs), None);
    assert_eq!(s.authenticate(a.get(), &Session::NONE), None);
    assert_eq!(s.authenticate(0x7FFF_FFFF, &secret_a), None, "unknown id");
    assert_eq!(s.stats().get(Counter::SessionsRefused), 3);
}

#[test]
fn a_replacement_server_takes_back_only_sessions_minted_under_the_shared_key() {
    let key = SessionKey::new(crate::ids::tests::GOOD_KEY).unwrap();
    // The failed server, which minted the client's session.
    let cfg = small();
    let mut old = TestServer::new(&cfg);
    old.set_session_key(key.clone(), test_mac);
    let victim = old.client(0);
    let (_, victims_session) = old.client_session(victim.get()).unwrap();
    let _ = old; // the failed server: only its key and the session it minted matter now

    let cfg = Config {
        recovery_clients: 2,
        epoch: 2,
        ..small()
    };
    let mut s = TestServer::new(&cfg);
    s.set_session_key(key.clone(), test_mac);
    // An attacker who knows the victim's id, with no session, a made-up one, or a session of
    // its own minted for another id: refused, counted, and nothing registered.
    let mut made_up = Session([0x5A; Session::LEN]);
    made_up.0[0] = 1;
    let other_id = Session::minted(&key, test_mac, victim.get() ^ 1, [3; 8]);
    for forged in [Session::NONE, made_up, other_id] {
        assert_eq!(
            s.client_reinit(victim.get(), 2, 0, &forged, 0),
            Err(Status::Einval)
        );
    }
    assert_eq!(s.stats().get(Counter::SessionsRefused), 3);
    assert_eq!(s.usage().clients, 0);
    // The victim itself comes back with the session the failed server gave it.
    assert_eq!(
        s.client_reinit(victim.get(), 2, 0, &victims_session, 0),
        Ok(victim)
    );
    // The session it is handed now is minted under the key too, for the next failover.
    let (_, fresh) = s.client_session(victim.get()).unwrap();
    assert!(fresh.is_minted_for(&key, test_mac, victim.get()));
}

/// The registration's reply says the revoke timeout the server holds the client's cached grants
/// to (protocol 7): the configured one, else the lease granted. A client that negotiated an
/// older version is sent zero in that word, which its decoder requires (it was reserved).
#[test]
fn the_registration_reply_says_the_revoke_timeout_to_a_client_of_version_7_only() {
    use super::dispatch::slots;
    use crate::proto::{
        CONTROL_FRAME_MAX, ControlHeader, ControlRequest, ControlRequestFrame, ControlResponse,
        decode_control_response, encode_control_request,
    };
    use crate::server::Routing;
    let told = |timeout_ms: u32, version: u8| {
        let cfg = Config {
            timing: crate::manager::Timing {
                min_hold_ms: 0,
                revoke_timeout_ms: timeout_ms,
                contention_window_ms: 0,
            },
            ..small()
        };
        let mut s = TestServer::new(&cfg);
        let mut entries = slots(&s);
        let mut routing = Routing::new(&mut entries);
        let frame = ControlRequestFrame {
            header: ControlHeader {
                version,
                msg: crate::proto::MsgType::ClientInit,
                message_id: 1,
                word: 0,
            },
            body: ControlRequest::ClientInit {
                min_version: crate::proto::PROTO_VERSION_MIN,
                lease_ms: 0,
            },
        };
        let mut req = vec![0u8; CONTROL_FRAME_MAX];
        let n = encode_control_request(&frame, &mut req).unwrap();
        let mut out = vec![0u8; CONTROL_FRAME_MAX];
        let at = (
            1,
            crate::ids::Peer::EXEMPT,
            crate::manager::retain::Role::Client,
        );
        let done = s.control(&mut routing, at, &req[..n], &mut out, 0).unwrap();
        match decode_control_response(&out[..done.len]).unwrap().body {
            ControlResponse::Init(init) => (init.version, init.revoke_timeout_ms),
            other => panic!("not a registration: {other:?}"),
        }
    };
    // `small()` grants a 1 s lease.
    assert_eq!(told(300, 7), (7, 300), "the configured timeout");
    assert_eq!(told(0, 7), (7, 1_000), "none configured: the lease");
    assert_eq!(told(300, 6), (6, 0), "an older client is told nothing");
}
