//! Acting as a service, as the reference client does.
//!
//! A service presents a TLS client certificate chain (`ClientCert`) and, in its client hello,
//! the same chain with a fresh per-connection Ed25519 "service session key" signed by the TLS
//! leaf key (simplexmq `Transport.hs`, `smpClientHandshake`, `mkClientService`). The credentials
//! are made as the reference agent makes them (simplexmq `Agent/Client.hs`,
//! `getServiceCredentials`, with `genCredentials` of `Transport/Credentials.hs`): a self-signed
//! Ed25519 certificate, CN "simplex". The service's identity is the SHA-256 fingerprint of the
//! identity certificate (`transport::service_cert`).
//!
//! In a service session, NEW, SUB and NSUB signed with a queue key carry a second signature
//! (simplexmq `Client.hs`, `authTransmission`; `Protocol.hs`, `useServiceAuth`): the service
//! session key signs the authorized bytes, and the queue key signs `fingerprint ‖ authorized`
//! instead of `authorized`, so that a different service cannot be substituted. SUBS and NSUBS are
//! signed by the service session key alone, with the service ID as entity ID.

use ed25519_dalek::{SigningKey, VerifyingKey};
use openssl::asn1::Asn1Time;
use openssl::bn::BigNum;
use openssl::hash::MessageDigest;
use openssl::pkey::{Id, PKey, Private};
use openssl::x509::extension::BasicConstraints;
use openssl::x509::{X509Name, X509NameBuilder, X509};

use super::error::ClientError;
use crate::crypto::hash::sha256;
use crate::crypto::keys::ed25519_to_spki;
use crate::crypto::signed_key::sign_spki_ed25519;
use crate::protocol::handshake::ClientService;
use crate::protocol::version::{Version, RCV_SERVICE, SERVICE_CERTS};
use crate::transport::service_cert;

/// Service roles as the hello encodes them (simplexmq `Transport.hs`, `SMPServiceRole`).
pub const ROLE_MESSAGING: u8 = b'M';
pub const ROLE_NOTIFIER: u8 = b'N';
pub const ROLE_PROXY: u8 = b'P';

/// The subject common name of the reference agent's service certificates.
pub const SERVICE_CN: &str = "simplex";

/// Validity of generated certificates, as the agent asks `genCredentials`: from 25 hours ago to
/// 24 × 999999 hours from now.
const VALID_BEFORE_SECS: i64 = 25 * 3600;
const VALID_AFTER_SECS: i64 = 24 * 999_999 * 3600;

/// The lowest version at which a role may be offered: a messaging service needs v19
/// (`rcvServiceSMPVersion`), the others v16 (`serviceCertsSMPVersion`).
pub fn role_min_version(role: u8) -> Version {
    if role == ROLE_MESSAGING {
        RCV_SERVICE
    } else {
        SERVICE_CERTS
    }
}

/// A TLS client certificate: the chain (DER, leaf first) and the leaf's Ed25519 private key.
#[derive(Clone)]
pub struct ClientCert {
    pub chain: Vec<Vec<u8>>,
    pub key: SigningKey,
}

impl std::fmt::Debug for ClientCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientCert")
            .field("certificates", &self.chain.len())
            .finish_non_exhaustive()
    }
}

fn setup(e: impl std::fmt::Display) -> ClientError {
    ClientError::TlsSetup(e.to_string())
}

fn ossl_key(key: &SigningKey) -> Result<PKey<Private>, ClientError> {
    PKey::private_key_from_raw_bytes(&key.to_bytes(), Id::ED25519).map_err(setup)
}

fn cn(name: &str) -> Result<X509Name, ClientError> {
    let mut b = X509NameBuilder::new().map_err(setup)?;
    b.append_entry_by_text("CN", name).map_err(setup)?;
    Ok(b.build())
}

