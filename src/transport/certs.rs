//! Server identity: generating the offline CA + online certificate pair and loading it for TLS.
//!
//! The files mirror the reference server's (`ca.key`, `ca.crt`, `server.key`, `server.crt`, PEM, PKCS#8
//! keys) so that an operator can move a key directory between the two. The server's identity
//! (`key_hash`, the fingerprint in `smp://<fp>@host`) is the SHA-256 of the CA certificate DER
//! (simplexmq `Transport/Client.hs`).

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine;
use ed25519_dalek::pkcs8::{DecodePrivateKey, PrivateKeyInfo};
use ed25519_dalek::SigningKey;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::CertificateDer;
use sha2::{Digest, Sha256};

use crate::crypto::keys::ED448_KEY_LEN;

pub const CA_KEY_FILE: &str = "ca.key";
pub const CA_CERT_FILE: &str = "ca.crt";
pub const SERVER_KEY_FILE: &str = "server.key";
pub const SERVER_CERT_FILE: &str = "server.crt";

/// PEM files larger than this are not certificate files; refusing them bounds what `load` reads.
const MAX_PEM_FILE_BYTES: u64 = 256 * 1024;
/// Clients accept chains of 2 to 4 certificates (simplexmq `Transport/Client.hs`); anything else
/// would make every handshake fail.
const MIN_CHAIN_LEN: usize = 2;
const MAX_CHAIN_LEN: usize = 4;
/// Validity, in years from the start of the current year. The CA outlives the online certificate
/// so that the online one can be reissued without changing the server's fingerprint.
const CA_VALIDITY_YEARS: i32 = 30;
const SERVER_VALIDITY_YEARS: i32 = 10;

const OID_ED25519: &str = "1.3.101.112";
const OID_ED448: &str = "1.3.101.113";

#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error("cannot read {}: {source}", file.display())]
    Io {
        file: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot write {}: {source}", file.display())]
    Write {
        file: PathBuf,
        source: std::io::Error,
    },
    #[error("{} is larger than {MAX_PEM_FILE_BYTES} bytes; it is not a certificate or key file", file.display())]
    TooLarge { file: PathBuf },
    #[error("{} is not valid PEM: {reason}", file.display())]
    Pem { file: PathBuf, reason: String },
    #[error("{} contains no certificate", file.display())]
    NoCertificate { file: PathBuf },
    #[error("{} contains no private key", file.display())]
    NoKey { file: PathBuf },
    #[error("{} holds an unsupported key ({reason}); the online key must be Ed25519: issue server.key and server.crt again from ca.key, or run `smp-relay init` in a fresh --data-dir (a new server address)", file.display())]
    UnsupportedKey { file: PathBuf, reason: String },
    #[error("{} is not a valid X.509 certificate: {reason}", file.display())]
    BadCertificate { file: PathBuf, reason: String },
    #[error("{} does not hold the key of {}: they come from different `init`s. Restore the pair from the same backup, or run `smp-relay init` in a fresh --data-dir (a new server address)", key.display(), cert.display())]
    KeyMismatch { key: PathBuf, cert: PathBuf },
    #[error("{} is not issued by {} ({reason}), so every client would refuse this server. Restore ca.crt, server.crt, server.key and fingerprint from the same `init`, or run `smp-relay init` in a fresh --data-dir (a new server address)", cert.display(), ca.display())]
    NotIssuedByCa {
        cert: PathBuf,
        ca: PathBuf,
        reason: String,
    },
    #[error("the chain {} + {} would be refused by every client: {reason}", cert.display(), ca.display())]
    BadChain {
        cert: PathBuf,
        ca: PathBuf,
        reason: String,
    },
    #[error("{} is missing: it is the server's identity (the fingerprint in its address, the SHA-256 of ca.crt) that clients check. Restore it from a backup of this directory", file.display())]
    NoFingerprint { file: PathBuf },
    #[error("{} says the server's fingerprint is {saved}, but {} has fingerprint {actual}: clients with the address of {saved} would refuse this server. Restore the files of the same `init` (ca.crt, server.crt, server.key, fingerprint) or run `smp-relay init` in a fresh --data-dir (a new server address)", file.display(), ca.display())]
    FingerprintMismatch {
        file: PathBuf,
        ca: PathBuf,
        saved: String,
        actual: String,
    },
    #[error("the certificate chain from server.crt + ca.crt has {0} certificates; clients accept 2 to 4")]
    ChainLength(usize),
    #[error("certificate generation failed: {0}")]
    Generate(#[from] rcgen::Error),
}

/// PEM text of a freshly generated identity, ready to be written as the four reference files.
#[derive(Clone)]
pub struct GeneratedCredentials {
    pub ca_key_pem: String,
    pub ca_cert_pem: String,
    pub server_key_pem: String,
    pub server_cert_pem: String,
}

impl std::fmt::Debug for GeneratedCredentials {
    // Keys stay out of logs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GeneratedCredentials")
            .field("ca_cert_pem", &self.ca_cert_pem)
            .field("server_cert_pem", &self.server_cert_pem)
            .finish_non_exhaustive()
    }
}

