//! The destination's identity (simplexmq `Transport/Client.hs`, `validateCertificateChain`): its
//! TLS chain must have an identity certificate (the 2nd of 2–4) whose SHA-256 is the key hash in
//! the address, and the chain must be valid up to the CA, as the reference client's
//! `validateCertificateChain` requires. The hash alone is not enough: anyone can present the public
//! CA certificate after a leaf of their own, so each certificate's signature is checked with the
//! next one's key.

use x509_parser::prelude::{FromDer, X509Certificate};

use crate::crypto::auth::{ed25519_verify, ed448_verify};
use crate::crypto::hash::fingerprint;
use crate::crypto::keys::PublicAuthKey;

const OID_ED25519: &str = "1.3.101.112";
const OID_ED448: &str = "1.3.101.113";

/// Why a chain does not prove the identity.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdentityError {
    #[error("the chain has {0} certificates (2 to 4 expected)")]
    ChainLength(usize),
    #[error("the identity certificate does not match the address key hash")]
    KeyHash,
    #[error("certificate {0} does not parse")]
    Parse(usize),
    #[error("certificate {0} is outside its validity period")]
    Expired(usize),
    #[error("certificate {0} is not signed by certificate {}", .0 + 1)]
    Signature(usize),
    #[error("certificate {0} signs others but is not a CA")]
    NotCa(usize),
}

/// The identity certificate of a 2–4 certificate chain (`chainIdCaCerts`).
pub fn id_cert(chain: &[Vec<u8>]) -> Result<&[u8], IdentityError> {
    match chain.len() {
        2..=4 => Ok(&chain[1]),
        n => Err(IdentityError::ChainLength(n)),
    }
}

/// The identity check alone: the identity certificate hashes to `key_hash`.
pub fn matches_key_hash(chain: &[Vec<u8>], key_hash: &[u8]) -> Result<(), IdentityError> {
    if fingerprint(id_cert(chain)?)[..] == *key_hash {
        Ok(())
    } else {
        Err(IdentityError::KeyHash)
    }
}

/// The full check of a TLS chain: identity, then every certificate valid now and signed by the
/// next one, which must be a CA. The last certificate is the trust anchor.
pub fn verify_chain(chain: &[Vec<u8>], key_hash: &[u8]) -> Result<(), IdentityError> {
    matches_key_hash(chain, key_hash)?;
    let certs = chain
        .iter()
        .enumerate()
        .map(|(i, der)| {
            X509Certificate::from_der(der)
                .map(|(_, c)| c)
                .map_err(|_| IdentityError::Parse(i))
        })
        .collect::<Result<Vec<_>, _>>()?;
    for (i, c) in certs.iter().enumerate() {
        if !c.validity().is_valid() {
            return Err(IdentityError::Expired(i));
        }
    }
    for i in 0..certs.len() - 1 {
        let (cert, issuer) = (&certs[i], &certs[i + 1]);
        if !issuer.is_ca() || !can_sign_certs(issuer) {
            return Err(IdentityError::NotCa(i + 1));
        }
        if !signed_by(cert, issuer) {
            return Err(IdentityError::Signature(i));
        }
    }
    Ok(())
}

/// A KeyUsage extension, when present, must allow certificate signing.
fn can_sign_certs(c: &X509Certificate<'_>) -> bool {
    match c.key_usage() {
        Ok(None) => true,
        Ok(Some(ku)) => ku.value.key_cert_sign(),
        Err(_) => false,
    }
}

/// EdDSA only: SMP chains are Ed25519 or Ed448 (simplexmq `Transport.hs`,
/// `defaultSupportedParams`).
fn signed_by(cert: &X509Certificate<'_>, issuer: &X509Certificate<'_>) -> bool {
    let tbs = cert.tbs_certificate.as_ref();
    let sig = &cert.signature_value.data[..];
    let alg = cert.signature_algorithm.algorithm.to_id_string();
    match PublicAuthKey::from_spki(issuer.public_key().raw) {
        Ok(PublicAuthKey::Ed25519(k)) if alg == OID_ED25519 => sig
            .try_into()
            .is_ok_and(|s: &[u8; 64]| ed25519_verify(&k, tbs, s)),
        Ok(PublicAuthKey::Ed448(k)) if alg == OID_ED448 => sig
            .try_into()
            .is_ok_and(|s: &[u8; 114]| ed448_verify(&k, tbs, s)),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::certs;

    fn chain() -> (Vec<Vec<u8>>, [u8; 32]) {
        let creds = certs::generated_for_tests("identity");
        (creds.chain_der.clone(), creds.key_hash)
    }

    #[test]
    fn a_relay_chain_proves_its_key_hash() {
        let (chain, kh) = chain();
        assert_eq!(verify_chain(&chain, &kh), Ok(()));
    }

    #[test]
    fn another_key_hash_is_refused() {
        let (chain, mut kh) = chain();
        kh[0] ^= 1;
        assert_eq!(verify_chain(&chain, &kh), Err(IdentityError::KeyHash));
    }

    #[test]
    fn a_foreign_leaf_before_the_right_ca_is_refused() {
        // The CA is public; a leaf from another CA in front of it must not pass.
        let (chain, kh) = chain();
        let (other, _) = super::tests::chain();
        let forged = vec![other[0].clone(), chain[1].clone()];
        assert_eq!(verify_chain(&forged, &kh), Err(IdentityError::Signature(0)));
    }

    #[test]
    fn chains_of_the_wrong_length_are_refused() {
        let (chain, kh) = chain();
        assert_eq!(
            verify_chain(&chain[..1], &kh),
            Err(IdentityError::ChainLength(1))
        );
        let five = vec![chain[0].clone(); 5];
        assert_eq!(verify_chain(&five, &kh), Err(IdentityError::ChainLength(5)));
    }
}
