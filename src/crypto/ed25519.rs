//! The relay's Ed25519 verification rule, and batch verification under exactly that rule.
//!
//! A signature `(R, S)` of message `M` under key `A` is accepted when:
//! 1. `S` is canonical (`S < ℓ`);
//! 2. `A` and `R` are canonical encodings (`y < p`) of curve points, and neither is of small order;
//! 3. `[8](S·B − k·A − R)` is the identity, with `k = SHA-512(R ‖ A ‖ M) mod ℓ` (the cofactored
//!    equation).
//!
//! Signatures from any honest signer (RFC 8032, libsodium, the reference's clients) pass; so does
//! every signature dalek's `verify_strict` accepts. The one kind `verify_strict` rejects and this
//! rule accepts is a signature whose error is a small-order point, which only the key's owner can
//! make (a deliberately mixed-order `R`). The cofactored equation is chosen because it is the one a
//! batch can decide exactly: `[8]·Σ zᵢ·(Sᵢ·B − kᵢ·Aᵢ − Rᵢ)` is the identity for random 128-bit
//! `zᵢ` if and only if every single equation holds (up to 2⁻¹²⁸), whereas the cofactorless batch
//! accepts some signatures its single check rejects with probability up to ½. So batching never
//! changes what is accepted: the checks 1–2 run on every item before the batch equation, and a
//! failed batch tells the caller to verify one by one.
//!
//! Cost here (`cargo bench --bench crypto_floor`): ~35 µs for one verification, ~15 µs per
//! signature in a batch of 135 (~19 µs when the keys were not seen before).

use std::cell::RefCell;
use std::collections::HashMap;

use curve25519_dalek::constants::ED25519_BASEPOINT_POINT;
use curve25519_dalek::edwards::{CompressedEdwardsY, EdwardsPoint};
use curve25519_dalek::scalar::Scalar;
use curve25519_dalek::traits::{IsIdentity, VartimeMultiscalarMul};
use rand::Rng;

pub const KEY_LEN: usize = 32;
pub const SIG_LEN: usize = 64;

/// One signature to check.
#[derive(Debug, Clone, Copy)]
pub struct Item<'a> {
    pub key: &'a [u8; KEY_LEN],
    pub msg: &'a [u8],
    pub sig: &'a [u8; SIG_LEN],
}

/// The parts of an item that passed checks 1–2.
struct Parsed {
    a: EdwardsPoint,
    r: EdwardsPoint,
    s: Scalar,
    k: Scalar,
}

/// `y < p = 2²⁵⁵ − 19` for the little-endian `y` of an encoding (the top bit is the sign of `x`).
fn canonical_y(b: &[u8; 32]) -> bool {
    let top = b[31] & 0x7f;
    !(top == 0x7f && b[1..31].iter().all(|&x| x == 0xff) && b[0] >= 0xed)
}

/// A canonical encoding of a point that is not of small order.
fn point(b: &[u8; 32]) -> Option<EdwardsPoint> {
    if !canonical_y(b) {
        return None;
    }
    CompressedEdwardsY(*b)
        .decompress()
        .filter(|p| !p.is_small_order())
}

/// Decompressed keys kept per thread (per shard), in two generations of this many: a key found in
/// the older one moves to the younger, and when the younger is full it becomes the older and the
/// oldest are dropped. Decompression is a field exponentiation, ~4.5 µs here; a queue's key is
/// used again by every SUB, ACK or SEND after the first. At most 2 × 16,384 entries of ~230 bytes
/// (~7 MB) per shard. SipHash with a random key, so chosen keys cannot flood one bucket.
const KEY_CACHE_GENERATION: usize = 16_384;

#[derive(Default)]
struct KeyCache {
    young: HashMap<[u8; 32], EdwardsPoint>,
    old: HashMap<[u8; 32], EdwardsPoint>,
}

impl KeyCache {
    fn get(&mut self, key: &[u8; 32]) -> Option<EdwardsPoint> {
        if let Some(p) = self.young.get(key) {
            return Some(*p);
        }
        let p = self.old.remove(key)?;
        self.insert(*key, p);
        Some(p)
    }

    fn insert(&mut self, key: [u8; 32], p: EdwardsPoint) {
        if self.young.len() >= KEY_CACHE_GENERATION {
            self.old = std::mem::take(&mut self.young);
        }
        self.young.insert(key, p);
    }
}

thread_local! {
    static KEYS: RefCell<KeyCache> = RefCell::new(KeyCache::default());
}

/// Empties this thread's key cache (benchmarks of first-use verification).
pub fn clear_key_cache() {
    KEYS.with(|c| *c.borrow_mut() = KeyCache::default());
}