impl GeneratedCredentials {
    /// Writes ca.key, ca.crt, server.key and server.crt into `dir` (keys readable by the owner only).
    /// Existing files are replaced.
    pub fn write_files(&self, dir: &Path) -> Result<(), CertError> {
        write_file(&dir.join(CA_KEY_FILE), &self.ca_key_pem, true)?;
        write_file(&dir.join(CA_CERT_FILE), &self.ca_cert_pem, false)?;
        write_file(&dir.join(SERVER_KEY_FILE), &self.server_key_pem, true)?;
        write_file(&dir.join(SERVER_CERT_FILE), &self.server_cert_pem, false)
    }
}

fn write_file(path: &Path, text: &str, secret: bool) -> Result<(), CertError> {
    use std::os::unix::fs::OpenOptionsExt;
    let err = |source| CertError::Write {
        file: path.to_path_buf(),
        source,
    };
    let mut opts = fs::OpenOptions::new();
    opts.write(true).create(true).truncate(true);
    if secret {
        opts.mode(0o600);
    }
    let mut f = opts.open(path).map_err(err)?;
    f.write_all(text.as_bytes()).map_err(err)?;
    f.sync_all().map_err(err)
}

/// The online certificate's private key: Ed25519 (what `init` makes) or Ed448 (the reference's
/// `init -a ED448`, which its `cert` keeps).
#[derive(Clone)]
pub enum LeafKey {
    Ed25519(SigningKey),
    Ed448([u8; ED448_KEY_LEN]),
}

impl LeafKey {
    /// The raw public key, as the leaf certificate holds it.
    pub fn public_bytes(&self) -> Vec<u8> {
        match self {
            LeafKey::Ed25519(k) => k.verifying_key().to_bytes().to_vec(),
            LeafKey::Ed448(k) => crate::crypto::auth::ed448_public(k).to_vec(),
        }
    }

    /// The key's signature of `msg` (64 bytes for Ed25519, 114 for Ed448).
    pub fn sign(&self, msg: &[u8]) -> Vec<u8> {
        use ed25519_dalek::Signer;
        match self {
            LeafKey::Ed25519(k) => k.sign(msg).to_bytes().to_vec(),
            LeafKey::Ed448(k) => crate::crypto::auth::sign_ed448(k, msg).to_vec(),
        }
    }

    /// The server hello's signed session key: the X25519 key's SPKI as an X.509 `SignedExact`
    /// of this key (simplexmq `Crypto.hs`, `signX509`).
    pub fn signed_x25519_key(&self, x25519_pub: &[u8; 32]) -> Vec<u8> {
        use crate::crypto::signed_key;
        match self {
            LeafKey::Ed25519(k) => signed_key::sign_x25519_key(k, x25519_pub),
            LeafKey::Ed448(k) => {
                signed_key::sign_spki_ed448(k, &crate::crypto::keys::x25519_to_spki(x25519_pub))
            }
        }
    }
}

/// What the TLS layer needs: the chain to present, the key to sign with, and the server identity.
pub struct ServerCredentials {
    /// DER certificates as presented in TLS: `[leaf, ca]` (or up to 4, as simplexmq
    /// `Transport/Client.hs` accepts).
    pub chain_der: Vec<Vec<u8>>,
    pub leaf_key: LeafKey,
    /// SHA-256 of the DER of `chain_der[1]` (the CA in the normal 2-certificate chain).
    pub key_hash: [u8; 32],
}

impl std::fmt::Debug for ServerCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerCredentials")
            .field("chain_len", &self.chain_der.len())
            .field("key_hash", &fingerprint_b64url(&self.key_hash))
            .finish_non_exhaustive()
    }
}

/// The fingerprint as written in server addresses and the reference's `fingerprint` file:
/// base64url WITH '=' padding.
pub fn fingerprint_b64url(key_hash: &[u8; 32]) -> String {
    base64::engine::general_purpose::URL_SAFE.encode(key_hash)
}

