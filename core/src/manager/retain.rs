//! Locks retained for recovery: a dead writer's grants stay held until its work is replayed.
//!
//! When a node dies in the middle of writing pages, its locks must not simply go: a reader
//! granted the lock next would read what the dead writer half wrote. The VMS lock manager and
//! the Linux DLM keep a dead node's locks out of reach until its recovery is done (the DLM's
//! lock recovery, GFS2's journal replay under the dead node's locks), and Db2 pureScale's
//! "retained locks" stay held by a failed member until its crash recovery releases them. Here a
//! grant marked retain-on-death (the request flag `RETAIN`, [`GrantState::retains`]) outlives
//! its holder, held by the dead client, until a recoverer calls `recovery_done(dead client)`.
//!
//! # One grant, when its client leaves ([`at_departure`])
//!
//! | departure                                   | the grant                | then                              |
//! |---------------------------------------------|--------------------------|-----------------------------------|
//! | `client_deinit` (graceful)                  | any                      | released                          |
//! | died (lease ran out, evicted, connection gone and not resumed) | retain-on-death | kept, plain: `Retain(state.plain() with retain)` |
//! | died                                        | any other grant          | released                          |
//! | either                                      | a ticket                 | dropped (a queued request, not a grant) |
//!
//! A kept grant loses its cached mark and any outstanding revoke: a dead client gives nothing
//! back, so revoking it is pointless, and the revoke decision reads a dead holder's grant as
//! `Retained` whatever its bits. The lock keeps the dead client's reference, so its slot and
//! name stay. An exclusive holder's death invalidates the lock's value block whether or not the
//! grant is retained ([`super::LockValue::grant_lost`]).
//!
//! # The dead client's slot ([`Life`])
//!
//! | slot             | event                                         | next                         |
//! |------------------|-----------------------------------------------|------------------------------|
//! | live             | deinit, or dies with no grant kept            | free                         |
//! | live             | dies with a grant kept                        | `Retaining`                  |
//! | `Retaining`      | `recovery_done` by a recoverer                | free, its retained grants released |
//! | `Retaining`      | `recovery_done` from a client without the role | unchanged; refused, counted  |
//! | `Retaining`      | its id re-registers (`client_reinit`)          | refused: `ClientRemovedByServer` |
//! | `Retaining`      | lease sweep, peer-cap eviction                 | unchanged: no lease, never evicted |
//!
//! A retaining slot **counts against its peer's registration cap** and is never evicted to make
//! room. The integration spec left this open; the reason is the trust model's "no peer fills
//! the client table": a peer that crashes in a loop while holding retained locks would
//! otherwise leave an uncounted retaining slot per crash until the table is full. A crash-looping
//! engine is then refused new registrations (`ServerNoResource`) until its recoverer catches
//! up, which is the back-pressure it needs anyway. A retaining slot cannot resume: the client
//! that died learns it lost its grants (the retained ones are the recoverer's to release), as
//! it does today when its lease has run out.
//!
//! # `recovery_done(dead)` ([`recovery_done`])
//!
//! | caller's role | target                    | outcome                                   |
//! |---------------|---------------------------|-------------------------------------------|
//! | not recoverer | any                       | `Einval`, counted (`recovery_done_refused`) |
//! | recoverer     | no such client            | `ClientNotInit`                           |
//! | recoverer     | a live client             | `Einval` (a live client releases by itself) |
//! | recoverer     | a retaining client        | `Success`: released, slot freed           |
//!
//! The role is checked first, so a client without it learns nothing about which clients are
//! retaining. Who has the role is the runtime's decision (a configured list, a TLS certificate
//! name under `--recoverer`, in-process clients when the operator says so), never the client's
//! claim; the core takes it as a [`Role`]. `ListRetained` needs the same role.

use super::grant::GrantState;
use crate::status::Status;
use crate::table::ClientState;

/// How a client left the server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Departure {
    /// `client_deinit`: it gave everything up.
    Deinit,
    /// Its lease ran out, it was evicted, or its connection was lost and never resumed.
    Died,
}

