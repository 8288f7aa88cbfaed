//! Who a connection's peer is, for the per-peer cap on registrations
//! (`dlock_core::server::peers`, [`Config::clients_per_peer`](dlock_core::Config::clients_per_peer)).
//!
//! | connection | the peer is | why |
//! |---|---|---|
//! | TCP under TLS | the client certificate's public key (its SubjectPublicKeyInfo) | what the handshake proved the peer holds. A subject name is a label a CA may give many certificates (a fleet issued one `CN=dlock-client`), and an address is shared behind NAT; a key is one holder's. A renewed certificate with the same key stays the same peer. |
//! | plaintext TCP, IPv4 | the address | nothing else identifies it |
//! | plaintext TCP, IPv6 | the address's /64 | one host commonly holds a whole /64: per address, it could register without bound |
//! | Unix socket (another process on this host) | exempt | the socket and the region are owner-only (0600): whoever can connect can map the region and act as any local client, so a cap would bind nobody |
//! | in-process (embedded) | exempt | the engine itself |
//!
//! One consequence under TLS: processes that share one certificate and key share one cap; give
//! each engine host a key of its own, or raise `clients_per_peer_max`.
//!
//! The state machine stores a 32-bit tag per registration. Tags are a keyed hash (SipHash with
//! keys drawn from the OS at start, `RandomState`) of the identity, so no peer can pick an
//! identity whose tag lands on another peer's and use up its cap. Two peers whose tags collide
//! by chance (about 1 in 10,000 at 1,000 distinct peers) share a cap, which costs them room,
//! never access.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::net::IpAddr;

use dlock_core::Peer;

/// Derives peers' tags under a key drawn when the server starts.
#[derive(Debug, Default)]
pub(super) struct Peers(RandomState);

impl Peers {
    /// The peer of a plaintext TCP connection from `ip`.
    pub(super) fn of_address(&self, ip: IpAddr) -> Peer {
        match ip.to_canonical() {
            IpAddr::V4(v4) => self.tag(b'4', &v4.octets()),
            IpAddr::V6(v6) => self.tag(b'6', &v6.octets()[..8]),
        }
    }

    /// The peer of a TLS connection whose client certificate has the DER-encoded
    /// SubjectPublicKeyInfo `spki`.
    pub(super) fn of_key(&self, spki: &[u8]) -> Peer {
        self.tag(b'k', spki)
    }

    /// The tag of `identity`, of kind `kind` (so an address and a key never share a tag but by
    /// chance).
    fn tag(&self, kind: u8, identity: &[u8]) -> Peer {
        let h = self.0.hash_one((kind, identity));
        Peer::remote((h ^ (h >> 32)) as u32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ipv6_host_is_one_peer_across_its_slash_64() {
        let p = Peers::default();
        let a: IpAddr = "2001:db8:1:2::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:ffff::9".parse().unwrap();
        let other: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        assert_eq!(p.of_address(a), p.of_address(b));
        assert_ne!(p.of_address(a), p.of_address(other));
    }

    #[test]
    fn a_mapped_ipv4_address_is_the_ipv4_peer() {
        let p = Peers::default();
        let v4: IpAddr = "192.0.2.7".parse().unwrap();
        let mapped: IpAddr = "::ffff:192.0.2.7".parse().unwrap();
        assert_eq!(p.of_address(v4), p.of_address(mapped));
        assert_ne!(p.of_address(v4), p.of_address("192.0.2.8".parse().unwrap()));
    }

    #[test]
    fn no_remote_peer_is_exempt() {
        let p = Peers::default();
        assert!(!p.of_key(b"").is_exempt());
        assert!(!p.of_address("127.0.0.1".parse().unwrap()).is_exempt());
        assert!(!Peer::remote(0).is_exempt());
    }
}
