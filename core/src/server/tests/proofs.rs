//! Grant proofs: what a keyed server issues with each grant and ticket, and the claims a
//! recovering server takes — including a genuine client's claim of a lock it never held, and a
//! stale grant's claim against the grant issued after it.

use super::*;
use crate::LockKind;
use crate::ids::tests::GOOD_KEY;
use crate::ids::{GrantProof, LockId, Session, SessionKey, Ticket};
use crate::proto::{
    Command, DATA_RESPONSE_MAX, DataHeader, FLAG_ALL_OR_NOTHING, FLAG_PROOFS, Held, LockClaim,
    LockCommand, LockOp, PROOF_LEN, decode_data_response, encode_data_request,
};
use crate::server::proof::{GrantSubject, grant_proof, proves};

fn key() -> SessionKey {
    SessionKey::new(GOOD_KEY).unwrap()
}

/// Sends `cmds` from `client` through the bytes path; the response's bytes.
fn exchange(s: &mut TestServer, client: ClientId, flags: u32, cmds: &[Command]) -> Vec<u8> {
    let header = DataHeader {
        version: crate::proto::PROTO_VERSION,
        count: 0,
        message_id: 7,
        client: client.get(),
        flags,
    };
    let mut req = [0u8; DATA_RESPONSE_MAX];
    let n = encode_data_request(&header, cmds, &mut req).unwrap();
    let mut out = vec![0u8; DATA_RESPONSE_MAX];
    let m = s.handle_data(&req[..n], &mut out, 10).unwrap();
    out.truncate(m);
    out
}

fn subject(
    client: ClientId,
    kind: LockKind,
    held: Held,
    token: u64,
    name: &[u8],
) -> GrantSubject<'_> {
    GrantSubject {
        client: client.get(),
        kind,
        held,
        partition: 0,
        epoch: 1,
        token,
        ticket: Ticket::default(),
        name,
    }
}

#[test]
fn a_keyed_server_proves_each_grant_and_ticket_and_nothing_else() {
    let cfg = small();
    let mut s = TestServer::keyed(&cfg);
    let (a, b) = (
        s.client_init(3, 0, 0).unwrap(),
        s.client_init(3, 0, 0).unwrap(),
    );
    let x = s.get_lock(a.get(), LockKind::Atomic, b"x", 0).unwrap();
    let take = lock(LockKind::Atomic, LockOp::TryExclusive, x, 60_000);
    let bytes = exchange(&mut s, a, 0, &[take]);
    let r = decode_data_response(&bytes).unwrap();
    let (grant, mac) = (r.result(0).result, r.proof_mac(0));
    assert_eq!(r.header().flags & FLAG_PROOFS, FLAG_PROOFS);
    let proof = GrantProof { epoch: 1, mac };
    let of_a = subject(a, LockKind::Atomic, Held::Exclusive, grant.aux, b"x");
    assert!(proves(&key(), test_mac, &of_a, &proof));
    assert!(!proves(
        &key(),
        test_mac,
        &GrantSubject {
            client: b.get(),
            ..of_a
        },
        &proof
    ));
    // An unlock, a refusal and an extend prove nothing: no trailer.
    let unlock = lock(LockKind::Atomic, LockOp::UnlockExclusive, x, 0);
    for cmd in [
        lock(LockKind::Atomic, LockOp::ExtendExclusive, x, 10),
        unlock,
    ] {
        let bytes = exchange(&mut s, a, 0, &[cmd]);
        assert_eq!(bytes.len(), 16 + 32, "{cmd:?}");
    }
    // A fair ticket is proved with the ticket the client files it under.
    let f = s.get_lock(a.get(), LockKind::Fair, b"f", 0).unwrap();
    let fb = s.get_lock(b.get(), LockKind::Fair, b"f", 0).unwrap();
    let f_try = |id: LockId| lock(LockKind::Fair, LockOp::TryExclusive, id, 60_000);
    exchange(&mut s, a, 0, &[f_try(f)]);
    let r = exchange(&mut s, b, 0, &[f_try(fb)]);
    let r = decode_data_response(&r).unwrap();
    let queued = r.result(0).result;
    assert_eq!(queued.status, Status::Eagain);
    let ticket = Ticket {
        exclusive: queued.aux as u16,
        shared: (queued.aux >> 16) as u16,
    };
    let of_b = GrantSubject {
        ticket,
        ..subject(
            b,
            LockKind::Fair,
            Held::Ticketed(crate::Mode::Exclusive),
            0,
            b"f",
        )
    };
    assert!(proves(
        &key(),
        test_mac,
        &of_b,
        &GrantProof {
            epoch: 1,
            mac: r.proof_mac(0)
        }
    ));
    // An all-or-nothing message that was undone reports Eagain for what worked: no ticket, and
    // so no proof; a granted one proves each grant, where it sits in the message.
    let y = s.get_lock(b.get(), LockKind::Atomic, b"y", 0).unwrap();
    let xb = s.get_lock(b.get(), LockKind::Atomic, b"x", 0).unwrap();
    let try_y = lock(LockKind::Atomic, LockOp::TryExclusive, y, 60_000);
    let held_x = exchange(&mut s, a, 0, &[take]);
    assert_eq!(
        decode_data_response(&held_x)
            .unwrap()
            .result(0)
            .result
            .status,
        Status::Success
    );
    let try_xb = lock(LockKind::Atomic, LockOp::TryExclusive, xb, 60_000);
    let undone = exchange(&mut s, b, FLAG_ALL_OR_NOTHING, &[try_y, try_xb]);
    assert_eq!(undone.len(), 16 + 2 * 32, "nothing held, nothing proved");
    let z = s.get_lock(b.get(), LockKind::Atomic, b"z", 0).unwrap();
    let try_z = lock(LockKind::Atomic, LockOp::TryExclusive, z, 60_000);
    let both = exchange(&mut s, b, FLAG_ALL_OR_NOTHING, &[try_y, try_z]);
    let r = decode_data_response(&both).unwrap();
    assert_eq!(both.len(), 16 + 2 * (32 + PROOF_LEN));
    for (i, name) in [&b"y"[..], b"z"].into_iter().enumerate() {
        let token = r.result(i).result.aux;
        let s_i = subject(b, LockKind::Atomic, Held::Exclusive, token, name);
        assert!(proves(
            &key(),
            test_mac,
            &s_i,
            &GrantProof {
                epoch: 1,
                mac: r.proof_mac(i)
            }
        ));
    }
}

