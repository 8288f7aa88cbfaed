//! Test certificates: a CA, a server certificate for `localhost`/127.0.0.1, client
//! certificates (good, expired, signed by another CA), CRLs and encrypted keys, all written as
//! PEM files into a fresh temporary directory that is removed on drop. Nothing here is ever
//! committed: every run makes new keys.
//!
//! Shared by the TLS unit tests (`src/tls/tests.rs` includes this file by path) and the
//! integration tests (through `common`); each uses a different subset, hence the allow.
#![allow(dead_code)]

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use rcgen::{
    BasicConstraints, CertificateParams, CertificateRevocationListParams, DnType,
    ExtendedKeyUsagePurpose, IsCa, Issuer, KeyIdMethod, KeyPair, KeyUsagePurpose,
    RevokedCertParams, SanType, SerialNumber,
};

/// A directory under the system temp dir, removed (with its files) on drop.
#[derive(Debug)]
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Self {
        // Relaxed: only uniqueness within the process matters.
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("dlock-tls-{tag}-{}-{n}", std::process::id()));
        fs::create_dir_all(&dir).expect("create temp dir");
        Self(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    /// Writes `contents` to `name` in the directory (owner-only, as a key file should be).
    pub fn write(&self, name: &str, contents: &str) -> PathBuf {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let path = self.0.join(name);
        let mut file = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&path)
            .expect("create PEM file");
        file.write_all(contents.as_bytes()).expect("write PEM file");
        path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// A certificate and its key, as PEM files.
#[derive(Debug)]
pub struct Leaf {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// The serial number, to revoke it in a CRL.
    pub serial: u64,
}

/// A certificate authority that can sign leaves and CRLs.
pub struct Ca {
    issuer: Issuer<'static, KeyPair>,
    /// The CA certificate as a PEM file (the bundle peers verify against).
    pub cert: PathBuf,
    name: String,
    next_serial: AtomicU32,
}

impl std::fmt::Debug for Ca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ca")
            .field("name", &self.name)
            .field("cert", &self.cert)
            .finish()
    }
}

impl Ca {
    /// A self-signed CA named `name`, its certificate written as `<name>.pem` in `dir`.
    pub fn new(dir: &TempDir, name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::new()).expect("CA params");
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let key = KeyPair::generate().expect("CA key");
        let cert = params.self_signed(&key).expect("CA certificate");
        Self {
            issuer: Issuer::new(params, key),
            cert: dir.write(&format!("{name}.pem"), &cert.pem()),
            name: name.to_owned(),
            next_serial: AtomicU32::new(1),
        }
    }

    /// The server certificate: `localhost` and 127.0.0.1, for server authentication.
    pub fn server(&self, dir: &TempDir, name: &str) -> Leaf {
        let mut params = CertificateParams::new(vec!["localhost".to_owned()]).expect("params");
        params
            .subject_alt_names
            .push(SanType::IpAddress([127, 0, 0, 1].into()));
        params
            .distinguished_name
            .push(DnType::CommonName, "localhost");
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.leaf(dir, name, params)
    }

    /// A client certificate with common name `cn`, valid now.
    pub fn client(&self, dir: &TempDir, name: &str, cn: &str) -> Leaf {
        self.leaf(dir, name, client_params(cn))
    }

    /// A client certificate with common name `cn` that expired in 2001.
    pub fn expired_client(&self, dir: &TempDir, name: &str, cn: &str) -> Leaf {
        let mut params = client_params(cn);
        params.not_before = rcgen::date_time_ymd(2000, 1, 1);
        params.not_after = rcgen::date_time_ymd(2001, 1, 1);
        self.leaf(dir, name, params)
    }

    /// A client certificate with common name `cn` valid only from 2090 (a clock or issuance
    /// mistake, not an old certificate).
    pub fn not_yet_valid_client(&self, dir: &TempDir, name: &str, cn: &str) -> Leaf {
        let mut params = client_params(cn);
        params.not_before = rcgen::date_time_ymd(2090, 1, 1);
        params.not_after = rcgen::date_time_ymd(2091, 1, 1);
        self.leaf(dir, name, params)
    }

    /// A CRL of this CA revoking `serials`, written as `name` in `dir`.
    pub fn crl(&self, dir: &TempDir, name: &str, serials: &[u64]) -> PathBuf {
        // Fixed dates around "now" for any test run: the CRL is current until 2100.
        let params = CertificateRevocationListParams {
            this_update: rcgen::date_time_ymd(2020, 1, 1),
            next_update: rcgen::date_time_ymd(2100, 1, 1),
            crl_number: SerialNumber::from(1u64),
            issuing_distribution_point: None,
            revoked_certs: serials
                .iter()
                .map(|&s| RevokedCertParams {
                    serial_number: SerialNumber::from(s),
                    revocation_time: rcgen::date_time_ymd(2020, 1, 1),
                    reason_code: Some(rcgen::RevocationReason::KeyCompromise),
                    invalidity_date: None,
                })
                .collect(),
            key_identifier_method: KeyIdMethod::Sha256,
        };
        let crl = params.signed_by(&self.issuer).expect("CRL");
        dir.write(name, &crl.pem().expect("CRL PEM"))
    }

    fn leaf(&self, dir: &TempDir, name: &str, mut params: CertificateParams) -> Leaf {
        let serial = u64::from(self.next_serial.fetch_add(1, Ordering::Relaxed)) + 1000;
        params.serial_number = Some(SerialNumber::from(serial));
        params.use_authority_key_identifier_extension = true;
        let key = KeyPair::generate().expect("leaf key");
        let cert = params
            .signed_by(&key, &self.issuer)
            .expect("leaf certificate");
        Leaf {
            cert: dir.write(&format!("{name}.crt"), &cert.pem()),
            key: dir.write(&format!("{name}.key"), &key.serialize_pem()),
            serial,
        }
    }
}