/// An X.509 v3 certificate for `subject_key` named `subject`, signed by `issuer_key` as `issuer`,
/// with dates around `now` and a basicConstraints cA extension if `ca`.
fn make_cert(
    subject: &str,
    subject_key: &SigningKey,
    issuer: &str,
    issuer_key: &SigningKey,
    ca: bool,
    not_before: i64,
    not_after: i64,
) -> Result<Vec<u8>, ClientError> {
    let mut b = X509::builder().map_err(setup)?;
    b.set_version(2).map_err(setup)?;
    let serial = BigNum::from_u32(1)
        .and_then(|n| n.to_asn1_integer())
        .map_err(setup)?;
    b.set_serial_number(&serial).map_err(setup)?;
    let (subject_name, issuer_name) = (cn(subject)?, cn(issuer)?);
    b.set_subject_name(&subject_name).map_err(setup)?;
    b.set_issuer_name(&issuer_name).map_err(setup)?;
    let public = ossl_key(subject_key)?;
    b.set_pubkey(&public).map_err(setup)?;
    let from = Asn1Time::from_unix(not_before).map_err(setup)?;
    let to = Asn1Time::from_unix(not_after).map_err(setup)?;
    b.set_not_before(&from).map_err(setup)?;
    b.set_not_after(&to).map_err(setup)?;
    if ca {
        let bc = BasicConstraints::new()
            .critical()
            .ca()
            .build()
            .map_err(setup)?;
        b.append_extension(bc).map_err(setup)?;
    }
    let signer = ossl_key(issuer_key)?;
    b.sign(&signer, MessageDigest::null()).map_err(setup)?;
    b.build().to_der().map_err(setup)
}

fn now_unix() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

impl ClientCert {
    /// The reference agent's service credentials: a fresh Ed25519 key and a self-signed
    /// certificate (CN "simplex", no extensions), valid from 25 hours ago for 999999 days. A
    /// 1-certificate chain: the certificate is its own trust anchor and identity.
    pub fn self_signed() -> Result<ClientCert, ClientError> {
        let key = SigningKey::generate(&mut rand::rngs::OsRng);
        let now = now_unix();
        let der = make_cert(
            SERVICE_CN,
            &key,
            SERVICE_CN,
            &key,
            false,
            now - VALID_BEFORE_SECS,
            now + VALID_AFTER_SECS,
        )?;
        Ok(ClientCert {
            chain: vec![der],
            key,
        })
    }

    /// A 2-certificate chain `[leaf, ca]` (for tests): a fresh leaf key (CN "simplex") certified
    /// by a fresh CA (CN "simplex CA", basicConstraints cA), both valid as `self_signed`. The CA
    /// is the trust anchor and the identity certificate.
    pub fn with_ca() -> Result<ClientCert, ClientError> {
        let ca_key = SigningKey::generate(&mut rand::rngs::OsRng);
        let key = SigningKey::generate(&mut rand::rngs::OsRng);
        let (from, to) = (
            now_unix() - VALID_BEFORE_SECS,
            now_unix() + VALID_AFTER_SECS,
        );
        let ca_name = "simplex CA";
        let ca = make_cert(ca_name, &ca_key, ca_name, &ca_key, true, from, to)?;
        let leaf = make_cert(SERVICE_CN, &key, ca_name, &ca_key, false, from, to)?;
        Ok(ClientCert {
            chain: vec![leaf, ca],
            key,
        })
    }

    /// A certificate with chosen dates (seconds since the epoch), self-signed by `key` (for
    /// tests of expired and not yet valid certificates).
    pub fn self_signed_with_dates(
        key: SigningKey,
        not_before: i64,
        not_after: i64,
    ) -> Result<ClientCert, ClientError> {
        let der = make_cert(
            SERVICE_CN, &key, SERVICE_CN, &key, false, not_before, not_after,
        )?;
        Ok(ClientCert {
            chain: vec![der],
            key,
        })
    }

