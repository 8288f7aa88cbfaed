//! The endpoint record both sides exchange out of band (over the TCP control connection) before
//! their queue pairs can talk: the verbs address of a queue pair and, from a server, where its
//! object cells are and the key to reach them.
//!
//! Fixed 56-byte little-endian layout, written and read by hand so that the format is the same
//! on every build and a malformed record is an error, never a panic:
//!
//! | offset | type     | field                                                        |
//! |--------|----------|--------------------------------------------------------------|
//! | 0      | u32      | magic [`ENDPOINT_MAGIC`]                                     |
//! | 4      | u8       | version [`ENDPOINT_VERSION`]                                 |
//! | 5      | u8       | flags: bit 0 GID present, bit 1 object table present         |
//! | 6      | u8       | path MTU as `ibv_mtu` (1 = 256 B … 5 = 4096 B)               |
//! | 7      | u8       | reserved, 0                                                  |
//! | 8      | u16      | LID                                                          |
//! | 10     | u16      | reserved, 0                                                  |
//! | 12     | u32      | queue pair number (24 bits)                                  |
//! | 16     | u32      | first packet sequence number (24 bits)                       |
//! | 20     | u32      | object cells (0 without a table)                             |
//! | 24     | [u8; 16] | GID, network order (0 without)                               |
//! | 40     | u64      | address of object cell 0 (0 without a table)                 |
//! | 48     | u32      | rkey of the object cells (0 without a table)                 |
//! | 52     | u32      | reserved, 0                                                  |
//!
//! Reserved bytes must be zero so that a later version can give them a meaning and still tell
//! old records apart.

use super::{CELL_BYTES, RdmaError};

/// Bytes in an encoded [`Endpoint`].
pub const ENDPOINT_LEN: usize = 56;
/// First word of an endpoint record: next in the reference's magic series (control
/// `0xedf7c94a`, data `0xedf7c94b`).
pub const ENDPOINT_MAGIC: u32 = 0xedf7_c94c;
/// Version of the record, and of the protocol on the queue pair it connects. 2: a credit
/// return has receive slots of its own and the server holds a client's requests behind its
/// events (`credit.rs`); a peer of version 1 counts neither, and could wait for ever on one of
/// 2, so the records refuse each other and the client uses TCP (as against a server without
/// RDMA).
pub const ENDPOINT_VERSION: u8 = 2;

const FLAG_GID: u8 = 1 << 0;
const FLAG_OBJECTS: u8 = 1 << 1;
/// Queue pair numbers and PSNs are 24-bit quantities on the wire.
const U24_MAX: u32 = (1 << 24) - 1;

/// Where a server's object cells are, as a client needs it for one-sided operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ObjectTable {
    /// Virtual address of cell 0 in the server's registered memory (8-byte aligned).
    pub addr: u64,
    /// The remote key of the registration covering exactly the cells.
    pub rkey: u32,
    /// Number of 8-byte cells.
    pub cells: u32,
}

/// One side's half of a queue-pair connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// Queue pair number (24 bits).
    pub qp_num: u32,
    /// Local identifier of the port (InfiniBand; 0 on RoCE).
    pub lid: u16,
    /// The port's GID, when it routes with a global routing header (always on RoCE).
    pub gid: Option<[u8; 16]>,
    /// First packet sequence number this side sends (24 bits).
    pub psn: u32,
    /// Active path MTU of the port as `ibv_mtu` (1..=5); the connection uses the smaller.
    pub mtu: u8,
    /// The server's object cells; `None` from a client.
    pub objects: Option<ObjectTable>,
}

