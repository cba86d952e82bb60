//! `smp-relay cert`: a new online certificate and key under the same offline CA, so the server
//! address (the CA's fingerprint) stays, as the reference's `cert` makes one (simplexmq
//! `Server/CLI.hs`, `genOnline`): the signature algorithm and common name of the current
//! `server.crt` unless given, the same extensions as `init`'s, signed with `ca.key`. OpenSSL
//! signs, so an Ed448 CA works as well as an Ed25519 one.

use std::fs;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use openssl::asn1::Asn1Time;
use openssl::bn::{BigNum, MsbOption};
use openssl::hash::MessageDigest;
use openssl::nid::Nid;
use openssl::pkey::{Id, PKey, Private};
use openssl::x509::extension::{
    AuthorityKeyIdentifier, BasicConstraints, ExtendedKeyUsage, KeyUsage, SubjectKeyIdentifier,
};
use openssl::x509::{X509NameBuilder, X509};

use crate::config::{CA_CERT_FILE, CA_KEY_FILE, SERVER_CERT_FILE, SERVER_KEY_FILE};

/// Days the new online certificate is valid, as `init`'s (10 years).
const VALIDITY_DAYS: u32 = 10 * 365;

/// The online key's algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    Ed25519,
    Ed448,
}

/// What was made: the algorithm and common name of the new certificate.
pub struct Reissued {
    pub algorithm: Algorithm,
    pub common_name: String,
}

/// Writes a new `server.key` and `server.crt` into `dir`, signed by its `ca.key` and `ca.crt`.
pub fn reissue(
    dir: &Path,
    algorithm: Option<Algorithm>,
    common_name: Option<&str>,
) -> Result<Reissued, String> {
    let read = |name: &str| {
        let path = dir.join(name);
        fs::read(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))
    };
    let ca_key_path = dir.join(CA_KEY_FILE);
    let ca_key = PKey::private_key_from_pem(&read(CA_KEY_FILE).map_err(|e| {
        format!(
            "{e}: `cert` signs with the offline CA key; put ca.key back into {} for it (and \
             take it offline again after)",
            dir.display()
        )
    })?)
    .map_err(|e| format!("{}: not a PEM private key: {e}", ca_key_path.display()))?;
    if !matches!(ca_key.id(), Id::ED25519 | Id::ED448) {
        return Err(format!(
            "{} is neither an Ed25519 nor an Ed448 key",
            ca_key_path.display()
        ));
    }
    let ca = X509::from_pem(&read(CA_CERT_FILE)?)
        .map_err(|e| format!("{}: {e}", dir.join(CA_CERT_FILE).display()))?;
    let old_path = dir.join(SERVER_CERT_FILE);
    let old = X509::from_pem(&read(SERVER_CERT_FILE)?)
        .map_err(|e| format!("{}: {e}", old_path.display()))?;
    let algorithm = match algorithm {
        Some(a) => a,
        None => match old.signature_algorithm().object().to_string().as_str() {
            "ED448" => Algorithm::Ed448,
            "ED25519" => Algorithm::Ed25519,
            other => {
                return Err(format!(
                    "{} is signed with {other}, neither Ed25519 nor Ed448: pass \
                     --sign-algorithm",
                    old_path.display()
                ))
            }
        },
    };
    let common_name = match common_name {
        Some(cn) => cn.to_string(),
        None => old
            .subject_name()
            .entries_by_nid(Nid::COMMONNAME)
            .next()
            .and_then(|e| String::from_utf8(e.data().as_slice().to_vec()).ok())
            .ok_or_else(|| format!("{} has no common name: pass --cn", old_path.display()))?,
    };
    let key = match algorithm {
        Algorithm::Ed25519 => PKey::generate_ed25519(),
        Algorithm::Ed448 => PKey::generate_ed448(),
    }
    .map_err(|e| e.to_string())?;
    let cert = build(&key, &ca, &ca_key, &common_name).map_err(|e| e.to_string())?;
    let key_pem = key.private_key_to_pem_pkcs8().map_err(|e| e.to_string())?;
    let cert_pem = cert.to_pem().map_err(|e| e.to_string())?;
    // The certificate first: a stop between the two leaves a key that does not match, which
    // `start` names, rather than a key given out under the old certificate.
    replace(&dir.join(SERVER_CERT_FILE), &cert_pem, false)?;
    replace(&dir.join(SERVER_KEY_FILE), &key_pem, true)?;
    Ok(Reissued {
        algorithm,
        common_name,
    })
}

fn build(
    key: &PKey<Private>,
    ca: &X509,
    ca_key: &PKey<Private>,
    common_name: &str,
) -> Result<X509, openssl::error::ErrorStack> {
    let mut name = X509NameBuilder::new()?;
    name.append_entry_by_nid(Nid::COMMONNAME, common_name)?;
    let name = name.build();
    let mut b = X509::builder()?;
    b.set_version(2)?;
    let mut serial = BigNum::new()?;
    serial.rand(128, MsbOption::MAYBE_ZERO, false)?;
    let serial = serial.to_asn1_integer()?;
    b.set_serial_number(&serial)?;
    b.set_subject_name(&name)?;
    b.set_issuer_name(ca.subject_name())?;
    b.set_pubkey(key)?;
    let (from, until) = (
        Asn1Time::days_from_now(0)?,
        Asn1Time::days_from_now(VALIDITY_DAYS)?,
    );
    b.set_not_before(&from)?;
    b.set_not_after(&until)?;
    b.append_extension(BasicConstraints::new().build()?)?;
    b.append_extension(
        KeyUsage::new()
            .digital_signature()
            .non_repudiation()
            .key_agreement()
            .build()?,
    )?;
    b.append_extension(ExtendedKeyUsage::new().server_auth().build()?)?;
    let ski = SubjectKeyIdentifier::new().build(&b.x509v3_context(Some(ca), None))?;
    b.append_extension(ski)?;
    let aki = AuthorityKeyIdentifier::new()
        .keyid(true)
        .build(&b.x509v3_context(Some(ca), None))?;
    b.append_extension(aki)?;
    // EdDSA signs the message itself: no digest (`reissue` checked the CA key's kind).
    b.sign(ca_key, MessageDigest::null())?;
    Ok(b.build())
}

/// Writes `path` through a temporary file and a rename, private (0600) when `secret`.
fn replace(path: &Path, bytes: &[u8], secret: bool) -> Result<(), String> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".new");
    let tmp = std::path::PathBuf::from(tmp);
    let err = |e: std::io::Error| format!("cannot write {}: {e}", path.display());
    let mut opts = fs::OpenOptions::new();
    opts.write(true).create(true).truncate(true);
    if secret {
        opts.mode(0o600);
    }
    let mut f = opts.open(&tmp).map_err(err)?;
    f.write_all(bytes)
        .and_then(|()| f.sync_all())
        .map_err(err)?;
    fs::rename(&tmp, path).map_err(err)
}
