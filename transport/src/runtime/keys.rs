//! The session key: reading it from a file, and the keyed MAC behind sessions.
//!
//! `dlock-core` computes no cryptography (it has no dependencies to do it with); it is handed
//! the MAC as a function. Here it is HMAC-SHA-256 from `ring`, which the TLS stack already
//! links.

use std::io;
use std::path::Path;

use dlock_core::SessionKey;

/// The session key in `path`: 64 hex digits on the first line (`head -c 32 /dev/urandom | xxd
/// -p -c 64` makes one). `InvalidData` for anything else, and for a key of obviously low
/// entropy ([`dlock_core::WeakSessionKey`] states the rule). Warns when the file can be read by
/// others than its owner.
pub fn read_session_key_file(path: &Path) -> io::Result<SessionKey> {
    use std::os::unix::fs::PermissionsExt;
    let bad = |why: String| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}: {why}", path.display()),
        )
    };
    let text = zeroize::Zeroizing::new(
        std::fs::read_to_string(path)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?,
    );
    if let Ok(meta) = std::fs::metadata(path)
        && meta.permissions().mode() & 0o077 != 0
    {
        tracing::warn!(
            path = %path.display(),
            mode = format_args!("{:o}", meta.permissions().mode() & 0o777),
            "the session key file is readable by others than its owner; chmod 600 it"
        );
    }
    let hex = text.lines().next().unwrap_or_default().trim();
    if hex.len() != 2 * SessionKey::LEN || !hex.is_ascii() {
        return Err(bad("a session key is 64 hex digits".into()));
    }
    let mut key = zeroize::Zeroizing::new([0u8; SessionKey::LEN]);
    for (i, byte) in key.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16)
            .map_err(|_| bad("a session key is 64 hex digits".into()))?;
    }
    SessionKey::new(*key).map_err(|weak| bad(weak.to_string()))
}

/// The server's [`SessionMac`](dlock_core::SessionMac): HMAC-SHA-256 of the concatenated
/// `parts` under the session key. Allocates nothing (ring's HMAC state lives on the stack).
pub fn hmac_sha256(key: &SessionKey, parts: &[&[u8]]) -> [u8; 32] {
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, key.as_bytes());
    let mut ctx = ring::hmac::Context::with_key(&key);
    for part in parts {
        ctx.update(part);
    }
    let tag = ctx.sign();
    let mut out = [0u8; 32];
    out.copy_from_slice(tag.as_ref());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The MAC of the parts is HMAC-SHA-256 of their concatenation, so a session is MACed as it
    /// was when sessions had a function of their own (`"dlock session v1" ‖ id ‖ nonce`), and
    /// a replacement server of this build recognises the sessions an older one minted.
    #[test]
    fn the_mac_is_hmac_sha256_of_the_concatenated_parts() {
        let bytes = [
            0x3c, 0x9a, 0x51, 0xe2, 0x07, 0xbd, 0x68, 0x14, 0xf9, 0x2e, 0x85, 0xc0, 0x4b, 0x76,
            0xd3, 0x1f, 0xa8, 0x62, 0x0d, 0x97, 0xee, 0x35, 0x5a, 0xc4, 0x81, 0x2b, 0xf0, 0x49,
            0xb6, 0x13, 0x7d, 0xdc,
        ];
        let key = SessionKey::new(bytes).unwrap();
        let whole = ring::hmac::sign(
            &ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &bytes),
            b"dlock session v1\x07\0\0\0nonce-42",
        );
        let parts: [&[u8]; 3] = [b"dlock session v1", &7u32.to_le_bytes(), b"nonce-42"];
        assert_eq!(hmac_sha256(&key, &parts)[..], whole.as_ref()[..]);
    }
}