#[test]
fn a_server_without_a_key_sends_no_proofs() {
    let cfg = small();
    let mut s = TestServer::new(&cfg);
    let a = s.client_init(3, 0, 0).unwrap();
    let x = s.get_lock(a.get(), LockKind::Rw, b"x", 0).unwrap();
    let bytes = exchange(&mut s, a, 0, &[lock(LockKind::Rw, LockOp::TryShared, x, 0)]);
    assert_eq!(bytes.len(), 16 + 32);
    assert_eq!(
        decode_data_response(&bytes)
            .unwrap()
            .result(0)
            .result
            .status,
        Status::Success
    );
}

/// A parked request granted later carries its proof too.
#[test]
fn a_parked_grant_is_proved_when_it_is_answered() {
    let cfg = small();
    let mut s = TestServer::keyed(&cfg);
    let (a, b) = (
        s.client_init(3, 0, 0).unwrap(),
        s.client_init(3, 0, 0).unwrap(),
    );
    let la = s.get_lock(a.get(), LockKind::Rw, b"x", 0).unwrap();
    let lb = s.get_lock(b.get(), LockKind::Rw, b"x", 0).unwrap();
    assert_eq!(
        s.run(a, lock(LockKind::Rw, LockOp::TryExclusive, la, 0), 0)
            .status,
        Status::Success
    );
    let mut park = lock(LockKind::Rw, LockOp::TryExclusive, lb, 0);
    if let Command::Lock(c) = &mut park {
        c.wait_ms = 10_000;
    }
    assert!(exchange(&mut s, b, 0, &[park]).is_empty(), "parked");
    s.run(a, lock(LockKind::Rw, LockOp::UnlockExclusive, la, 0), 1);
    let mut got = Vec::new();
    s.take_replies(|r| got.push(r));
    let r = got.pop().unwrap();
    assert_eq!(r.result.status, Status::Success);
    assert!(proves(
        &key(),
        test_mac,
        &subject(b, LockKind::Rw, Held::Exclusive, r.result.aux, b"x"),
        &r.proof
    ));
    let mut out = [0u8; DATA_RESPONSE_MAX];
    let n = r.encode(&mut out).unwrap();
    assert_eq!(
        decode_data_response(&out[..n]).unwrap().proof_mac(0),
        r.proof.mac
    );
}

/// A claim as the client makes it from a record: grant in `held` with `token` and `proof`.
fn claim<'n>(
    kind: LockKind,
    held: Held,
    name: &'n [u8],
    token: u64,
    proof: GrantProof,
) -> LockClaim<'n> {
    LockClaim {
        value: None,
        kind,
        held,
        name,
        old_lock: 0,
        word: 0,
        ticket: Ticket::default(),
        remaining_ms: 60_000,
        age_ms: 10,
        token,
        proof,
    }
}