/// What becomes of one grant when its client leaves ([`at_departure`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub enum AtDeparture {
    /// Release it (unlock it for the client) or drop the ticket.
    Release,
    /// Keep it, held by the dead client in this state, until `recovery_done`.
    Retain(GrantState),
    /// Nothing was held.
    Nothing,
}

/// The rule for one grant (module doc: the first table).
#[inline]
pub const fn at_departure(state: GrantState, how: Departure) -> AtDeparture {
    match (state.grant_mode(), how) {
        (Some(mode), Departure::Died) if state.retains() => {
            AtDeparture::Retain(GrantState::granted(mode, false, true))
        }
        _ if state.is_none() => AtDeparture::Nothing,
        _ => AtDeparture::Release,
    }
}

/// Who is asking, as the runtime decided it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// An ordinary client.
    Client,
    /// A client the server's configuration names as a recoverer.
    Recoverer,
}

/// The stage of a client entry that matters here (module doc: the slot table).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Life {
    /// Registered and heard from.
    Active,
    /// Its connection was lost; it may come back within its lease.
    Abnormal,
    /// Re-syncing with a recovering server.
    Recovering,
    /// Dead, keeping retained grants until `recovery_done`.
    Retaining,
}

impl Life {
    /// The stage of a live entry in `state`; `None` for a free one.
    #[inline]
    pub const fn of(state: ClientState) -> Option<Life> {
        match state {
            ClientState::Free => None,
            ClientState::Active => Some(Life::Active),
            ClientState::Abnormal => Some(Life::Abnormal),
            ClientState::Recovering => Some(Life::Recovering),
            ClientState::Retaining => Some(Life::Retaining),
        }
    }

    /// The slot after its client leaves: retaining if a grant was kept, else free (`None`).
    #[inline]
    pub const fn after_departure(how: Departure, kept_any: bool) -> Option<Life> {
        match (how, kept_any) {
            (Departure::Died, true) => Some(Life::Retaining),
            _ => None,
        }
    }

    /// Whether silence declares the client dead: a retaining client is dead already.
    #[inline]
    pub const fn lease_runs(self) -> bool {
        !matches!(self, Life::Retaining)
    }

    /// Whether the per-peer cap may evict this entry to make room for its peer's new
    /// registration: only an abnormal one, as today; never a retaining one.
    #[inline]
    pub const fn evictable(self) -> bool {
        matches!(self, Life::Abnormal)
    }

    /// Whether the entry counts against its peer's registration cap: every one (module doc).
    #[inline]
    pub const fn counts_against_peer_cap(self) -> bool {
        true
    }

    /// Whether a `client_reinit` may resume it.
    #[inline]
    pub const fn resumable(self) -> bool {
        !matches!(self, Life::Retaining)
    }
}

/// What a `recovery_done` does ([`recovery_done`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub enum RecoveryDone {
    /// Release every retained grant of the target and free its slot (`Success`).
    Release,
    /// The caller has no recoverer role: `Einval`, and count it (`recovery_done_refused`).
    Unauthorised,
    /// Refused for the target: `ClientNotInit` (none) or `Einval` (alive).
    Refused(Status),
}

impl RecoveryDone {
    /// The status the caller is answered.
    #[inline]
    pub const fn status(self) -> Status {
        match self {
            RecoveryDone::Release => Status::Success,
            RecoveryDone::Unauthorised => Status::Einval,
            RecoveryDone::Refused(s) => s,
        }
    }
}

/// `recovery_done` for a target in `target` (`None`: no client has that id) from a caller with
/// `role` (module doc: the last table).
#[inline]
pub const fn recovery_done(role: Role, target: Option<Life>) -> RecoveryDone {
    match (role, target) {
        (Role::Client, _) => RecoveryDone::Unauthorised,
        (Role::Recoverer, None) => RecoveryDone::Refused(Status::ClientNotInit),
        (Role::Recoverer, Some(Life::Retaining)) => RecoveryDone::Release,
        (Role::Recoverer, Some(_)) => RecoveryDone::Refused(Status::Einval),
    }
}