/// `point(key)` through the per-thread cache; only valid keys are kept.
fn key_point(key: &[u8; 32]) -> Option<EdwardsPoint> {
    if let Some(p) = KEYS.with(|c| c.borrow_mut().get(key)) {
        return Some(p);
    }
    let p = point(key)?;
    KEYS.with(|c| c.borrow_mut().insert(*key, p));
    Some(p)
}

fn parse(item: &Item) -> Option<Parsed> {
    let r_bytes: &[u8; 32] = item.sig[..32].try_into().ok()?;
    let s_bytes: [u8; 32] = item.sig[32..].try_into().ok()?;
    let s = Option::<Scalar>::from(Scalar::from_canonical_bytes(s_bytes))?;
    let a = key_point(item.key)?;
    let r = point(r_bytes)?;
    // OpenSSL's SHA-512: a SEND signs its whole body (up to 16 KB), where its assembly is
    // ~20% faster here than the `sha2` crate's (benches/README.md, "Crypto floor").
    let mut h = openssl::sha::Sha512::new();
    h.update(r_bytes);
    h.update(item.key);
    h.update(item.msg);
    let k = Scalar::from_bytes_mod_order_wide(&h.finish());
    Some(Parsed { a, r, s, k })
}

/// One verification under the rule above.
pub fn verify(key: &[u8; KEY_LEN], msg: &[u8], sig: &[u8; SIG_LEN]) -> bool {
    let Some(p) = parse(&Item { key, msg, sig }) else {
        return false;
    };
    let e = EdwardsPoint::vartime_double_scalar_mul_basepoint(&p.k, &(-p.a), &p.s) - p.r;
    e.mul_by_cofactor().is_identity()
}

/// Whether every item verifies, in one multi-scalar multiplication. `false` means at least one item
/// fails (or, with probability 2⁻¹²⁸ per bad item, that they all pass): the caller then verifies
/// one by one with [`verify`], which decides.
pub fn verify_batch(items: &[Item]) -> bool {
    let mut parsed = Vec::with_capacity(items.len());
    for item in items {
        match parse(item) {
            Some(p) => parsed.push(p),
            None => return false,
        }
    }
    let mut rng = rand::thread_rng();
    let zs: Vec<Scalar> = parsed
        .iter()
        .map(|_| Scalar::from(rng.gen::<u128>()))
        .collect();
    let b: Scalar = parsed.iter().zip(&zs).map(|(p, z)| z * p.s).sum();
    // −(Σ zᵢ·Eᵢ) = −b·B + Σ zᵢ·Rᵢ + Σ (zᵢ·kᵢ)·Aᵢ
    let scalars = std::iter::once(-b)
        .chain(zs.iter().copied())
        .chain(parsed.iter().zip(&zs).map(|(p, z)| z * p.k));
    let points = std::iter::once(ED25519_BASEPOINT_POINT)
        .chain(parsed.iter().map(|p| p.r))
        .chain(parsed.iter().map(|p| p.a));
    EdwardsPoint::vartime_multiscalar_mul(scalars, points)
        .mul_by_cofactor()
        .is_identity()
}

#[cfg(test)]
mod tests {
    use super::*;
    use curve25519_dalek::constants::EIGHT_TORSION;
    use ed25519_dalek::{Signer, SigningKey, VerifyingKey};
    use rand::{RngCore, SeedableRng};
    use sha2::{Digest, Sha512};

    struct Owned {
        key: [u8; 32],
        msg: Vec<u8>,
        sig: [u8; 64],
    }