impl Endpoint {
    /// Encodes the record.
    pub fn to_bytes(&self) -> [u8; ENDPOINT_LEN] {
        let mut b = [0u8; ENDPOINT_LEN];
        b[0..4].copy_from_slice(&ENDPOINT_MAGIC.to_le_bytes());
        b[4] = ENDPOINT_VERSION;
        b[5] = if self.gid.is_some() { FLAG_GID } else { 0 }
            | if self.objects.is_some() {
                FLAG_OBJECTS
            } else {
                0
            };
        b[6] = self.mtu;
        b[8..10].copy_from_slice(&self.lid.to_le_bytes());
        b[12..16].copy_from_slice(&self.qp_num.to_le_bytes());
        b[16..20].copy_from_slice(&self.psn.to_le_bytes());
        if let Some(gid) = self.gid {
            b[24..40].copy_from_slice(&gid);
        }
        if let Some(t) = self.objects {
            b[20..24].copy_from_slice(&t.cells.to_le_bytes());
            b[40..48].copy_from_slice(&t.addr.to_le_bytes());
            b[48..52].copy_from_slice(&t.rkey.to_le_bytes());
        }
        b
    }

    /// Decodes and checks a record received from a peer.
    pub fn from_bytes(b: &[u8]) -> Result<Self, RdmaError> {
        let b: &[u8; ENDPOINT_LEN] = b
            .try_into()
            .map_err(|_| RdmaError::BadEndpoint("length is not 56 bytes"))?;
        let u16_at = |o: usize| u16::from_le_bytes([b[o], b[o + 1]]);
        let u32_at = |o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let u64_at = |o: usize| u64::from(u32_at(o)) | u64::from(u32_at(o + 4)) << 32;

        if u32_at(0) != ENDPOINT_MAGIC {
            return Err(RdmaError::BadEndpoint("bad magic"));
        }
        if b[4] != ENDPOINT_VERSION {
            return Err(RdmaError::BadEndpoint("unknown version"));
        }
        let flags = b[5];
        if flags & !(FLAG_GID | FLAG_OBJECTS) != 0 {
            return Err(RdmaError::BadEndpoint("unknown flags"));
        }
        if b[7] != 0 || u16_at(10) != 0 || u32_at(52) != 0 {
            return Err(RdmaError::BadEndpoint("reserved bytes are not zero"));
        }
        let mtu = b[6];
        if !(1..=5).contains(&mtu) {
            return Err(RdmaError::BadEndpoint("path MTU is not 1..=5"));
        }
        let (qp_num, psn) = (u32_at(12), u32_at(16));
        if qp_num > U24_MAX || psn > U24_MAX {
            return Err(RdmaError::BadEndpoint("QP number or PSN exceeds 24 bits"));
        }
        let gid_bytes: [u8; 16] = b[24..40].try_into().unwrap_or([0; 16]);
        let gid = if flags & FLAG_GID != 0 {
            Some(gid_bytes)
        } else if gid_bytes != [0; 16] {
            return Err(RdmaError::BadEndpoint("GID bytes without the GID flag"));
        } else {
            None
        };
        let table = ObjectTable {
            addr: u64_at(40),
            rkey: u32_at(48),
            cells: u32_at(20),
        };
        let objects = if flags & FLAG_OBJECTS != 0 {
            check_table(&table)?;
            Some(table)
        } else if table
            != (ObjectTable {
                addr: 0,
                rkey: 0,
                cells: 0,
            })
        {
            return Err(RdmaError::BadEndpoint("object table without its flag"));
        } else {
            None
        };
        Ok(Endpoint {
            qp_num,
            lid: u16_at(8),
            gid,
            psn,
            mtu,
            objects,
        })
    }
}

