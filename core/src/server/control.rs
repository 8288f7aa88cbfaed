//! Who a control connection speaks for, and what it may send: the rules a transport applies to
//! each control frame before the state machine sees it, kept beside the data path's
//! ([`route`](super::route)) so a simulator can run them too.
//!
//! A connection's first bytes decide its role (a control frame, a data attach, a queue-pair
//! attach: the transport's to tell apart). A control connection speaks for at most one client,
//! the one its first successful registration bound it to ([`ControlConn`]). [`ControlConn::admit`]
//! says what becomes of a frame of type `msg` naming client `c` in its header:
//!
//! | the connection        | the frame                                  | then                                  |
//! |-----------------------|--------------------------------------------|---------------------------------------|
//! | unbound               | `ClientInit`, `ClientReinit`, `ClientJoin` | run (a reinit or join shows the session) |
//! | unbound               | `Stats`, `GetMap`, `Drain`, `RecoveryDone`, `ListRetained` | run: none needs a registration (a drain's and a recoverer's authority are the transport's to give) |
//! | unbound               | anything else                              | close                                 |
//! | bound to `c`          | `ClientInit`, `ClientReinit`               | close: one registration per connection|
//! | bound to `c`          | anything else naming `c`                   | run                                   |
//! | bound to `c`          | a frame naming another id                  | close                                 |
//! | bound, `c` gone       | `ClientInit`, `ClientReinit`               | run: it may register again here       |
//! | bound, `c` gone       | `Stats`, `GetMap`, `Drain`, `RecoveryDone`, `ListRetained` naming `c` | run                  |
//! | bound, `c` gone       | anything else naming `c`                   | answer `ClientNotInit` ([`answer_gone`]) |
//! | bound, `c` gone       | a frame naming another id                  | close                                 |
//!
//! and what happens to the connection:
//!
//! | event                                              | then                                           |
//! |----------------------------------------------------|------------------------------------------------|
//! | a registration's reply registers client `r` on it  | bound to `r`, whatever it was; every other connection bound to `r`, gone or not, is closed ([`ControlConn::speaks_for`]): one control connection per client |
//! | `c` is no longer registered (deinit, expiry, eviction) | bound, `c` gone ([`ControlConn::client_gone`]) |
//!
//! Why: an unbound connection that could send anything but a registration would speak for a
//! client it is not; a bound one naming another id is lying, and the reference drops such
//! "hostile" connections too. A connection whose client is gone is answered `ClientNotInit`
//! without the state machine seeing the frame, since the id may be registered again by someone
//! else meanwhile; the answer (rather than a reset) tells the client why, and it may register
//! again on the same connection. How long an unbound or gone connection may hold its place is
//! the transport's (a timeout, and the first to go at the connection cap).
//!
//! # Control frames over a stream connection
//!
//! The members of a multiplexing client send their control frames over the stream connection
//! they share (a control frame's magic tells it from a data message), and each reply comes back
//! on it, so a thousand workers of one process cost the server one connection rather than a
//! thousand and one. (The first member registered before there was a shared connection, over
//! a control connection of its own, which it keeps.) A frame names its client in its header as
//! on a control connection; [`admit_on_stream`] says what becomes of it, taking the data path's
//! ownership rule ([`route::admit`](super::route::admit)) for the client it names:
//!
//! | the frame                      | the client it names                      | then                          |
//! |--------------------------------|------------------------------------------|-------------------------------|
//! | `ClientInit`, `ClientReinit`, `ClientJoin` | any (a reinit or join shows the session) | run; see below |
//! | `Stats`, `GetMap`              | any                                      | run                           |
//! | anything else                  | bound to this connection                 | run                           |
//! | anything else                  | registered, not bound to this connection | close, as for a data message  |
//! | anything else                  | not registered                           | answer `ClientNotInit`        |
//!
//! A registration over a stream binds its client to that connection (it speaks for the client
//! from then on, as after a join) and makes the connection the client's control path: its
//! closing is the client's loss, as a control connection's is ([`Server::control_closed`] and
//! [`Server::stream_closed`](super::Server::stream_closed)), and a control connection still
//! bound to the client is closed (one control path per client). Registering needs nothing the
//! connection's peer could not get by opening a control connection, and counts toward that
//! peer's cap the same way.
//!
//! [`Server::control_closed`]: super::Server::control_closed

use super::route::Admission;
use crate::proto::{
    CONTROL_HEADER_LEN, ControlHeader, ControlResponse, EncodeError, MsgType,
    encode_control_response,
};
use crate::status::Status;

/// Who a control connection speaks for (module doc).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ControlConn {
    /// Nobody yet: it may register, or read the counters.
    #[default]
    Unbound,
    /// The client its registration registered.
    Bound(u32),
    /// The client it was bound to, no longer registered.
    Gone(u32),
}

/// What a transport does with a control frame ([`ControlConn::admit`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub enum ControlAdmission {
    /// Hand it to the state machine.
    Run,
    /// Answer it `ClientNotInit` without the state machine ([`answer_gone`]).
    AnswerGone,
    /// Close the connection.
    Close,
}