/// Generates an Ed25519 offline CA and an online server certificate for `host`, with the
/// extensions the reference `init` produces (simplexmq `Server/Main/Init.hs`).
pub fn generate(host: &str) -> Result<GeneratedCredentials, CertError> {
    let year = current_year();
    let not_before = rcgen::date_time_ymd(year, 1, 1);

    let (ca_key, ca_key_pem) = new_ed25519_key()?;
    let mut ca_params = CertificateParams::default();
    ca_params.distinguished_name = distinguished_name("SMP server CA", Some("SimpleX"));
    // rcgen writes basicConstraints critical and a SubjectKeyIdentifier for CA certificates.
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.use_authority_key_identifier_extension = true;
    ca_params.not_before = not_before;
    ca_params.not_after = rcgen::date_time_ymd(year + CA_VALIDITY_YEARS, 1, 1);
    let ca_cert = ca_params.self_signed(&ca_key)?;

    let (server_key, server_key_pem) = new_ed25519_key()?;
    let mut params = CertificateParams::default();
    params.distinguished_name = distinguished_name(host, None);
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::ContentCommitment, // = nonRepudiation
        KeyUsagePurpose::KeyAgreement,
    ];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.use_authority_key_identifier_extension = true;
    params.not_before = not_before;
    params.not_after = rcgen::date_time_ymd(year + SERVER_VALIDITY_YEARS, 1, 1);
    let server_cert = params.signed_by(&server_key, &ca_cert, &ca_key)?;

    Ok(GeneratedCredentials {
        ca_key_pem,
        ca_cert_pem: ca_cert.pem(),
        server_key_pem,
        server_cert_pem: server_cert.pem(),
    })
}

/// PKCS#8 v1 prefix for an Ed25519 private key (RFC 8410), followed by the 32-byte seed (simplexmq
/// `Crypto.hs`).
const ED25519_PKCS8_V1_PREFIX: [u8; 16] = [
    0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20,
];

/// The key as PKCS#8 v1 DER. rcgen/ring and ed25519-dalek write v2 (with the public key), which
/// OpenSSL 3.0 and the reference's tooling do not read; v1 is what `openssl genpkey` writes.
pub fn ed25519_pkcs8_v1_der(key: &SigningKey) -> Vec<u8> {
    let mut der = ED25519_PKCS8_V1_PREFIX.to_vec();
    der.extend_from_slice(&key.to_bytes());
    der
}

fn pem_private_key(der: &[u8]) -> String {
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut pem = String::from("-----BEGIN PRIVATE KEY-----\n");
    // 64-character lines, as RFC 7468 requires; base64 text is ASCII so byte chunks are whole chars.
    for line in b64.as_bytes().chunks(64) {
        pem.push_str(&String::from_utf8_lossy(line));
        pem.push('\n');
    }
    pem.push_str("-----END PRIVATE KEY-----\n");
    pem
}

fn new_ed25519_key() -> Result<(KeyPair, String), CertError> {
    let key = SigningKey::generate(&mut rand::rngs::OsRng);
    let der = ed25519_pkcs8_v1_der(&key);
    let pair = KeyPair::try_from(der.as_slice())?;
    Ok((pair, pem_private_key(&der)))
}

fn distinguished_name(cn: &str, org: Option<&str>) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, cn);
    if let Some(o) = org {
        dn.push(DnType::OrganizationName, o);
    }
    dn
}

/// The calendar year from the system clock, kept in a range `rcgen::date_time_ymd` accepts.
fn current_year() -> i32 {
    const SECONDS_PER_YEAR: u64 = 31_556_952; // mean Gregorian year
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let year = 1970 + (secs / SECONDS_PER_YEAR).min(7000) as i32;
    // Near a year boundary the estimate can be one year ahead; step back so not_before is past.
    year - 1
}

