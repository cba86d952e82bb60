//! Client (service) certificate chains: their shapes and how the server validates them.
//!
//! Any TLS client may present a chain; only services do (simplexmq `Transport/Server.hs`,
//! `validateClientCertificate`). The shape rules are simplexmq `Transport/Shared.hs`,
//! `chainIdCaCerts`:
//!
//! | certificates | leaf | identity cert | trust anchor |
//! |---|---|---|---|
//! | 1 | chain[0] | chain[0] | chain[0] (its own anchor) |
//! | 2 | chain[0] | chain[1] | chain[1] |
//! | 3 | chain[0] | chain[1] | chain[2] |
//! | 4 | chain[0] | chain[1] | chain[3] |
//! | 5 or more | rejected ("chain too long") | | |
//!
//! `validate_chain` is the TLS-level check: X.509 path validation against the single anchor with
//! the default checks of the reference's x509 validation (`x509validate`, host name check off):
//! the leaf is X.509 v3; from the leaf, each certificate's issuer is the anchor when its issuer
//! name is the anchor's subject (the signature is then checked with the anchor's key and the walk
//! stops), otherwise a certificate of the rest of the chain whose subject is that issuer name,
//! which must be allowed to act as a CA (basicConstraints cA, keyCertSign when key usage is
//! present, path length); a self-signed certificate that is not the anchor, or an issuer that is
//! nowhere, fails. Every certificate on the walk must be within its validity period. The anchor
//! itself is trusted as given (its own dates and self-signature are not checked, as in the
//! reference), except for a 1-certificate chain, where the anchor is the leaf and so is checked
//! like any leaf, including its self-signature.
//!
//! One deliberate narrowing: the reference's x509 code verifies any algorithm it knows, while
//! SMP's TLS parameters allow EdDSA only (simplexmq `Transport.hs`, `defaultSupportedParams`);
//! here the leaf key must be Ed25519 or Ed448 and every signature on the walk must be Ed25519 or
//! Ed448 too. An RSA or ECDSA certificate anywhere on the walk is rejected.
//!
//! `service_cert` is what the SMP layer needs from a chain already accepted at the TLS level: the
//! leaf key (which signs the service's session key in the client hello) and the identity
//! certificate's SHA-256 fingerprint (the service's identity).

use x509_parser::certificate::X509Certificate;
use x509_parser::oid_registry::Oid;
use x509_parser::x509::X509Version;

use crate::crypto::auth::{ed25519_verify, ed448_verify};
use crate::crypto::hash::sha256;
use crate::crypto::keys::{PublicAuthKey, ED25519_SIG_LEN, ED448_SIG_LEN};

/// The longest chain accepted (`chainIdCaCerts`: 5 or more is `CCLong`).
pub const MAX_CHAIN_LEN: usize = 4;

const OID_ED25519: &str = "1.3.101.112";
const OID_ED448: &str = "1.3.101.113";

/// Why a chain is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ServiceCertError {
    #[error("empty certificate chain")]
    Empty,
    #[error("chain too long ({0} certificates, at most {MAX_CHAIN_LEN})")]
    TooLong(usize),
    #[error("certificate does not parse")]
    Parse,
    #[error("leaf key is not Ed25519 or Ed448")]
    LeafKey,
    #[error("leaf certificate is not X.509 v3")]
    LeafNotV3,
    #[error("certificate expired")]
    Expired,
    #[error("certificate not yet valid")]
    NotYetValid,
    #[error("certificate signature is not Ed25519 or Ed448, or does not match the issuer key")]
    UnsupportedSignature,
    #[error("certificate signature does not verify")]
    BadSignature,
    #[error("certificate issuer is neither the trust anchor nor in the chain")]
    UnknownCa,
    #[error("self-signed certificate that is not the trust anchor")]
    SelfSigned,
    #[error("issuer certificate is not allowed to act as a CA")]
    NotCa,
}