/// The checks a client relies on before it turns a cell index into a remote address.
fn check_table(t: &ObjectTable) -> Result<(), RdmaError> {
    if t.cells == 0 {
        return Err(RdmaError::BadEndpoint("object table has no cells"));
    }
    if !t.addr.is_multiple_of(CELL_BYTES as u64) {
        return Err(RdmaError::BadEndpoint(
            "object cells are not 8-byte aligned",
        ));
    }
    let bytes = u64::from(t.cells) * CELL_BYTES as u64;
    if t.addr.checked_add(bytes).is_none() {
        return Err(RdmaError::BadEndpoint(
            "object table wraps the address space",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server() -> Endpoint {
        Endpoint {
            qp_num: 0x00ab_cdef,
            lid: 0x1234,
            gid: Some([0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8]),
            psn: 0x0012_3456,
            mtu: 5,
            objects: Some(ObjectTable {
                addr: 0x7f00_1234_5000,
                rkey: 0xdead_beef,
                cells: 102_400,
            }),
        }
    }

    fn client() -> Endpoint {
        Endpoint {
            qp_num: 17,
            lid: 3,
            gid: None,
            psn: 0,
            mtu: 3,
            objects: None,
        }
    }

    #[test]
    fn endpoint_round_trips_with_and_without_optional_parts() {
        for ep in [server(), client()] {
            let bytes = ep.to_bytes();
            assert_eq!(Endpoint::from_bytes(&bytes), Ok(ep));
        }
    }

    #[test]
    fn layout_is_fixed_little_endian() {
        let b = server().to_bytes();
        assert_eq!(&b[0..4], &[0x4c, 0xc9, 0xf7, 0xed]);
        assert_eq!((b[4], b[5], b[6], b[7]), (2, 0b11, 5, 0));
        assert_eq!(&b[8..10], &[0x34, 0x12]);
        assert_eq!(&b[12..16], &[0xef, 0xcd, 0xab, 0x00]);
        assert_eq!(&b[16..20], &[0x56, 0x34, 0x12, 0x00]);
        assert_eq!(&b[20..24], &102_400u32.to_le_bytes());
        assert_eq!(&b[24..26], &[0xfe, 0x80]);
        assert_eq!(&b[40..48], &0x7f00_1234_5000u64.to_le_bytes());
        assert_eq!(&b[48..52], &[0xef, 0xbe, 0xad, 0xde]);
        assert_eq!(&b[52..56], &[0; 4]);
        // A client record carries no GID and no table: those bytes stay zero.
        let c = client().to_bytes();
        assert_eq!(c[5], 0);
        assert!(c[20..24].iter().chain(&c[24..56]).all(|&x| x == 0));
    }

    #[test]
    fn wrong_length_is_rejected() {
        let b = client().to_bytes();
        for len in [0, 55, 57] {
            let mut v = b.to_vec();
            v.resize(len, 0);
            assert!(matches!(
                Endpoint::from_bytes(&v),
                Err(RdmaError::BadEndpoint(_))
            ));
        }
    }

    /// Every malformed record is refused with `BadEndpoint`, and none panics.
    #[test]
    fn malformed_fields_are_rejected() {
        type Patch = fn(&mut [u8; ENDPOINT_LEN]);
        let patches: &[(&str, Patch)] = &[
            ("magic", |b| b[0] ^= 1),
            ("version", |b| b[4] = 3),
            // A peer of the credit protocol before credit returns had slots of their own.
            ("version 1", |b| b[4] = 1),
            ("flags", |b| b[5] |= 0x80),
            ("reserved 7", |b| b[7] = 1),
            ("reserved 10", |b| b[11] = 1),
            ("reserved 52", |b| b[55] = 1),
            ("mtu 0", |b| b[6] = 0),
            ("mtu 6", |b| b[6] = 6),
            ("qp 25 bits", |b| b[15] = 1),
            ("psn 25 bits", |b| b[19] = 1),
            ("no cells", |b| b[20..24].fill(0)),
            ("misaligned", |b| b[40] |= 4),
            ("wraps", |b| {
                b[40..48].copy_from_slice(&(u64::MAX - 7).to_le_bytes())
            }),
            ("gid without flag", |b| b[5] &= !FLAG_GID),
            ("table without flag", |b| b[5] &= !FLAG_OBJECTS),
        ];
        for (what, patch) in patches {
            let mut b = server().to_bytes();
            patch(&mut b);
            assert!(
                matches!(Endpoint::from_bytes(&b), Err(RdmaError::BadEndpoint(_))),
                "{what} was accepted"
            );
        }
    }

    /// Any 56 bytes decode to an error or to a record that encodes back to the same bytes.
    #[test]
    fn decode_is_total_and_canonical() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let base = server().to_bytes();
        for _ in 0..20_000 {
            let mut b = base;
            // Flip a few random bytes of a valid record (xorshift keeps this dependency-free).
            for _ in 0..3 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                b[(x % ENDPOINT_LEN as u64) as usize] = (x >> 32) as u8;
            }
            if let Ok(ep) = Endpoint::from_bytes(&b) {
                assert_eq!(ep.to_bytes(), b);
            }
        }
    }
}
