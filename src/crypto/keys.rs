//! Public keys as they travel in SMP: DER SubjectPublicKeyInfo with fixed prefixes
//! (simplexmq `Crypto.hs`). Queue keys (`APublicAuthKey`) are Ed25519, Ed448 or X25519; X448 is
//! rejected at decode time, as the reference does.

use std::fmt;

pub const ED25519_SPKI_PREFIX: [u8; 12] = hex12(*b"302a300506032b6570032100");
pub const X25519_SPKI_PREFIX: [u8; 12] = hex12(*b"302a300506032b656e032100");
pub const ED448_SPKI_PREFIX: [u8; 12] = hex12(*b"3043300506032b6571033a00");
pub const X448_SPKI_PREFIX: [u8; 12] = hex12(*b"3042300506032b656f033900");

pub const ED25519_KEY_LEN: usize = 32;
pub const X25519_KEY_LEN: usize = 32;
pub const ED448_KEY_LEN: usize = 57;

pub const ED25519_SIG_LEN: usize = 64;
pub const ED448_SIG_LEN: usize = 114;
/// An X25519 authenticator: 16-byte tag and the 64-byte SHA-512 digest.
pub const X25519_AUTHENTICATOR_LEN: usize = 80;

const fn hex12(s: [u8; 24]) -> [u8; 12] {
    const fn nib(c: u8) -> u8 {
        match c {
            b'0'..=b'9' => c - b'0',
            b'a'..=b'f' => c - b'a' + 10,
            _ => panic!("not hex"),
        }
    }
    let mut out = [0u8; 12];
    let mut i = 0;
    while i < 12 {
        out[i] = nib(s[2 * i]) << 4 | nib(s[2 * i + 1]);
        i += 1;
    }
    out
}

/// The SPKI bytes are not one of the accepted key encodings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyError;

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("not an Ed25519, Ed448 or X25519 public key")
    }
}

impl std::error::Error for KeyError {}

/// A queue authorization key (`APublicAuthKey`).
#[derive(Clone, PartialEq, Eq, Hash)]
pub enum PublicAuthKey {
    Ed25519([u8; ED25519_KEY_LEN]),
    Ed448([u8; ED448_KEY_LEN]),
    X25519([u8; X25519_KEY_LEN]),
}

impl fmt::Debug for PublicAuthKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (name, k) = match self {
            PublicAuthKey::Ed25519(k) => ("Ed25519", &k[..]),
            PublicAuthKey::Ed448(k) => ("Ed448", &k[..]),
            PublicAuthKey::X25519(k) => ("X25519", &k[..]),
        };
        write!(f, "{name}(")?;
        for b in &k[..4] {
            write!(f, "{b:02x}")?;
        }
        f.write_str("…)")
    }
}

impl PublicAuthKey {
    /// Decodes a DER SPKI; X448 and anything else fail.
    pub fn from_spki(spki: &[u8]) -> Result<Self, KeyError> {
        if let Some(k) = strip(spki, &ED25519_SPKI_PREFIX, ED25519_KEY_LEN) {
            return Ok(PublicAuthKey::Ed25519(k.try_into().map_err(|_| KeyError)?));
        }
        if let Some(k) = strip(spki, &X25519_SPKI_PREFIX, X25519_KEY_LEN) {
            return Ok(PublicAuthKey::X25519(k.try_into().map_err(|_| KeyError)?));
        }
        if let Some(k) = strip(spki, &ED448_SPKI_PREFIX, ED448_KEY_LEN) {
            return Ok(PublicAuthKey::Ed448(k.try_into().map_err(|_| KeyError)?));
        }
        Err(KeyError)
    }

    pub fn to_spki(&self) -> Vec<u8> {
        match self {
            PublicAuthKey::Ed25519(k) => spki(&ED25519_SPKI_PREFIX, k),
            PublicAuthKey::Ed448(k) => spki(&ED448_SPKI_PREFIX, k),
            PublicAuthKey::X25519(k) => spki(&X25519_SPKI_PREFIX, k),
        }
    }
}

/// Decodes an X25519 SPKI (DH keys: `rcvDhKey`, the hello keys, `PFWD`'s command key).
pub fn x25519_from_spki(spki: &[u8]) -> Result<[u8; X25519_KEY_LEN], KeyError> {
    strip(spki, &X25519_SPKI_PREFIX, X25519_KEY_LEN)
        .ok_or(KeyError)?
        .try_into()
        .map_err(|_| KeyError)
}

pub fn x25519_to_spki(key: &[u8; X25519_KEY_LEN]) -> Vec<u8> {
    spki(&X25519_SPKI_PREFIX, key)
}

pub fn ed25519_to_spki(key: &[u8; ED25519_KEY_LEN]) -> Vec<u8> {
    spki(&ED25519_SPKI_PREFIX, key)
}

fn strip<'a>(spki: &'a [u8], prefix: &[u8; 12], len: usize) -> Option<&'a [u8]> {
    let k = spki.strip_prefix(&prefix[..])?;
    (k.len() == len).then_some(k)
}

fn spki(prefix: &[u8; 12], key: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(prefix.len() + key.len());
    v.extend_from_slice(prefix);
    v.extend_from_slice(key);
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine;

    #[test]
    fn sample_keys_of_the_reference_tests_decode() {
        let b64 = base64::engine::general_purpose::STANDARD;
        let ed = b64
            .decode("MCowBQYDK2VwAyEAfAOflyvbJv1fszgzkQ6buiZJVgSpQWsucXq7U6zjMgY=")
            .unwrap();
        let k = PublicAuthKey::from_spki(&ed).unwrap();
        assert!(matches!(k, PublicAuthKey::Ed25519(_)));
        assert_eq!(k.to_spki(), ed);

        let x = b64
            .decode("MCowBQYDK2VuAyEAriy+HcARIhqsgSjVnjKqoft+y6pxrxdY68zn4+LjYhQ=")
            .unwrap();
        assert!(matches!(
            PublicAuthKey::from_spki(&x).unwrap(),
            PublicAuthKey::X25519(_)
        ));
        assert_eq!(x25519_to_spki(&x25519_from_spki(&x).unwrap()), x);

        let e448 = b64
            .decode("MEMwBQYDK2VxAzoA6ibQc9XpkSLtwrf7PLvp81qW/etiumckVFImCMRdftcG/XopbOSaq9qyLhrgJWKOLyNrQPNVvpMA")
            .unwrap();
        assert!(matches!(
            PublicAuthKey::from_spki(&e448).unwrap(),
            PublicAuthKey::Ed448(_)
        ));
    }

    #[test]
    fn x448_and_truncated_keys_are_rejected() {
        let mut x448 = X448_SPKI_PREFIX.to_vec();
        x448.extend_from_slice(&[7u8; 56]);
        assert_eq!(PublicAuthKey::from_spki(&x448), Err(KeyError));
        let mut short = ED25519_SPKI_PREFIX.to_vec();
        short.extend_from_slice(&[7u8; 31]);
        assert_eq!(PublicAuthKey::from_spki(&short), Err(KeyError));
        assert!(x25519_from_spki(&ed25519_to_spki(&[1u8; 32])).is_err());
    }
}
