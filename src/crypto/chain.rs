//! The block-encryption key chains (simplexmq `Crypto.hs`, `sbcInit`/`sbcHkdf`): one HKDF-SHA512
//! chain per direction, seeded from the session's X25519 secret and the tls-unique session id, and
//! advanced once per block so that every block has its own key and nonce.

use std::fmt;

use hkdf::Hkdf;
use sha2::Sha512;

const INIT_INFO: &[u8] = b"SimpleXSbChainInit";
const STEP_INFO: &[u8] = b"SimpleXSbChain";

/// The current key of one direction's chain. Not `Clone`, so a chain cannot be forked by accident
/// and reuse a (key, nonce) pair.
pub struct ChainKey([u8; 32]);

impl fmt::Debug for ChainKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ChainKey(…)")
    }
}

/// Returns `(ck1, ck2)`: the server sends with `ck1` and receives with `ck2`; the client swaps them.
pub fn init_chains(session_id: &[u8], secret: &[u8; 32]) -> (ChainKey, ChainKey) {
    let mut okm = [0u8; 64];
    hkdf_sha512(session_id, secret, INIT_INFO, &mut okm);
    let (ck1, ck2) = okm.split_at(32);
    (ChainKey::from_slice(ck1), ChainKey::from_slice(ck2))
}

impl ChainKey {
    pub fn new(key: [u8; 32]) -> Self {
        ChainKey(key)
    }

    fn from_slice(key: &[u8]) -> Self {
        let mut k = [0u8; 32];
        k.copy_from_slice(key);
        ChainKey(k)
    }

    /// Advances the chain and returns the key and nonce for the next block in this direction.
    // Named `next` by the agreed interface; an endless `Iterator` would invite `.take()`/`.nth()`
    // calls that silently skip keys.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> ([u8; 32], [u8; 24]) {
        let mut okm = [0u8; 88];
        // The reference uses an empty salt, which HKDF treats like no salt.
        hkdf_sha512(&[], &self.0, STEP_INFO, &mut okm);
        let mut key = [0u8; 32];
        let mut nonce = [0u8; 24];
        self.0.copy_from_slice(&okm[..32]);
        key.copy_from_slice(&okm[32..64]);
        nonce.copy_from_slice(&okm[64..]);
        (key, nonce)
    }
}

fn hkdf_sha512(salt: &[u8], ikm: &[u8], info: &[u8], okm: &mut [u8]) {
    let hk = Hkdf::<Sha512>::new(Some(salt), ikm);
    // Only lengths above 255 * 64 bytes are rejected; callers pass 64 or 88.
    hk.expand(info, okm)
        .expect("HKDF-SHA512 output of at most 88 bytes");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seq<const N: usize>(from: u8) -> [u8; N] {
        std::array::from_fn(|i| from + i as u8)
    }

    #[test]
    fn v2_init_and_first_step() {
        let session_id = seq::<32>(1);
        let secret = seq::<32>(0x21);
        let (mut ck1, ck2) = init_chains(&session_id, &secret);
        assert_eq!(
            hex::encode(ck1.0),
            "ea2f289fa335ea9f9fbcb74cb81d1770c07a760489b52f7302191b74751ac05d"
        );
        assert_eq!(
            hex::encode(ck2.0),
            "19d5b50589bd892d3b28f25c1a345a8fd822881df4a68f766fa8835ffcbf0c07"
        );
        let (key, nonce) = ck1.next();
        assert_eq!(
            hex::encode(ck1.0),
            "bf4f328764b8458c59db468bdee6b7e8aee5504a72eaa36b904f568bfcec9ec5"
        );
        assert_eq!(
            hex::encode(key),
            "7255ff71fe29b29d85a19d8198c29031b430ff2f1765f3b4fe6b2c136e7054a8"
        );
        assert_eq!(
            hex::encode(nonce),
            "83f3fdec12bc0a5c0048579bae195f07c53145184b86d83c"
        );
    }

    #[test]
    fn empty_salt_equals_no_salt_and_steps_differ() {
        let mut a = [0u8; 88];
        let mut b = [0u8; 88];
        Hkdf::<Sha512>::new(None, &[5u8; 32])
            .expand(STEP_INFO, &mut a)
            .unwrap();
        hkdf_sha512(&[], &[5u8; 32], STEP_INFO, &mut b);
        assert_eq!(a, b);

        let mut ck = ChainKey::new([5u8; 32]);
        let first = ck.next();
        let second = ck.next();
        assert_eq!(first.0[..], a[32..64]);
        assert_ne!(first, second);
    }
}
