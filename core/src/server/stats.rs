//! Server counters: the reference's debug statistics that still mean something here, plus the
//! throughput and liveness counters an operator of dlock wants.
//!
//! Plain `u64`s, written only by the thread that runs the state machine; a reader elsewhere gets
//! a copy through `Server::stats`.

/// One counter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(usize)]
#[non_exhaustive]
pub enum Counter {
    /// Control requests handled.
    ControlRequests,
    /// Data messages handled.
    DataMessages,
    /// Data commands executed.
    DataCommands,
    /// Grants issued (every kind and mode).
    Grants,
    /// Grants that displaced an expired or timed-out holder.
    Preemptions,
    /// Fair-lock requests queued with a ticket (`DLOCK_EAGAIN`).
    Eagain,
    /// Requests refused as malformed or invalid (`DLOCK_EINVAL`).
    Einval,
    /// Requests from unknown clients.
    ClientNotInit,
    /// Lock commands on a lock the client did not get (or a stale id).
    LockNotGet,
    /// Lock operations the lock word refused (`DLOCK_FAIL`).
    Fail,
    /// Requests answered `DLOCK_NOT_READY` during recovery.
    NotReady,
    /// Requests refused because a table was full.
    NoResource,
    /// Object commands on an object the client did not get.
    ObjectNotGet,
    /// Compare-and-swap misses.
    ObjectCasFailed,
    /// Clients registered.
    ClientsRegistered,
    /// Clients declared dead after their lease ran out.
    ClientsExpired,
    /// Abnormal clients evicted to make room.
    ClientsEvicted,
    /// Clients that left with `client_deinit`.
    ClientsDeinit,
    /// Blocking lock requests parked on the server.
    Waits,
    /// Parked requests answered `Etimeout`.
    WaitTimeouts,
    /// Reinits and channel attaches that showed a wrong session secret.
    SessionsRefused,
    /// Registrations that asked for a lease above `client_lease_max_ms` and got the maximum.
    LeasesCapped,
    /// Connections closed because a frame (or the handshake) did not complete in time, or a
    /// reply could not be written in time (transport).
    ConnectionsTimedOut,
    /// Unregistered connections closed to make room for a new one at the cap (transport).
    ConnectionsEvicted,
    /// Connections refused: at the cap with nothing to evict, or out of file descriptors
    /// (transport).
    ConnectionsRefused,
    /// Connections whose client expired, was evicted or deinitialised; from then on they count
    /// as unregistered and are closed after the handshake timeout (transport).
    ConnectionsOfGoneClients,
    /// TLS handshakes refused: the peer sent no client certificate (transport).
    TlsNoClientCert,
    /// TLS handshakes refused: the client certificate is not signed by the configured CA (transport).
    TlsUnknownCa,
    /// TLS handshakes refused: the client certificate has expired (transport).
    TlsExpired,
    /// TLS handshakes refused: the client certificate is revoked by the configured CRL (transport).
    TlsRevoked,
    /// TLS handshakes refused: another certificate problem (bad signature, wrong usage, malformed) (transport).
    TlsBadCertificate,
    /// TLS handshakes refused: the peer does not speak TLS 1.3 (transport).
    TlsProtocolVersion,
    /// TLS handshakes refused: no cipher suite in common (the default is TLS_AES_256_GCM_SHA384 only) (transport).
    TlsNoCommonCipher,
    /// Connections to a TLS listener whose first bytes were not TLS (a plaintext peer) (transport).
    TlsNotTls,
    /// TLS handshakes that failed for any other reason (malformed records, a peer that hung up) (transport).
    TlsOther,
    /// Clients a recovering server expects to re-sync (`recovery_clients`).
    RecoveryExpected,
    /// Clients that re-registered with a recovering server (`client_reinit`).
    RecoveryReregistered,
    /// Re-registered clients that finished re-syncing (`reinit_done`).
    RecoveryDone,
    /// Grants and fair tickets restored from the clients' claims.
    RecoveryLocksRestored,
    /// Expected clients given up on: their lease ran out while re-syncing, or the recovery
    /// deadline passed before they finished.
    RecoveryClientsGivenUp,
    // Counters added later go here, at the end, so that every earlier one keeps its index (the
    // C header's `debug_stats_code` numbers them).
    /// Registrations refused because their peer already held `clients_per_peer_max` of them.
    ClientsRefusedPeerCap,
    /// TLS handshakes refused: the client certificate is not valid yet (its start date is in
    /// the future: a clock or an issuance problem, not an old certificate) (transport).
    TlsNotYetValid,
    /// TLS handshake steps the control thread put off to a later turn of its loop, so that the
    /// established connections' requests were served first (a burst of new connections)
    /// (transport).
    TlsHandshakesDeferred,
    /// Commands and names answered `PartitionMoved` (cluster: not owned here at the epoch
    /// named, or fenced).
    PartitionMoved,
    /// Of those, answered because this server fenced itself (its authority lapsed).
    Fenced,
    /// Partitions this server owns under its applied map (a gauge, set at each map).
    PartitionsOwned,
    /// Owned partitions still recovering from a takeover (a gauge, set at each tick).
    PartitionsRecovering,
    /// Epoch renewals asked for (a partition's token counter ran half out).
    TokenRenewals,
    /// Counter high-water-mark reservations asked for.
    CounterReservations,
    /// Grants kept, retained, when their holder died (`manager::retain`).
    LocksRetained,
    /// Retained grants released by a recoverer's `recovery_done`. `locks_retained` minus this
    /// is how many are retained now.
    RetainedReleased,
    /// `recovery_done` (and `ListRetained`) calls refused: the caller has no recoverer role.
    RecoveryDoneRefused,
    /// Requests refused (or, waiting, answered at their deadline) `DLOCK_LOCK_RETAINED`: a dead
    /// client's retained grant was in the way.
    LockRetained,
    /// Clients registered now (a gauge, read from the client table at each `Stats`).
    ClientsActive,
    /// Lock slots in use now (a gauge, read from the lock table at each `Stats`).
    LocksInUse,
    /// The version of the cluster map this server applied (a gauge; 0: standalone, or none yet).
    MapVersion,
    /// Milliseconds since etcd stopped answering this server's agent; 0 while it answers (a
    /// gauge, transport: the cluster thread sets it from the membership's status).
    EtcdUnreachableMs,
    /// Milliseconds since the agent sent its last confirmed keepalive round, the one its
    /// authority counts from; `u64::MAX` while none was confirmed (a gauge, transport). Past
    /// the lease TTL minus the drift margin the server fences itself.
    KeepaliveAgeMs,
    /// 1 while this server's agent is the cluster's elected coordinator (a gauge, transport).
    Coordinator,
    /// 1 once this server asked to be drained (a gauge, transport).
    Draining,
    /// Revokes sent to cached holders (`server/revokes.rs`): one per holder and grant.
    RevokesSent,
    /// Revoked grants given back with an unlock.
    RevokesGivenBack,
    /// Exclusive grants turned shared (`LockOp::Downgrade`), revoked or not.
    Downgrades,
    /// Revoked grants released by the server because their holder did not give them back
    /// within the revoke timeout (as at the end of a lease).
    RevokesLapsed,
    /// Clients the recovering partitions still await a `ReclaimDone` from, summed over the
    /// partitions (a client awaited in ten partitions counts ten; a gauge, set at each tick).
    ReclaimAwaited,
    /// The most clients any one recovering partition still awaits (a gauge): the partition
    /// that ends its recovery last, unless its grace deadline comes first.
    ReclaimAwaitedMax,
    /// Recovering partitions that await their grace deadline whatever their clients say: the
    /// old owner's client ids could not be read, or did not fit the table of awaited clients
    /// (a gauge).
    ReclaimUntracked,
    /// `ReclaimDone` and `ReclaimDones` messages taken (one each, whatever the partitions it
    /// names).
    ReclaimDoneMessages,
    /// Grants made plain to requests that asked for a cached one, because the lock was fought
    /// over within the contention window (`manager::contention`): each is told so in its
    /// result (protocol 8) or by a revoke notice (older clients).
    ContendedGrants,
    /// Acquisitions that found a conflicting cached grant still inside its minimum hold
    /// (`manager::revoke`'s `RevokeAt`), so were refused or parked until the hold ends rather
    /// than revoking it: one per request that met a hold, however many holders it met and
    /// whether it was parked or refused — a parked request is counted at the first of its
    /// attempts that met one, not again at its later retries, and the timer that sends the
    /// revokes a refused request left due counts nothing. Each retry a client sends itself
    /// is a request of its own. With a minimum hold of 0 it stays 0.
    MinHoldConflicts,
}

