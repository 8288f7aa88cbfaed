//! Grant proofs: how a server that did not issue a grant tells its holder from a thief.
//!
//! A server that replaces a failed one rebuilds its locks from the clients' claims
//! (`recovery.rs`), and a cluster partition's new owner will do the same when servers fail over
//! by themselves. Neither has any state of the server that granted. The session key tells it
//! that a client re-registering *is* the client it says (`Session::minted`), but not that the
//! client held what it claims: any genuine client could claim a lock it never held before its
//! holder does, and the first claim wins. So with a session key every grant and every fair-lock
//! ticket comes with a proof, which the client keeps beside its record and shows with its claim:
//!
//! ```text
//! proof = HMAC-SHA-256(key, "dlock grant v2" ‖ client u32 ‖ kind u8 ‖ held u8 ‖ partition u16
//!                           ‖ epoch u32 ‖ token u64 ‖ tx u16 ‖ ts u16 ‖ name_len u16 ‖ name)[..16]
//! ```
//!
//! (all little-endian, `held` the claim's [`Held`] code). What each part stops:
//!
//! | bound          | a claim it refuses                                                   |
//! |----------------|----------------------------------------------------------------------|
//! | client id      | another client's proof replayed (the client is who its session says)  |
//! | name, kind     | a proof for one lock shown for another                               |
//! | held           | a shared grant or a ticket shown as an exclusive grant               |
//! | token          | a proof of one grant shown with the token of a later one             |
//! | ticket         | a fair grant or ticket moved to another place in the queue           |
//! | epoch          | a proof issued by one incarnation (or partition owner) replayed as another's |
//! | partition      | a proof of partition `p` at epoch `e` taken for another partition's epoch `e` |
//!
//! **Epoch and partition.** On a standalone server the epoch is the server's (a `u16` the
//! operator picks, widened) and the partition is 0. In a cluster they are the lock's partition
//! (`cluster::partition_of(name)`, which the checker computes itself: a claim does not carry
//! it) and that partition's `u32` epoch at the grant. Epochs of different partitions are
//! unrelated numbers, so the partition is bound beside the epoch: the name alone would pin it
//! only as long as every server agreed on the partition count, which the MAC then need not
//! trust. Version 1 of this MAC (`"dlock grant v1"`, a `u16` epoch and no partition, protocol 4
//! servers) has another domain string, so no v1 proof ever verifies as a v2 one: a server of
//! this build refuses the claims of grants a protocol-4 server gave (the clients are told their
//! grants are lost), which is the safe side of a mixed-version failover.
//!
//! The name is MACed whole rather than hashed first: a hash would be one more step that must
//! resist collisions, for a saving of nothing (the MAC reads the name once either way).
//!
//! **Length.** 128 bits of the HMAC. A forger can check a guess only by claiming (an online
//! attempt), but claims come 31 to a frame, recovery windows recur for the life of a cluster,
//! and a proof stays valid as long as its grant is held, across any number of failovers; 2^64
//! is a margin we would have to argue again for each of those, 2^128 needs no argument. It
//! costs 16 bytes per grant on the wire (a response's proof trailer, `proto::data`) and in the
//! client's record.
//!
//! **What a proof does not show** is that its grant is still current: a client that held a lock
//! and released it keeps the proof, and can claim the lock again. The merge in `recovery.rs`
//! keeps the first claim accepted, so such a claim, if it comes first, makes the current
//! holder's claim fail (the holder is told its grant is lost): a genuine client can cost another
//! its grant, never share the lock. Ordering claims by fencing token would stop that only by
//! revoking claims already answered `Success` (`recovery.rs` says why it does not).
//!
//! **Cost.** One HMAC-SHA-256 per grant or ticket a keyed server gives (a few hundred
//! nanoseconds; nothing without a key), and one per claim it checks. Nothing is allocated: the
//! message is handed to the MAC in parts.
//!
//! These are pure functions of the key and the subject, so the server that issues a proof, the
//! one that checks it after a failover, and a simulator run the same rule.

use super::Server;
use crate::ids::{GrantProof, LockId, LockKind, Mode, SessionKey, SessionMac, Ticket};
use crate::proto::{CommandResult, Held, LockCommand, LockOp};
use crate::status::Status;
use crate::word::fair;

