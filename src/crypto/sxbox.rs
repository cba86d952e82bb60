//! SXbox, the SimpleX NaCl box (simplexmq `Crypto.hs`): HSalsa20(key, 0^16) and then
//! XSalsa20-Poly1305, laid out as `tag ‖ ciphertext`. The same construction serves DH secrets
//! (where it equals NaCl `crypto_box`) and the symmetric block-encryption keys (where it does not
//! equal plain `crypto_secretbox`), plus the X25519 and nonce helpers that feed it.

use std::fmt;

use salsa20::cipher::consts::U10;
use salsa20::cipher::generic_array::GenericArray;

use super::pad::{pad_into, unpad};
use super::sodium;

pub const TAG_LEN: usize = 16;
pub const NONCE_LEN: usize = 24;

/// Authentication, decryption or padding failed. Deliberately carries no detail: callers answer
/// with a protocol error and must not leak which check failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CryptoError;

impl fmt::Display for CryptoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("cryptographic check failed")
    }
}

impl std::error::Error for CryptoError {}

/// `HSalsa20(key, 0^16)`; with a raw X25519 output this is NaCl `crypto_box_beforenm`.
pub fn hsalsa20_key(key: &[u8; 32]) -> [u8; 32] {
    salsa20::hsalsa::<U10>(GenericArray::from_slice(key), &GenericArray::default()).into()
}

/// Encrypts `buf` in place and returns the tag; blocks use this to avoid copying 16 KB.
pub fn seal_in_place(key: &[u8; 32], nonce: &[u8; NONCE_LEN], buf: &mut [u8]) -> [u8; TAG_LEN] {
    sodium::secretbox_seal_in_place(&hsalsa20_key(key), nonce, buf)
}

/// Checks the tag in constant time and only then decrypts `buf` in place; on failure `buf` is left
/// as it was.
pub fn open_in_place(
    key: &[u8; 32],
    nonce: &[u8; NONCE_LEN],
    tag: &[u8; TAG_LEN],
    buf: &mut [u8],
) -> Result<(), CryptoError> {
    if sodium::secretbox_open_in_place(&hsalsa20_key(key), nonce, tag, buf) {
        Ok(())
    } else {
        Err(CryptoError)
    }
}

pub fn seal(key: &[u8; 32], nonce: &[u8; NONCE_LEN], msg: &[u8]) -> Vec<u8> {
    let mut out = vec![0u8; TAG_LEN + msg.len()];
    out[TAG_LEN..].copy_from_slice(msg);
    let tag = seal_in_place(key, nonce, &mut out[TAG_LEN..]);
    out[..TAG_LEN].copy_from_slice(&tag);
    out
}

pub fn open(key: &[u8; 32], nonce: &[u8; NONCE_LEN], boxed: &[u8]) -> Result<Vec<u8>, CryptoError> {
    let (tag, ct) = split_tag(boxed)?;
    let mut msg = ct.to_vec();
    open_in_place(key, nonce, &tag, &mut msg)?;
    Ok(msg)
}

/// Pads `msg` to `padded_len` bytes (so the ciphertext hides the message length), then seals.
pub fn seal_padded(
    key: &[u8; 32],
    nonce: &[u8; NONCE_LEN],
    msg: &[u8],
    padded_len: usize,
) -> Result<Vec<u8>, CryptoError> {
    let mut out = vec![0u8; TAG_LEN + padded_len];
    pad_into(msg, &mut out[TAG_LEN..]).map_err(|_| CryptoError)?;
    let tag = seal_in_place(key, nonce, &mut out[TAG_LEN..]);
    out[..TAG_LEN].copy_from_slice(&tag);
    Ok(out)
}

pub fn open_padded(
    key: &[u8; 32],
    nonce: &[u8; NONCE_LEN],
    boxed: &[u8],
) -> Result<Vec<u8>, CryptoError> {
    let mut msg = open(key, nonce, boxed)?;
    let len = unpad(&msg).map_err(|_| CryptoError)?.len();
    msg.copy_within(2..2 + len, 0);
    msg.truncate(len);
    Ok(msg)
}

