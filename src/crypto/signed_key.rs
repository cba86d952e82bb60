//! Signed public keys (simplexmq `Crypto.hs`): the server's per-connection X25519 key in its
//! hello, and a service's session key, each signed by a certificate key so the peer can bind the key
//! to the TLS identity. The DER is tiny and fixed in shape, so it is written and read by hand.

use ed25519_dalek::{Signer as _, SigningKey};

use super::auth::{ed25519_verify, ed448_verify, sign_ed448};
use super::keys::{x25519_to_spki, PublicAuthKey, ED25519_SIG_LEN, ED448_KEY_LEN, ED448_SIG_LEN};
use super::sxbox::CryptoError;

const SEQUENCE: u8 = 0x30;
const OID: u8 = 0x06;
const BIT_STRING: u8 = 0x03;
const OID_ED25519: [u8; 3] = [0x2b, 0x65, 0x70];
const OID_ED448: [u8; 3] = [0x2b, 0x65, 0x71];

/// Bounds the work on hostile input; the largest real structure, an Ed448 key signed with Ed448,
/// is under 200 bytes.
const MAX_DER_LEN: usize = 512;

/// The 120-byte signed key of the server hello: an X25519 SPKI signed by the Ed25519 leaf key.
pub fn sign_x25519_key(signer: &SigningKey, x25519_pub: &[u8; 32]) -> Vec<u8> {
    sign_spki_ed25519(signer, &x25519_to_spki(x25519_pub))
}

pub fn sign_spki_ed25519(signer: &SigningKey, spki: &[u8]) -> Vec<u8> {
    let sig = signer.sign(spki).to_bytes();
    encode(spki, &OID_ED25519, &sig)
}

pub fn sign_spki_ed448(signer: &[u8; ED448_KEY_LEN], spki: &[u8]) -> Vec<u8> {
    let sig = sign_ed448(signer, spki);
    encode(spki, &OID_ED448, &sig)
}

fn encode(spki: &[u8], oid: &[u8; 3], sig: &[u8]) -> Vec<u8> {
    let mut alg = Vec::with_capacity(7);
    put_tlv(&mut alg, OID, oid);
    let mut bits = Vec::with_capacity(1 + sig.len());
    bits.push(0); // no unused bits
    bits.extend_from_slice(sig);

    let mut body = Vec::with_capacity(spki.len() + 9 + bits.len() + 3);
    body.extend_from_slice(spki);
    put_tlv(&mut body, SEQUENCE, &alg);
    put_tlv(&mut body, BIT_STRING, &bits);
    let mut out = Vec::with_capacity(body.len() + 4);
    put_tlv(&mut out, SEQUENCE, &body);
    out
}

/// DER definite length, short form below 128, otherwise the minimal long form.
fn put_tlv(out: &mut Vec<u8>, tag: u8, content: &[u8]) {
    out.push(tag);
    let len = content.len();
    if len < 0x80 {
        out.push(len as u8);
    } else {
        let bytes = len.to_be_bytes();
        let skip = bytes.iter().take_while(|&&b| b == 0).count();
        out.push(0x80 | (bytes.len() - skip) as u8);
        out.extend_from_slice(&bytes[skip..]);
    }
    out.extend_from_slice(content);
}

/// Checks the signature with the signer's key (Ed25519 or Ed448, which must match the algorithm named
/// in the structure) and returns the signed SPKI bytes for the caller to decode.
pub fn verify_signed_key(der: &[u8], signer: &PublicAuthKey) -> Result<Vec<u8>, CryptoError> {
    if der.len() > MAX_DER_LEN {
        return Err(CryptoError);
    }
    let (outer, rest) = read_tlv(der, SEQUENCE)?;
    if !rest.is_empty() {
        return Err(CryptoError);
    }
    // The SPKI is kept with its own header: those exact bytes are what was signed.
    let (_, after_spki) = read_tlv(outer, SEQUENCE)?;
    let spki = &outer[..outer.len() - after_spki.len()];
    let (alg, after_alg) = read_tlv(after_spki, SEQUENCE)?;
    let (oid, alg_rest) = read_tlv(alg, OID)?;
    let (bits, end) = read_tlv(after_alg, BIT_STRING)?;
    if !alg_rest.is_empty() || !end.is_empty() {
        return Err(CryptoError);
    }
    let (&unused, sig) = bits.split_first().ok_or(CryptoError)?;
    if unused != 0 {
        return Err(CryptoError);
    }
    let ok = match signer {
        PublicAuthKey::Ed25519(k) if oid == OID_ED25519 => {
            let sig: &[u8; ED25519_SIG_LEN] = sig.try_into().map_err(|_| CryptoError)?;
            ed25519_verify(k, spki, sig)
        }
        PublicAuthKey::Ed448(k) if oid == OID_ED448 => {
            let sig: &[u8; ED448_SIG_LEN] = sig.try_into().map_err(|_| CryptoError)?;
            ed448_verify(k, spki, sig)
        }
        _ => false,
    };
    if ok {
        Ok(spki.to_vec())
    } else {
        Err(CryptoError)
    }
}

