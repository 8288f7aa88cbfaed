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

/// The server's [`SessionMac`](dlock_core::SessionMac): HMAC-SHA-256 of the client id and the
/// nonce under the session key, truncated to 8 bytes.
pub fn hmac_session(key: &SessionKey, client: u32, nonce: &[u8; 8]) -> [u8; 8] {
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, key.as_bytes());
    let mut ctx = ring::hmac::Context::with_key(&key);
    ctx.update(b"dlock session v1");
    ctx.update(&client.to_le_bytes());
    ctx.update(nonce);
    let tag = ctx.sign();
    let mut out = [0u8; 8];
    out.copy_from_slice(&tag.as_ref()[..8]);
    out
}
