//! Identifier newtypes and the small enums every layer shares.
//!
//! Ids handed to clients are 31-bit positive integers so they fit the C ABI's `int` and a
//! failed batch entry can still be reported as `<= 0`, as the reference does. Lock and object ids
//! pack a slot index and the slot's generation: when a slot is freed and reused the generation
//! moves on, so a client holding a stale id is refused instead of touching someone else's lock.

use core::num::NonZeroU32;

/// Bits of a lock or object id that hold the slot index (so `*_max` ≤ 2^20).
pub const SLOT_INDEX_BITS: u32 = 20;
/// Bits of a lock or object id that hold the slot generation.
pub const GENERATION_BITS: u32 = 11;
/// The largest slot index an id can carry, plus one.
pub const SLOT_INDEX_LIMIT: u32 = 1 << SLOT_INDEX_BITS;
/// Generations run `1..=GENERATION_MAX` and wrap to 1; 0 never appears, so no id is 0.
pub const GENERATION_MAX: u32 = (1 << GENERATION_BITS) - 1;

static_assertions::const_assert_eq!(SLOT_INDEX_BITS + GENERATION_BITS, 31);

/// The generation that follows `g` (wrapping past [`GENERATION_MAX`] to 1).
#[inline]
pub const fn next_generation(g: u32) -> u32 {
    if g >= GENERATION_MAX { 1 } else { g + 1 }
}

macro_rules! slot_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[repr(transparent)]
        pub struct $name(u32);

        impl $name {
            /// The id of slot `index` at `generation`. Panics (a bug, not bad input) when either
            /// is out of range: only the server makes ids.
            #[inline]
            pub const fn new(index: u32, generation: u32) -> Self {
                assert!(index < SLOT_INDEX_LIMIT);
                assert!(generation >= 1 && generation <= GENERATION_MAX);
                Self(generation << SLOT_INDEX_BITS | index)
            }

            /// Reads an id off the wire or the C ABI; `None` if it cannot be a valid id (zero,
            /// negative as an `int`, or generation 0). Whether the slot exists is the tables' call.
            #[inline]
            pub const fn from_raw(raw: u32) -> Option<Self> {
                let generation = (raw >> SLOT_INDEX_BITS) & GENERATION_MAX;
                if raw >> 31 != 0 || generation == 0 { None } else { Some(Self(raw)) }
            }

            /// The raw 31-bit value (what the wire and the C ABI carry).
            #[inline]
            pub const fn raw(self) -> u32 {
                self.0
            }

            /// The slot index.
            #[inline]
            pub const fn index(self) -> u32 {
                self.0 & (SLOT_INDEX_LIMIT - 1)
            }

            /// The slot generation this id was issued at.
            #[inline]
            pub const fn generation(self) -> u32 {
                self.0 >> SLOT_INDEX_BITS
            }
        }

        impl core::fmt::Display for $name {
            fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                write!(f, "{}#{}.{}", stringify!($name), self.index(), self.generation())
            }
        }
    };
}

slot_id!(
    /// A named lock, as returned by `get_lock`.
    LockId
);
slot_id!(
    /// A `umo_atomic64` object, as returned by object create/get.
    ObjectId
);

/// A registered client instance: a random non-zero 31-bit number chosen by the server.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(transparent)]
pub struct ClientId(NonZeroU32);

impl ClientId {
    /// Client ids are below this bound (31 bits, positive as a C `int`).
    pub const LIMIT: u32 = 1 << 31;

    /// `None` for 0 and for values that do not fit 31 bits.
    #[inline]
    pub const fn new(raw: u32) -> Option<Self> {
        if raw >= Self::LIMIT {
            return None;
        }
        match NonZeroU32::new(raw) {
            Some(v) => Some(Self(v)),
            None => None,
        }
    }

    /// The raw value.
    #[inline]
    pub const fn get(self) -> u32 {
        self.0.get()
    }
}

/// Who a registration came from, for the per-peer cap on registrations
/// ([`Config::clients_per_peer`](crate::Config::clients_per_peer)): a 32-bit tag the transport
/// derives from the peer's identity (a keyed hash of its certificate's key or its address), or
/// [`Peer::EXEMPT`] for a client the cap does not apply to (a local one). Two peers whose tags
/// collide share one cap; the key keeps anyone from aiming for that.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[repr(transparent)]
pub struct Peer(u32);