/// A service's identity as the SMP layer uses it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceCert {
    /// The leaf certificate's key (Ed25519 or Ed448).
    pub leaf_key: PublicAuthKey,
    /// SHA-256 of the identity certificate's DER: the only certificate of a 1-certificate
    /// chain, otherwise chain[1].
    pub fingerprint: [u8; 32],
}

/// Index of the identity certificate for a chain of `len` certificates (1..=4), else `None`.
pub fn id_cert_index(len: usize) -> Option<usize> {
    match len {
        1 => Some(0),
        2..=MAX_CHAIN_LEN => Some(1),
        _ => None,
    }
}

/// Index of the trust anchor for a chain of `len` certificates (1..=4), else `None`.
pub fn anchor_index(len: usize) -> Option<usize> {
    match len {
        1..=MAX_CHAIN_LEN => Some(len - 1),
        _ => None,
    }
}

fn check_len(len: usize) -> Result<(), ServiceCertError> {
    match len {
        0 => Err(ServiceCertError::Empty),
        1..=MAX_CHAIN_LEN => Ok(()),
        n => Err(ServiceCertError::TooLong(n)),
    }
}

fn parse(der: &[u8]) -> Result<X509Certificate<'_>, ServiceCertError> {
    match x509_parser::parse_x509_certificate(der) {
        Ok(([], cert)) => Ok(cert),
        _ => Err(ServiceCertError::Parse),
    }
}

/// An EdDSA signing key from a certificate (X25519 and anything else: `None`).
fn signing_key(cert: &X509Certificate<'_>) -> Option<PublicAuthKey> {
    match PublicAuthKey::from_spki(cert.public_key().raw) {
        Ok(k @ (PublicAuthKey::Ed25519(_) | PublicAuthKey::Ed448(_))) => Some(k),
        _ => None,
    }
}

/// The shape and the leaf key only, with no date or signature check: for the SMP handshake, on a
/// chain the TLS layer already validated (`validate_chain`).
pub fn service_cert(chain: &[Vec<u8>]) -> Result<ServiceCert, ServiceCertError> {
    check_len(chain.len())?;
    let leaf = parse(&chain[0])?;
    let leaf_key = signing_key(&leaf).ok_or(ServiceCertError::LeafKey)?;
    let id = id_cert_index(chain.len()).ok_or(ServiceCertError::TooLong(chain.len()))?;
    Ok(ServiceCert {
        leaf_key,
        fingerprint: sha256(&chain[id]),
    })
}

/// The full TLS-level rules (see the module documentation), at `now_unix` seconds. An empty chain
/// is an ordinary client and passes (the reference's `CCEmpty`).
pub fn validate_chain(chain: &[Vec<u8>], now_unix: u64) -> Result<(), ServiceCertError> {
    if chain.is_empty() {
        return Ok(());
    }
    check_len(chain.len())?;
    let certs = chain
        .iter()
        .map(|der| parse(der))
        .collect::<Result<Vec<_>, _>>()?;
    let leaf = &certs[0];
    signing_key(leaf).ok_or(ServiceCertError::LeafKey)?;
    if leaf.version() != X509Version::V3 {
        return Err(ServiceCertError::LeafNotV3);
    }
    let anchor = &certs[anchor_index(certs.len()).ok_or(ServiceCertError::TooLong(certs.len()))?];
    let now = i64::try_from(now_unix).unwrap_or(i64::MAX);

    // The walk: `current` and the chain certificates not used yet (the anchor may be among them;
    // it is matched through the trust store first, as the reference does).
    let mut current = 0usize;
    let mut remaining: Vec<usize> = (1..certs.len()).collect();
    let mut level = 0u32;
    loop {
        let cert = &certs[current];
        check_time(cert, now)?;
        let issuer_name = cert.issuer().as_raw();
        if issuer_name == anchor.subject().as_raw() {
            return check_signature(cert, anchor);
        }
        if issuer_name == cert.subject().as_raw() {
            return Err(ServiceCertError::SelfSigned);
        }
        let pos = remaining
            .iter()
            .position(|&i| certs[i].subject().as_raw() == issuer_name)
            .ok_or(ServiceCertError::UnknownCa)?;
        let issuer = remaining.remove(pos);
        check_ca(&certs[issuer], level)?;
        check_signature(cert, &certs[issuer])?;
        current = issuer;
        level += 1;
    }
}