impl Counter {
    /// Whether a transport keeps this counter (connections, TLS handshakes): the state machine
    /// only carries it in its `Stats` reply ([`super::Server::set_counter`]).
    pub const fn is_transport(self) -> bool {
        matches!(
            self,
            Counter::ConnectionsTimedOut
                | Counter::ConnectionsEvicted
                | Counter::ConnectionsRefused
                | Counter::ConnectionsOfGoneClients
                | Counter::TlsNoClientCert
                | Counter::TlsUnknownCa
                | Counter::TlsExpired
                | Counter::TlsRevoked
                | Counter::TlsBadCertificate
                | Counter::TlsProtocolVersion
                | Counter::TlsNoCommonCipher
                | Counter::TlsNotTls
                | Counter::TlsOther
                | Counter::TlsNotYetValid
                | Counter::TlsHandshakesDeferred
                | Counter::EtcdUnreachableMs
                | Counter::KeepaliveAgeMs
                | Counter::Coordinator
                | Counter::Draining
        )
    }

    /// Whether this counter is a level that goes up and down (a gauge, for Prometheus) rather
    /// than a count that only grows.
    pub const fn is_gauge(self) -> bool {
        matches!(
            self,
            Counter::RecoveryExpected
                | Counter::PartitionsOwned
                | Counter::PartitionsRecovering
                | Counter::ReclaimAwaited
                | Counter::ReclaimAwaitedMax
                | Counter::ReclaimUntracked
                | Counter::ClientsActive
                | Counter::LocksInUse
                | Counter::MapVersion
                | Counter::EtcdUnreachableMs
                | Counter::KeepaliveAgeMs
                | Counter::Coordinator
                | Counter::Draining
        )
    }