impl Peer {
    /// Not subject to the cap (shared-memory and embedded clients).
    pub const EXEMPT: Peer = Peer(0);

    /// The peer of tag `tag`; a hash that came out 0 (the exempt tag) becomes 1, so that no
    /// remote peer is ever exempt.
    #[inline]
    pub const fn remote(tag: u32) -> Peer {
        if tag == 0 { Peer(1) } else { Peer(tag) }
    }

    /// The peer a client entry stores as `tag` (0: exempt).
    #[inline]
    pub const fn from_tag(tag: u32) -> Peer {
        Peer(tag)
    }

    /// The tag stored in the client's entry.
    #[inline]
    pub const fn tag(self) -> u32 {
        self.0
    }

    /// Whether the cap does not apply.
    #[inline]
    pub const fn is_exempt(self) -> bool {
        self.0 == 0
    }
}

/// A registration's secret: 128 bits the server draws from its entropy source (the operating
/// system's CSPRNG in the runtime) when a client registers. Whoever shows it may bind another
/// channel (a TCP data connection, an RDMA queue pair) to the client or resume the registration;
/// the client id alone proves nothing, since ids are small and visible.
///
/// Comparison is constant-time ([`Session::matches`]) so that the time a refusal takes says
/// nothing about how many leading bytes of a guess were right, and `Debug` never prints it.
#[derive(Clone, Copy, Default)]
#[repr(transparent)]
pub struct Session(pub [u8; Session::LEN]);

impl Session {
    /// Bytes in a session secret.
    pub const LEN: usize = 16;
    /// No session: what an unregistered client or a free table entry holds. A registration never
    /// gets it (the server redraws), so showing it proves nothing.
    pub const NONE: Session = Session([0; Session::LEN]);

    /// Whether `other` is this secret — and a secret at all: [`Session::NONE`] matches
    /// nothing — in time that does not depend on where they differ.
    #[inline]
    pub fn matches(&self, other: &Session) -> bool {
        self == other && !self.is_none()
    }

    /// Whether this is [`Session::NONE`].
    #[inline]
    pub fn is_none(&self) -> bool {
        self.0 == [0; Session::LEN]
    }
}

/// An operator's secret shared by a server and the server that may replace it after a failure.
/// With it, a session is `nonce ‖ MAC(key, client id, nonce)` (8 bytes each, the MAC supplied by
/// the runtime as a [`SessionMac`]), so a replacement server can tell a client that
/// re-registers with the session the failed server gave it from one that only claims its id.
///
/// A key is 32 bytes from a CSPRNG (`head -c 32 /dev/urandom`); [`SessionKey::new`] refuses
/// one of obviously low entropy (see [`WeakSessionKey`]), since everything the key protects is
/// only as hard to forge as the key is to guess.
#[derive(Clone)]
pub struct SessionKey([u8; SessionKey::LEN]);

/// Why [`SessionKey::new`] refused a key. The rule: a key must hold at least
/// [`SessionKey::DISTINCT_MIN`] distinct byte values, must not repeat itself with a period of 16
/// bytes or less, and its bytes must not step by a constant (`00 01 02 …`, `ff fe fd …`, or all
/// one byte). Thirty-two bytes from a CSPRNG fail the first test with a chance of about
/// 3 × 10^-17 and the others with less than 2^-128, so a refused key was made by hand, copied
/// from an example, or read from a file that is not what it should be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeakSessionKey {
    /// Only this many distinct byte values (all-zero keys have one).
    FewDistinctBytes(u32),
    /// The key repeats itself every this many bytes.
    Repeats(u32),
    /// Every byte is the one before it plus this constant (mod 256).
    Progression(u8),
}