/// Reads one DER element with the expected tag; returns its content and the bytes after it.
/// Only minimal definite lengths up to two length bytes are accepted.
fn read_tlv(input: &[u8], tag: u8) -> Result<(&[u8], &[u8]), CryptoError> {
    let (&t, rest) = input.split_first().ok_or(CryptoError)?;
    if t != tag {
        return Err(CryptoError);
    }
    let (&first, rest) = rest.split_first().ok_or(CryptoError)?;
    let (len, rest) = match first {
        0..=0x7f => (usize::from(first), rest),
        0x81 => {
            let (&b, rest) = rest.split_first().ok_or(CryptoError)?;
            if b < 0x80 {
                return Err(CryptoError);
            }
            (usize::from(b), rest)
        }
        0x82 => {
            let (b, rest) = rest.split_first_chunk::<2>().ok_or(CryptoError)?;
            let len = usize::from(u16::from_be_bytes(*b));
            if len < 0x100 {
                return Err(CryptoError);
            }
            (len, rest)
        }
        _ => return Err(CryptoError),
    };
    if rest.len() < len {
        return Err(CryptoError);
    }
    Ok(rest.split_at(len))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypto::auth::ed448_public;
    use crate::crypto::keys::{ed25519_to_spki, PublicAuthKey};

    fn seq<const N: usize>(from: u8) -> [u8; N] {
        std::array::from_fn(|i| from.wrapping_add(i as u8))
    }

    fn ed25519_signer() -> (SigningKey, PublicAuthKey) {
        let sk = SigningKey::from_bytes(&seq::<32>(0x11));
        let pk = PublicAuthKey::Ed25519(sk.verifying_key().to_bytes());
        (sk, pk)
    }

    #[test]
    fn ed25519_signed_x25519_key_layout_and_round_trip() {
        let (sk, pk) = ed25519_signer();
        let x = seq::<32>(0x21);
        let der = sign_x25519_key(&sk, &x);
        assert_eq!(der.len(), 120);
        assert_eq!(der[..4], [0x30, 0x76, 0x30, 0x2a]);
        assert_eq!(der[4..46], x25519_to_spki(&x)[2..]);
        assert_eq!(der[46..56], hex::decode("300506032b6570034100").unwrap());
        let spki = verify_signed_key(&der, &pk).unwrap();
        assert_eq!(spki, x25519_to_spki(&x));
    }

    #[test]
    fn openssl_accepts_the_signature_over_the_spki() {
        use openssl::pkey::{Id, PKey};
        use openssl::sign::Verifier;
        let (sk, _) = ed25519_signer();
        let x = seq::<32>(0x21);
        let der = sign_x25519_key(&sk, &x);
        let ossl =
            PKey::public_key_from_raw_bytes(sk.verifying_key().as_bytes(), Id::ED25519).unwrap();
        assert!(Verifier::new_without_digest(&ossl)
            .unwrap()
            .verify_oneshot(&der[56..], &der[2..46])
            .unwrap());
    }

    #[test]
    fn tampered_or_wrong_signer_is_rejected() {
        let (sk, pk) = ed25519_signer();
        let der = sign_x25519_key(&sk, &seq::<32>(0x21));
        for i in [10, 45, 55, 60, 119] {
            let mut bad = der.clone();
            bad[i] ^= 1;
            assert_eq!(verify_signed_key(&bad, &pk), Err(CryptoError), "byte {i}");
        }
        let other = PublicAuthKey::Ed25519(
            SigningKey::from_bytes(&[9u8; 32])
                .verifying_key()
                .to_bytes(),
        );
        assert_eq!(verify_signed_key(&der, &other), Err(CryptoError));
        assert_eq!(
            verify_signed_key(&der, &PublicAuthKey::X25519([1u8; 32])),
            Err(CryptoError)
        );
        let mut trailing = der.clone();
        trailing.push(0);
        assert_eq!(verify_signed_key(&trailing, &pk), Err(CryptoError));
        for n in 0..der.len() {
            assert_eq!(verify_signed_key(&der[..n], &pk), Err(CryptoError));
        }
    }

    #[test]
    fn ed448_signed_key_uses_long_form_lengths() {
        let sk = seq::<57>(0x30);
        let pk = PublicAuthKey::Ed448(ed448_public(&sk));
        let spki = ed25519_to_spki(&seq::<32>(2));
        let der = sign_spki_ed448(&sk, &spki);
        // 44 (SPKI) + 7 (algorithm) + 2 + 115 (bit string) = 168 bytes of content, which needs the
        // long length form.
        assert_eq!(der.len(), 3 + 168);
        assert_eq!(der[..3], [0x30, 0x81, 168]);
        assert_eq!(
            der[3 + 44..3 + 44 + 10],
            hex::decode("300506032b6571037300").unwrap()
        );
        assert_eq!(verify_signed_key(&der, &pk).unwrap(), spki);

        let (_, ed_pk) = ed25519_signer();
        assert_eq!(verify_signed_key(&der, &ed_pk), Err(CryptoError));
        let mut bad = der.clone();
        bad[100] ^= 1;
        assert_eq!(verify_signed_key(&bad, &pk), Err(CryptoError));
    }

    #[test]
    fn non_minimal_lengths_are_rejected() {
        assert!(read_tlv(&[0x30, 0x81, 0x05, 0, 0, 0, 0, 0], SEQUENCE).is_err());
        assert!(read_tlv(&[0x30, 0x82, 0x00, 0x80], SEQUENCE).is_err());
        assert!(read_tlv(&[0x30, 0x80], SEQUENCE).is_err());
        let (content, rest) = read_tlv(&[0x30, 0x01, 0xaa, 0xbb], SEQUENCE).unwrap();
        assert_eq!((content, rest), (&[0xaa][..], &[0xbb][..]));
    }
}
