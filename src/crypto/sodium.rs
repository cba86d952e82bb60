//! libsodium's XSalsa20-Poly1305 secretbox behind one safe interface (`docs/ARCHITECTURE.md` §7):
//! the relay's only foreign cryptography besides OpenSSL's Ed448.
//!
//! Why: per 16 KB, RustCrypto's XSalsa20-Poly1305 costs ~30 µs on these machines and libsodium's
//! ~10 µs (`cargo bench --bench crypto_floor`), and the relay runs it 2–4 times per delivered
//! message (MSG body, block, the answer's block). The output is byte-identical; the tests below
//! compare both on random keys, nonces and lengths, and CI runs them.
//!
//! `libsodium-sys-stable` builds the library from the source tarball it ships (no download, no
//! `-march=native`). If `sodium_init` ever fails, every call falls back to RustCrypto, so the relay
//! never stops over it.

use std::sync::OnceLock;

use xsalsa20poly1305::aead::{AeadInPlace, KeyInit};
use xsalsa20poly1305::XSalsa20Poly1305;

pub const KEY_LEN: usize = 32;
pub const NONCE_LEN: usize = 24;
pub const TAG_LEN: usize = 16;

/// Whether libsodium initialised (it picks its SIMD implementations then).
fn sodium_ready() -> bool {
    static READY: OnceLock<bool> = OnceLock::new();
    // SAFETY: `sodium_init` takes no arguments, is thread-safe and idempotent (documented); it is
    // called once here anyway.
    *READY.get_or_init(|| unsafe { libsodium_sys::sodium_init() } >= 0)
}

/// Which implementation runs: "libsodium", or "rustcrypto" after a failed initialisation.
pub fn implementation() -> &'static str {
    if sodium_ready() {
        "libsodium"
    } else {
        "rustcrypto"
    }
}

/// XSalsa20-Poly1305 (NaCl `crypto_secretbox`) of `buf` in place; returns the tag.
pub fn secretbox_seal_in_place(
    key: &[u8; KEY_LEN],
    nonce: &[u8; NONCE_LEN],
    buf: &mut [u8],
) -> [u8; TAG_LEN] {
    if !sodium_ready() {
        return rustcrypto_seal(key, nonce, buf);
    }
    let mut tag = [0u8; TAG_LEN];
    let ptr = buf.as_mut_ptr();
    // SAFETY: `ptr` is valid for reads and writes of `buf.len()` bytes, exclusively borrowed for
    // the call; libsodium's `crypto_secretbox_detached` allows c == m (exact in-place: its overlap
    // check is false and the stream XOR reads each byte before writing it). `tag` is writable for
    // 16 bytes (crypto_secretbox_MACBYTES), `nonce` readable for 24 (NONCEBYTES) and `key` for 32
    // (KEYBYTES). It always returns 0 for these arguments.
    unsafe {
        libsodium_sys::crypto_secretbox_detached(
            ptr,
            tag.as_mut_ptr(),
            ptr,
            buf.len() as u64,
            nonce.as_ptr(),
            key.as_ptr(),
        );
    }
    tag
}

/// Checks the tag in constant time and only then decrypts `buf` in place; on failure `buf` is
/// unchanged.
pub fn secretbox_open_in_place(
    key: &[u8; KEY_LEN],
    nonce: &[u8; NONCE_LEN],
    tag: &[u8; TAG_LEN],
    buf: &mut [u8],
) -> bool {
    if !sodium_ready() {
        return rustcrypto_open(key, nonce, tag, buf);
    }
    let ptr = buf.as_mut_ptr();
    // SAFETY: as in `secretbox_seal_in_place`: `ptr` valid for `buf.len()` bytes, m == c allowed by
    // `crypto_secretbox_open_detached`, which verifies the Poly1305 tag (constant time) before it
    // writes anything; `tag`, `nonce` and `key` are readable for 16, 24 and 32 bytes.
    let rc = unsafe {
        libsodium_sys::crypto_secretbox_open_detached(
            ptr,
            ptr,
            tag.as_ptr(),
            buf.len() as u64,
            nonce.as_ptr(),
            key.as_ptr(),
        )
    };
    rc == 0
}

fn rustcrypto_seal(key: &[u8; KEY_LEN], nonce: &[u8; NONCE_LEN], buf: &mut [u8]) -> [u8; TAG_LEN] {
    // The crate only fails when associated data is given; there is none.
    XSalsa20Poly1305::new(key.into())
        .encrypt_in_place_detached(nonce.into(), &[], buf)
        .map(Into::into)
        .unwrap_or_default()
}

fn rustcrypto_open(
    key: &[u8; KEY_LEN],
    nonce: &[u8; NONCE_LEN],
    tag: &[u8; TAG_LEN],
    buf: &mut [u8],
) -> bool {
    XSalsa20Poly1305::new(key.into())
        .decrypt_in_place_detached(nonce.into(), &[], buf, tag.into())
        .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, RngCore, SeedableRng};

    #[test]
    fn libsodium_is_the_implementation() {
        assert_eq!(implementation(), "libsodium");
    }

    /// Byte-identical to RustCrypto, both ways, on lengths around the 64-byte first block and up
    /// to a full 16 KB block.
    #[test]
    fn matches_rustcrypto_on_random_inputs() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        let mut lens: Vec<usize> = (0..80).collect();
        lens.extend([255, 256, 4095, 16_368, 16_384]);
        lens.extend((0..40).map(|_| rng.gen_range(0..20_000)));
        for len in lens {
            let mut key = [0u8; 32];
            let mut nonce = [0u8; 24];
            rng.fill_bytes(&mut key);
            rng.fill_bytes(&mut nonce);
            let mut plain = vec![0u8; len];
            rng.fill_bytes(&mut plain);
            let mut a = plain.clone();
            let mut b = plain.clone();
            let ta = secretbox_seal_in_place(&key, &nonce, &mut a);
            let tb = rustcrypto_seal(&key, &nonce, &mut b);
            assert_eq!((ta, &a), (tb, &b), "seal, len {len}");
            assert!(rustcrypto_open(&key, &nonce, &ta, &mut b), "len {len}");
            assert_eq!(b, plain);
            assert!(secretbox_open_in_place(&key, &nonce, &ta, &mut a));
            assert_eq!(a, plain, "open, len {len}");
        }
    }

    #[test]
    fn failed_open_leaves_the_buffer_and_rejects_every_flipped_bit() {
        let key = [3u8; 32];
        let nonce = [4u8; 24];
        let mut buf = vec![5u8; 200];
        let tag = secretbox_seal_in_place(&key, &nonce, &mut buf);
        let sealed = buf.clone();
        for bit in [0, 7, 8 * 63, 8 * 64, 8 * 199 + 7] {
            let mut b = sealed.clone();
            b[bit / 8] ^= 1 << (bit % 8);
            let before = b.clone();
            assert!(!secretbox_open_in_place(&key, &nonce, &tag, &mut b));
            assert_eq!(b, before, "bit {bit}");
        }
        let mut bad_tag = tag;
        bad_tag[15] ^= 0x80;
        assert!(!secretbox_open_in_place(&key, &nonce, &bad_tag, &mut buf));
        assert_eq!(buf, sealed);
        let mut other_nonce = nonce;
        other_nonce[23] ^= 1;
        assert!(!secretbox_open_in_place(&key, &other_nonce, &tag, &mut buf));
    }
}