impl core::fmt::Display for WeakSessionKey {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match *self {
            WeakSessionKey::FewDistinctBytes(n) => write!(
                f,
                "the session key has only {n} distinct byte values (a random key has about 30; \
                 at least {} are required): draw one from a CSPRNG",
                SessionKey::DISTINCT_MIN
            ),
            WeakSessionKey::Repeats(p) => write!(
                f,
                "the session key repeats itself every {p} bytes: draw one from a CSPRNG"
            ),
            WeakSessionKey::Progression(d) => write!(
                f,
                "the session key's bytes step by a constant {d:#04x}: draw one from a CSPRNG"
            ),
        }
    }
}

impl SessionKey {
    /// Bytes in a key.
    pub const LEN: usize = 32;
    /// The fewest distinct byte values a key may have (a random key has about 30).
    pub const DISTINCT_MIN: u32 = 16;

    /// The key `bytes`, unless it is of obviously low entropy (the rule: [`WeakSessionKey`]).
    pub fn new(bytes: [u8; SessionKey::LEN]) -> Result<SessionKey, WeakSessionKey> {
        let mut seen = [false; 256];
        for &b in &bytes {
            seen[usize::from(b)] = true;
        }
        let distinct = seen.iter().filter(|&&s| s).count() as u32;
        if distinct < Self::DISTINCT_MIN {
            return Err(WeakSessionKey::FewDistinctBytes(distinct));
        }
        if let Some(p) =
            (1..=SessionKey::LEN / 2).find(|&p| bytes.iter().zip(&bytes[p..]).all(|(a, b)| a == b))
        {
            return Err(WeakSessionKey::Repeats(p as u32));
        }
        let step = bytes[1].wrapping_sub(bytes[0]);
        if bytes.windows(2).all(|w| w[1].wrapping_sub(w[0]) == step) {
            return Err(WeakSessionKey::Progression(step));
        }
        Ok(SessionKey(bytes))
    }

    /// The key's bytes, for the MAC that uses it.
    #[inline]
    pub fn as_bytes(&self) -> &[u8; SessionKey::LEN] {
        &self.0
    }
}

impl core::fmt::Debug for SessionKey {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("SessionKey(..)")
    }
}

/// The keyed MAC behind [`SessionKey`]: `mac(key, parts)` is the MAC of the concatenation of
/// `parts` under `key`, 32 bytes, of which each use keeps a prefix (sessions 8 bytes, grant
/// proofs 16: [`crate::server::proof`]). Every message begins with its own domain string, so
/// no MAC made for one use is valid for another. `dlock-core` computes no cryptography itself;
/// the runtime passes HMAC-SHA-256 (`dlock_transport::runtime::hmac_sha256`).
pub type SessionMac = fn(key: &SessionKey, parts: &[&[u8]]) -> [u8; 32];

/// The domain string of a session's MAC.
const SESSION_DOMAIN: &[u8] = b"dlock session v1";

impl Session {
    /// The session minted for `client` from `nonce` under `key`: `nonce ‖ MAC(key, "dlock
    /// session v1" ‖ client ‖ nonce)[..8]`.
    ///
    /// Eight bytes of MAC are enough here: a forger can only check a guess by re-registering
    /// with it (an online attempt, answered by the server and counted in `sessions_refused`),
    /// so the 2^63 attempts a forgery takes on average are out of reach at any rate a server
    /// answers, and a longer MAC would need a longer session on the wire and in every client
    /// entry. Grant proofs, which a later partition owner may check long after they were
    /// issued, get 16 bytes.
    pub fn minted(key: &SessionKey, mac: SessionMac, client: u32, nonce: [u8; 8]) -> Session {
        let mut s = Session::NONE;
        s.0[..8].copy_from_slice(&nonce);
        let tag = mac(key, &[SESSION_DOMAIN, &client.to_le_bytes(), &nonce]);
        s.0[8..].copy_from_slice(&tag[..8]);
        s
    }

    /// Whether this session was minted for `client` under `key` (constant-time).
    pub fn is_minted_for(&self, key: &SessionKey, mac: SessionMac, client: u32) -> bool {
        let mut nonce = [0u8; 8];
        nonce.copy_from_slice(&self.0[..8]);
        Session::minted(key, mac, client, nonce).matches(self)
    }
}