fn client_params(cn: &str) -> CertificateParams {
    let mut params = CertificateParams::new(Vec::new()).expect("params");
    params.distinguished_name.push(DnType::CommonName, cn);
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    params
}

/// Rewrites the PKCS#8 key at `key` as an encrypted PKCS#8 (PBES2: PBKDF2-SHA256, AES-256-CBC)
/// under `password`, as `openssl pkcs8 -topk8 -v2 aes-256-cbc` would; returns the new file.
pub fn encrypt_key(dir: &TempDir, key: &Path, password: &str) -> PathBuf {
    // A low iteration count keeps the debug-build test fast; real keys use more.
    encrypt_key_with(dir, key, password, 2048)
}

/// [`encrypt_key`] with `iterations` rounds of PBKDF2 (1 for tests that try many passwords).
pub fn encrypt_key_with(dir: &TempDir, key: &Path, password: &str, iterations: u32) -> PathBuf {
    use pkcs8::der::asn1::OctetStringRef;
    use pkcs8::der::{Encode, SecretDocument};
    use pkcs8::pkcs5::pbes2;

    let pem = fs::read_to_string(key).expect("read key");
    let (label, doc) = SecretDocument::from_pem(&pem).expect("key PEM");
    assert_eq!(label, "PRIVATE KEY");
    let params =
        pbes2::Parameters::generate_pbkdf2_sha256_aes256cbc(iterations, &[7u8; 16], [9u8; 16])
            .expect("PBES2 parameters");
    let ciphertext = params
        .encrypt(password, doc.as_bytes())
        .expect("encrypt key");
    let info = pkcs8::EncryptedPrivateKeyInfoRef {
        encryption_algorithm: params.into(),
        encrypted_data: OctetStringRef::new(&ciphertext).expect("octet string"),
    };
    let der = info.to_der().expect("encode encrypted key");
    let pem = pkcs8::der::pem::encode_string("ENCRYPTED PRIVATE KEY", pkcs8::LineEnding::LF, &der)
        .expect("encrypted key PEM");
    let name = format!("{}.enc", key.file_name().expect("name").to_string_lossy());
    dir.write(&name, &pem)
}