/// The domain string of a grant proof's MAC (a session's has another).
const GRANT_DOMAIN: &[u8] = b"dlock grant v2";

/// What a proof is about: one grant or ticket of one client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GrantSubject<'a> {
    /// The holder.
    pub client: u32,
    /// The lock's kind.
    pub kind: LockKind,
    /// What is held: a grant in a mode or a ticket ([`Held::Reference`] needs no proof).
    pub held: Held,
    /// The lock's partition (0 on a standalone server).
    pub partition: u16,
    /// The epoch the grant was made at: the server's on a standalone server, the partition's
    /// in a cluster.
    pub epoch: u32,
    /// The grant's fencing token (0 for a ticket).
    pub token: u64,
    /// Fair locks: the ticket granted under or queued with (zero otherwise).
    pub ticket: Ticket,
    /// The lock's name.
    pub name: &'a [u8],
}

/// The proof of `subject` under `key`.
pub fn grant_proof(key: &SessionKey, mac: SessionMac, subject: &GrantSubject<'_>) -> GrantProof {
    let s = subject;
    let name_len = (s.name.len().min(usize::from(u16::MAX)) as u16).to_le_bytes();
    let tag = mac(
        key,
        &[
            GRANT_DOMAIN,
            &s.client.to_le_bytes(),
            &[s.kind as u8, s.held.code()],
            &s.partition.to_le_bytes(),
            &s.epoch.to_le_bytes(),
            &s.token.to_le_bytes(),
            &s.ticket.exclusive.to_le_bytes(),
            &s.ticket.shared.to_le_bytes(),
            &name_len,
            s.name,
        ],
    );
    let mut proof = GrantProof {
        epoch: s.epoch,
        mac: [0; GrantProof::LEN],
    };
    proof.mac.copy_from_slice(&tag[..GrantProof::LEN]);
    proof
}

/// Whether `proof` proves `subject` under `key` (compared in constant time). The subject's
/// epoch is the proof's own: a claim names the incarnation that granted.
pub fn proves(
    key: &SessionKey,
    mac: SessionMac,
    subject: &GrantSubject<'_>,
    proof: &GrantProof,
) -> bool {
    !proof.is_none() && grant_proof(key, mac, subject) == *proof
}