/// Equality in constant time: every byte is read and combined before the one branch, so the
/// time `==` takes says nothing about how many leading bytes of a guess were right. (The
/// optimiser cannot turn the fold back into an early exit: it cannot see through `black_box`.)
impl PartialEq for Session {
    #[inline]
    fn eq(&self, other: &Session) -> bool {
        let mut diff = 0u8;
        for (a, b) in self.0.iter().zip(other.0.iter()) {
            diff |= a ^ b;
        }
        core::hint::black_box(diff) == 0
    }
}

impl Eq for Session {}

impl core::fmt::Debug for Session {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(if self.is_none() {
            "Session(none)"
        } else {
            "Session(..)"
        })
    }
}

impl core::fmt::Display for ClientId {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "client {}", self.get())
    }
}

/// A grant's proof: what a server with a session key hands the client with every grant and
/// fair-lock ticket, and the client shows when it re-claims the lock from a server that
/// replaces this one (see [`crate::server::proof`] for what it binds and why). `mac` is
/// 128 bits of HMAC-SHA-256 under the session key; `epoch` is one of the values the MAC binds:
/// the epoch the grant was made at, which is the server's epoch (widened) on a standalone server
/// and the partition's epoch in a cluster.
///
/// The partition the MAC also binds is not carried: whoever checks a proof computes it from the
/// lock's name (`cluster::partition_of`; 0 on a standalone server), so a claim cannot name
/// another partition than its lock's.
///
/// A data response's proof trailer carries only the MAC; the client files it under the epoch
/// the grant was made at, which it knows without asking: the epoch its request named
/// (`LockCommand::partition_epoch`) in a cluster, where a server serves a request only at
/// exactly that epoch, and the registration's `InitReply::epoch` on a standalone server.
///
/// All zeros is "no proof": what a server without a key gives, and what a record without a
/// grant holds. Comparison is constant-time and `Debug` never prints the MAC.
#[derive(Clone, Copy, Default)]
pub struct GrantProof {
    /// The epoch the grant was made at (module doc of [`crate::server::proof`]).
    pub epoch: u32,
    /// The MAC (zero: none).
    pub mac: [u8; GrantProof::LEN],
}

impl GrantProof {
    /// Bytes of MAC in a proof (and per command in a data response's proof trailer).
    pub const LEN: usize = 16;
    /// No proof.
    pub const NONE: GrantProof = GrantProof {
        epoch: 0,
        mac: [0; GrantProof::LEN],
    };

    /// Whether this is [`GrantProof::NONE`]'s MAC (the epoch is not looked at).
    #[inline]
    pub fn is_none(&self) -> bool {
        self.mac == [0; GrantProof::LEN]
    }
}

/// Equality in constant time, as [`Session`]'s.
impl PartialEq for GrantProof {
    #[inline]
    fn eq(&self, other: &GrantProof) -> bool {
        let mut diff = 0u8;
        for (a, b) in self.mac.iter().zip(other.mac.iter()) {
            diff |= a ^ b;
        }
        core::hint::black_box(diff) == 0 && self.epoch == other.epoch
    }
}

impl Eq for GrantProof {}

impl core::hash::Hash for GrantProof {
    fn hash<H: core::hash::Hasher>(&self, state: &mut H) {
        // Proofs are secrets; a hash of the epoch alone is consistent with `==`.
        self.epoch.hash(state);
    }
}

impl core::fmt::Debug for GrantProof {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        if self.is_none() {
            f.write_str("GrantProof(none)")
        } else {
            write!(f, "GrantProof(epoch {}, ..)", self.epoch)
        }
    }
}

/// A fencing token: strictly greater than every token issued before it for the same lock, also
/// across a server failover (the epoch is in the high bits). Storage that remembers the
/// largest token it has seen for a resource can reject a write from a paused ex-holder.
///
/// The token is one `u64` on the wire and compares as one; how it splits depends on who
/// issued it, and the constructors and accessors name the layout they use:
///
/// | issued by            | layout                  | epoch from                                  |
/// |----------------------|-------------------------|---------------------------------------------|
/// | a standalone server  | `epoch:16 \| counter:48` | the operator ([`crate::Config::epoch`])     |
/// | a cluster partition  | `epoch:32 \| counter:32` | the map, per partition ([`crate::cluster::token`]) |
///
/// A lock is served either standalone or in one cluster, never both, so the tokens of one lock
/// all have one layout and grow as integers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
#[repr(transparent)]
pub struct FencingToken(pub u64);

