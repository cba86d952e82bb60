//! Digests and the base64url text form used by SMP: SHA-256 for certificate fingerprints (the server's
//! key hash), SHA-512 inside X25519 authenticators, SHA3-384 for the `NEW` sender-id check
//! (simplexmq `Crypto.hs`).

use base64::alphabet;
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig, URL_SAFE};
use base64::engine::DecodePaddingMode;
use base64::Engine;
use sha2::{Digest, Sha256, Sha512};
use sha3::Sha3_384;

pub fn sha256(data: &[u8]) -> [u8; 32] {
    Sha256::digest(data).into()
}

pub fn sha512(data: &[u8]) -> [u8; 64] {
    Sha512::digest(data).into()
}

pub fn sha3_384(data: &[u8]) -> [u8; 48] {
    Sha3_384::digest(data).into()
}

/// The key hash of a server address: SHA-256 of the DER of the identity (CA) certificate.
pub fn fingerprint(cert_der: &[u8]) -> [u8; 32] {
    sha256(cert_der)
}

/// URL-safe base64 with `=` padding, the form of server addresses and key hashes.
pub fn b64url(data: &[u8]) -> String {
    URL_SAFE.encode(data)
}

/// Clients in the wild write key hashes both with and without the trailing `=`, and the reference
/// decoder accepts both, so padding is optional here.
const URL_SAFE_LENIENT: GeneralPurpose = GeneralPurpose::new(
    &alphabet::URL_SAFE,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

pub fn b64url_decode(text: &str) -> Option<Vec<u8>> {
    URL_SAFE_LENIENT.decode(text).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seq(from: u8, to: u8) -> Vec<u8> {
        (from..=to).collect()
    }

    #[test]
    fn v5_fingerprint_of_ed25519_spki() {
        let key: [u8; 32] = seq(1, 0x20).try_into().unwrap();
        let spki = crate::crypto::keys::ed25519_to_spki(&key);
        assert_eq!(
            hex::encode(fingerprint(&spki)),
            "b570e91749359b37ded3a5db7d05f6e00e91c19144822370cbed215005027e96"
        );
    }

    #[test]
    fn digests_of_abc() {
        assert_eq!(
            hex::encode(sha256(b"abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(&hex::encode(sha512(b"abc"))[..16], "ddaf35a193617aba");
        assert_eq!(&hex::encode(sha3_384(b"abc"))[..16], "ec01498288516fc9");
    }

    #[test]
    fn b64url_pads_and_decodes_both_forms() {
        let hash = b64url_decode("LcJUMfVhwD8yxjAiSaDzzGF3-kLG4Uh0Fl_ZIjrRwjI=").unwrap();
        assert_eq!(hash.len(), 32);
        assert_eq!(
            b64url(&hash),
            "LcJUMfVhwD8yxjAiSaDzzGF3-kLG4Uh0Fl_ZIjrRwjI="
        );
        assert_eq!(
            b64url_decode("LcJUMfVhwD8yxjAiSaDzzGF3-kLG4Uh0Fl_ZIjrRwjI"),
            Some(hash)
        );
        assert_eq!(b64url(b"\xfb\xff"), "-_8=");
        assert_eq!(b64url_decode("+/8="), None);
        assert_eq!(b64url_decode("a"), None);
    }
}
