//! Reading the PEM files of a [`TlsConfig`]: certificates, CA bundle, CRLs and the private key.
//!
//! Every error names the file and says what was wrong with it. Key material is only ever held
//! in `Zeroizing` buffers allocated at their final size (file bytes, decoded DER, decrypted
//! PKCS#8, password), which are wiped when this module returns, once `ring` has built its
//! signing key.

use std::fs;
use std::io;
use std::path::Path;
use std::sync::Arc;

use pkcs8::EncryptedPrivateKeyInfoRef;
use rustls::RootCertStore;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{
    CertificateDer, CertificateRevocationListDer, PrivateKeyDer, PrivatePkcs1KeyDer,
    PrivatePkcs8KeyDer, PrivateSec1KeyDer,
};
use rustls::sign::{CertifiedKey, SigningKey};
use zeroize::Zeroizing;

use super::TlsConfig;

fn bad_file(path: &Path, what: impl std::fmt::Display) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("TLS file {}: {what}", path.display()),
    )
}

fn read_file(path: &Path, role: &str) -> io::Result<Vec<u8>> {
    fs::read(path).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("TLS {role} file {}: cannot read: {e}", path.display()),
        )
    })
}

/// All certificates of a PEM file, in order; at least one.
pub(super) fn load_certs(path: &Path) -> io::Result<Vec<CertificateDer<'static>>> {
    let bytes = read_file(path, "certificate")?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad_file(path, format_args!("bad PEM certificate: {e}")))?;
    if certs.is_empty() {
        return Err(bad_file(path, "no PEM 'CERTIFICATE' block"));
    }
    Ok(certs)
}

/// The CA bundle as a root store; every certificate in it must be a usable trust anchor.
pub(super) fn load_roots(path: &Path) -> io::Result<RootCertStore> {
    let mut roots = RootCertStore::empty();
    for cert in load_certs(path)? {
        roots
            .add(cert)
            .map_err(|e| bad_file(path, format_args!("not a usable CA certificate: {e}")))?;
    }
    Ok(roots)
}

/// Every CRL of every file; each file must hold at least one.
pub(super) fn load_crls(
    paths: &[impl AsRef<Path>],
) -> io::Result<Vec<CertificateRevocationListDer<'static>>> {
    let mut crls = Vec::new();
    for path in paths {
        let path = path.as_ref();
        let bytes = read_file(path, "CRL")?;
        let before = crls.len();
        for crl in CertificateRevocationListDer::pem_slice_iter(&bytes) {
            crls.push(crl.map_err(|e| bad_file(path, format_args!("bad PEM CRL: {e}")))?);
        }
        if crls.len() == before {
            return Err(bad_file(path, "no PEM 'X509 CRL' block"));
        }
    }
    Ok(crls)
}

/// This end's chain and signing key, checked to belong together.
pub(super) fn load_certified_key(cfg: &TlsConfig) -> io::Result<CertifiedKey> {
    let chain = load_certs(&cfg.cert)?;
    let key = load_signing_key(cfg)?;
    let certified = CertifiedKey::new(chain, key);
    match certified.keys_match() {
        // `Unknown`: the key cannot tell its public half, so there is nothing to compare.
        Ok(()) | Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => {
            Ok(certified)
        }
        Err(e) => Err(bad_file(
            &cfg.key,
            format_args!(
                "private key does not match certificate {}: {e}",
                cfg.cert.display()
            ),
        )),
    }
}

/// Reads the key file once and builds `ring`'s signing key; every copy of the key bytes made
/// on the way is a `Zeroizing` buffer, wiped on return.
fn load_signing_key(cfg: &TlsConfig) -> io::Result<Arc<dyn SigningKey>> {
    let path = &cfg.key;
    let bytes = Zeroizing::new(read_file(path, "key")?);
    let text = std::str::from_utf8(&bytes).map_err(|_| bad_file(path, "not a PEM text file"))?;
    let block = first_pem_block(text).ok_or_else(|| bad_file(path, "no PEM block"))?;
    // Decoded into one buffer sized up front (DER is shorter than its Base64 text) and wiped
    // on return; a growing Vec would leave unwiped copies behind in freed memory.
    let mut der_buf = Zeroizing::new(vec![0u8; block.len()]);
    let (label, der) = pkcs8::der::pem::decode(block.as_bytes(), &mut der_buf)
        .map_err(|e| bad_file(path, format_args!("bad PEM private key: {e}")))?;
    let sign = |key: PrivateKeyDer<'_>| {
        rustls::crypto::ring::sign::any_supported_type(&key)
            .map_err(|e| bad_file(path, format_args!("unusable private key: {e}")))
    };
    match label {
        "PRIVATE KEY" => sign(PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(der))),
        "RSA PRIVATE KEY" => sign(PrivateKeyDer::Pkcs1(PrivatePkcs1KeyDer::from(der))),
        "EC PRIVATE KEY" => sign(PrivateKeyDer::Sec1(PrivateSec1KeyDer::from(der))),
        "ENCRYPTED PRIVATE KEY" => {
            let Some(password_fn) = &cfg.key_password else {
                return Err(bad_file(
                    path,
                    "the private key is encrypted but no key password is configured",
                ));
            };
            let info = EncryptedPrivateKeyInfoRef::try_from(der)
                .map_err(|e| bad_file(path, format_args!("bad encrypted PKCS#8 key: {e}")))?;
            let password = password_fn()
                .map_err(|e| bad_file(path, format_args!("key password callback failed: {e}")))?;
            // Decrypt in place in a buffer we wipe: pkcs8's own `decrypt` returns a Vec that
            // is reallocated into the document, leaving an unwiped copy behind.
            let mut buf = Zeroizing::new(info.encrypted_data.as_bytes().to_vec());
            let plain = info
                .encryption_algorithm
                .decrypt_in_place(password.as_bytes(), &mut buf)
                .map_err(|e| {
                    bad_file(
                        path,
                        format_args!("cannot decrypt the private key (wrong password?): {e}"),
                    )
                })?;
            // A wrong password usually breaks the cipher's padding, but about one time in 256
            // the padding checks out and the bytes are merely garbage: say the same then.
            rustls::crypto::ring::sign::any_supported_type(&PrivateKeyDer::Pkcs8(
                PrivatePkcs8KeyDer::from(plain),
            ))
            .map_err(|e| {
                bad_file(
                    path,
                    format_args!(
                        "cannot decrypt the private key (wrong password?): it decrypts to no \
                         usable key: {e}"
                    ),
                )
            })
        }
        other => Err(bad_file(
            path,
            format_args!(
                "PEM block {other:?} is not a private key (expected 'PRIVATE KEY' or \
                 'ENCRYPTED PRIVATE KEY')"
            ),
        )),
    }
}

/// The first `-----BEGIN …-----` … `-----END …-----` block, without the text around it (tools
/// such as `openssl pkcs12` put "Bag Attributes" before the block, which the strict PEM decoder
/// refuses).
fn first_pem_block(text: &str) -> Option<&str> {
    let start = text.find("-----BEGIN ")?;
    let end_marker = start + text[start..].find("-----END ")?;
    let end_line = end_marker + "-----END ".len();
    let end = end_line + text[end_line..].find("-----")? + "-----".len();
    Some(&text[start..end])
}