impl ControlConn {
    /// The admission rule (module doc) for a frame of type `msg` whose header names `client`.
    #[inline]
    pub const fn admit(self, msg: MsgType, client: u32) -> ControlAdmission {
        let registers = matches!(
            msg,
            MsgType::ClientInit | MsgType::ClientReinit | MsgType::ClientJoin
        );
        // Needing no registration: the counters, the map (a client fetches it first), an
        // operator's drain, and the recoverer's calls; the transport decides whom it trusts
        // with a drain (`proto::cluster`) and gives the recoverer role (`manager::retain`).
        let stats = matches!(
            msg,
            MsgType::Stats
                | MsgType::GetMap
                | MsgType::Drain
                | MsgType::RecoveryDone
                | MsgType::ListRetained
        );
        match self {
            ControlConn::Unbound if registers || stats => ControlAdmission::Run,
            ControlConn::Unbound => ControlAdmission::Close,
            ControlConn::Bound(_) if registers => ControlAdmission::Close,
            ControlConn::Gone(_) if registers => ControlAdmission::Run,
            ControlConn::Bound(id) | ControlConn::Gone(id) if client != id => {
                ControlAdmission::Close
            }
            ControlConn::Bound(_) => ControlAdmission::Run,
            ControlConn::Gone(_) if stats => ControlAdmission::Run,
            ControlConn::Gone(_) => ControlAdmission::AnswerGone,
        }
    }

    /// The connection after `client` stopped being registered: gone if it was bound to it.
    #[inline]
    #[must_use]
    pub const fn client_gone(self, client: u32) -> Self {
        match self {
            ControlConn::Bound(id) if id == client => ControlConn::Gone(id),
            other => other,
        }
    }

    /// The registered client the connection speaks for (not one that has gone since).
    #[inline]
    pub const fn serving(self) -> Option<u32> {
        match self {
            ControlConn::Bound(id) => Some(id),
            ControlConn::Unbound | ControlConn::Gone(_) => None,
        }
    }

    /// Whether a registration of `client` on another connection replaces this one: it is bound
    /// to `client`, gone or not.
    #[inline]
    pub const fn speaks_for(self, client: u32) -> bool {
        matches!(self, ControlConn::Bound(id) | ControlConn::Gone(id) if id == client)
    }
}

/// The rule for a control frame of type `msg` on a stream connection (module doc), given what
/// the data path's rule says of the client it names (`named`: [`route::admit`] for the
/// connection and that client).
///
/// [`route::admit`]: super::route::admit
#[inline]
pub const fn admit_on_stream(msg: MsgType, named: Admission) -> ControlAdmission {
    match (msg, named) {
        // A cluster client joins, and reads the map, over a shared connection as over a control
        // connection of its own: the same rule as there (`ControlConn::admit`).
        (
            MsgType::ClientInit
            | MsgType::ClientReinit
            | MsgType::ClientJoin
            | MsgType::Stats
            | MsgType::GetMap,
            _,
        ) => ControlAdmission::Run,
        (_, Admission::Execute { .. }) => ControlAdmission::Run,
        (_, Admission::Refuse) => ControlAdmission::AnswerGone,
        (_, Admission::Close) => ControlAdmission::Close,
    }
}

/// Writes into `out` the answer to a frame with header `header` from a connection whose client
/// is gone: `ClientNotInit`, echoing its type and message id, as the state machine would answer
/// a client it does not know. Returns its length ([`CONTROL_HEADER_LEN`]).
pub fn answer_gone(header: &ControlHeader, out: &mut [u8]) -> Result<usize, EncodeError> {
    let reply = ControlHeader {
        word: Status::ClientNotInit as u32,
        ..*header
    };
    encode_control_response(&reply, &ControlResponse::Empty, out)
}