impl Server<'_> {
    /// The proof of what result `r` of lock command `c` gave client `raw_client`: a grant
    /// (`Success` to a trylock or ticket retry) or a fair-lock ticket (`Eagain` to one, outside
    /// an all-or-nothing message, where `Eagain` means "undone"). [`GrantProof::NONE`] for
    /// anything else, and always without a session key, which costs one branch.
    #[inline]
    pub(super) fn proof_of(
        &self,
        raw_client: u32,
        c: &LockCommand,
        r: &CommandResult,
        all_or_nothing: bool,
    ) -> GrantProof {
        let Some((key, mac)) = &self.session_key else {
            return GrantProof::NONE;
        };
        self.proof_with(key, *mac, raw_client, c, r, all_or_nothing)
    }

    #[cold]
    fn proof_with(
        &self,
        key: &SessionKey,
        mac: SessionMac,
        raw_client: u32,
        c: &LockCommand,
        r: &CommandResult,
        all_or_nothing: bool,
    ) -> GrantProof {
        if !matches!(
            c.op,
            LockOp::TryExclusive
                | LockOp::TryShared
                | LockOp::TicketExclusive
                | LockOp::TicketShared
        ) {
            return GrantProof::NONE;
        }
        let mode = c.op.mode();
        let fair = c.kind == LockKind::Fair;
        let (held, token, ticket) = match r.status {
            Status::Success => {
                let held = match mode {
                    Mode::Exclusive => Held::Exclusive,
                    Mode::Shared => Held::Shared,
                };
                // The client files a fair grant under the ticket the reply word carries.
                let ticket = match fair {
                    true => fair::FairWord::from_bits(r.word).counters(),
                    false => Ticket::default(),
                };
                (held, r.aux, ticket)
            }
            Status::Eagain if fair && !all_or_nothing => {
                let ticket = Ticket {
                    exclusive: r.aux as u16,
                    shared: (r.aux >> 16) as u16,
                };
                (Held::Ticketed(mode), 0, ticket)
            }
            _ => return GrantProof::NONE,
        };
        let Some(id) = LockId::from_raw(c.lock) else {
            return GrantProof::NONE;
        };
        let Some(name) = self.t.lock_names.get(id.index() as usize) else {
            return GrantProof::NONE;
        };
        // A standalone server's lock is in partition 0, granted at the server's epoch; a
        // cluster lock in its name's partition, at the partition's epoch (the one the request
        // named: a cluster server serves a command only at exactly that epoch).
        let partition = self.lock_partition(id.index());
        let subject = GrantSubject {
            client: raw_client,
            kind: c.kind,
            held,
            partition,
            epoch: self.proof_epoch(partition),
            token,
            ticket,
            name: name.name(),
        };
        grant_proof(key, mac, &subject)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Mode;
    use crate::ids::tests::GOOD_KEY;
    use crate::server::tests::test_mac;

    fn subject() -> GrantSubject<'static> {
        GrantSubject {
            client: 77,
            kind: LockKind::Fair,
            held: Held::Exclusive,
            partition: 5,
            epoch: 3,
            token: crate::FencingToken::cluster(3, 9).0,
            ticket: Ticket {
                exclusive: 4,
                shared: 2,
            },
            name: b"orders/rg-17",
        }
    }

    #[test]
    fn a_proof_proves_its_subject_and_nothing_else_bound_into_it() {
        let key = SessionKey::new(GOOD_KEY).unwrap();
        let s = subject();
        let p = grant_proof(&key, test_mac, &s);
        assert!(proves(&key, test_mac, &s, &p));
        assert_eq!(p.epoch, 3);
        let others = [
            GrantSubject { client: 78, ..s },
            GrantSubject {
                kind: LockKind::Atomic,
                ..s
            },
            GrantSubject {
                held: Held::Shared,
                ..s
            },
            GrantSubject {
                held: Held::Ticketed(Mode::Exclusive),
                ..s
            },
            GrantSubject { epoch: 4, ..s },
            GrantSubject {
                epoch: 3 + (1 << 16),
                ..s
            },
            GrantSubject { partition: 6, ..s },
            GrantSubject {
                token: s.token + 1,
                ..s
            },
            GrantSubject {
                ticket: Ticket {
                    exclusive: 5,
                    shared: 2,
                },
                ..s
            },
            GrantSubject {
                name: b"orders/rg-18",
                ..s
            },
        ];
        for other in others {
            assert!(!proves(&key, test_mac, &other, &p), "{other:?}");
            assert!(!proves(
                &key,
                test_mac,
                &s,
                &grant_proof(&key, test_mac, &other)
            ));
        }
        let mut other_key = GOOD_KEY;
        other_key[0] ^= 1;
        let other_key = SessionKey::new(other_key).unwrap();
        assert!(!proves(&other_key, test_mac, &s, &p), "another key");
        assert!(!proves(&key, test_mac, &s, &GrantProof::NONE));
        assert_eq!(format!("{p:?}"), "GrantProof(epoch 3, ..)");
    }

    /// A proof a protocol-4 server made (`"dlock grant v1"`, a `u16` epoch, no partition) is
    /// not a proof of the same grant now, whatever partition it is checked for.
    #[test]
    fn a_v1_proof_never_verifies_as_v2() {
        let key = SessionKey::new(GOOD_KEY).unwrap();
        let s = GrantSubject {
            partition: 0,
            ..subject()
        };
        let tag = test_mac(
            &key,
            &[
                b"dlock grant v1",
                &s.client.to_le_bytes(),
                &[s.kind as u8, s.held.code()],
                &(s.epoch as u16).to_le_bytes(),
                &s.token.to_le_bytes(),
                &s.ticket.exclusive.to_le_bytes(),
                &s.ticket.shared.to_le_bytes(),
                &(s.name.len() as u16).to_le_bytes(),
                s.name,
            ],
        );
        let mut v1 = GrantProof {
            epoch: s.epoch,
            mac: [0; GrantProof::LEN],
        };
        v1.mac.copy_from_slice(&tag[..GrantProof::LEN]);
        for partition in [0, 1, 5, u16::MAX] {
            let subject = GrantSubject { partition, ..s };
            assert!(
                !proves(&key, test_mac, &subject, &v1),
                "partition {partition}"
            );
        }
        assert!(proves(&key, test_mac, &s, &grant_proof(&key, test_mac, &s)));
    }
}