impl FencingToken {
    /// Bits below the epoch in a standalone server's token.
    pub const STANDALONE_COUNTER_BITS: u32 = 48;
    /// The largest counter a standalone token carries.
    pub const STANDALONE_COUNTER_MAX: u64 = (1 << Self::STANDALONE_COUNTER_BITS) - 1;
    /// Bits below the epoch in a cluster token ([`crate::cluster::token::COUNTER_BITS`]).
    pub const CLUSTER_COUNTER_BITS: u32 = crate::cluster::token::COUNTER_BITS;

    /// Grant `counter` of a standalone server at `epoch`. Panics (a bug, not bad input: only
    /// servers make tokens) when `counter` does not fit 48 bits.
    #[inline]
    pub const fn standalone(epoch: u16, counter: u64) -> FencingToken {
        assert!(counter <= Self::STANDALONE_COUNTER_MAX);
        FencingToken((epoch as u64) << Self::STANDALONE_COUNTER_BITS | counter)
    }

    /// Grant `counter` of a cluster partition at `epoch` ([`crate::cluster::token::token`]).
    #[inline]
    pub const fn cluster(epoch: u32, counter: u32) -> FencingToken {
        FencingToken(crate::cluster::token::token(epoch, counter))
    }

    /// The server epoch a standalone server's token was issued at.
    #[inline]
    pub const fn standalone_epoch(self) -> u16 {
        (self.0 >> Self::STANDALONE_COUNTER_BITS) as u16
    }

    /// The counter of a standalone server's token.
    #[inline]
    pub const fn standalone_counter(self) -> u64 {
        self.0 & Self::STANDALONE_COUNTER_MAX
    }

    /// The partition epoch a cluster token was issued at
    /// ([`crate::cluster::token::token_epoch`]).
    #[inline]
    pub const fn cluster_epoch(self) -> u32 {
        crate::cluster::token::token_epoch(self.0)
    }

    /// The counter of a cluster token.
    #[inline]
    pub const fn cluster_counter(self) -> u32 {
        self.0 as u32
    }
}

/// The three lock kinds. The discriminants are the reference's `dlock_type` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum LockKind {
    /// Exclusive with expiry.
    Atomic = 0,
    /// Reader-writer, no expiry.
    Rw = 1,
    /// Fair (FIFO tickets), exclusive or shared, with expiry.
    Fair = 2,
}

impl LockKind {
    /// The kind with this wire value.
    #[inline]
    pub const fn from_u8(v: u8) -> Option<Self> {
        match v {
            0 => Some(LockKind::Atomic),
            1 => Some(LockKind::Rw),
            2 => Some(LockKind::Fair),
            _ => None,
        }
    }
}

/// Exclusive or shared.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mode {
    /// One holder.
    Exclusive,
    /// Many holders.
    Shared,
}

