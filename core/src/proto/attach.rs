//! The attach record: how a second channel (a TCP data connection, an RDMA queue pair) is bound
//! to a registered client.
//!
//! | off | type       | field                                                              |
//! |-----|------------|--------------------------------------------------------------------|
//! | 0   | u32        | magic: [`ATTACH_MAGIC`] (TCP data) or the RDMA attach magic         |
//! | 4   | u32        | client id, from the registration's reply                           |
//! | 8   | [u8; 16]   | session secret, from the registration's reply ([`Session`])         |
//!
//! A TCP data connection starts with exactly this record and is answered with a `u32` status;
//! an RDMA attach carries the client's queue-pair endpoint after it. The server binds the
//! channel only if the session is the registration's secret; a wrong one is refused, counted and
//! the connection closed.

use super::{DecodeError, get_array, get_u32};
use crate::ids::Session;

/// First word of a TCP data connection's attach record.
pub const ATTACH_MAGIC: u32 = 0xedf7_c94c;
/// Bytes of the attach record.
pub const ATTACH_LEN: usize = 8 + Session::LEN;

/// A decoded attach record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attach {
    /// The first word: which kind of channel is being attached.
    pub magic: u32,
    /// The client the channel is for.
    pub client: u32,
    /// The proof that the sender registered as `client`.
    pub session: Session,
}

impl Attach {
    /// The record's bytes.
    pub fn encode(&self) -> [u8; ATTACH_LEN] {
        let mut b = [0u8; ATTACH_LEN];
        b[0..4].copy_from_slice(&self.magic.to_le_bytes());
        b[4..8].copy_from_slice(&self.client.to_le_bytes());
        b[8..].copy_from_slice(&self.session.0);
        b
    }

    /// Reads the record at the start of `buf` (bytes after it are the caller's); `Truncated`
    /// while fewer than [`ATTACH_LEN`] bytes have arrived. The magic is the caller's to check.
    pub fn decode(buf: &[u8]) -> Result<Self, DecodeError> {
        Ok(Self {
            magic: get_u32(buf, 0)?,
            client: get_u32(buf, 4)?,
            session: Session(get_array(buf, 8)?),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_attach_record_round_trips_and_a_short_one_is_truncated() {
        let a = Attach {
            magic: ATTACH_MAGIC,
            client: 0x0102_0304,
            session: Session([0xA5; Session::LEN]),
        };
        let b = a.encode();
        assert_eq!(Attach::decode(&b), Ok(a));
        assert_eq!(
            Attach::decode(&b[..ATTACH_LEN - 1]),
            Err(DecodeError::Truncated)
        );
    }
}
