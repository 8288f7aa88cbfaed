//! What a client is built from: [`ClientConfig`].

use std::time::Duration;

use dlock_core::proto::PROTO_VERSION;

use super::{Endpoint, Mux};

/// How long a synchronous request may take before the client gives up (the reference's 5 s).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Client settings: [`ClientConfig::new`] and the `with_*` methods, or field by field.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ClientConfig {
    /// Where the server is.
    pub endpoint: Endpoint,
    /// The lease to ask for (zero: the server's default), in whole milliseconds. The server
    /// grants at most its maximum ([`Client::lease`](super::Client::lease) says what it
    /// granted). Heartbeat well within it.
    pub lease: Duration,
    /// The synchronous request timeout.
    pub timeout: Duration,
    /// How long a wait for a reply over shared memory stays awake (polling, then backing off
    /// and yielding) before it sleeps. A sleeping waiter is woken by a futex, which costs tens of
    /// microseconds; a waiter that stays awake sees a lock handed over within microseconds but
    /// keeps a core busy meanwhile. Default zero: the 20 µs every wait polls first (enough for
    /// any reply that is not a parked `lock()`), then sleep.
    pub wait_awake: Duration,
    /// A data connection to share with other clients of this process (TCP and TLS
    /// endpoints); `None`: a connection of its own.
    pub mux: Option<Mux>,
    /// A bound on the server's revoke timeout (`dlock serve --revoke-timeout-ms`); zero: none.
    /// The client uses its cached grants locally only within the revoke timeout of its last
    /// answered data request (`dlock_core::manager::trust`). A server of protocol 7 or later
    /// says its own at registration, and the client takes the shorter of the two
    /// ([`Client::revoke_timeout`](super::Client::revoke_timeout)); an older server says
    /// nothing, and then this, else the lease (the server's default), is what the client
    /// assumes — so set it to the server's value when an older server's is shorter than the
    /// lease.
    pub revoke_timeout: Duration,
    /// The newest protocol version the client registers with (default: the newest it speaks,
    /// [`PROTO_VERSION`]; a larger value means the same). An engine pins the wire version with
    /// it during a rolling upgrade: every node of the old release and the new keeps talking
    /// the old one until the last old node is gone, so that what a lock's holders are told
    /// does not depend on which release each runs — at 7, for instance, a cacheable request
    /// granted plain on a contended lock is told so by a revoke notice after the grant, as by a
    /// release before protocol 8, instead of by the grant's result. It bounds the versions a
    /// standalone server negotiates (the client still asks for at least 6); below 6 the client
    /// refuses to register (`Einval`). A cluster client registers at its own versions: its
    /// link asks every server of the cluster for the newest it speaks, whatever the cap, so
    /// that every server tells it the same.
    ///
    /// What a cap gives up. Below 8: a plain grant made to a cacheable request on a contended
    /// lock is not marked in its result; the server writes the client a revoke notice for it
    /// instead, one more event to read before the handle knows to give the lock back with its
    /// guard. Below 7: the server's revoke timeout is not told at registration, so the client
    /// trusts a cached grant for its lease (or [`ClientConfig::revoke_timeout`] when set), and
    /// the server, to match what it told, lets an ignored revoke of this client lapse only at
    /// the client's lease rather than at its own shorter revoke timeout: another client's
    /// request may wait up to that lease for a holder that stopped answering.
    pub version_max: u8,
}

impl ClientConfig {
    /// Defaults for `endpoint`: the server's lease, the reference's 5 s timeout.
    pub fn new(endpoint: Endpoint) -> Self {
        Self {
            endpoint,
            lease: Duration::ZERO,
            timeout: REQUEST_TIMEOUT,
            wait_awake: Duration::ZERO,
            mux: None,
            revoke_timeout: Duration::ZERO,
            version_max: PROTO_VERSION,
        }
    }

    /// Shares `mux`'s data connection with the other clients given it (see [`Mux`]).
    pub fn with_mux(mut self, mux: Mux) -> Self {
        self.mux = Some(mux);
        self
    }

    /// Asks for `lease` (see [`ClientConfig::lease`]).
    pub fn with_lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// Gives up a synchronous request after `timeout`.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Stays awake `awake` waiting for a shared-memory reply (see [`ClientConfig::wait_awake`]).
    pub fn with_wait_awake(mut self, awake: Duration) -> Self {
        self.wait_awake = awake;
        self
    }

    /// Trusts cached grants only `timeout` past the last answered data request (see
    /// [`ClientConfig::revoke_timeout`]).
    pub fn with_revoke_timeout(mut self, timeout: Duration) -> Self {
        self.revoke_timeout = timeout;
        self
    }

    /// Registers at protocol version `max` at most (see [`ClientConfig::version_max`]).
    pub fn with_version_max(mut self, max: u8) -> Self {
        self.version_max = max;
        self
    }

    /// The lease as the wire carries it, by the core's one rounding rule
    /// ([`dlock_core::time::duration_to_ms`]: rounded up, saturating).
    pub(super) fn lease_ms(&self) -> u32 {
        dlock_core::time::duration_to_ms(self.lease)
    }
}