    /// Number of counters.
    pub const COUNT: usize = Counter::MinHoldConflicts as usize + 1;

    /// Every counter, in index order.
    pub const ALL: [Counter; Self::COUNT] = [
        Counter::ControlRequests,
        Counter::DataMessages,
        Counter::DataCommands,
        Counter::Grants,
        Counter::Preemptions,
        Counter::Eagain,
        Counter::Einval,
        Counter::ClientNotInit,
        Counter::LockNotGet,
        Counter::Fail,
        Counter::NotReady,
        Counter::NoResource,
        Counter::ObjectNotGet,
        Counter::ObjectCasFailed,
        Counter::ClientsRegistered,
        Counter::ClientsExpired,
        Counter::ClientsEvicted,
        Counter::ClientsDeinit,
        Counter::Waits,
        Counter::WaitTimeouts,
        Counter::SessionsRefused,
        Counter::LeasesCapped,
        Counter::ConnectionsTimedOut,
        Counter::ConnectionsEvicted,
        Counter::ConnectionsRefused,
        Counter::ConnectionsOfGoneClients,
        Counter::TlsNoClientCert,
        Counter::TlsUnknownCa,
        Counter::TlsExpired,
        Counter::TlsRevoked,
        Counter::TlsBadCertificate,
        Counter::TlsProtocolVersion,
        Counter::TlsNoCommonCipher,
        Counter::TlsNotTls,
        Counter::TlsOther,
        Counter::RecoveryExpected,
        Counter::RecoveryReregistered,
        Counter::RecoveryDone,
        Counter::RecoveryLocksRestored,
        Counter::RecoveryClientsGivenUp,
        Counter::ClientsRefusedPeerCap,
        Counter::TlsNotYetValid,
        Counter::TlsHandshakesDeferred,
        Counter::PartitionMoved,
        Counter::Fenced,
        Counter::PartitionsOwned,
        Counter::PartitionsRecovering,
        Counter::TokenRenewals,
        Counter::CounterReservations,
        Counter::LocksRetained,
        Counter::RetainedReleased,
        Counter::RecoveryDoneRefused,
        Counter::LockRetained,
        Counter::ClientsActive,
        Counter::LocksInUse,
        Counter::MapVersion,
        Counter::EtcdUnreachableMs,
        Counter::KeepaliveAgeMs,
        Counter::Coordinator,
        Counter::Draining,
        Counter::RevokesSent,
        Counter::RevokesGivenBack,
        Counter::Downgrades,
        Counter::RevokesLapsed,
        Counter::ReclaimAwaited,
        Counter::ReclaimAwaitedMax,
        Counter::ReclaimUntracked,
        Counter::ReclaimDoneMessages,
        Counter::ContendedGrants,
        Counter::MinHoldConflicts,
    ];

