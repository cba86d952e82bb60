//! TLS 1.3 records of the ChaCha20-Poly1305 suite — the only suite the SimpleX apps offer
//! (`ClientSuites::Apps`) — sealed and opened by OpenSSL, whose ChaCha20 and Poly1305 use AVX-512
//! where the CPU has it: 16 KB in ~6.4 µs against ring's ~8.5 (`benches/README.md`, "Crypto
//! floor"). Everything else of the suite (its key schedule, HKDF-SHA256) stays rustls' ring
//! provider's; only the record protection (RFC 8446 §5.2–5.3) is done here. Where OpenSSL cannot
//! key the cipher (a build without ChaCha20-Poly1305), the record layer falls back to ring's.

use std::sync::LazyLock;

use openssl::cipher::Cipher;
use openssl::cipher_ctx::CipherCtx;
use rustls::crypto::cipher::{
    make_tls13_aad, AeadKey, InboundOpaqueMessage, InboundPlainMessage, Iv, MessageDecrypter,
    MessageEncrypter, Nonce, OutboundOpaqueMessage, OutboundPlainMessage, PrefixedPayload,
    Tls13AeadAlgorithm, UnsupportedOperationError,
};
use rustls::crypto::ring::cipher_suite::TLS13_CHACHA20_POLY1305_SHA256 as RING_SUITE;
use rustls::crypto::CipherSuiteCommon;
use rustls::{
    ConnectionTrafficSecrets, ContentType, Error, ProtocolVersion, SupportedCipherSuite,
    Tls13CipherSuite,
};

/// The Poly1305 tag's length.
pub const TAG_LEN: usize = 16;
/// The key's length.
pub const KEY_LEN: usize = 32;
/// The nonce's length (RFC 8446 §5.3).
pub const NONCE_LEN: usize = 12;

/// ring's suite, whose key schedule this one keeps.
fn ring_suite() -> &'static Tls13CipherSuite {
    match RING_SUITE {
        SupportedCipherSuite::Tls13(s) => s,
        // The constant is the TLS 1.3 suite by its definition in rustls.
        SupportedCipherSuite::Tls12(_) => unreachable!("TLS13_CHACHA20_POLY1305_SHA256 is TLS 1.3"),
    }
}

static SUITE: LazyLock<Tls13CipherSuite> = LazyLock::new(|| {
    let ring = ring_suite();
    Tls13CipherSuite {
        common: CipherSuiteCommon {
            suite: ring.common.suite,
            hash_provider: ring.common.hash_provider,
            confidentiality_limit: ring.common.confidentiality_limit,
        },
        hkdf_provider: ring.hkdf_provider,
        aead_alg: &ChaChaRecords,
        // SMP never runs over QUIC.
        quic: None,
    }
});

/// TLS_CHACHA20_POLY1305_SHA256 with its records protected by OpenSSL.
pub fn suite() -> SupportedCipherSuite {
    SupportedCipherSuite::Tls13(&SUITE)
}

/// One direction's ChaCha20-Poly1305 key in an OpenSSL context, keyed once; each record gives
/// its nonce. Also what the crypto floor times (`load::floor`).
pub struct RecordKey {
    ctx: CipherCtx,
}

impl RecordKey {
    /// A sealing (`seal == true`) or opening key; `None` when OpenSSL cannot key the cipher.
    pub fn new(key: &[u8; KEY_LEN], seal: bool) -> Option<RecordKey> {
        let mut ctx = CipherCtx::new().ok()?;
        let cipher = Cipher::chacha20_poly1305();
        let nonce = [0u8; NONCE_LEN];
        let keyed = if seal {
            ctx.encrypt_init(Some(cipher), Some(key), Some(&nonce))
        } else {
            ctx.decrypt_init(Some(cipher), Some(key), Some(&nonce))
        };
        keyed.ok()?;
        Some(RecordKey { ctx })
    }