fn split_tag(boxed: &[u8]) -> Result<([u8; TAG_LEN], &[u8]), CryptoError> {
    if boxed.len() < TAG_LEN {
        return Err(CryptoError);
    }
    let (tag, ct) = boxed.split_at(TAG_LEN);
    Ok((tag.try_into().map_err(|_| CryptoError)?, ct))
}

/// Raw X25519 shared secret (no hashing); SXbox applies HSalsa20 to it.
pub fn dh(secret: &[u8; 32], public: &[u8; 32]) -> [u8; 32] {
    let secret = x25519_dalek::StaticSecret::from(*secret);
    secret
        .diffie_hellman(&x25519_dalek::PublicKey::from(*public))
        .to_bytes()
}

pub fn x25519_public(secret: &[u8; 32]) -> [u8; 32] {
    x25519_dalek::PublicKey::from(&x25519_dalek::StaticSecret::from(*secret)).to_bytes()
}

/// The reference turns a correlation id into a nonce by zero-padding on the right or truncating,
/// which is why corrIds other than 24 bytes are still accepted.
pub fn cb_nonce(corr_id: &[u8]) -> [u8; NONCE_LEN] {
    let mut nonce = [0u8; NONCE_LEN];
    let n = corr_id.len().min(NONCE_LEN);
    nonce[..n].copy_from_slice(&corr_id[..n]);
    nonce
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seq<const N: usize>(from: u8) -> [u8; N] {
        std::array::from_fn(|i| from + i as u8)
    }

    const V1_BOX: &str = "bc861d7776bd7b5ef059d8b5b415d38ad890960a28c657199bb296d55c36d0df7d9344af9014c6e672553847694f734f82358c0b2b8cd15c9655896bdf4e6b294112299991219760eda29c6d73bccac234c9239ee9e0759b4e7b1d76543be0cc41b340db7ebae098319cfd69128614c46f5d903c8d947d70683a213d9df1114a19cc41f86cc9e1e0b42a8106fb44dacabf711f3348ac92c022f3326a0eb710111b63a9463feda452f4dd248b8acc71ee425c93eeaefda0f6ba958b5fb428f18315cf0f33296e1ba116d5ab9960375e463c29b7a9b45f20cfccd83e424c981873d0dd5cf6159c6d0f4600d2978ede9b673e69dedf5192185f2096c9ee298856ae091fcdded315a1ae5e607d38b441a581";

    #[test]
    fn v1_sxbox_matches_reference_bytes() {
        let key = seq::<32>(1);
        let nonce = seq::<24>(1);
        let boxed = seal_padded(&key, &nonce, b"hello NaCl secretbox", 256).unwrap();
        assert_eq!(boxed.len(), 272);
        assert_eq!(hex::encode(&boxed), V1_BOX);
        assert_eq!(
            open_padded(&key, &nonce, &boxed).unwrap(),
            b"hello NaCl secretbox"
        );
    }

    #[test]
    fn v1_is_not_plain_secretbox() {
        // Guards against dropping the HSalsa20 step: plain secretbox with the raw key differs.
        let key = seq::<32>(1);
        let nonce = seq::<24>(1);
        let mut buf = vec![0u8; 256];
        pad_into(b"hello NaCl secretbox", &mut buf).unwrap();
        let tag = sodium::secretbox_seal_in_place(&key, &nonce, &mut buf);
        assert_ne!(hex::encode(tag), &V1_BOX[..32]);
    }

    #[test]
    fn v6_hsalsa20_of_rfc7748_shared_secret() {
        let alice_sk: [u8; 32] =
            hex::decode("77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a")
                .unwrap()
                .try_into()
                .unwrap();
        let bob_pk: [u8; 32] =
            hex::decode("de9edb7d7b7dc1b4d35b61c2ece435373f8343c85b78674dadfc7e146f882b4f")
                .unwrap()
                .try_into()
                .unwrap();
        let shared = dh(&alice_sk, &bob_pk);
        assert_eq!(
            hex::encode(shared),
            "4a5d9d5ba4ce2de1728e3bf480350f25e07e21c947d19e3376f09b3c1e161742"
        );
        assert_eq!(
            hex::encode(hsalsa20_key(&shared)),
            "1b27556473e985d462cd51197a9a46c76009549eac6474f206c4ee0844f68389"
        );
    }

    #[test]
    fn v3_x25519() {
        let sk1 = seq::<32>(1);
        let sk2 = seq::<32>(0x21);
        let pk1 = x25519_public(&sk1);
        let pk2 = x25519_public(&sk2);
        assert_eq!(
            hex::encode(pk1),
            "07a37cbc142093c8b755dc1b10e86cb426374ad16aa853ed0bdfc0b2b86d1c7c"
        );
        assert_eq!(
            hex::encode(pk2),
            "5869aff450549732cbaaed5e5df9b30a6da31cb0e5742bad5ad4a1a768f1a67b"
        );
        let expected = "a84dc7c3c8f058b1b2dc4cd1e9b5dc0a7987f88b6a9564cde3391fc421159e77";
        assert_eq!(hex::encode(dh(&sk1, &pk2)), expected);
        assert_eq!(hex::encode(dh(&sk2, &pk1)), expected);
    }

    #[test]
    fn tampering_and_short_input_are_rejected() {
        let key = [7u8; 32];
        let nonce = [9u8; 24];
        let boxed = seal(&key, &nonce, b"message");
        assert_eq!(boxed.len(), TAG_LEN + 7);
        assert_eq!(open(&key, &nonce, &boxed).unwrap(), b"message");
        for i in [0, TAG_LEN, boxed.len() - 1] {
            let mut bad = boxed.clone();
            bad[i] ^= 1;
            assert_eq!(open(&key, &nonce, &bad), Err(CryptoError));
        }
        assert_eq!(open(&[8u8; 32], &nonce, &boxed), Err(CryptoError));
        assert_eq!(open(&key, &nonce, &boxed[..15]), Err(CryptoError));
        assert_eq!(open(&key, &nonce, &seal(&key, &nonce, b"")).unwrap(), b"");
    }

    #[test]
    fn open_in_place_leaves_buffer_untouched_on_failure() {
        let key = [1u8; 32];
        let nonce = [2u8; 24];
        let mut buf = *b"in place";
        let tag = seal_in_place(&key, &nonce, &mut buf);
        let ct = buf;
        let mut bad_tag = tag;
        bad_tag[3] ^= 0x80;
        assert_eq!(
            open_in_place(&key, &nonce, &bad_tag, &mut buf),
            Err(CryptoError)
        );
        assert_eq!(buf, ct);
        open_in_place(&key, &nonce, &tag, &mut buf).unwrap();
        assert_eq!(&buf, b"in place");
    }

    #[test]
    fn padded_open_rejects_bad_length_prefix() {
        let key = [3u8; 32];
        let nonce = [4u8; 24];
        // A valid box whose plaintext claims more bytes than it has.
        let boxed = seal(&key, &nonce, b"\x00\x05abc");
        assert_eq!(open_padded(&key, &nonce, &boxed), Err(CryptoError));
        assert_eq!(seal_padded(&key, &nonce, b"abc", 4), Err(CryptoError));
        assert_eq!(
            open_padded(&key, &nonce, &seal_padded(&key, &nonce, b"abc", 5).unwrap()).unwrap(),
            b"abc"
        );
    }

    #[test]
    fn cb_nonce_pads_and_truncates() {
        assert_eq!(cb_nonce(b"abcd")[..5], *b"abcd\0");
        assert_eq!(cb_nonce(b"")[..], [0u8; 24]);
        let long: Vec<u8> = (0..30).collect();
        assert_eq!(cb_nonce(&long)[..], long[..24]);
    }
}
