//! The RDMA attach exchange: how a registered client and a server trade [`Endpoint`]s over TCP.
//!
//! A client registers over its TCP control connection as every TCP client does, then opens a
//! second TCP connection to the same listener and sends one [`AttachRecord`]. Its first word,
//! [`RDMA_ATTACH_MAGIC`], tells the control thread this is neither a control connection
//! (`CONTROL_MAGIC`) nor a TCP data connection (`ATTACH_MAGIC`). The server checks the session
//! secret exactly as it does for a TCP data connection, and answers with a status word and, on
//! success, its own endpoint; then it closes the connection. The queue pairs carry everything
//! after that.
//!
//! Request, 80 bytes, little-endian: the attach record of `dlock_core::proto::Attach`, then the
//! endpoint.
//!
//! | offset | type     | field                                     |
//! |--------|----------|-------------------------------------------|
//! | 0      | u32      | magic [`RDMA_ATTACH_MAGIC`]               |
//! | 4      | u32      | client id                                 |
//! | 8      | [u8; 16] | session secret from the init reply        |
//! | 24     | [u8; 56] | the client's [`Endpoint`] (no object table) |
//!
//! Reply: a `u32` status (`dlock_core::Status` code), followed only when it is 0 by the server's
//! 56-byte [`Endpoint`] (which carries the object table). A non-zero status is the last thing on
//! the connection:
//!
//! | status | meaning | what the client does |
//! |---|---|---|
//! | `CLIENT_NOT_INIT` | unknown client or wrong session secret | fails, as a refused TCP attach |
//! | `SERVER_NOT_INIT` | the server runs without RDMA (no device, or not configured) | uses TCP |
//! | `SERVER_NO_RESOURCE` | the server could not create or connect a queue pair | uses TCP |
//!
//! A malformed request (bad endpoint record, a client record carrying an object table) gets no
//! reply: the connection is closed, as for any bytes that cannot start a frame.

use dlock_core::Session;
use dlock_core::proto::{ATTACH_LEN, Attach};

use super::RdmaError;
use super::endpoint::{ENDPOINT_LEN, Endpoint};

/// First word of an RDMA attach request; next in the reference's magic series after the TCP
/// attach header (`0xedf7c94c`, which the endpoint record's own magic shares: an endpoint record
/// never starts a connection, so the two are never confused).
pub const RDMA_ATTACH_MAGIC: u32 = 0xedf7_c94d;
/// Bytes of an attach request.
pub const RDMA_ATTACH_LEN: usize = ATTACH_LEN + ENDPOINT_LEN;
/// Bytes of a successful attach reply: status 0 and the server's endpoint.
pub const RDMA_ATTACH_REPLY_LEN: usize = 4 + ENDPOINT_LEN;

/// What a client sends to attach its queue pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttachRecord {
    /// The client id the init reply gave.
    pub client: u32,
    /// The session secret the init reply gave: proves the sender registered as `client`.
    pub session: Session,
    /// The client's queue pair.
    pub endpoint: Endpoint,
}

impl AttachRecord {
    /// Encodes the request.
    pub fn to_bytes(&self) -> [u8; RDMA_ATTACH_LEN] {
        let mut b = [0u8; RDMA_ATTACH_LEN];
        let prefix = Attach {
            magic: RDMA_ATTACH_MAGIC,
            client: self.client,
            session: self.session,
        };
        b[..ATTACH_LEN].copy_from_slice(&prefix.encode());
        b[ATTACH_LEN..].copy_from_slice(&self.endpoint.to_bytes());
        b
    }

    /// Decodes and checks a request from a peer: the magic, the exact length, a well-formed
    /// endpoint, and no object table (only a server has one to advertise).
    pub fn from_bytes(b: &[u8]) -> Result<Self, RdmaError> {
        let b: &[u8; RDMA_ATTACH_LEN] = b
            .try_into()
            .map_err(|_| RdmaError::BadEndpoint("attach request is not 80 bytes"))?;
        let prefix =
            Attach::decode(b).map_err(|_| RdmaError::BadEndpoint("attach request is truncated"))?;
        if prefix.magic != RDMA_ATTACH_MAGIC {
            return Err(RdmaError::BadEndpoint("attach request has a bad magic"));
        }
        let endpoint = Endpoint::from_bytes(&b[ATTACH_LEN..])?;
        if endpoint.objects.is_some() {
            return Err(RdmaError::BadEndpoint(
                "a client endpoint carries an object table",
            ));
        }
        Ok(AttachRecord {
            client: prefix.client,
            session: prefix.session,
            endpoint,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rdma::ObjectTable;

    fn record() -> AttachRecord {
        AttachRecord {
            client: 0x0102_0304,
            session: Session([0x11; Session::LEN]),
            endpoint: Endpoint {
                qp_num: 0x12_3456,
                lid: 7,
                gid: None,
                psn: 99,
                mtu: 4,
                objects: None,
            },
        }
    }

    #[test]
    fn attach_record_round_trips_little_endian() {
        let r = record();
        let b = r.to_bytes();
        assert_eq!(&b[0..4], &[0x4d, 0xc9, 0xf7, 0xed]);
        assert_eq!(&b[4..8], &[4, 3, 2, 1]);
        assert_eq!(&b[8..ATTACH_LEN], &[0x11; Session::LEN]);
        assert_eq!(AttachRecord::from_bytes(&b), Ok(r));
    }

    #[test]
    fn attach_record_refuses_wrong_length_magic_and_endpoint() {
        let b = record().to_bytes();
        for len in [0, ATTACH_LEN, RDMA_ATTACH_LEN - 1, RDMA_ATTACH_LEN + 1] {
            let mut v = b.to_vec();
            v.resize(len, 0);
            assert!(AttachRecord::from_bytes(&v).is_err(), "length {len}");
        }
        let mut bad = b;
        bad[0] ^= 1;
        assert!(AttachRecord::from_bytes(&bad).is_err(), "magic");
        let mut bad = b;
        bad[ATTACH_LEN] ^= 1; // the endpoint's own magic
        assert!(AttachRecord::from_bytes(&bad).is_err(), "endpoint magic");
        let mut bad = b;
        bad[ATTACH_LEN + 6] = 9; // path MTU out of range
        assert!(AttachRecord::from_bytes(&bad).is_err(), "endpoint mtu");
    }

    #[test]
    fn a_client_cannot_advertise_an_object_table() {
        let mut r = record();
        r.endpoint.objects = Some(ObjectTable {
            addr: 0x1000,
            rkey: 1,
            cells: 1,
        });
        assert!(matches!(
            AttachRecord::from_bytes(&r.to_bytes()),
            Err(RdmaError::BadEndpoint(_))
        ));
    }
}