    /// Encrypts `buf` in place under `nonce` with `aad` authenticated; returns the tag.
    pub fn seal(
        &mut self,
        nonce: &[u8; NONCE_LEN],
        aad: &[u8],
        buf: &mut [u8],
    ) -> Result<[u8; TAG_LEN], openssl::error::ErrorStack> {
        self.ctx.encrypt_init(None, None, Some(nonce))?;
        self.ctx.cipher_update(aad, None)?;
        let n = buf.len();
        self.ctx.cipher_update_inplace(buf, n)?;
        // A stream cipher: nothing is left for the final step, which computes the tag.
        self.ctx.cipher_final(&mut [0u8; TAG_LEN])?;
        let mut tag = [0u8; TAG_LEN];
        self.ctx.tag(&mut tag)?;
        Ok(tag)
    }

    /// Decrypts `buf` in place and checks `tag` over it and `aad`; false when the tag does not
    /// match (what `buf` then holds must not be used).
    pub fn open(
        &mut self,
        nonce: &[u8; NONCE_LEN],
        aad: &[u8],
        buf: &mut [u8],
        tag: &[u8; TAG_LEN],
    ) -> bool {
        let mut run = || -> Result<(), openssl::error::ErrorStack> {
            self.ctx.decrypt_init(None, None, Some(nonce))?;
            self.ctx.cipher_update(aad, None)?;
            let n = buf.len();
            self.ctx.cipher_update_inplace(buf, n)?;
            self.ctx.set_tag(tag)?;
            self.ctx.cipher_final(&mut [0u8; TAG_LEN])?;
            Ok(())
        };
        run().is_ok()
    }
}

/// The suite's record protection: OpenSSL's, else ring's.
struct ChaChaRecords;

impl ChaChaRecords {
    fn key_bytes(key: &AeadKey) -> Option<[u8; KEY_LEN]> {
        <[u8; KEY_LEN]>::try_from(key.as_ref()).ok()
    }
}

impl Tls13AeadAlgorithm for ChaChaRecords {
    fn encrypter(&self, key: AeadKey, iv: Iv) -> Box<dyn MessageEncrypter> {
        match Self::key_bytes(&key).and_then(|k| RecordKey::new(&k, true)) {
            Some(key) => Box::new(Sealer { key, iv }),
            None => ring_suite().aead_alg.encrypter(key, iv),
        }
    }

    fn decrypter(&self, key: AeadKey, iv: Iv) -> Box<dyn MessageDecrypter> {
        match Self::key_bytes(&key).and_then(|k| RecordKey::new(&k, false)) {
            Some(key) => Box::new(Opener { key, iv }),
            None => ring_suite().aead_alg.decrypter(key, iv),
        }
    }

    fn key_len(&self) -> usize {
        KEY_LEN
    }

    fn extract_keys(
        &self,
        key: AeadKey,
        iv: Iv,
    ) -> Result<ConnectionTrafficSecrets, UnsupportedOperationError> {
        Ok(ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv })
    }
}

struct Sealer {
    key: RecordKey,
    iv: Iv,
}

impl MessageEncrypter for Sealer {
    fn encrypt(
        &mut self,
        msg: OutboundPlainMessage<'_>,
        seq: u64,
    ) -> Result<OutboundOpaqueMessage, Error> {
        let total_len = self.encrypted_payload_len(msg.payload.len());
        let mut payload = PrefixedPayload::with_capacity(total_len);
        // TLSInnerPlaintext: the content, then its real type (RFC 8446 §5.2), no padding.
        payload.extend_from_chunks(&msg.payload);
        payload.extend_from_slice(&msg.typ.to_array());
        let nonce = Nonce::new(&self.iv, seq).0;
        let aad = make_tls13_aad(total_len);
        let tag = self
            .key
            .seal(&nonce, &aad, payload.as_mut())
            .map_err(|_| Error::EncryptError)?;
        payload.extend_from_slice(&tag);
        // Every TLS 1.3 record says TLS 1.2 (0x0303) as its legacy version (RFC 8446 §5.1).
        Ok(OutboundOpaqueMessage::new(
            ContentType::ApplicationData,
            ProtocolVersion::TLSv1_2,
            payload,
        ))
    }