/// A replacement server for `n` clients, with the key, and those clients re-registered with
/// the sessions the failed server (same key) minted for them.
fn replacement(cfg: &Config, ids: &[u32]) -> TestServer {
    let mut s = TestServer::keyed(cfg);
    for &id in ids {
        let session = Session::minted(&key(), test_mac, id, [id as u8; 8]);
        s.client_reinit(id, 4, 0, &session, 0).unwrap();
    }
    s
}

/// A standalone server's locks are partition 0's: a proof of the same grant made for another
/// partition is not taken, while the partition-0 proof is.
#[test]
fn a_proof_made_for_another_partition_is_not_taken() {
    let cfg = Config {
        recovery_clients: 1,
        epoch: 2,
        ..small()
    };
    let c = ClientId::new(11).unwrap();
    let mut s = replacement(&cfg, &[c.get()]);
    let token = crate::FencingToken::standalone(1, 40).0;
    let subj = subject(c, LockKind::Rw, Held::Exclusive, token, b"x");
    let other = grant_proof(
        &key(),
        test_mac,
        &GrantSubject {
            partition: 1,
            ..subj
        },
    );
    let with = |proof| claim(LockKind::Rw, Held::Exclusive, b"x", token, proof);
    assert_eq!(s.update_lock(c.get(), &with(other), 1), Err(Status::Einval));
    let own = grant_proof(&key(), test_mac, &subj);
    assert!(s.update_lock(c.get(), &with(own), 2).is_ok());
}

/// A claim names a grant of an earlier incarnation, so its proof was made at an epoch below
/// ours. One made at our epoch or a later one — genuine, since the key is shared — is for a
/// grant no failed server gave (this server's own, or a successor's): it restores nothing,
/// leaves nothing behind, and the earlier incarnation's proof of the same grant still works.
/// No client's records hold such a proof, so only a forged claim reaches this refusal.
#[test]
fn a_proof_made_at_our_epoch_or_later_restores_nothing() {
    let cfg = Config {
        recovery_clients: 1,
        epoch: 2,
        ..small()
    };
    let c = ClientId::new(11).unwrap();
    let mut s = replacement(&cfg, &[c.get()]);
    let token = crate::FencingToken::standalone(1, 40).0;
    let subj = subject(c, LockKind::Rw, Held::Exclusive, token, b"x");
    let with = |proof| claim(LockKind::Rw, Held::Exclusive, b"x", token, proof);
    let before = s.tables().digest();
    for epoch in [2, 3] {
        let proof = grant_proof(&key(), test_mac, &GrantSubject { epoch, ..subj });
        assert_eq!(
            s.update_lock(c.get(), &with(proof), 1),
            Err(Status::Einval),
            "a proof made at epoch {epoch}"
        );
    }
    assert_eq!(s.tables().digest(), before, "nothing of the claims is left");
    let earlier = grant_proof(&key(), test_mac, &subj);
    assert!(s.update_lock(c.get(), &with(earlier), 2).is_ok());
}

