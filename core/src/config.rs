//! Capacities and server settings, checked once at start.
//!
//! Every limit is named `*_max` and the defaults are the reference's (§1.3 of
//! `shared/reference/dlock-reference.md`). Nothing is resized later: a full table is an
//! operating error reported to the client, never a panic and never a reallocation.

use crate::ids::SLOT_INDEX_LIMIT;
use crate::status::Status;
use crate::table::Layout;

/// Commands in one data message, keys in one control batch (`MAX_LOCK_BATCH_SIZE`).
pub const BATCH_MAX: usize = 31;
/// Longest lock or object name in bytes (`MAX_LOCK_DESC_LEN`). Names are never truncated.
pub const NAME_LEN_MAX: usize = 512;
/// Most servers one process may run (`MAX_NUM_SERVER`).
pub const SERVERS_MAX: usize = 32;
/// Default TCP port (`CONTROL_PORT_CLIENT`).
pub const DEFAULT_PORT: u16 = 21616;
/// Readers a fair lock admits at once (`rcnt` is 6 bits).
pub const FAIR_READERS_MAX: u8 = 63;

/// Server capacities and settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    /// Lock slots (reference: 51,200).
    pub locks_max: u32,
    /// Registered clients (reference: 1,000).
    pub clients_max: u32,
    /// `umo_atomic64` objects (reference: 102,400).
    pub objects_max: u32,
    /// The lease of a client that asks for none (0): a client not heard from for this long
    /// (heartbeat or any request) is declared dead and everything it held is released. The
    /// reference relies on ~114 s of TCP keepalive.
    pub client_lease_ms: u32,
    /// The longest lease the server grants: a client asking for more gets this (and the
    /// registration's reply says so). It bounds how long a killed client's locks stay held and
    /// how long a silent registration keeps a table entry.
    pub client_lease_max_ms: u32,
    /// Clients expected to re-sync after a failover; while they have not all reported
    /// `reinit_done`, every other request gets `NotReady`. 0 starts ready.
    pub recovery_clients: u32,
    /// Server incarnation, the high 16 bits of every fencing token. A server that replaces a
    /// failed one must be started with a larger epoch so it never issues a lower token.
    pub epoch: u16,
    /// How long a recovering server waits for the `recovery_clients` it expects, counted from
    /// its first `tick` (or first re-registration): when it passes, the server serves and
    /// treats every expected client that has not finished re-syncing as dead — the claims of
    /// one that never came back never arrive, and one still re-claiming becomes an ordinary
    /// client whose further claims are refused. 0 waits forever, as the reference does (one
    /// crashed client then keeps the whole service down).
    ///
    /// Keep it at least as long as the leases clients hold: a client that was paused across the
    /// failover still trusts its locks until its own lease runs out, and once the deadline
    /// passes the new server grants them to others (fencing tokens still rise, so storage that
    /// checks them refuses the stale holder).
    pub recovery_deadline_ms: u32,
    /// Registrations one remote peer may hold at once (`server::peers`): past it, its next
    /// `client_init` gets `ServerNoResource` (unless it has an abnormal client of its own to
    /// evict), so one peer cannot fill the table and lock everyone else out. 0 means half of
    /// `clients_max`, rounded up ([`Config::clients_per_peer`]). Local clients are not counted.
    pub clients_per_peer_max: u32,
    /// Cached grants: the minimum hold before a revoke, and how long a revoked holder has to
    /// give the lock back (`manager::revoke`).
    pub timing: crate::manager::Timing,
}

impl Config {
    /// The reference's capacities with a 5-second client lease (30 s at most), epoch 1, and a
    /// 10-second recovery deadline.
    pub const DEFAULT: Config = Config {
        locks_max: 51_200,
        clients_max: 1_000,
        objects_max: 102_400,
        client_lease_ms: 5_000,
        client_lease_max_ms: 30_000,
        recovery_clients: 0,
        epoch: 1,
        recovery_deadline_ms: 10_000,
        clients_per_peer_max: 0,
        timing: crate::manager::Timing::DEFAULT,
    };

    /// Shortest lease accepted: a client must be able to heartbeat within it.
    pub const CLIENT_LEASE_MIN_MS: u32 = 100;
    /// Most clients a server can register (bounds the per-client bitmaps).
    pub const CLIENTS_LIMIT: u32 = 65_536;

    /// Checks every field; `Err(Status::Einval)` names nothing, so the transport logs which field
    /// via [`Config::invalid_field`].
    pub fn validate(&self) -> Result<(), Status> {
        match self.invalid_field() {
            None => Ok(()),
            Some(_) => Err(Status::Einval),
        }
    }