fn check_time(cert: &X509Certificate<'_>, now: i64) -> Result<(), ServiceCertError> {
    let validity = cert.validity();
    if now < validity.not_before.timestamp() {
        return Err(ServiceCertError::NotYetValid);
    }
    if now > validity.not_after.timestamp() {
        return Err(ServiceCertError::Expired);
    }
    Ok(())
}

/// The issuer taken from the chain may sign certificates: basicConstraints with cA, keyCertSign
/// if key usage is present, and a path length constraint (if any) of at least `level`.
fn check_ca(issuer: &X509Certificate<'_>, level: u32) -> Result<(), ServiceCertError> {
    let may_sign = match issuer.key_usage() {
        Ok(Some(ku)) => ku.value.key_cert_sign(),
        Ok(None) => true,
        Err(_) => false,
    };
    let (is_ca, path_len) = match issuer.basic_constraints() {
        Ok(Some(bc)) if bc.value.ca => (true, bc.value.path_len_constraint),
        _ => (false, None),
    };
    let depth_ok = path_len.is_none_or(|pl| pl >= level);
    if may_sign && is_ca && depth_ok {
        Ok(())
    } else {
        Err(ServiceCertError::NotCa)
    }
}

/// `cert` is signed by `issuer`'s key, with Ed25519 or Ed448 (and the algorithm of the key).
fn check_signature(
    cert: &X509Certificate<'_>,
    issuer: &X509Certificate<'_>,
) -> Result<(), ServiceCertError> {
    let alg: &Oid = &cert.signature_algorithm.algorithm;
    let alg = alg.to_id_string();
    let tbs: &[u8] = cert.tbs_certificate.as_ref();
    let sig: &[u8] = &cert.signature_value.data;
    let ok = match (alg.as_str(), signing_key(issuer)) {
        (OID_ED25519, Some(PublicAuthKey::Ed25519(k))) => {
            let sig: &[u8; ED25519_SIG_LEN] =
                sig.try_into().map_err(|_| ServiceCertError::BadSignature)?;
            ed25519_verify(&k, tbs, sig)
        }
        (OID_ED448, Some(PublicAuthKey::Ed448(k))) => {
            let sig: &[u8; ED448_SIG_LEN] =
                sig.try_into().map_err(|_| ServiceCertError::BadSignature)?;
            ed448_verify(&k, tbs, sig)
        }
        _ => return Err(ServiceCertError::UnsupportedSignature),
    };
    if ok {
        Ok(())
    } else {
        Err(ServiceCertError::BadSignature)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};

    const NOW: u64 = 1_750_000_000; // 2025-06-15

    fn ed25519_key() -> KeyPair {
        KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap()
    }

    fn params(cn: &str, ca: bool) -> CertificateParams {
        let mut p = CertificateParams::default();
        p.distinguished_name.push(DnType::CommonName, cn);
        p.not_before = rcgen::date_time_ymd(2024, 1, 1);
        p.not_after = rcgen::date_time_ymd(2030, 1, 1);
        if ca {
            p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        }
        p
    }

    /// A chain of `n` certificates: leaf, then issuers, the last self-signed.
    fn chain(n: usize) -> Vec<Vec<u8>> {
        let keys: Vec<KeyPair> = (0..n).map(|_| ed25519_key()).collect();
        let mut certs = vec![params(&format!("c{}", n - 1), n > 1)
            .self_signed(&keys[n - 1])
            .unwrap()];
        for i in (0..n - 1).rev() {
            let issuer = certs.last().unwrap();
            let c = params(&format!("c{i}"), i > 0)
                .signed_by(&keys[i], issuer, &keys[i + 1])
                .unwrap();
            certs.push(c);
        }
        certs.reverse();
        certs.iter().map(|c| c.der().to_vec()).collect()
    }

    #[test]
    fn chains_of_one_to_four_are_valid_and_five_is_too_long() {
        for n in 1..=4 {
            let c = chain(n);
            assert_eq!(validate_chain(&c, NOW), Ok(()), "{n}");
            let sc = service_cert(&c).unwrap();
            assert!(matches!(sc.leaf_key, PublicAuthKey::Ed25519(_)));
            let id = if n == 1 { 0 } else { 1 };
            assert_eq!(sc.fingerprint, sha256(&c[id]), "{n}");
            assert_eq!(sc.fingerprint, crate::crypto::hash::fingerprint(&c[id]));
        }
        let c = chain(5);
        assert_eq!(validate_chain(&c, NOW), Err(ServiceCertError::TooLong(5)));
        assert_eq!(service_cert(&c), Err(ServiceCertError::TooLong(5)));
        assert_eq!(validate_chain(&[], NOW), Ok(()));
        assert_eq!(service_cert(&[]), Err(ServiceCertError::Empty));
    }

    #[test]
    fn four_chains_skip_the_third_certificate_as_the_reference_does() {
        // [leaf, id, X, ca] with id issued directly by ca: X is never on the walk.
        let mut c = chain(3);
        let stranger = chain(1).remove(0);
        c.insert(2, stranger);
        assert_eq!(validate_chain(&c, NOW), Ok(()));
    }

    #[test]
    fn dates_are_checked() {
        let c = chain(2);
        assert_eq!(
            validate_chain(&c, 1_600_000_000),
            Err(ServiceCertError::NotYetValid)
        );
        assert_eq!(
            validate_chain(&c, 2_000_000_000),
            Err(ServiceCertError::Expired)
        );
        // The leaf alone out of date.
        let ca_key = ed25519_key();
        let ca = params("ca", true).self_signed(&ca_key).unwrap();
        let mut p = params("leaf", false);
        p.not_after = rcgen::date_time_ymd(2025, 1, 1);
        let leaf = p.signed_by(&ed25519_key(), &ca, &ca_key).unwrap();
        let c = vec![leaf.der().to_vec(), ca.der().to_vec()];
        assert_eq!(validate_chain(&c, NOW), Err(ServiceCertError::Expired));
        // The shape check does not look at dates.
        assert!(service_cert(&c).is_ok());
    }

    #[test]
    fn wrong_signatures_are_rejected() {
        // Leaf signed by another key than the CA's, with the CA's name.
        let ca_key = ed25519_key();
        let ca = params("ca", true).self_signed(&ca_key).unwrap();
        let impostor_key = ed25519_key();
        let impostor = params("ca", true).self_signed(&impostor_key).unwrap();
        let leaf = params("leaf", false)
            .signed_by(&ed25519_key(), &impostor, &impostor_key)
            .unwrap();
        let c = vec![leaf.der().to_vec(), ca.der().to_vec()];
        assert_eq!(validate_chain(&c, NOW), Err(ServiceCertError::BadSignature));
        // A flipped bit in the signature of a self-signed certificate.
        let mut one = chain(1);
        let last = one[0].len() - 1;
        one[0][last] ^= 1;
        assert_eq!(
            validate_chain(&one, NOW),
            Err(ServiceCertError::BadSignature)
        );
        // An issuer that is nowhere.
        let c = vec![leaf.der().to_vec(), chain(1).remove(0)];
        assert_eq!(validate_chain(&c, NOW), Err(ServiceCertError::UnknownCa));
    }

    #[test]
    fn intermediates_must_be_cas() {
        let keys: Vec<KeyPair> = (0..3).map(|_| ed25519_key()).collect();
        let ca = params("ca", true).self_signed(&keys[2]).unwrap();
        let id = params("id", false)
            .signed_by(&keys[1], &ca, &keys[2])
            .unwrap();
        let leaf = params("leaf", false)
            .signed_by(&keys[0], &id, &keys[1])
            .unwrap();
        let c: Vec<Vec<u8>> = [&leaf, &id, &ca].iter().map(|c| c.der().to_vec()).collect();
        assert_eq!(validate_chain(&c, NOW), Err(ServiceCertError::NotCa));
    }

    fn openssl_self_signed(
        key: &openssl::pkey::PKey<openssl::pkey::Private>,
        digest: bool,
    ) -> Vec<u8> {
        use openssl::asn1::Asn1Time;
        let mut name = openssl::x509::X509NameBuilder::new().unwrap();
        name.append_entry_by_text("CN", "svc").unwrap();
        let name = name.build();
        let mut b = openssl::x509::X509::builder().unwrap();
        b.set_version(2).unwrap();
        b.set_subject_name(&name).unwrap();
        b.set_issuer_name(&name).unwrap();
        b.set_pubkey(key).unwrap();
        b.set_not_before(&Asn1Time::from_unix(1_700_000_000).unwrap())
            .unwrap();
        b.set_not_after(&Asn1Time::from_unix(1_900_000_000).unwrap())
            .unwrap();
        let md = if digest {
            openssl::hash::MessageDigest::sha256()
        } else {
            openssl::hash::MessageDigest::null()
        };
        b.sign(key, md).unwrap();
        b.build().to_der().unwrap()
    }

    #[test]
    fn ed448_chains_are_valid() {
        let key = openssl::pkey::PKey::generate_ed448().unwrap();
        let c = vec![openssl_self_signed(&key, false)];
        assert_eq!(validate_chain(&c, NOW), Ok(()));
        let sc = service_cert(&c).unwrap();
        assert!(matches!(sc.leaf_key, PublicAuthKey::Ed448(_)));
        assert_eq!(sc.fingerprint, sha256(&c[0]));
    }

    #[test]
    fn non_eddsa_keys_are_rejected() {
        use openssl::ec::{EcGroup, EcKey};
        use openssl::nid::Nid;
        use openssl::pkey::PKey;
        let rsa = PKey::from_rsa(openssl::rsa::Rsa::generate(2048).unwrap()).unwrap();
        let group = EcGroup::from_curve_name(Nid::X9_62_PRIME256V1).unwrap();
        let ec = PKey::from_ec_key(EcKey::generate(&group).unwrap()).unwrap();
        for key in [rsa, ec] {
            let c = vec![openssl_self_signed(&key, true)];
            assert_eq!(validate_chain(&c, NOW), Err(ServiceCertError::LeafKey));
            assert_eq!(service_cert(&c), Err(ServiceCertError::LeafKey));
        }
        // An Ed25519 leaf under an ECDSA CA: the CA's signature is not EdDSA.
        let ca_key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let ca = params("ca", true).self_signed(&ca_key).unwrap();
        let leaf = params("leaf", false)
            .signed_by(&ed25519_key(), &ca, &ca_key)
            .unwrap();
        let c = vec![leaf.der().to_vec(), ca.der().to_vec()];
        assert_eq!(
            validate_chain(&c, NOW),
            Err(ServiceCertError::UnsupportedSignature)
        );
    }

    #[test]
    fn garbage_does_not_parse() {
        assert_eq!(
            validate_chain(&[vec![0x30, 0x00]], NOW),
            Err(ServiceCertError::Parse)
        );
        let mut c = chain(1);
        c[0].push(0);
        assert_eq!(validate_chain(&c, NOW), Err(ServiceCertError::Parse));
        assert_eq!(service_cert(&c), Err(ServiceCertError::Parse));
    }
}