    /// A stable snake-case name for printing.
    pub const fn name(self) -> &'static str {
        match self {
            Counter::ControlRequests => "control_requests",
            Counter::DataMessages => "data_messages",
            Counter::DataCommands => "data_commands",
            Counter::Grants => "grants",
            Counter::Preemptions => "preemptions",
            Counter::Eagain => "eagain",
            Counter::Einval => "einval",
            Counter::ClientNotInit => "client_not_init",
            Counter::LockNotGet => "lock_not_get",
            Counter::Fail => "fail",
            Counter::NotReady => "not_ready",
            Counter::NoResource => "no_resource",
            Counter::ObjectNotGet => "object_not_get",
            Counter::ObjectCasFailed => "object_cas_failed",
            Counter::ClientsRegistered => "clients_registered",
            Counter::ClientsExpired => "clients_expired",
            Counter::ClientsEvicted => "clients_evicted",
            Counter::ClientsDeinit => "clients_deinit",
            Counter::Waits => "waits",
            Counter::WaitTimeouts => "wait_timeouts",
            Counter::SessionsRefused => "sessions_refused",
            Counter::LeasesCapped => "leases_capped",
            Counter::ConnectionsTimedOut => "connections_timed_out",
            Counter::ConnectionsEvicted => "connections_evicted",
            Counter::ConnectionsRefused => "connections_refused",
            Counter::ConnectionsOfGoneClients => "connections_of_gone_clients",
            Counter::TlsNoClientCert => "tls_no_client_cert",
            Counter::TlsUnknownCa => "tls_unknown_ca",
            Counter::TlsExpired => "tls_expired",
            Counter::TlsRevoked => "tls_revoked",
            Counter::TlsBadCertificate => "tls_bad_certificate",
            Counter::TlsProtocolVersion => "tls_protocol_version",
            Counter::TlsNoCommonCipher => "tls_no_common_cipher",
            Counter::TlsNotTls => "tls_not_tls",
            Counter::TlsOther => "tls_other",
            Counter::RecoveryExpected => "recovery_expected",
            Counter::RecoveryReregistered => "recovery_reregistered",
            Counter::RecoveryDone => "recovery_done",
            Counter::RecoveryLocksRestored => "recovery_locks_restored",
            Counter::RecoveryClientsGivenUp => "recovery_clients_given_up",
            Counter::ClientsRefusedPeerCap => "clients_refused_peer_cap",
            Counter::TlsNotYetValid => "tls_not_yet_valid",
            Counter::TlsHandshakesDeferred => "tls_handshakes_deferred",
            Counter::PartitionMoved => "partition_moved",
            Counter::Fenced => "fenced",
            Counter::PartitionsOwned => "partitions_owned",
            Counter::PartitionsRecovering => "partitions_recovering",
            Counter::TokenRenewals => "token_renewals",
            Counter::CounterReservations => "counter_reservations",
            Counter::LocksRetained => "locks_retained",
            Counter::RetainedReleased => "retained_released",
            Counter::RecoveryDoneRefused => "recovery_done_refused",
            Counter::LockRetained => "lock_retained",
            Counter::ClientsActive => "clients_active",
            Counter::LocksInUse => "locks_in_use",
            Counter::MapVersion => "map_version",
            Counter::EtcdUnreachableMs => "etcd_unreachable_ms",
            Counter::KeepaliveAgeMs => "keepalive_age_ms",
            Counter::Coordinator => "coordinator",
            Counter::Draining => "draining",
            Counter::RevokesSent => "revokes_sent",
            Counter::RevokesGivenBack => "revokes_given_back",
            Counter::Downgrades => "downgrades",
            Counter::RevokesLapsed => "revokes_lapsed",
            Counter::ReclaimAwaited => "reclaim_awaited",
            Counter::ReclaimAwaitedMax => "reclaim_awaited_max",
            Counter::ReclaimUntracked => "reclaim_untracked",
            Counter::ReclaimDoneMessages => "reclaim_done_messages",
            Counter::ContendedGrants => "contended_grants",
            Counter::MinHoldConflicts => "min_hold_conflicts",
        }
    }
}

// Every counter fits a `Stats` reply: one past the limit made every reply unencodable, and
// `dlock stat` read a closed connection.
const _: () = assert!(Counter::COUNT <= crate::proto::COUNTERS_MAX);

/// The counter set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stats(pub [u64; Counter::COUNT]);

impl Default for Stats {
    fn default() -> Self {
        Stats([0; Counter::COUNT])
    }
}

impl Stats {
    /// Adds one.
    #[inline]
    pub fn bump(&mut self, c: Counter) {
        self.0[c as usize] += 1;
    }

    /// Adds `n`.
    #[inline]
    pub fn add(&mut self, c: Counter, n: u64) {
        self.0[c as usize] += n;
    }

    /// Reads one counter.
    #[inline]
    pub fn get(&self, c: Counter) -> u64 {
        self.0[c as usize]
    }

    /// Counts an error status under its counter (successes and unlisted codes are not counted).
    #[inline]
    pub fn count_status(&mut self, s: crate::Status) {
        use crate::Status as S;
        let c = match s {
            S::Eagain => Counter::Eagain,
            S::Einval => Counter::Einval,
            S::ClientNotInit => Counter::ClientNotInit,
            S::LockNotGet => Counter::LockNotGet,
            S::Fail => Counter::Fail,
            S::NotReady => Counter::NotReady,
            S::ServerNoResource | S::ObjectTooMany => Counter::NoResource,
            S::ObjectNotGet => Counter::ObjectNotGet,
            S::ObjectCasFailed => Counter::ObjectCasFailed,
            S::PartitionMoved => Counter::PartitionMoved,
            S::LockRetained => Counter::LockRetained,
            _ => return,
        };
        self.bump(c);
    }
}
