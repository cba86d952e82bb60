//! Command authorization (simplexmq `Server.hs`, `verifyCmdAuthorization`): Ed25519 and Ed448
//! signatures and X25519 authenticators over the authorized bytes, plus the dummy verifications
//! that make a missing queue or a key of the wrong algorithm cost the same as a real check (the
//! reference's dummy keys in simplexmq `Server.hs`). Client-side signing lives here too so that
//! both ends share one definition.

use std::cell::Cell;

use ed25519_dalek::{Signer as _, SigningKey};
use subtle::ConstantTimeEq;

use super::hash::sha512;
use super::keys::{
    PublicAuthKey, ED25519_KEY_LEN, ED25519_SIG_LEN, ED448_KEY_LEN, ED448_SIG_LEN,
    X25519_AUTHENTICATOR_LEN, X25519_KEY_LEN,
};
use super::sxbox::{cb_nonce, dh, open_in_place, seal, TAG_LEN};

/// The authorization field of a transmission, classified by its length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Authorization<'a> {
    None,
    Ed25519(&'a [u8; ED25519_SIG_LEN]),
    Ed448(&'a [u8; ED448_SIG_LEN]),
    X25519(&'a [u8; X25519_AUTHENTICATOR_LEN]),
}

impl<'a> Authorization<'a> {
    /// Any length other than 0, 64, 114 or 80 is a malformed transmission (`ERR BLOCK`).
    pub fn from_bytes(bytes: &'a [u8]) -> Option<Self> {
        match bytes.len() {
            0 => Some(Authorization::None),
            ED25519_SIG_LEN => bytes.try_into().ok().map(Authorization::Ed25519),
            ED448_SIG_LEN => bytes.try_into().ok().map(Authorization::Ed448),
            X25519_AUTHENTICATOR_LEN => bytes.try_into().ok().map(Authorization::X25519),
            _ => None,
        }
    }
}

/// The reference server's fixed dummy keys; verifying against them costs what a real check costs.
const DUMMY_ED25519: [u8; ED25519_KEY_LEN] =
    hex_array(*b"d77f4eaace10829a9b026074a3bad97fa4f5f6bca5ec4eb99380187b4904dd0b");
const DUMMY_ED448: [u8; ED448_KEY_LEN] = hex_array(
    *b"ea26d073d5e99122edc2b7fb3cbbe9f35a96fdeb62ba672454522608c45d7ed706fd7a296ce49aabdab22e1ae025628e2f236b40f355be9300",
);
const DUMMY_X25519: [u8; X25519_KEY_LEN] =
    hex_array(*b"e0919231886dd7c1f899ab3f8c7781c1f70cee32f035824d380862dbf8384578");

/// Stands in for the session key when a connection has none (v6 or no client key), so an
/// authenticator check still does the work of one DH and one box open.
const NO_SESSION_SECRET: [u8; 32] = [0x5a; 32];

const fn hex_array<const H: usize, const N: usize>(s: [u8; H]) -> [u8; N] {
    const fn nib(c: u8) -> u8 {
        match c {
            b'0'..=b'9' => c - b'0',
            b'a'..=b'f' => c - b'a' + 10,
            _ => panic!("not hex"),
        }
    }
    assert!(H == 2 * N);
    let mut out = [0u8; N];
    let mut i = 0;
    while i < N {
        out[i] = nib(s[2 * i]) << 4 | nib(s[2 * i + 1]);
        i += 1;
    }
    out
}

/// Real verifications performed on this thread, per algorithm, so tests can check that every path
/// (right key, wrong key, wrong algorithm, missing queue) does exactly one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VerifyCounts {
    pub ed25519: u64,
    pub ed448: u64,
    pub x25519: u64,
}

thread_local! {
    static COUNTS: Cell<VerifyCounts> = const { Cell::new(VerifyCounts { ed25519: 0, ed448: 0, x25519: 0 }) };
}

fn count(f: impl FnOnce(&mut VerifyCounts)) {
    COUNTS.with(|c| {
        let mut v = c.get();
        f(&mut v);
        c.set(v);
    });
}

pub fn verify_count() -> u64 {
    let c = verify_count_by_alg();
    c.ed25519 + c.ed448 + c.x25519
}

pub fn verify_count_by_alg() -> VerifyCounts {
    COUNTS.with(Cell::get)
}

/// Verifies `auth` over `authorized` with the queue key. A signature of another algorithm than the
/// key is checked against the dummy key of the signature's algorithm before failing, so the answer
/// takes as long as a real rejection. An empty authorization verifies nothing and fails.
pub fn verify(
    key: &PublicAuthKey,
    auth: &Authorization,
    authorized: &[u8],
    server_session_secret: Option<&[u8; 32]>,
    corr_id: &[u8],
) -> bool {
    match (key, auth) {
        (PublicAuthKey::Ed25519(k), Authorization::Ed25519(sig)) => {
            count(|c| c.ed25519 += 1);
            ed25519_verify(k, authorized, sig)
        }
        (PublicAuthKey::Ed448(k), Authorization::Ed448(sig)) => {
            count(|c| c.ed448 += 1);
            ed448_verify(k, authorized, sig)
        }
        (PublicAuthKey::X25519(k), Authorization::X25519(a)) => {
            count(|c| c.x25519 += 1);
            x25519_verify(k, a, authorized, server_session_secret, corr_id)
        }
        _ => dummy_verify(auth, authorized, server_session_secret, corr_id),
    }
}

/// Always false, after one real verification against the dummy key of the authorization's
/// algorithm: used when the queue does not exist or the key algorithm does not match.
pub fn dummy_verify(
    auth: &Authorization,
    authorized: &[u8],
    server_session_secret: Option<&[u8; 32]>,
    corr_id: &[u8],
) -> bool {
    let dummy_ok = match auth {
        Authorization::None => false,
        Authorization::Ed25519(sig) => {
            count(|c| c.ed25519 += 1);
            ed25519_verify(&DUMMY_ED25519, authorized, sig)
        }
        Authorization::Ed448(sig) => {
            count(|c| c.ed448 += 1);
            ed448_verify(&DUMMY_ED448, authorized, sig)
        }
        Authorization::X25519(a) => {
            count(|c| c.x25519 += 1);
            x25519_verify(&DUMMY_X25519, a, authorized, server_session_secret, corr_id)
        }
    };
    // The result must not be optimised away, yet can never authorize anything.
    std::hint::black_box(dummy_ok);
    false
}

/// Ed25519 under the relay's rule (`crypto::ed25519`): canonical encodings, no small-order key or
/// R, the cofactored equation. Plain verification would let the first two through (malleability).
pub fn ed25519_verify(
    key: &[u8; ED25519_KEY_LEN],
    msg: &[u8],
    sig: &[u8; ED25519_SIG_LEN],
) -> bool {
    super::ed25519::verify(key, msg, sig)
}

/// Several Ed25519 checks in one batch (`crypto::ed25519::verify_batch`), each counted as one
/// verification. `false` means "verify one by one", not "all fail".
pub fn ed25519_verify_batch(items: &[super::ed25519::Item]) -> bool {
    count(|c| c.ed25519 += items.len() as u64);
    super::ed25519::verify_batch(items)
}

/// The dummy key an Ed25519 signature is checked against when its queue does not exist, so that a
/// batch holding it fails exactly as one with a wrong key does.
pub fn ed25519_dummy_key() -> &'static [u8; ED25519_KEY_LEN] {
    &DUMMY_ED25519
}