    impl Owned {
        fn item(&self) -> Item<'_> {
            Item {
                key: &self.key,
                msg: &self.msg,
                sig: &self.sig,
            }
        }
    }

    fn honest(rng: &mut rand::rngs::StdRng) -> Owned {
        let mut seed = [0u8; 32];
        rng.fill_bytes(&mut seed);
        let sk = SigningKey::from_bytes(&seed);
        let mut msg = vec![0u8; rng.gen_range(0..300)];
        rng.fill_bytes(&mut msg);
        Owned {
            key: sk.verifying_key().to_bytes(),
            sig: sk.sign(&msg).to_bytes(),
            msg,
        }
    }

    fn dalek_strict(o: &Owned) -> bool {
        VerifyingKey::from_bytes(&o.key).is_ok_and(|k| {
            k.verify_strict(&o.msg, &ed25519_dalek::Signature::from_bytes(&o.sig))
                .is_ok()
        })
    }

    /// A signature made by hand with `R = r·B + T` for a small-order `T`: its error is `−T`, so the
    /// cofactored rule accepts it and dalek's cofactorless `verify_strict` does not.
    fn mixed_order_r(rng: &mut rand::rngs::StdRng, t: usize) -> Owned {
        let mut wide = [0u8; 64];
        rng.fill_bytes(&mut wide);
        let a = Scalar::from_bytes_mod_order_wide(&wide);
        rng.fill_bytes(&mut wide);
        let r = Scalar::from_bytes_mod_order_wide(&wide);
        let key = EdwardsPoint::mul_base(&a).compress().to_bytes();
        let r_point = EdwardsPoint::mul_base(&r) + EIGHT_TORSION[t];
        let r_bytes = r_point.compress().to_bytes();
        let msg = b"mixed".to_vec();
        let mut h = Sha512::new();
        h.update(r_bytes);
        h.update(key);
        h.update(&msg);
        let k = Scalar::from_bytes_mod_order_wide(&h.finalize().into());
        let s = r + k * a;
        let mut sig = [0u8; 64];
        sig[..32].copy_from_slice(&r_bytes);
        sig[32..].copy_from_slice(s.as_bytes());
        Owned { key, msg, sig }
    }

    #[test]
    fn agrees_with_dalek_verify_strict_on_honest_and_mutated_signatures() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        let mut rejected = 0;
        for _ in 0..60 {
            let o = honest(&mut rng);
            assert!(verify(&o.key, &o.msg, &o.sig));
            assert!(dalek_strict(&o));
            // One flipped bit anywhere in key, signature or message.
            for _ in 0..8 {
                let mut m = Owned {
                    key: o.key,
                    msg: o.msg.clone(),
                    sig: o.sig,
                };
                match rng.gen_range(0..3) {
                    0 => m.key[rng.gen_range(0..32)] ^= 1 << rng.gen_range(0..8),
                    1 => m.sig[rng.gen_range(0..64)] ^= 1 << rng.gen_range(0..8),
                    _ if !m.msg.is_empty() => {
                        let i = rng.gen_range(0..m.msg.len());
                        m.msg[i] ^= 1;
                    }
                    _ => m.msg.push(0),
                }
                assert_eq!(verify(&m.key, &m.msg, &m.sig), dalek_strict(&m));
                assert!(!verify(&m.key, &m.msg, &m.sig));
                rejected += 1;
            }
        }
        assert_eq!(rejected, 480);
    }

    /// A SEND signs up to 16 KB: every byte of a long message is hashed (a flip anywhere, the
    /// last byte included, is rejected), alone and in a batch, and dalek agrees.
    #[test]
    fn long_messages_are_hashed_whole() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let owned: Vec<Owned> = [127usize, 128, 16_048, 16_200]
            .iter()
            .map(|&len| {
                let mut seed = [0u8; 32];
                rng.fill_bytes(&mut seed);
                let sk = SigningKey::from_bytes(&seed);
                let mut msg = vec![0u8; len];
                rng.fill_bytes(&mut msg);
                Owned {
                    key: sk.verifying_key().to_bytes(),
                    sig: sk.sign(&msg).to_bytes(),
                    msg,
                }
            })
            .collect();
        let items: Vec<Item> = owned.iter().map(Owned::item).collect();
        assert!(verify_batch(&items));
        for o in &owned {
            assert!(verify(&o.key, &o.msg, &o.sig) && dalek_strict(o));
            for at in [0, o.msg.len() / 2, o.msg.len() - 1] {
                let mut m = o.msg.clone();
                m[at] ^= 0x80;
                assert!(!verify(&o.key, &m, &o.sig), "flip at {at} of {}", m.len());
            }
        }
    }

    #[test]
    fn non_canonical_s_and_small_order_keys_are_rejected() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(2);
        let o = honest(&mut rng);
        // S + ℓ: same value mod ℓ, non-canonical.
        // ℓ = 2²⁵² + 27742317777372353535851937790883648493, little-endian.
        let l: [u8; 32] = [
            0xed, 0xd3, 0xf5, 0x5c, 0x1a, 0x63, 0x12, 0x58, 0xd6, 0x9c, 0xf7, 0xa2, 0xde, 0xf9,
            0xde, 0x14, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x10,
        ];
        let mut s_plus_l = o.sig;
        let mut carry = 0u16;
        for i in 0..32 {
            let v = s_plus_l[32 + i] as u16 + l[i] as u16 + carry;
            s_plus_l[32 + i] = v as u8;
            carry = v >> 8;
        }
        assert!(!verify(&o.key, &o.msg, &s_plus_l));
        for t in EIGHT_TORSION {
            let weak = t.compress().to_bytes();
            // With a small-order key and R = identity, S = 0 satisfies the equation: still refused.
            let mut sig = [0u8; 64];
            sig[..32].copy_from_slice(&EdwardsPoint::default().compress().to_bytes());
            assert!(!verify(&weak, b"m", &sig));
            // A small-order R is refused likewise.
            let mut sig = o.sig;
            sig[..32].copy_from_slice(&weak);
            assert!(!verify(&o.key, &o.msg, &sig));
        }
    }

    #[test]
    fn non_canonical_point_encodings_are_rejected() {
        // y + p for every y < 19 that is on the curve: dalek decompresses it, the rule does not.
        let mut found = 0;
        for y in 0u8..19 {
            let mut enc = [0u8; 32];
            enc[0] = y;
            if CompressedEdwardsY(enc).decompress().is_none() {
                continue;
            }
            let mut non = [0xffu8; 32];
            non[31] = 0x7f;
            non[0] = 0xed + y;
            assert!(CompressedEdwardsY(non).decompress().is_some());
            assert!(!canonical_y(&non));
            assert!(point(&non).is_none());
            found += 1;
        }
        assert!(found > 0);
        assert!(!canonical_y(&[0xff; 32]));
        let mut below_p = [0xffu8; 32];
        below_p[31] = 0x7f;
        below_p[0] = 0xec;
        assert!(canonical_y(&below_p));
    }

    #[test]
    fn mixed_order_r_is_accepted_alone_and_in_batches_alike() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        for t in 1..8 {
            let m = mixed_order_r(&mut rng, t);
            assert!(!dalek_strict(&m), "t{t}");
            assert!(verify(&m.key, &m.msg, &m.sig), "t{t}");
            let others: Vec<Owned> = (0..5).map(|_| honest(&mut rng)).collect();
            let mut items: Vec<Item> = others.iter().map(Owned::item).collect();
            items.push(m.item());
            // The batch decides the same way every time, whatever its random coefficients.
            for _ in 0..16 {
                assert!(verify_batch(&items), "t{t}");
            }
        }
    }

    #[test]
    fn a_batch_passes_exactly_when_every_item_verifies() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(4);
        let pool: Vec<Owned> = (0..135).map(|_| honest(&mut rng)).collect();
        let all: Vec<Item> = pool.iter().map(Owned::item).collect();
        assert!(verify_batch(&all));
        assert!(verify_batch(&[]));
        for trial in 0..40 {
            let n = rng.gen_range(1..=135);
            let mut owned: Vec<Owned> = pool[..n]
                .iter()
                .map(|o| Owned {
                    key: o.key,
                    msg: o.msg.clone(),
                    sig: o.sig,
                })
                .collect();
            // Half the trials break one to three items: a wrong key, a changed message, or a
            // signature of another key.
            if trial % 2 == 1 {
                for _ in 0..rng.gen_range(1..=3) {
                    let i = rng.gen_range(0..n);
                    match rng.gen_range(0..3) {
                        0 => owned[i].key = pool[(i + 1) % 135].key,
                        1 => owned[i].msg.push(1),
                        _ => owned[i].sig = pool[(i + 1) % 135].sig,
                    }
                }
            }
            let items: Vec<Item> = owned.iter().map(Owned::item).collect();
            let singles = items.iter().all(|i| verify(i.key, i.msg, i.sig));
            assert_eq!(verify_batch(&items), singles, "trial {trial}");
            assert_eq!(singles, trial % 2 == 0);
        }
    }

    #[test]
    fn an_unparsable_item_fails_the_batch_before_any_arithmetic() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        let good: Vec<Owned> = (0..3).map(|_| honest(&mut rng)).collect();
        let mut bad = Owned {
            key: good[0].key,
            msg: good[0].msg.clone(),
            sig: good[0].sig,
        };
        bad.sig[63] |= 0xf0; // S ≥ ℓ
        let mut items: Vec<Item> = good.iter().map(Owned::item).collect();
        items.push(bad.item());
        assert!(!verify_batch(&items));
    }

    #[test]
    fn the_key_cache_is_bounded_and_keeps_what_is_used_again() {
        let mut c = KeyCache::default();
        let p = EdwardsPoint::mul_base(&Scalar::from(7u8));
        let key = |i: usize| {
            let mut k = [0u8; 32];
            k[..8].copy_from_slice(&(i as u64).to_le_bytes());
            k
        };
        for i in 0..KEY_CACHE_GENERATION {
            c.insert(key(i), p);
        }
        // The next insert ages the whole generation; key 0 is found in the old one and moves up.
        c.insert(key(KEY_CACHE_GENERATION), p);
        assert!(c.get(&key(0)).is_some());
        for i in 1..=3 * KEY_CACHE_GENERATION {
            c.insert(key(KEY_CACHE_GENERATION + i), p);
            assert!(c.young.len() + c.old.len() <= 2 * KEY_CACHE_GENERATION);
        }
        assert!(c.get(&key(1)).is_none(), "dropped after two generations");
        // And a cached key verifies exactly as a fresh one.
        let mut rng = rand::rngs::StdRng::seed_from_u64(6);
        let o = honest(&mut rng);
        assert!(verify(&o.key, &o.msg, &o.sig));
        assert!(verify(&o.key, &o.msg, &o.sig));
        let mut bad = o.sig;
        bad[40] ^= 1;
        assert!(!verify(&o.key, &o.msg, &bad));
    }
}