/// Whether a caller with `role` may list retained locks (`ListRetained`).
#[inline]
pub const fn may_list_retained(role: Role) -> bool {
    matches!(role, Role::Recoverer)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::Mode;
    use GrantState as G;

    #[test]
    fn a_death_keeps_exactly_the_retain_grants_plain() {
        for state in GrantState::ALL {
            let got = at_departure(state, Departure::Died);
            match (state.grant_mode(), state.retains()) {
                (Some(mode), true) => {
                    let kept = GrantState::granted(mode, false, true);
                    assert_eq!(got, AtDeparture::Retain(kept), "{state:?}");
                    assert!(!kept.is_cached() && !kept.revoke_outstanding() && kept.retains());
                }
                _ if state.is_none() => assert_eq!(got, AtDeparture::Nothing),
                _ => assert_eq!(got, AtDeparture::Release, "{state:?}"),
            }
        }
    }

    #[test]
    fn a_graceful_deinit_releases_everything() {
        for state in GrantState::ALL {
            let want = match state {
                G::None => AtDeparture::Nothing,
                _ => AtDeparture::Release,
            };
            assert_eq!(at_departure(state, Departure::Deinit), want, "{state:?}");
        }
    }

    #[test]
    fn tickets_of_the_dead_are_dropped_not_retained() {
        for mode in [Mode::Exclusive, Mode::Shared] {
            let t = GrantState::ticketed(mode);
            assert_eq!(at_departure(t, Departure::Died), AtDeparture::Release);
        }
    }

    #[test]
    fn a_slot_retains_only_when_a_death_kept_a_grant() {
        assert_eq!(
            Life::after_departure(Departure::Died, true),
            Some(Life::Retaining)
        );
        assert_eq!(Life::after_departure(Departure::Died, false), None);
        assert_eq!(Life::after_departure(Departure::Deinit, true), None);
        assert_eq!(Life::after_departure(Departure::Deinit, false), None);
    }

    #[test]
    fn a_retaining_slot_has_no_lease_is_never_evicted_and_cannot_resume() {
        let lives = [
            Life::Active,
            Life::Abnormal,
            Life::Recovering,
            Life::Retaining,
        ];
        for life in lives {
            let retaining = life == Life::Retaining;
            assert_eq!(life.lease_runs(), !retaining, "{life:?}");
            assert_eq!(life.resumable(), !retaining, "{life:?}");
            assert_eq!(life.evictable(), life == Life::Abnormal, "{life:?}");
            assert!(life.counts_against_peer_cap(), "{life:?}");
        }
        assert_eq!(Life::of(ClientState::Free), None);
        assert_eq!(Life::of(ClientState::Abnormal), Some(Life::Abnormal));
    }

    #[test]
    fn recovery_done_releases_only_for_a_recoverer_and_a_retaining_target() {
        let targets = [
            None,
            Some(Life::Active),
            Some(Life::Abnormal),
            Some(Life::Recovering),
            Some(Life::Retaining),
        ];
        for target in targets {
            let got = recovery_done(Role::Recoverer, target);
            let want = match target {
                None => RecoveryDone::Refused(Status::ClientNotInit),
                Some(Life::Retaining) => RecoveryDone::Release,
                Some(_) => RecoveryDone::Refused(Status::Einval),
            };
            assert_eq!(got, want, "{target:?}");
        }
        assert_eq!(
            recovery_done(Role::Recoverer, Some(Life::Retaining)).status(),
            Status::Success
        );
    }

    #[test]
    fn recovery_done_without_the_role_is_refused_counted_and_tells_nothing() {
        for target in [None, Some(Life::Active), Some(Life::Retaining)] {
            let got = recovery_done(Role::Client, target);
            assert_eq!(got, RecoveryDone::Unauthorised, "{target:?}");
            assert_eq!(
                got.status(),
                Status::Einval,
                "the same answer whatever the target"
            );
        }
        assert!(may_list_retained(Role::Recoverer) && !may_list_retained(Role::Client));
    }
}