/// The length of [`answer_gone`]'s answer.
pub const GONE_ANSWER_LEN: usize = CONTROL_HEADER_LEN;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::decode_control_response;

    const OTHER: [MsgType; 13] = [
        MsgType::ClientDeinit,
        MsgType::Heartbeat,
        MsgType::GetLock,
        MsgType::ReleaseLock,
        MsgType::BatchGetLock,
        MsgType::BatchReleaseLock,
        MsgType::ObjectCreate,
        MsgType::ObjectGet,
        MsgType::ObjectRelease,
        MsgType::ObjectDestroy,
        MsgType::ReinitDone,
        MsgType::BatchUpdateLocks,
        MsgType::Stats,
    ];

    #[test]
    fn an_unbound_connection_may_only_register_or_read_the_counters() {
        let c = ControlConn::default();
        assert_eq!(c, ControlConn::Unbound);
        for msg in [MsgType::ClientInit, MsgType::ClientReinit, MsgType::Stats] {
            assert_eq!(c.admit(msg, 5), ControlAdmission::Run, "{msg:?}");
        }
        for msg in OTHER.into_iter().filter(|&m| m != MsgType::Stats) {
            assert_eq!(c.admit(msg, 5), ControlAdmission::Close, "{msg:?}");
        }
        assert_eq!(c.serving(), None);
    }

    #[test]
    fn a_bound_connection_speaks_only_for_its_client_and_registers_once() {
        let c = ControlConn::Bound(7);
        assert_eq!(c.serving(), Some(7));
        for msg in [MsgType::ClientInit, MsgType::ClientReinit] {
            assert_eq!(c.admit(msg, 7), ControlAdmission::Close, "{msg:?}");
        }
        for msg in OTHER {
            assert_eq!(c.admit(msg, 7), ControlAdmission::Run, "{msg:?}");
            assert_eq!(
                c.admit(msg, 8),
                ControlAdmission::Close,
                "{msg:?} for another id"
            );
        }
    }

    #[test]
    fn a_gone_clients_connection_is_answered_until_it_registers_again() {
        let c = ControlConn::Bound(7).client_gone(7);
        assert_eq!(c, ControlConn::Gone(7));
        assert_eq!(c.serving(), None);
        for msg in [MsgType::ClientInit, MsgType::ClientReinit] {
            assert_eq!(c.admit(msg, 0), ControlAdmission::Run, "{msg:?}");
        }
        assert_eq!(c.admit(MsgType::Stats, 7), ControlAdmission::Run);
        assert_eq!(c.admit(MsgType::Stats, 8), ControlAdmission::Close);
        for msg in OTHER.into_iter().filter(|&m| m != MsgType::Stats) {
            assert_eq!(c.admit(msg, 7), ControlAdmission::AnswerGone, "{msg:?}");
            assert_eq!(
                c.admit(msg, 8),
                ControlAdmission::Close,
                "{msg:?} for another id"
            );
        }
    }

    #[test]
    fn an_operators_drain_needs_no_registration_on_a_control_connection_of_its_own() {
        assert_eq!(
            ControlConn::Unbound.admit(MsgType::Drain, 0),
            ControlAdmission::Run
        );
        assert_eq!(
            ControlConn::Gone(7).admit(MsgType::Drain, 7),
            ControlAdmission::Run
        );
        // Over a client's shared stream it is any other frame of the client's (and the state
        // machine refuses it: the transport answers drains on control connections only).
        for n in [Admission::Refuse, Admission::Close] {
            assert_ne!(admit_on_stream(MsgType::Drain, n), ControlAdmission::Run);
        }
    }

    #[test]
    fn only_the_client_a_connection_is_bound_to_can_be_gone_from_it() {
        assert_eq!(ControlConn::Bound(7).client_gone(8), ControlConn::Bound(7));
        assert_eq!(ControlConn::Unbound.client_gone(7), ControlConn::Unbound);
        assert_eq!(ControlConn::Gone(7).client_gone(7), ControlConn::Gone(7));
    }

    #[test]
    fn a_registration_replaces_every_connection_bound_to_its_client() {
        assert!(ControlConn::Bound(7).speaks_for(7));
        assert!(
            ControlConn::Gone(7).speaks_for(7),
            "gone, it still holds a place"
        );
        assert!(!ControlConn::Bound(7).speaks_for(8));
        assert!(!ControlConn::Unbound.speaks_for(0));
    }

    #[test]
    fn on_a_stream_anyone_may_register_join_or_read_the_counters_and_the_map() {
        let named = [
            Admission::Execute { slot: 3 },
            Admission::Refuse,
            Admission::Close,
        ];
        for msg in [
            MsgType::ClientInit,
            MsgType::ClientReinit,
            MsgType::ClientJoin,
            MsgType::Stats,
            MsgType::GetMap,
        ] {
            for n in named {
                assert_eq!(
                    admit_on_stream(msg, n),
                    ControlAdmission::Run,
                    "{msg:?} {n:?}"
                );
            }
        }
    }

    #[test]
    fn on_a_stream_other_frames_follow_the_data_paths_rule_for_their_client() {
        for msg in OTHER.into_iter().filter(|&m| m != MsgType::Stats) {
            let run = admit_on_stream(msg, Admission::Execute { slot: 3 });
            assert_eq!(run, ControlAdmission::Run, "{msg:?} of a member");
            let stranger = admit_on_stream(msg, Admission::Refuse);
            assert_eq!(stranger, ControlAdmission::AnswerGone, "{msg:?} of nobody");
            let other = admit_on_stream(msg, Admission::Close);
            assert_eq!(
                other,
                ControlAdmission::Close,
                "{msg:?} of another's client"
            );
        }
    }

    #[test]
    fn a_gone_clients_request_is_answered_client_not_init_with_its_id() {
        let header = ControlHeader {
            version: 4,
            msg: MsgType::GetLock,
            message_id: 77,
            word: 7,
        };
        let mut out = [0u8; GONE_ANSWER_LEN];
        assert_eq!(answer_gone(&header, &mut out), Ok(GONE_ANSWER_LEN));
        let reply = decode_control_response(&out).unwrap();
        assert_eq!(reply.header.msg, MsgType::GetLock);
        assert_eq!(reply.header.message_id, 77);
        assert_eq!(reply.header.status(), Some(Status::ClientNotInit));
    }
}