fn x25519_verify(
    queue_key: &[u8; X25519_KEY_LEN],
    authenticator: &[u8; X25519_AUTHENTICATOR_LEN],
    authorized: &[u8],
    server_session_secret: Option<&[u8; 32]>,
    corr_id: &[u8],
) -> bool {
    let secret = server_session_secret.unwrap_or(&NO_SESSION_SECRET);
    let shared = dh(secret, queue_key);
    let mut tag = [0u8; TAG_LEN];
    tag.copy_from_slice(&authenticator[..TAG_LEN]);
    let mut digest = [0u8; 64];
    digest.copy_from_slice(&authenticator[TAG_LEN..]);
    let opened = open_in_place(&shared, &cb_nonce(corr_id), &tag, &mut digest).is_ok();
    let matches = bool::from(digest.ct_eq(&sha512(authorized)));
    opened & matches & server_session_secret.is_some()
}

pub fn sign_ed25519(sk: &SigningKey, authorized: &[u8]) -> [u8; ED25519_SIG_LEN] {
    sk.sign(authorized).to_bytes()
}

/// The authenticator a client sends for an X25519 queue key (simplexmq `Server.hs`,
/// `verifyCmdAuthorization`): SXbox over the DH of its queue key with the server's session key,
/// nonce from the corrId, of SHA-512 of the authorized bytes.
pub fn x25519_authenticator(
    client_priv: &[u8; 32],
    server_pub: &[u8; 32],
    corr_id: &[u8],
    authorized: &[u8],
) -> [u8; X25519_AUTHENTICATOR_LEN] {
    let boxed = seal(
        &dh(client_priv, server_pub),
        &cb_nonce(corr_id),
        &sha512(authorized),
    );
    let mut out = [0u8; X25519_AUTHENTICATOR_LEN];
    out.copy_from_slice(&boxed);
    out
}