/// The thief: a client that really was registered with the failed server claims a
/// lock it never held before its holder does. With a key it cannot: it has no proof for that
/// lock, and none it has fits. The holder's claim then succeeds.
#[test]
fn a_genuine_client_cannot_reclaim_a_lock_it_never_held() {
    let cfg = Config {
        recovery_clients: 2,
        epoch: 2,
        ..small()
    };
    let (holder, thief) = (ClientId::new(11).unwrap(), ClientId::new(22).unwrap());
    let mut s = replacement(&cfg, &[holder.get(), thief.get()]);
    let token = (1 << 48) + 40;
    let holders = grant_proof(
        &key(),
        test_mac,
        &subject(holder, LockKind::Rw, Held::Exclusive, token, b"x"),
    );
    // What the thief may try: no proof; a proof of its own grant of another lock; the holder's
    // proof (it cannot have it, but it names another client); a shared grant of its own shown
    // as exclusive; a proof of the thief's ticket shown as a grant.
    let own_y = grant_proof(
        &key(),
        test_mac,
        &subject(thief, LockKind::Rw, Held::Exclusive, token + 1, b"y"),
    );
    let own_shared = grant_proof(
        &key(),
        test_mac,
        &subject(thief, LockKind::Rw, Held::Shared, token + 2, b"x"),
    );
    let attempts = [
        claim(
            LockKind::Rw,
            Held::Exclusive,
            b"x",
            token + 9,
            GrantProof::NONE,
        ),
        claim(LockKind::Rw, Held::Exclusive, b"x", token + 1, own_y),
        claim(LockKind::Rw, Held::Exclusive, b"x", token, holders),
        claim(LockKind::Rw, Held::Exclusive, b"x", token + 2, own_shared),
        claim(
            LockKind::Rw,
            Held::Shared,
            b"x",
            token + 9,
            GrantProof::NONE,
        ),
    ];
    for steal in attempts {
        assert_eq!(
            s.update_lock(thief.get(), &steal, 1),
            Err(Status::Einval),
            "{steal:?}"
        );
    }
    assert_eq!(s.usage().locks, 0, "no trace of the attempts");
    let x = s
        .update_lock(
            holder.get(),
            &claim(LockKind::Rw, Held::Exclusive, b"x", token, holders),
            2,
        )
        .expect("the holder's claim succeeds");
    let w = crate::word::rw::RwWord::from_bits(s.tables().lock_cells[x.index() as usize].word);
    assert_eq!(w.owner(), holder.get());
    // Its own, proved claims the thief may make; a ticket needs its proof too.
    let ok = claim(LockKind::Rw, Held::Exclusive, b"y", token + 1, own_y);
    assert!(s.update_lock(thief.get(), &ok, 3).is_ok());
    let ticket = LockClaim {
        value: None,
        ticket: Ticket {
            exclusive: 3,
            shared: 0,
        },
        ..claim(
            LockKind::Fair,
            Held::Ticketed(crate::Mode::Exclusive),
            b"f",
            0,
            GrantProof::NONE,
        )
    };
    assert_eq!(s.update_lock(thief.get(), &ticket, 4), Err(Status::Einval));
    let proof = grant_proof(
        &key(),
        test_mac,
        &GrantSubject {
            ticket: ticket.ticket,
            ..subject(thief, LockKind::Fair, ticket.held, 0, b"f")
        },
    );
    assert!(
        s.update_lock(thief.get(), &LockClaim { proof, ..ticket }, 5)
            .is_ok()
    );
}

/// A proof shows a grant was given, not that it is current: the client that held a lock and
/// released it keeps its proof. The first claim accepted keeps the lock, so a stale grant that
/// is claimed first wins and the current holder is told its grant is lost (`Fail`), and one
/// that comes second is refused; either way exactly one client holds the lock and believes so.
#[test]
fn a_stale_proven_claim_first_wins_and_the_holder_is_told_it_lost() {
    let cfg = Config {
        recovery_clients: 2,
        epoch: 2,
        ..small()
    };
    let (old, new) = (ClientId::new(11).unwrap(), ClientId::new(22).unwrap());
    let (t_old, t_new) = ((1u64 << 48) + 5, (1u64 << 48) + 8);
    for kind in [LockKind::Atomic, LockKind::Rw, LockKind::Fair] {
        for stale_first in [true, false] {
            let mut s = replacement(&cfg, &[old.get(), new.get()]);
            let ticket = |t: u16| Ticket {
                exclusive: t,
                shared: 0,
            };
            let make = |c: ClientId, token: u64, t: u16| {
                let subj = GrantSubject {
                    ticket: if kind == LockKind::Fair {
                        ticket(t)
                    } else {
                        Ticket::default()
                    },
                    ..subject(c, kind, Held::Exclusive, token, b"x")
                };
                LockClaim {
                    value: None,
                    ticket: subj.ticket,
                    ..claim(
                        kind,
                        Held::Exclusive,
                        b"x",
                        token,
                        grant_proof(&key(), test_mac, &subj),
                    )
                }
            };
            let (stale, current) = (make(old, t_old, 4), make(new, t_new, 5));
            let (winner, loser) = if stale_first {
                ((old, stale, 4), (new, current))
            } else {
                ((new, current, 5), (old, stale))
            };
            let case = format!("{kind:?}, stale first: {stale_first}");
            let id = s.update_lock(winner.0.get(), &winner.1, 1).expect(&case);
            assert_eq!(
                s.update_lock(loser.0.get(), &loser.1, 2),
                Err(Status::Fail),
                "{case}"
            );
            s.reinit_done(old.get(), 3).unwrap();
            s.reinit_done(new.get(), 3).unwrap();
            let unlock = match lock(kind, LockOp::UnlockExclusive, id, 0) {
                Command::Lock(l) if kind == LockKind::Fair => Command::Lock(LockCommand {
                    ticket: ticket(winner.2),
                    ..l
                }),
                c => c,
            };
            assert_eq!(s.run(winner.0, unlock, 4).status, Status::Success, "{case}");
        }
    }
}