/// A fair-lock ticket: the exclusive and shared "next ticket" counters at the time the request
/// was queued. Counters compare modulo 2^16 (see [`crate::word::fair::ticket_before`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Ticket {
    /// The exclusive counter (`tx`).
    pub exclusive: u16,
    /// The shared counter (`ts`).
    pub shared: u16,
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn slot_ids_round_trip_and_are_positive() {
        let id = LockId::new(51_199, GENERATION_MAX);
        assert_eq!(id.index(), 51_199);
        assert_eq!(id.generation(), GENERATION_MAX);
        assert!((id.raw() as i32) > 0);
        assert_eq!(LockId::from_raw(id.raw()), Some(id));
    }

    #[test]
    fn raw_ids_that_cannot_be_issued_are_refused() {
        assert_eq!(LockId::from_raw(0), None);
        assert_eq!(LockId::from_raw(5), None, "generation 0");
        assert_eq!(LockId::from_raw(u32::MAX), None, "negative as int");
        assert_eq!(ObjectId::from_raw(1 << 31 | 1 << 20), None);
    }

    #[test]
    fn generations_wrap_past_max_to_one() {
        assert_eq!(next_generation(1), 2);
        assert_eq!(next_generation(GENERATION_MAX), 1);
    }

    #[test]
    fn sessions_match_only_themselves_and_none_matches_nothing() {
        let a = Session([7; Session::LEN]);
        let mut b = a;
        assert!(a.matches(&b));
        b.0[Session::LEN - 1] ^= 1;
        assert!(!a.matches(&b));
        assert!(!Session::NONE.matches(&Session::NONE));
        assert_eq!(format!("{a:?}"), "Session(..)");
    }

    /// 32 bytes from a CSPRNG (once, by hand).
    pub(crate) const GOOD_KEY: [u8; 32] = [
        0x3c, 0x9a, 0x51, 0xe2, 0x07, 0xbd, 0x68, 0x14, 0xf9, 0x2e, 0x85, 0xc0, 0x4b, 0x76, 0xd3,
        0x1f, 0xa8, 0x62, 0x0d, 0x97, 0xee, 0x35, 0x5a, 0xc4, 0x81, 0x2b, 0xf0, 0x49, 0xb6, 0x13,
        0x7d, 0xdc,
    ];

    #[test]
    fn session_keys_of_obviously_low_entropy_are_refused() {
        use WeakSessionKey::*;
        assert!(SessionKey::new(GOOD_KEY).is_ok());
        assert_eq!(SessionKey::new([0; 32]).err(), Some(FewDistinctBytes(1)));
        assert_eq!(SessionKey::new([0x42; 32]).err(), Some(FewDistinctBytes(1)));
        let mut ascii = [b'a'; 32];
        ascii[..8].copy_from_slice(b"password");
        assert_eq!(SessionKey::new(ascii).err(), Some(FewDistinctBytes(7)));
        // Sixteen distinct bytes, twice over: enough values, but a period of 16.
        let halves: [u8; 32] = core::array::from_fn(|i| GOOD_KEY[i % 16]);
        assert_eq!(SessionKey::new(halves).err(), Some(Repeats(16)));
        let counting: [u8; 32] = core::array::from_fn(|i| i as u8);
        assert_eq!(SessionKey::new(counting).err(), Some(Progression(1)));
        let down: [u8; 32] = core::array::from_fn(|i| 0xff - 3 * i as u8);
        assert_eq!(SessionKey::new(down).err(), Some(Progression(0xfd)));
        // One byte changed in a good key is still a good key.
        let mut k = GOOD_KEY;
        k[31] = k[0];
        assert!(SessionKey::new(k).is_ok());
        assert!(format!("{}", FewDistinctBytes(1)).contains("only 1 distinct"));
    }

    #[test]
    fn fencing_tokens_name_their_layout() {
        let s = FencingToken::standalone(7, FencingToken::STANDALONE_COUNTER_MAX);
        assert_eq!(s.0, 0x0007_FFFF_FFFF_FFFF);
        assert_eq!(
            (s.standalone_epoch(), s.standalone_counter()),
            (7, (1 << 48) - 1)
        );
        let c = FencingToken::cluster(0x0001_0002, 9);
        assert_eq!(c.0, crate::cluster::token::token(0x0001_0002, 9));
        assert_eq!((c.cluster_epoch(), c.cluster_counter()), (0x0001_0002, 9));
        // Within one layout, tokens order as (epoch, counter); on the wire they are one u64.
        assert!(FencingToken::cluster(2, 1) > FencingToken::cluster(1, u32::MAX));
        assert!(FencingToken::standalone(2, 1) > FencingToken::standalone(1, (1 << 48) - 1));
    }

    #[test]
    #[should_panic]
    fn a_standalone_counter_past_48_bits_is_a_bug() {
        let _ = FencingToken::standalone(1, 1 << 48);
    }

    #[test]
    fn client_ids_are_31_bit_non_zero() {
        assert!(ClientId::new(0).is_none());
        assert!(ClientId::new(1 << 31).is_none());
        assert_eq!(
            ClientId::new(0x7FFF_FFFF).map(ClientId::get),
            Some(0x7FFF_FFFF)
        );
    }
}