// Ed448 (RFC 8032, pure: empty context, no pre-hash) is OpenSSL's: its curve448 code comes from
// libdecaf, like the reference's, and the pure-Rust arithmetic available was far too slow.
pub fn ed448_public(sk: &[u8; ED448_KEY_LEN]) -> [u8; ED448_KEY_LEN] {
    let mut out = [0u8; ED448_KEY_LEN];
    // Any 57 bytes are an Ed448 private key, so OpenSSL cannot refuse these inputs.
    if let Ok(public) = ed448_private(sk).and_then(|k| k.raw_public_key()) {
        out.copy_from_slice(&public);
    }
    out
}

/// An Ed448 signature (RFC 8032, no context), made by OpenSSL.
pub fn sign_ed448(sk: &[u8; ED448_KEY_LEN], authorized: &[u8]) -> [u8; ED448_SIG_LEN] {
    let mut sig = [0u8; ED448_SIG_LEN];
    let made = ed448_private(sk).and_then(|k| {
        openssl::sign::Signer::new_without_digest(&k)?.sign_oneshot_to_vec(authorized)
    });
    if let Ok(made) = made {
        sig.copy_from_slice(&made);
    }
    sig
}

fn ed448_private(
    sk: &[u8; ED448_KEY_LEN],
) -> Result<openssl::pkey::PKey<openssl::pkey::Private>, openssl::error::ErrorStack> {
    openssl::pkey::PKey::private_key_from_raw_bytes(sk, openssl::pkey::Id::ED448)
}

/// Ed448 verification by OpenSSL, whose curve448 code comes from libdecaf like the reference's
/// (cryptonite), so the same signatures are accepted. The pure-Rust point decoding that ran before
/// it cost milliseconds per signature (a torsion check per point), which would let anyone burn a
/// core with Ed448-signed commands (`benches/auth_timing`).
pub fn ed448_verify(key: &[u8; ED448_KEY_LEN], msg: &[u8], sig: &[u8; ED448_SIG_LEN]) -> bool {
    // S must be below L: its top byte is always zero (OpenSSL checks the full bound too).
    if sig[113] != 0 {
        return false;
    }
    openssl_ed448_verify(key, msg, sig)
}