    fn encrypted_payload_len(&self, payload_len: usize) -> usize {
        payload_len + 1 + TAG_LEN
    }
}

struct Opener {
    key: RecordKey,
    iv: Iv,
}

impl MessageDecrypter for Opener {
    fn decrypt<'a>(
        &mut self,
        mut msg: InboundOpaqueMessage<'a>,
        seq: u64,
    ) -> Result<InboundPlainMessage<'a>, Error> {
        let payload = &mut msg.payload;
        let Some(plain_len) = payload.len().checked_sub(TAG_LEN) else {
            return Err(Error::DecryptError);
        };
        let nonce = Nonce::new(&self.iv, seq).0;
        let aad = make_tls13_aad(payload.len());
        let (body, tag) = payload.split_at_mut(plain_len);
        let tag: &[u8; TAG_LEN] = (&*tag).try_into().map_err(|_| Error::DecryptError)?;
        if !self.key.open(&nonce, &aad, body, tag) {
            return Err(Error::DecryptError);
        }
        payload.truncate(plain_len);
        msg.into_tls13_unpadded_message()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ring::aead::{Aad, LessSafeKey, Nonce as RingNonce, UnboundKey, CHACHA20_POLY1305};

    /// OpenSSL's records are ring's byte for byte (RFC 8439 is one function), and each opens the
    /// other's; a flipped bit anywhere, the tag included, fails to open.
    #[test]
    fn records_match_ring_and_reject_every_flipped_bit() {
        let key = [7u8; KEY_LEN];
        let ring = LessSafeKey::new(UnboundKey::new(&CHACHA20_POLY1305, &key).unwrap());
        let mut sealer = RecordKey::new(&key, true).expect("OpenSSL has ChaCha20-Poly1305");
        let mut opener = RecordKey::new(&key, false).expect("OpenSSL has ChaCha20-Poly1305");
        for (i, len) in [0usize, 1, 63, 64, 65, 1000, 16_385]
            .into_iter()
            .enumerate()
        {
            let nonce = [i as u8; NONCE_LEN];
            let aad = [23u8, 3, 3, (len >> 8) as u8, len as u8];
            let plain: Vec<u8> = (0..len).map(|b| (b * 31 + i) as u8).collect();
            let mut ours = plain.clone();
            let tag = sealer.seal(&nonce, &aad, &mut ours).unwrap();
            let mut theirs = plain.clone();
            let ring_tag = ring
                .seal_in_place_separate_tag(
                    RingNonce::assume_unique_for_key(nonce),
                    Aad::from(aad),
                    &mut theirs,
                )
                .unwrap();
            assert_eq!(ours, theirs, "ciphertext, {len} bytes");
            assert_eq!(&tag[..], ring_tag.as_ref(), "tag, {len} bytes");
            let mut back = ours.clone();
            assert!(opener.open(&nonce, &aad, &mut back, &tag));
            assert_eq!(back, plain);
            for bit in [0, len * 8 / 2, (len + TAG_LEN) * 8 - 1] {
                let (mut c, mut t) = (ours.clone(), tag);
                if bit / 8 < len {
                    c[bit / 8] ^= 1 << (bit % 8);
                } else {
                    t[bit / 8 - len] ^= 1 << (bit % 8);
                }
                assert!(!opener.open(&nonce, &aad, &mut c, &t), "bit {bit} of {len}");
            }
            let mut wrong_aad = aad;
            wrong_aad[4] ^= 1;
            let mut c = ours.clone();
            assert!(!opener.open(&nonce, &wrong_aad, &mut c, &tag));
        }
    }
}