    /// The first field that is out of range, with the rule it breaks.
    pub fn invalid_field(&self) -> Option<&'static str> {
        if self.locks_max == 0 || self.locks_max > SLOT_INDEX_LIMIT {
            return Some("locks_max must be in 1..=1048576");
        }
        if self.objects_max == 0 || self.objects_max > SLOT_INDEX_LIMIT {
            return Some("objects_max must be in 1..=1048576");
        }
        if self.clients_max == 0 || self.clients_max > Self::CLIENTS_LIMIT {
            return Some("clients_max must be in 1..=65536");
        }
        if self.client_lease_ms < Self::CLIENT_LEASE_MIN_MS {
            return Some("client_lease_ms must be at least 100");
        }
        if self.client_lease_max_ms < self.client_lease_ms {
            return Some("client_lease_max_ms must be at least client_lease_ms");
        }
        if self.recovery_clients > self.clients_max {
            return Some("recovery_clients must not exceed clients_max");
        }
        if self.epoch == 0 {
            return Some("epoch must be at least 1");
        }
        None
    }

    /// The most registrations one remote peer may hold: `clients_per_peer_max`, or half the
    /// client table when that is 0.
    ///
    /// Why half by default: it leaves room for at least one other peer whatever the first one
    /// does, and it serves an engine node whose every worker thread registers a client of its
    /// own (the C ABI gives each worker one) up to 500 workers at the reference's 1,000 clients,
    /// with no setting to change. A deployment that puts more of the table behind one address
    /// or certificate (many engine processes behind one NAT address, or sharing one
    /// certificate) raises it; `clients_max` or more turns the cap off.
    #[inline]
    pub const fn clients_per_peer(&self) -> u32 {
        match self.clients_per_peer_max {
            0 => self.clients_max.div_ceil(2),
            n => n,
        }
    }

    /// The lease granted to a client that asks for `asked_ms`: the default for 0, else the
    /// request within `[CLIENT_LEASE_MIN_MS, client_lease_max_ms]`. The server owns leases: a
    /// client may ask for less than the maximum, never more.
    #[inline]
    pub const fn grant_lease_ms(&self, asked_ms: u32) -> u32 {
        match asked_ms {
            0 => self.client_lease_ms,
            l if l < Self::CLIENT_LEASE_MIN_MS => Self::CLIENT_LEASE_MIN_MS,
            l if l > self.client_lease_max_ms => self.client_lease_max_ms,
            l => l,
        }
    }

    /// The exact number of bytes the region must have for these capacities.
    pub fn region_size(&self) -> Result<usize, Status> {
        self.validate()?;
        Ok(Layout::new(self).total)
    }
}

impl Default for Config {
    fn default() -> Self {
        Self::DEFAULT
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_reference_limits_and_valid() {
        let c = Config::default();
        assert_eq!(
            (c.locks_max, c.clients_max, c.objects_max),
            (51_200, 1_000, 102_400)
        );
        assert_eq!(c.validate(), Ok(()));
    }

    #[test]
    fn the_per_peer_cap_defaults_to_half_the_client_table() {
        let d = Config::default();
        assert_eq!(d.clients_per_peer(), 500);
        let small = Config {
            clients_max: 5,
            ..d
        };
        assert_eq!(small.clients_per_peer(), 3, "rounded up");
        let one = Config {
            clients_max: 1,
            ..d
        };
        assert_eq!(
            one.clients_per_peer(),
            1,
            "never 0: a peer can always register"
        );
        let set = Config {
            clients_per_peer_max: 7,
            ..d
        };
        assert_eq!(set.clients_per_peer(), 7);
    }

    #[test]
    fn granted_leases_stay_within_the_minimum_and_the_maximum() {
        let c = Config::default();
        assert_eq!(c.grant_lease_ms(0), c.client_lease_ms);
        assert_eq!(c.grant_lease_ms(1), Config::CLIENT_LEASE_MIN_MS);
        assert_eq!(c.grant_lease_ms(10_000), 10_000);
        assert_eq!(c.grant_lease_ms(u32::MAX), c.client_lease_max_ms);
    }

    #[test]
    fn out_of_range_fields_are_rejected() {
        let d = Config::default();
        for bad in [
            Config { locks_max: 0, ..d },
            Config {
                locks_max: SLOT_INDEX_LIMIT + 1,
                ..d
            },
            Config {
                clients_max: 0,
                ..d
            },
            Config {
                objects_max: 0,
                ..d
            },
            Config {
                client_lease_ms: 99,
                ..d
            },
            Config {
                client_lease_max_ms: d.client_lease_ms - 1,
                ..d
            },
            Config {
                recovery_clients: d.clients_max + 1,
                ..d
            },
            Config { epoch: 0, ..d },
        ] {
            assert_eq!(bad.validate(), Err(Status::Einval), "{bad:?}");
            assert!(bad.invalid_field().is_some());
            assert_eq!(bad.region_size(), Err(Status::Einval));
        }
    }
}