/// OpenSSL's Ed448 verification (libcrypto).
fn openssl_ed448_verify(key: &[u8; ED448_KEY_LEN], msg: &[u8], sig: &[u8; ED448_SIG_LEN]) -> bool {
    use openssl::pkey::{Id, PKey};
    use openssl::sign::Verifier;
    let Ok(pkey) = PKey::public_key_from_raw_bytes(key, Id::ED448) else {
        return false;
    };
    let Ok(mut v) = Verifier::new_without_digest(&pkey) else {
        return false;
    };
    v.verify_oneshot(sig, msg).unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypto::sxbox::x25519_public;
    use base64::Engine;

    fn seq<const N: usize>(from: u8) -> [u8; N] {
        std::array::from_fn(|i| from.wrapping_add(i as u8))
    }

    fn counts_during(f: impl FnOnce()) -> VerifyCounts {
        let before = verify_count_by_alg();
        f();
        let after = verify_count_by_alg();
        VerifyCounts {
            ed25519: after.ed25519 - before.ed25519,
            ed448: after.ed448 - before.ed448,
            x25519: after.x25519 - before.x25519,
        }
    }

    const V4: &str = "a971985fd4e2416a671dfbc9ba8ba962e092f9090894ef0a294b7a7a79999e9fcb95e25b97bb5b5e4e8b6896f327078f52fae659e16c98f865a7e85cbb8f8c91a65dc4fe0449dece0d331304ceac08d8";

    #[test]
    fn from_bytes_classifies_by_length() {
        assert_eq!(Authorization::from_bytes(&[]), Some(Authorization::None));
        assert!(matches!(
            Authorization::from_bytes(&[0; 64]),
            Some(Authorization::Ed25519(_))
        ));
        assert!(matches!(
            Authorization::from_bytes(&[0; 114]),
            Some(Authorization::Ed448(_))
        ));
        assert!(matches!(
            Authorization::from_bytes(&[0; 80]),
            Some(Authorization::X25519(_))
        ));
        for len in [1, 32, 63, 65, 79, 81, 113, 115, 255] {
            assert_eq!(Authorization::from_bytes(&vec![0; len]), None, "{len}");
        }
    }

    #[test]
    fn dummy_keys_are_those_of_the_reference() {
        let b64 = base64::engine::general_purpose::STANDARD;
        let key = |s: &str| PublicAuthKey::from_spki(&b64.decode(s).unwrap()).unwrap();
        assert_eq!(
            key("MCowBQYDK2VwAyEA139Oqs4QgpqbAmB0o7rZf6T19ryl7E65k4AYe0kE3Qs="),
            PublicAuthKey::Ed25519(DUMMY_ED25519)
        );
        assert_eq!(
            key("MEMwBQYDK2VxAzoA6ibQc9XpkSLtwrf7PLvp81qW/etiumckVFImCMRdftcG/XopbOSaq9qyLhrgJWKOLyNrQPNVvpMA"),
            PublicAuthKey::Ed448(DUMMY_ED448)
        );
        assert_eq!(
            key("MCowBQYDK2VuAyEA4JGSMYht18H4mas/jHeBwfcM7jLwNYJNOAhi2/g4RXg="),
            PublicAuthKey::X25519(DUMMY_X25519)
        );
    }

    #[test]
    fn v4_authenticator_bytes_and_server_side_verify() {
        let sk1 = seq::<32>(1);
        let sk2 = seq::<32>(0x21);
        let corr_id = seq::<24>(100);
        let authorized = b"example authorized bytes";
        let a = x25519_authenticator(&sk1, &x25519_public(&sk2), &corr_id, authorized);
        assert_eq!(hex::encode(a), V4);

        let queue_key = PublicAuthKey::X25519(x25519_public(&sk1));
        let auth = Authorization::X25519(&a);
        assert!(verify(&queue_key, &auth, authorized, Some(&sk2), &corr_id));
        assert!(!verify(
            &queue_key,
            &auth,
            b"other bytes",
            Some(&sk2),
            &corr_id
        ));
        assert!(!verify(&queue_key, &auth, authorized, Some(&sk1), &corr_id));
        assert!(!verify(
            &queue_key,
            &auth,
            authorized,
            Some(&sk2),
            b"other corr id"
        ));
        assert!(!verify(&queue_key, &auth, authorized, None, &corr_id));
        let mut bad = a;
        bad[79] ^= 1;
        assert!(!verify(
            &queue_key,
            &Authorization::X25519(&bad),
            authorized,
            Some(&sk2),
            &corr_id
        ));
    }

    #[test]
    fn ed25519_sign_verify_round_trip() {
        let sk = SigningKey::from_bytes(&seq::<32>(9));
        let key = PublicAuthKey::Ed25519(sk.verifying_key().to_bytes());
        let sig = sign_ed25519(&sk, b"authorized");
        assert!(verify(
            &key,
            &Authorization::Ed25519(&sig),
            b"authorized",
            None,
            b""
        ));
        assert!(!verify(
            &key,
            &Authorization::Ed25519(&sig),
            b"authorizeD",
            None,
            b""
        ));
        let mut bad = sig;
        bad[0] ^= 1;
        assert!(!verify(
            &key,
            &Authorization::Ed25519(&bad),
            b"authorized",
            None,
            b""
        ));
    }

    #[test]
    fn ed25519_strict_rejects_small_order_key() {
        // The identity point as a public key with an identity R and S = 0 passes the lax equation
        // for any message; strict verification must refuse it.
        let mut identity = [0u8; 32];
        identity[0] = 1;
        let mut sig = [0u8; 64];
        sig[0] = 1;
        use ed25519_dalek::Verifier as _;
        assert!(ed25519_dalek::VerifyingKey::from_bytes(&identity)
            .unwrap()
            .verify(b"anything", &ed25519_dalek::Signature::from_bytes(&sig))
            .is_ok());
        assert!(!ed25519_verify(&identity, b"anything", &sig));
    }

    #[test]
    fn ed25519_rejects_non_canonical_s() {
        let sk = SigningKey::from_bytes(&seq::<32>(3));
        let pk = sk.verifying_key().to_bytes();
        let sig = sign_ed25519(&sk, b"m");
        assert!(ed25519_verify(&pk, b"m", &sig));
        // S + L is the same scalar but a second encoding.
        const L: [u8; 32] =
            hex_array(*b"edd3f55c1a631258d69cf7a2def9de1400000000000000000000000000000010");
        let mut s_plus_l = sig;
        let mut carry = 0u16;
        for i in 0..32 {
            let v = u16::from(sig[32 + i]) + u16::from(L[i]) + carry;
            s_plus_l[32 + i] = v as u8;
            carry = v >> 8;
        }
        assert!(!ed25519_verify(&pk, b"m", &s_plus_l));
    }

    #[test]
    fn ed448_rfc8032_blank_message_vector() {
        let sk: [u8; 57] = hex::decode("6c82a562cb808d10d632be89c8513ebf6c929f34ddfa8c9f63c9960ef6e348a3528c8a3fcc2f044e39a3fc5b94492f8f032e7549a20098f95b").unwrap().try_into().unwrap();
        let pk = ed448_public(&sk);
        assert_eq!(hex::encode(pk), "5fd7449b59b461fd2ce787ec616ad46a1da1342485a70e1f8a0ea75d80e96778edf124769b46c7061bd6783df1e50f6cd1fa1abeafe8256180");
        let sig = sign_ed448(&sk, b"");
        assert_eq!(hex::encode(sig), "533a37f6bbe457251f023c0d88f976ae2dfb504a843e34d2074fd823d41a591f2b233f034f628281f2fd7a22ddd47d7828c59bd0a21bfd3980ff0d2028d4b18a9df63e006c5d1c2d345b925d8dc00b4104852db99ac5c7cdda8530a113a0f4dbb61149f05a7363268c71d95808ff2e652600");
        assert!(ed448_verify(&pk, b"", &sig));
    }

    #[test]
    fn ed448_sign_verify_round_trip_and_openssl_agrees() {
        use openssl::pkey::{Id, PKey};
        use openssl::sign::{Signer, Verifier};
        let sk = seq::<57>(0x40);
        let pk = ed448_public(&sk);
        let msg = b"example authorized bytes";
        let sig = sign_ed448(&sk, msg);
        let key = PublicAuthKey::Ed448(pk);
        assert!(verify(&key, &Authorization::Ed448(&sig), msg, None, b""));
        assert!(!verify(
            &key,
            &Authorization::Ed448(&sig),
            b"other",
            None,
            b""
        ));
        for i in [0, 56, 57, 112, 113] {
            let mut bad = sig;
            bad[i] ^= 1;
            assert!(!ed448_verify(&pk, msg, &bad), "byte {i}");
        }

        let ossl = PKey::private_key_from_raw_bytes(&sk, Id::ED448).unwrap();
        assert_eq!(ossl.raw_public_key().unwrap(), pk);
        let ossl_sig = Signer::new_without_digest(&ossl)
            .unwrap()
            .sign_oneshot_to_vec(msg)
            .unwrap();
        assert_eq!(ossl_sig, sig);
        let ossl_pub = PKey::public_key_from_raw_bytes(&pk, Id::ED448).unwrap();
        assert!(Verifier::new_without_digest(&ossl_pub)
            .unwrap()
            .verify_oneshot(&sig, msg)
            .unwrap());
    }

    #[test]
    fn ed448_rejects_s_with_high_byte_and_bad_points() {
        let sk = seq::<57>(1);
        let pk = ed448_public(&sk);
        let sig = sign_ed448(&sk, b"m");
        let mut high = sig;
        high[113] = 1;
        assert!(!ed448_verify(&pk, b"m", &high));
        assert!(!ed448_verify(&[0xff; 57], b"m", &sig));
        let mut bad_r = sig;
        bad_r[..57].fill(0xff);
        assert!(!ed448_verify(&pk, b"m", &bad_r));
    }

    #[test]
    fn each_path_counts_exactly_one_real_verification() {
        let ed_sk = SigningKey::from_bytes(&seq::<32>(5));
        let ed_key = PublicAuthKey::Ed25519(ed_sk.verifying_key().to_bytes());
        let ed_sig = sign_ed25519(&ed_sk, b"a");
        let e448_sk = seq::<57>(7);
        let e448_key = PublicAuthKey::Ed448(ed448_public(&e448_sk));
        let e448_sig = sign_ed448(&e448_sk, b"a");
        let x_key = PublicAuthKey::X25519(x25519_public(&seq::<32>(11)));
        let x_auth = [0u8; 80];
        let session = seq::<32>(13);

        let one = |ed25519, ed448, x25519| VerifyCounts {
            ed25519,
            ed448,
            x25519,
        };
        let ed = Authorization::Ed25519(&ed_sig);
        let e448 = Authorization::Ed448(&e448_sig);
        let x = Authorization::X25519(&x_auth);

        // Matching algorithm: one verification of that algorithm.
        assert_eq!(
            counts_during(|| assert!(verify(&ed_key, &ed, b"a", None, b""))),
            one(1, 0, 0)
        );
        assert_eq!(
            counts_during(|| assert!(verify(&e448_key, &e448, b"a", None, b""))),
            one(0, 1, 0)
        );
        assert_eq!(
            counts_during(|| assert!(!verify(&x_key, &x, b"a", Some(&session), b""))),
            one(0, 0, 1)
        );

        // Wrong algorithm: one dummy verification of the signature's algorithm, and false.
        assert_eq!(
            counts_during(|| assert!(!verify(&e448_key, &ed, b"a", None, b""))),
            one(1, 0, 0)
        );
        assert_eq!(
            counts_during(|| assert!(!verify(&x_key, &ed, b"a", None, b""))),
            one(1, 0, 0)
        );
        assert_eq!(
            counts_during(|| assert!(!verify(&ed_key, &e448, b"a", None, b""))),
            one(0, 1, 0)
        );
        assert_eq!(
            counts_during(|| assert!(!verify(&ed_key, &x, b"a", Some(&session), b""))),
            one(0, 0, 1)
        );

        // Missing queue: one dummy verification each, never true, even for a valid signature.
        assert_eq!(
            counts_during(|| assert!(!dummy_verify(&ed, b"a", None, b""))),
            one(1, 0, 0)
        );
        assert_eq!(
            counts_during(|| assert!(!dummy_verify(&e448, b"a", None, b""))),
            one(0, 1, 0)
        );
        assert_eq!(
            counts_during(|| assert!(!dummy_verify(&x, b"a", Some(&session), b""))),
            one(0, 0, 1)
        );

        // No authorization: nothing to verify.
        assert_eq!(
            counts_during(|| assert!(!verify(&ed_key, &Authorization::None, b"a", None, b""))),
            one(0, 0, 0)
        );
        assert_eq!(verify_count(), {
            let c = verify_count_by_alg();
            c.ed25519 + c.ed448 + c.x25519
        });
    }

    #[test]
    fn x25519_dummy_is_checked_against_the_dummy_key() {
        // An authenticator made for the dummy key still fails through dummy_verify.
        let session = seq::<32>(0x21);
        let a = x25519_authenticator(&session, &DUMMY_X25519, b"corr", b"a");
        assert!(x25519_verify(
            &DUMMY_X25519,
            &a,
            b"a",
            Some(&session),
            b"corr"
        ));
        assert!(!dummy_verify(
            &Authorization::X25519(&a),
            b"a",
            Some(&session),
            b"corr"
        ));
    }
}