/// Reads server.crt + ca.crt + server.key from `dir`.
/// A fresh identity for unit tests: generated, written to a temporary directory and loaded back
/// as a start would load it (`tag` keeps concurrent tests apart).
#[cfg(test)]
pub fn generated_for_tests(tag: &str) -> ServerCredentials {
    let dir = std::env::temp_dir().join(format!(
        "smp-relay-{tag}-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    generate("localhost").unwrap().write_files(&dir).unwrap();
    let creds = load(&dir).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    creds
}

pub fn load(dir: &Path) -> Result<ServerCredentials, CertError> {
    let server_crt = dir.join(SERVER_CERT_FILE);
    let ca_crt = dir.join(CA_CERT_FILE);
    let server_key = dir.join(SERVER_KEY_FILE);

    let mut chain_der = read_certs(&server_crt)?;
    for ca in read_certs(&ca_crt)? {
        // Some operators put the whole chain in server.crt; do not present a certificate twice.
        if !chain_der.contains(&ca) {
            chain_der.push(ca);
        }
    }
    if !(MIN_CHAIN_LEN..=MAX_CHAIN_LEN).contains(&chain_der.len()) {
        return Err(CertError::ChainLength(chain_der.len()));
    }
    for der in &chain_der {
        // Fail at startup, not on every handshake, if a certificate is unparsable.
        x509_parser::parse_x509_certificate(der).map_err(|e| CertError::BadCertificate {
            file: server_crt.clone(),
            reason: e.to_string(),
        })?;
    }

    let leaf_key = read_leaf_key(&server_key)?;
    let leaf_public = leaf_public_key(&chain_der[0], &server_crt)?;
    if leaf_public != leaf_key.public_bytes() {
        return Err(CertError::KeyMismatch {
            key: server_key,
            cert: server_crt,
        });
    }

    let key_hash: [u8; 32] = Sha256::digest(&chain_der[1]).into();
    // Clients check the whole chain (`server::proxy::identity`, as the reference client's
    // `validateCertificateChain`): a ca.crt from another `init` would make every handshake fail,
    // so it is refused here, once, with the files named.
    if let Err(e) = crate::transport::identity::verify_chain(&chain_der, &key_hash) {
        use crate::transport::identity::IdentityError;
        let (cert, ca, reason) = (server_crt, ca_crt, e.to_string());
        return Err(match e {
            IdentityError::Signature(_) | IdentityError::NotCa(_) => {
                CertError::NotIssuedByCa { cert, ca, reason }
            }
            _ => CertError::BadChain { cert, ca, reason },
        });
    }
    Ok(ServerCredentials {
        chain_der,
        leaf_key,
        key_hash,
    })
}

/// As `load`, and the `fingerprint` file must name the CA that was loaded, as the reference checks
/// at start (`checkSavedFingerprint`, `simplex-chat/simplexmq`, `src/Simplex/Messaging/Server/CLI.hs`):
/// the fingerprint is what clients were given, so a CA that does not match it locks them all out.
pub fn load_for_start(dir: &Path) -> Result<ServerCredentials, CertError> {
    let creds = load(dir)?;
    let file = dir.join(crate::config::FINGERPRINT_FILE);
    let saved = match fs::read_to_string(&file) {
        Ok(s) => s.trim().to_string(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(CertError::NoFingerprint { file })
        }
        Err(source) => return Err(CertError::Io { file, source }),
    };
    let actual = fingerprint_b64url(&creds.key_hash);
    // The reference writes it with padding; an operator may have copied it from an address
    // without, so both spellings of the same hash are accepted.
    if saved.trim_end_matches('=') != actual.trim_end_matches('=') {
        return Err(CertError::FingerprintMismatch {
            file,
            ca: dir.join(CA_CERT_FILE),
            saved,
            actual,
        });
    }
    Ok(creds)
}

fn read_bounded(file: &Path) -> Result<Vec<u8>, CertError> {
    let io_err = |source| CertError::Io {
        file: file.to_path_buf(),
        source,
    };
    let len = fs::metadata(file).map_err(io_err)?.len();
    if len > MAX_PEM_FILE_BYTES {
        return Err(CertError::TooLarge {
            file: file.to_path_buf(),
        });
    }
    fs::read(file).map_err(io_err)
}

fn read_certs(file: &Path) -> Result<Vec<Vec<u8>>, CertError> {
    let pem = read_bounded(file)?;
    let certs: Vec<CertificateDer<'static>> = rustls_pemfile::certs(&mut pem.as_slice())
        .collect::<Result<_, _>>()
        .map_err(|e| CertError::Pem {
            file: file.to_path_buf(),
            reason: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(CertError::NoCertificate {
            file: file.to_path_buf(),
        });
    }
    Ok(certs.into_iter().map(|c| c.as_ref().to_vec()).collect())
}

fn read_leaf_key(file: &Path) -> Result<LeafKey, CertError> {
    let pem = read_bounded(file)?;
    let key = rustls_pemfile::private_key(&mut pem.as_slice())
        .map_err(|e| CertError::Pem {
            file: file.to_path_buf(),
            reason: e.to_string(),
        })?
        .ok_or_else(|| CertError::NoKey {
            file: file.to_path_buf(),
        })?;
    let der = match key {
        rustls::pki_types::PrivateKeyDer::Pkcs8(k) => k.secret_pkcs8_der().to_vec(),
        other => {
            return Err(CertError::UnsupportedKey {
                file: file.to_path_buf(),
                reason: format!("{other:?} is not PKCS#8"),
            })
        }
    };
    let info = PrivateKeyInfo::try_from(der.as_slice()).map_err(|e| CertError::Pem {
        file: file.to_path_buf(),
        reason: format!("bad PKCS#8: {e}"),
    })?;
    let oid = info.algorithm.oid.to_string();
    if oid == OID_ED448 {
        // The private key is an OCTET STRING of the 57 key bytes (RFC 8410 §7).
        let raw = match info.private_key {
            [0x04, 0x39, rest @ ..] => <[u8; ED448_KEY_LEN]>::try_from(rest).ok(),
            _ => None,
        };
        return raw
            .map(LeafKey::Ed448)
            .ok_or_else(|| CertError::UnsupportedKey {
                file: file.to_path_buf(),
                reason: "an Ed448 key that is not 57 bytes".into(),
            });
    }
    if oid != OID_ED25519 {
        return Err(CertError::UnsupportedKey {
            file: file.to_path_buf(),
            reason: format!("algorithm {oid}"),
        });
    }
    SigningKey::from_pkcs8_der(&der)
        .map(LeafKey::Ed25519)
        .map_err(|e| CertError::UnsupportedKey {
            file: file.to_path_buf(),
            reason: e.to_string(),
        })
}

/// The raw Ed25519 or Ed448 public key of the leaf certificate.
fn leaf_public_key(der: &[u8], file: &Path) -> Result<Vec<u8>, CertError> {
    let (_, cert) =
        x509_parser::parse_x509_certificate(der).map_err(|e| CertError::BadCertificate {
            file: file.to_path_buf(),
            reason: e.to_string(),
        })?;
    let spki = cert.public_key();
    let oid = spki.algorithm.algorithm.to_id_string();
    if oid != OID_ED25519 && oid != OID_ED448 {
        return Err(CertError::UnsupportedKey {
            file: file.to_path_buf(),
            reason: format!("certificate key algorithm {oid}"),
        });
    }
    Ok(spki.subject_public_key.data.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;
    use x509_parser::extensions::ParsedExtension;

    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "smp-relay-certs-{name}-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn generated_credentials_load_and_have_reference_extensions() {
        let dir = temp_dir("gen");
        let generated = generate("smp.example.com").unwrap();
        generated.write_files(&dir).unwrap();
        let creds = load(&dir).unwrap();
        assert_eq!(creds.chain_der.len(), 2);
        let expected: [u8; 32] = Sha256::digest(&creds.chain_der[1]).into();
        assert_eq!(creds.key_hash, expected);

        let (_, ca) = x509_parser::parse_x509_certificate(&creds.chain_der[1]).unwrap();
        assert_eq!(ca.version(), x509_parser::x509::X509Version::V3);
        let bc = ca.basic_constraints().unwrap().unwrap();
        assert!(bc.critical && bc.value.ca);
        let ca_ski = ski(&ca).expect("CA has a SubjectKeyIdentifier");
        let subject = ca.subject().to_string();
        assert!(subject.contains("CN=SMP server CA") && subject.contains("O=SimpleX"));
        assert_eq!(ca.subject(), ca.issuer());

        let (_, leaf) = x509_parser::parse_x509_certificate(&creds.chain_der[0]).unwrap();
        assert!(!leaf.basic_constraints().unwrap().unwrap().value.ca);
        let ku = leaf.key_usage().unwrap().unwrap().value;
        assert!(ku.digital_signature() && ku.non_repudiation() && ku.key_agreement());
        assert!(!ku.key_cert_sign());
        assert!(
            leaf.extended_key_usage()
                .unwrap()
                .unwrap()
                .value
                .server_auth
        );
        assert_eq!(leaf.subject().to_string(), "CN=smp.example.com");
        assert_eq!(leaf.issuer(), ca.subject());
        assert_eq!(aki(&leaf), Some(ca_ski.clone()));
        assert_eq!(aki(&ca), Some(ca_ski));
        // The leaf is signed by the CA key.
        let ca_key: [u8; 32] = ca
            .public_key()
            .subject_public_key
            .data
            .as_ref()
            .try_into()
            .unwrap();
        let sig: [u8; 64] = leaf.signature_value.data.as_ref().try_into().unwrap();
        ed25519_dalek::VerifyingKey::from_bytes(&ca_key)
            .unwrap()
            .verify_strict(
                leaf.tbs_certificate.as_ref(),
                &ed25519_dalek::Signature::from_bytes(&sig),
            )
            .unwrap();
        assert!(leaf.validity().is_valid() && ca.validity().is_valid());
    }

    fn ski(cert: &x509_parser::certificate::X509Certificate) -> Option<Vec<u8>> {
        cert.extensions()
            .iter()
            .find_map(|e| match e.parsed_extension() {
                ParsedExtension::SubjectKeyIdentifier(k) => Some(k.0.to_vec()),
                _ => None,
            })
    }

    fn aki(cert: &x509_parser::certificate::X509Certificate) -> Option<Vec<u8>> {
        cert.extensions()
            .iter()
            .find_map(|e| match e.parsed_extension() {
                ParsedExtension::AuthorityKeyIdentifier(k) => {
                    k.key_identifier.as_ref().map(|k| k.0.to_vec())
                }
                _ => None,
            })
    }

    #[test]
    fn generated_files_are_readable_by_openssl() {
        let generated = generate("h").unwrap();
        for pem in [&generated.ca_key_pem, &generated.server_key_pem] {
            let key = openssl::pkey::PKey::private_key_from_pem(pem.as_bytes()).unwrap();
            assert_eq!(key.id(), openssl::pkey::Id::ED25519);
            let der = key.private_key_to_pkcs8().unwrap();
            assert_eq!(der.len(), 48);
            assert_eq!(der[..16], ED25519_PKCS8_V1_PREFIX);
        }
        let ca = openssl::x509::X509::from_pem(generated.ca_cert_pem.as_bytes()).unwrap();
        let leaf = openssl::x509::X509::from_pem(generated.server_cert_pem.as_bytes()).unwrap();
        assert!(leaf.verify(&ca.public_key().unwrap()).unwrap());
        assert!(ca.verify(&ca.public_key().unwrap()).unwrap());
    }

    #[test]
    fn fingerprint_is_padded_base64url() {
        let fp = fingerprint_b64url(&[0xfb; 32]);
        assert_eq!(fp.len(), 44);
        assert!(fp.ends_with('='));
        assert!(fp.starts_with("-_"));
    }

    #[test]
    fn missing_and_garbled_files_are_named() {
        let dir = temp_dir("missing");
        let err = load(&dir).unwrap_err().to_string();
        assert!(err.contains("server.crt"), "{err}");

        generate("h").unwrap().write_files(&dir).unwrap();
        fs::write(dir.join(CA_CERT_FILE), "not pem at all").unwrap();
        let err = load(&dir).unwrap_err().to_string();
        assert!(err.contains("ca.crt"), "{err}");

        generate("h").unwrap().write_files(&dir).unwrap();
        fs::write(dir.join(SERVER_KEY_FILE), "garbage").unwrap();
        let err = load(&dir).unwrap_err().to_string();
        assert!(err.contains("server.key"), "{err}");
    }

    #[test]
    fn key_from_another_identity_is_a_mismatch() {
        let dir = temp_dir("mismatch");
        generate("h").unwrap().write_files(&dir).unwrap();
        let other = generate("h").unwrap();
        fs::write(dir.join(SERVER_KEY_FILE), other.server_key_pem).unwrap();
        assert!(matches!(load(&dir), Err(CertError::KeyMismatch { .. })));
    }

    #[test]
    fn an_ed448_server_key_that_is_not_the_certificate_s_is_refused() {
        let dir = temp_dir("ed448");
        generate("h").unwrap().write_files(&dir).unwrap();
        // PKCS#8 Ed448 private key: OID 1.3.101.113 and 57 key bytes.
        let mut der = vec![
            0x30, 0x47, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x71, 0x04, 0x3b,
            0x04, 0x39,
        ];
        der.extend_from_slice(&[7u8; 57]);
        let pem = format!(
            "-----BEGIN PRIVATE KEY-----\n{}\n-----END PRIVATE KEY-----\n",
            base64::engine::general_purpose::STANDARD.encode(&der)
        );
        fs::write(dir.join(SERVER_KEY_FILE), pem).unwrap();
        // Read as Ed448, then found not to be the Ed25519 certificate's key.
        assert!(matches!(load(&dir), Err(CertError::KeyMismatch { .. })));
    }
}