    /// SHA-256 of the identity certificate's DER (the only certificate of a 1-certificate chain,
    /// otherwise the second); `None` for an empty chain or one of more than 4 certificates.
    pub fn fingerprint(&self) -> Option<[u8; 32]> {
        let i = service_cert::id_cert_index(self.chain.len())?;
        Some(sha256(&self.chain[i]))
    }

    /// The hello's service credentials: `role`, this chain, and the SPKI of `session_key` signed by
    /// the leaf key as an X.509 SignedExact (`crypto::signed_key::sign_spki_ed25519`).
    pub fn client_service(&self, role: u8, session_key: &VerifyingKey) -> ClientService {
        ClientService {
            role,
            chain: self.chain.clone(),
            signed_key: sign_spki_ed25519(&self.key, &ed25519_to_spki(session_key.as_bytes())),
        }
    }
}

/// A service session: the service handshake succeeded.
#[derive(Clone)]
pub struct ServiceSession {
    pub role: u8,
    /// SHA-256 of the identity certificate, which queue keys sign along (`authTransmission`).
    pub fingerprint: [u8; 32],
    /// The per-connection key whose SPKI the hello carried, signed by the TLS leaf key.
    pub session_key: SigningKey,
    /// The ID the server gave the service (the third handshake block).
    pub service_id: Vec<u8>,
}

impl std::fmt::Debug for ServiceSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceSession")
            .field("role", &char::from(self.role))
            .field("service_id", &self.service_id)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypto::keys::PublicAuthKey;
    use crate::crypto::signed_key::verify_signed_key;
    use crate::protocol::handshake::ClientHello;

    #[test]
    fn generated_chains_pass_the_server_rules() {
        let now = u64::try_from(now_unix()).unwrap();
        for c in [
            ClientCert::self_signed().unwrap(),
            ClientCert::with_ca().unwrap(),
        ] {
            assert_eq!(service_cert::validate_chain(&c.chain, now), Ok(()));
            let sc = service_cert::service_cert(&c.chain).unwrap();
            assert_eq!(
                sc.leaf_key,
                PublicAuthKey::Ed25519(c.key.verifying_key().to_bytes())
            );
            assert_eq!(Some(sc.fingerprint), c.fingerprint());
        }
        let one = ClientCert::self_signed().unwrap();
        assert_eq!(one.fingerprint(), Some(sha256(&one.chain[0])));
        let two = ClientCert::with_ca().unwrap();
        assert_eq!(two.fingerprint(), Some(sha256(&two.chain[1])));
        let (_, cert) = x509_parser::parse_x509_certificate(&one.chain[0]).unwrap();
        assert_eq!(
            cert.subject().iter_common_name().next().unwrap().as_str(),
            Ok(SERVICE_CN)
        );
    }

    #[test]
    fn hello_service_signs_the_session_key_with_the_leaf() {
        let c = ClientCert::self_signed().unwrap();
        let session = SigningKey::generate(&mut rand::rngs::OsRng);
        let svc = c.client_service(ROLE_NOTIFIER, &session.verifying_key());
        assert_eq!(svc.chain, c.chain);
        let leaf = PublicAuthKey::Ed25519(c.key.verifying_key().to_bytes());
        let spki = verify_signed_key(&svc.signed_key, &leaf).unwrap();
        assert_eq!(spki, ed25519_to_spki(session.verifying_key().as_bytes()));
        // It survives the hello codec.
        let hello = ClientHello {
            version: 16,
            key_hash: vec![1; 32],
            client_key: None,
            proxy_server: false,
            service: Some(svc.clone()),
        };
        assert_eq!(
            ClientHello::decode(&hello.encode()).unwrap().service,
            Some(svc)
        );
        assert_eq!(role_min_version(ROLE_MESSAGING), 19);
        assert_eq!(role_min_version(ROLE_NOTIFIER), 16);
        assert_eq!(role_min_version(ROLE_PROXY), 16);
    }
}
