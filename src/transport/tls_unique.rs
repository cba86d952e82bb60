//! tls-unique for TLS 1.3: the verify_data of the client's Finished message, which SMP uses as the
//! session id (simplexmq `Transport.hs`, `tlsUnique`). rustls has no API for it, so we read it back
//! from the client's own records: skip the plaintext ClientHello(s) and ChangeCipherSpec, decrypt
//! the records protected under client_handshake_traffic_secret, reassemble handshake messages and
//! stop at Finished. Anything outside that shape is an error: a wrong session id must never be
//! produced.

use ring::{aead, hkdf};
use rustls::{CipherSuite, SupportedCipherSuite};

const RECORD_HEADER_BYTES: usize = 5;
/// RFC 8446 §5.1 / §5.2 record size limits.
const MAX_PLAINTEXT_RECORD_BYTES: usize = 1 << 14;
const MAX_CIPHERTEXT_RECORD_BYTES: usize = (1 << 14) + 256;
/// Handshake messages the client may send before Finished are small (a certificate chain at most);
/// anything larger is refused rather than buffered.
const MAX_HANDSHAKE_BUFFER_BYTES: usize = 64 * 1024;

const CONTENT_CHANGE_CIPHER_SPEC: u8 = 20;
const CONTENT_ALERT: u8 = 21;
const CONTENT_HANDSHAKE: u8 = 22;
const CONTENT_APPLICATION_DATA: u8 = 23;

const HS_CERTIFICATE: u8 = 11;
const HS_CERTIFICATE_VERIFY: u8 = 15;
const HS_FINISHED: u8 = 20;
const HS_COMPRESSED_CERTIFICATE: u8 = 25;

const AEAD_NONCE_BYTES: usize = 12;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TlsUniqueError {
    #[error("negotiated cipher suite {0:?} is not a TLS 1.3 suite this code decrypts")]
    UnsupportedSuite(CipherSuite),
    #[error("handshake traffic secret is {got} bytes, the suite's hash needs {want}")]
    BadSecretLength { got: usize, want: usize },
    #[error("captured bytes end before the client Finished")]
    NoFinished,
    #[error("record of {0} bytes exceeds the TLS 1.3 limit")]
    RecordOverflow(usize),
    #[error("unexpected record content type {0}")]
    UnexpectedContentType(u8),
    #[error("encrypted record before any ClientHello")]
    NoClientHello,
    #[error("plaintext handshake record after encryption started")]
    PlaintextAfterEncrypted,
    #[error("malformed ChangeCipherSpec record")]
    BadChangeCipherSpec,
    #[error("client sent an alert during the handshake")]
    Alert,
    #[error("handshake record failed to decrypt")]
    Decrypt,
    #[error("decrypted record has no content type")]
    NoInnerContentType,
    #[error("unexpected inner content type {0} before Finished")]
    UnexpectedInnerType(u8),
    #[error("unexpected handshake message type {0} before Finished")]
    UnexpectedHandshake(u8),
    #[error("Finished is {got} bytes, the suite's hash is {want}")]
    BadFinishedLength { got: usize, want: usize },
    #[error("handshake bytes follow Finished in the same record")]
    TrailingAfterFinished,
    #[error("handshake messages before Finished exceed {MAX_HANDSHAKE_BUFFER_BYTES} bytes")]
    HandshakeTooLarge,
    #[error("too many encrypted records")]
    SequenceOverflow,
}

/// The record-protection parameters of one TLS 1.3 suite.
#[derive(Clone, Copy)]
struct SuiteParams {
    aead: &'static aead::Algorithm,
    hkdf: hkdf::Algorithm,
    hash_len: usize,
}

fn suite_params(suite: CipherSuite) -> Result<SuiteParams, TlsUniqueError> {
    match suite {
        CipherSuite::TLS13_AES_128_GCM_SHA256 => Ok(SuiteParams {
            aead: &aead::AES_128_GCM,
            hkdf: hkdf::HKDF_SHA256,
            hash_len: 32,
        }),
        CipherSuite::TLS13_AES_256_GCM_SHA384 => Ok(SuiteParams {
            aead: &aead::AES_256_GCM,
            hkdf: hkdf::HKDF_SHA384,
            hash_len: 48,
        }),
        CipherSuite::TLS13_CHACHA20_POLY1305_SHA256 => Ok(SuiteParams {
            aead: &aead::CHACHA20_POLY1305,
            hkdf: hkdf::HKDF_SHA256,
            hash_len: 32,
        }),
        other => Err(TlsUniqueError::UnsupportedSuite(other)),
    }
}

/// Length marker so ring's HKDF can fill an IV-sized buffer.
struct OutputLen(usize);

impl hkdf::KeyType for OutputLen {
    fn len(&self) -> usize {
        self.0
    }
}

/// HKDF-Expand-Label(secret, label, "", len) of RFC 8446 §7.1 into `out`.
fn expand_label(prk: &hkdf::Prk, label: &[u8], out: &mut [u8]) -> Result<(), TlsUniqueError> {
    // Only the fixed labels "key" and "iv" and lengths <= 48 are used, so these casts cannot truncate.
    let len_be = (out.len() as u16).to_be_bytes();
    let label_len = [(b"tls13 ".len() + label.len()) as u8];
    let context_len = [0u8];
    let info: [&[u8]; 5] = [&len_be, &label_len, b"tls13 ", label, &context_len];
    prk.expand(&info, OutputLen(out.len()))
        .and_then(|okm| okm.fill(out))
        .map_err(|_| TlsUniqueError::Decrypt)
}

/// Record-protection key and IV derived from a traffic secret (RFC 8446 §7.3).
struct TrafficKey {
    key: aead::LessSafeKey,
    iv: [u8; AEAD_NONCE_BYTES],
}

fn derive_traffic_key(
    params: SuiteParams,
    secret: &[u8],
) -> Result<(Vec<u8>, [u8; AEAD_NONCE_BYTES]), TlsUniqueError> {
    if secret.len() != params.hash_len {
        return Err(TlsUniqueError::BadSecretLength {
            got: secret.len(),
            want: params.hash_len,
        });
    }
    let prk = hkdf::Prk::new_less_safe(params.hkdf, secret);
    let mut key = vec![0u8; params.aead.key_len()];
    expand_label(&prk, b"key", &mut key)?;
    let mut iv = [0u8; AEAD_NONCE_BYTES];
    expand_label(&prk, b"iv", &mut iv)?;
    Ok((key, iv))
}

impl TrafficKey {
    fn new(params: SuiteParams, secret: &[u8]) -> Result<Self, TlsUniqueError> {
        let (key, iv) = derive_traffic_key(params, secret)?;
        let unbound =
            aead::UnboundKey::new(params.aead, &key).map_err(|_| TlsUniqueError::Decrypt)?;
        Ok(Self {
            key: aead::LessSafeKey::new(unbound),
            iv,
        })
    }

    /// Decrypts one record in place and returns its inner plaintext (content, type, padding).
    fn open<'a>(
        &self,
        seq: u64,
        header: &[u8; RECORD_HEADER_BYTES],
        payload: &'a mut [u8],
    ) -> Result<&'a mut [u8], TlsUniqueError> {
        let mut nonce = self.iv;
        for (n, s) in nonce[AEAD_NONCE_BYTES - 8..]
            .iter_mut()
            .zip(seq.to_be_bytes())
        {
            *n ^= s;
        }
        self.key
            .open_in_place(
                aead::Nonce::assume_unique_for_key(nonce),
                aead::Aad::from(*header),
                payload,
            )
            .map_err(|_| TlsUniqueError::Decrypt)
    }
}

/// Returns the verify_data of the client's Finished found in `captured_client_bytes` (everything
/// the client sent, from its first ClientHello on; bytes after Finished are ignored).
pub fn client_finished(
    captured_client_bytes: &[u8],
    suite: SupportedCipherSuite,
    client_hs_traffic_secret: &[u8],
) -> Result<Vec<u8>, TlsUniqueError> {
    client_finished_for_suite(
        captured_client_bytes,
        suite.suite(),
        client_hs_traffic_secret,
    )
}

fn client_finished_for_suite(
    captured: &[u8],
    suite: CipherSuite,
    secret: &[u8],
) -> Result<Vec<u8>, TlsUniqueError> {
    let params = suite_params(suite)?;
    let key = TrafficKey::new(params, secret)?;

    let mut rest = captured;
    let mut seen_client_hello = false;
    let mut seq: Option<u64> = None; // None until the first encrypted record
    let mut handshake = Vec::new();
    let mut scratch = Vec::new();

    loop {
        if rest.len() < RECORD_HEADER_BYTES {
            return Err(TlsUniqueError::NoFinished);
        }
        let mut header = [0u8; RECORD_HEADER_BYTES];
        header.copy_from_slice(&rest[..RECORD_HEADER_BYTES]);
        let content_type = header[0];
        let len = u16::from_be_bytes([header[3], header[4]]) as usize;
        if len > MAX_CIPHERTEXT_RECORD_BYTES {
            return Err(TlsUniqueError::RecordOverflow(len));
        }
        let Some(payload) = rest.get(RECORD_HEADER_BYTES..RECORD_HEADER_BYTES + len) else {
            return Err(TlsUniqueError::NoFinished);
        };
        rest = &rest[RECORD_HEADER_BYTES + len..];

        match content_type {
            CONTENT_HANDSHAKE => {
                // ClientHello, and a second one after HelloRetryRequest: their content is
                // covered by the transcript rustls already checked, so it is not parsed here.
                if seq.is_some() {
                    return Err(TlsUniqueError::PlaintextAfterEncrypted);
                }
                if len > MAX_PLAINTEXT_RECORD_BYTES {
                    return Err(TlsUniqueError::RecordOverflow(len));
                }
                seen_client_hello = true;
            }
            CONTENT_CHANGE_CIPHER_SPEC => {
                // Middlebox-compatibility CCS (RFC 8446 §5): exactly one byte 0x01, no state.
                if payload != [1] {
                    return Err(TlsUniqueError::BadChangeCipherSpec);
                }
            }
            CONTENT_APPLICATION_DATA => {
                if !seen_client_hello {
                    return Err(TlsUniqueError::NoClientHello);
                }
                let this_seq = seq.unwrap_or(0);
                seq = Some(
                    this_seq
                        .checked_add(1)
                        .ok_or(TlsUniqueError::SequenceOverflow)?,
                );
                scratch.clear();
                scratch.extend_from_slice(payload);
                let inner = key.open(this_seq, &header, &mut scratch)?;
                let (inner_type, content) = split_inner_plaintext(inner)?;
                if content.len() > MAX_PLAINTEXT_RECORD_BYTES {
                    return Err(TlsUniqueError::RecordOverflow(content.len()));
                }
                match inner_type {
                    CONTENT_HANDSHAKE => {}
                    CONTENT_ALERT => return Err(TlsUniqueError::Alert),
                    other => return Err(TlsUniqueError::UnexpectedInnerType(other)),
                }
                if handshake.len() + content.len() > MAX_HANDSHAKE_BUFFER_BYTES {
                    return Err(TlsUniqueError::HandshakeTooLarge);
                }
                handshake.extend_from_slice(content);
                if let Some(verify_data) = take_messages(&mut handshake, params.hash_len)? {
                    return Ok(verify_data);
                }
            }
            CONTENT_ALERT => return Err(TlsUniqueError::Alert),
            other => return Err(TlsUniqueError::UnexpectedContentType(other)),
        }
    }
}

/// TLSInnerPlaintext = content ‖ type ‖ zeros: the type is the last non-zero byte.
fn split_inner_plaintext(inner: &[u8]) -> Result<(u8, &[u8]), TlsUniqueError> {
    let end = inner
        .iter()
        .rposition(|&b| b != 0)
        .ok_or(TlsUniqueError::NoInnerContentType)?;
    Ok((inner[end], &inner[..end]))
}

/// Consumes the complete handshake messages at the front of `buf`. Returns the Finished
/// verify_data once it is complete; messages split across records wait in `buf`.
fn take_messages(buf: &mut Vec<u8>, hash_len: usize) -> Result<Option<Vec<u8>>, TlsUniqueError> {
    let mut pos = 0;
    let result = loop {
        let Some(head) = buf.get(pos..pos + 4) else {
            break None;
        };
        let msg_type = head[0];
        let len = u32::from_be_bytes([0, head[1], head[2], head[3]]) as usize;
        match msg_type {
            HS_CERTIFICATE | HS_CERTIFICATE_VERIFY | HS_COMPRESSED_CERTIFICATE => {}
            HS_FINISHED => {
                if len != hash_len {
                    return Err(TlsUniqueError::BadFinishedLength {
                        got: len,
                        want: hash_len,
                    });
                }
            }
            other => return Err(TlsUniqueError::UnexpectedHandshake(other)),
        }
        if len > MAX_HANDSHAKE_BUFFER_BYTES {
            return Err(TlsUniqueError::HandshakeTooLarge);
        }
        let Some(body) = buf.get(pos + 4..pos + 4 + len) else {
            break None;
        };
        if msg_type == HS_FINISHED {
            // Keys change after Finished, so it must end its record (RFC 8446 §5.1).
            if pos + 4 + len != buf.len() {
                return Err(TlsUniqueError::TrailingAfterFinished);
            }
            break Some(body.to_vec());
        }
        pos += 4 + len;
    };
    buf.drain(..pos.min(buf.len()));
    Ok(result)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        let s: String = s.split_whitespace().collect();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    // RFC 8448 §3 "Simple 1-RTT Handshake" (TLS_AES_128_GCM_SHA256).
    const RFC8448_CLIENT_HS_SECRET: &str =
        "b3eddb126e067f35a780b3abf45e2d8f3b1a950738f52e9600746a0e27a55a21";
    const RFC8448_CLIENT_HS_KEY: &str = "dbfaa693d1762c5b666af5d950258d01";
    const RFC8448_CLIENT_HS_IV: &str = "5bd3c71b836e0b76bb73265f";
    const RFC8448_CLIENT_FINISHED_RECORD: &str = "17 03 03 00 35 75 ec 4d c2 38 cc e6 0b 29 80 44
        a7 1e 21 9c 56 cc 77 b0 51 7f e9 b9 3c 7a 4b fc 44 d8 7f 38 f8 03 38 ac 98 fc 46 de b3 84
        bd 1c ae ac ab 68 67 d7 26 c4 05 46";
    const RFC8448_VERIFY_DATA: &str =
        "a8ec436d677634ae525ac1fcebe11a039ec17694fac6e98527b642f2edd5ce61";

    const AES128: CipherSuite = CipherSuite::TLS13_AES_128_GCM_SHA256;

    /// A plaintext handshake record standing in for a ClientHello (its content is not parsed).
    fn fake_client_hello() -> Vec<u8> {
        let mut r = vec![22, 3, 1, 0, 8, 1, 0, 0, 4];
        r.extend_from_slice(&[3, 3, 0, 0]);
        r
    }

    fn rfc_input() -> Vec<u8> {
        let mut v = fake_client_hello();
        v.extend_from_slice(&[20, 3, 3, 0, 1, 1]); // compatibility CCS
        v.extend(hex(RFC8448_CLIENT_FINISHED_RECORD));
        v
    }

    #[test]
    fn rfc8448_key_and_iv_derivation() {
        let params = suite_params(AES128).unwrap();
        let (key, iv) = derive_traffic_key(params, &hex(RFC8448_CLIENT_HS_SECRET)).unwrap();
        assert_eq!(key, hex(RFC8448_CLIENT_HS_KEY));
        assert_eq!(iv.to_vec(), hex(RFC8448_CLIENT_HS_IV));
    }

    #[test]
    fn rfc8448_client_finished_record_gives_verify_data() {
        let got = client_finished_for_suite(&rfc_input(), AES128, &hex(RFC8448_CLIENT_HS_SECRET))
            .unwrap();
        assert_eq!(got, hex(RFC8448_VERIFY_DATA));
    }

    #[test]
    fn public_entry_point_takes_a_rustls_suite() {
        let suite = rustls::crypto::ring::cipher_suite::TLS13_AES_128_GCM_SHA256;
        let got = client_finished(&rfc_input(), suite, &hex(RFC8448_CLIENT_HS_SECRET)).unwrap();
        assert_eq!(got, hex(RFC8448_VERIFY_DATA));
    }

    #[test]
    fn bytes_after_finished_are_ignored() {
        let mut input = rfc_input();
        input.extend_from_slice(&[23, 3, 3, 0, 3, 9, 9, 9, 0xff]);
        let got =
            client_finished_for_suite(&input, AES128, &hex(RFC8448_CLIENT_HS_SECRET)).unwrap();
        assert_eq!(got, hex(RFC8448_VERIFY_DATA));
    }

    #[test]
    fn truncated_capture_has_no_finished() {
        let input = rfc_input();
        for cut in 0..input.len() {
            let err =
                client_finished_for_suite(&input[..cut], AES128, &hex(RFC8448_CLIENT_HS_SECRET))
                    .unwrap_err();
            assert_eq!(err, TlsUniqueError::NoFinished, "cut at {cut}");
        }
    }

    #[test]
    fn wrong_secret_or_tampered_record_fails_to_decrypt() {
        let mut secret = hex(RFC8448_CLIENT_HS_SECRET);
        secret[0] ^= 1;
        assert_eq!(
            client_finished_for_suite(&rfc_input(), AES128, &secret),
            Err(TlsUniqueError::Decrypt)
        );
        let mut input = rfc_input();
        let last = input.len() - 1;
        input[last] ^= 1;
        assert_eq!(
            client_finished_for_suite(&input, AES128, &hex(RFC8448_CLIENT_HS_SECRET)),
            Err(TlsUniqueError::Decrypt)
        );
    }

    #[test]
    fn malformed_shapes_fail_closed() {
        let secret = hex(RFC8448_CLIENT_HS_SECRET);
        // Encrypted record with no ClientHello before it.
        assert_eq!(
            client_finished_for_suite(&hex(RFC8448_CLIENT_FINISHED_RECORD), AES128, &secret),
            Err(TlsUniqueError::NoClientHello)
        );
        // A CCS with the wrong body.
        let mut v = fake_client_hello();
        v.extend_from_slice(&[20, 3, 3, 0, 1, 2]);
        assert_eq!(
            client_finished_for_suite(&v, AES128, &secret),
            Err(TlsUniqueError::BadChangeCipherSpec)
        );
        // An alert.
        let mut v = fake_client_hello();
        v.extend_from_slice(&[21, 3, 3, 0, 2, 2, 40]);
        assert_eq!(
            client_finished_for_suite(&v, AES128, &secret),
            Err(TlsUniqueError::Alert)
        );
        // Unknown content type.
        let mut v = fake_client_hello();
        v.extend_from_slice(&[99, 3, 3, 0, 0]);
        assert_eq!(
            client_finished_for_suite(&v, AES128, &secret),
            Err(TlsUniqueError::UnexpectedContentType(99))
        );
        // Oversized record.
        let mut v = fake_client_hello();
        v.extend_from_slice(&[23, 3, 3, 0xff, 0xff]);
        assert_eq!(
            client_finished_for_suite(&v, AES128, &secret),
            Err(TlsUniqueError::RecordOverflow(0xffff))
        );
        // Plaintext handshake after the encrypted Finished record never gets read, but before it
        // (after another encrypted record) it is refused: see the sealed-record tests below.
        assert_eq!(
            client_finished_for_suite(&rfc_input(), AES128, &secret[..31]),
            Err(TlsUniqueError::BadSecretLength { got: 31, want: 32 })
        );
        let suite = CipherSuite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256;
        assert_eq!(
            client_finished_for_suite(&rfc_input(), suite, &secret),
            Err(TlsUniqueError::UnsupportedSuite(suite))
        );
    }

    #[test]
    fn mutated_and_random_inputs_never_panic() {
        // xorshift64: deterministic, so a failure reproduces.
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let secret = hex(RFC8448_CLIENT_HS_SECRET);
        let valid = rfc_input();
        for _ in 0..20_000 {
            let mut input = valid.clone();
            for _ in 0..(next() % 4 + 1) {
                let i = (next() as usize) % input.len();
                input[i] = next() as u8;
            }
            let cut = (next() as usize) % (input.len() + 1);
            let result = client_finished_for_suite(&input[..cut], AES128, &secret);
            if let Ok(v) = result {
                // Only an untouched Finished record can authenticate.
                assert_eq!(v, hex(RFC8448_VERIFY_DATA));
            }
            let random: Vec<u8> = (0..(next() % 300)).map(|_| next() as u8).collect();
            assert!(client_finished_for_suite(&random, AES128, &secret).is_err());
        }
    }

    /// Seals `content` as TLS 1.3 records under `secret` to exercise reassembly and checks.
    fn seal(suite: CipherSuite, secret: &[u8], records: &[(&[u8], u8, usize)]) -> Vec<u8> {
        let params = suite_params(suite).unwrap();
        let (key, iv) = derive_traffic_key(params, secret).unwrap();
        let key = aead::LessSafeKey::new(aead::UnboundKey::new(params.aead, &key).unwrap());
        let mut out = fake_client_hello();
        for (seq, (content, inner_type, padding)) in records.iter().enumerate() {
            let mut inner = content.to_vec();
            inner.push(*inner_type);
            inner.extend(std::iter::repeat_n(0, *padding));
            let len = (inner.len() + params.aead.tag_len()) as u16;
            let header = [23, 3, 3, (len >> 8) as u8, len as u8];
            let mut nonce = iv;
            for (n, s) in nonce[4..].iter_mut().zip((seq as u64).to_be_bytes()) {
                *n ^= s;
            }
            key.seal_in_place_append_tag(
                aead::Nonce::assume_unique_for_key(nonce),
                aead::Aad::from(header),
                &mut inner,
            )
            .unwrap();
            out.extend_from_slice(&header);
            out.extend(inner);
        }
        out
    }

    #[test]
    fn reassembles_messages_split_across_records_with_padding() {
        let secret = [0x42u8; 48];
        let suite = CipherSuite::TLS13_AES_256_GCM_SHA384;
        let mut flight = vec![HS_CERTIFICATE, 0, 0, 4, 0, 0, 0, 0]; // empty Certificate
        flight.extend_from_slice(&[HS_FINISHED, 0, 0, 48]);
        flight.extend_from_slice(&[0xab; 48]);
        let input = seal(
            suite,
            &secret,
            &[
                (&flight[..3], 22, 0),
                (&flight[3..10], 22, 5),
                (&flight[10..], 22, 100),
            ],
        );
        assert_eq!(
            client_finished_for_suite(&input, suite, &secret).unwrap(),
            vec![0xab; 48]
        );
    }

    #[test]
    fn sealed_flight_errors() {
        let secret = [7u8; 32];
        let suite = CipherSuite::TLS13_CHACHA20_POLY1305_SHA256;
        let mut fin = vec![HS_FINISHED, 0, 0, 32];
        fin.extend_from_slice(&[1; 32]);

        let mut with_trailer = fin.clone();
        with_trailer.extend_from_slice(&[HS_CERTIFICATE, 0, 0, 0]);
        let input = seal(suite, &secret, &[(&with_trailer, 22, 0)]);
        assert_eq!(
            client_finished_for_suite(&input, suite, &secret),
            Err(TlsUniqueError::TrailingAfterFinished)
        );

        let input = seal(suite, &secret, &[(&fin, 23, 0)]);
        assert_eq!(
            client_finished_for_suite(&input, suite, &secret),
            Err(TlsUniqueError::UnexpectedInnerType(23))
        );

        let input = seal(suite, &secret, &[(&[], 0, 3)]);
        assert_eq!(
            client_finished_for_suite(&input, suite, &secret),
            Err(TlsUniqueError::NoInnerContentType)
        );

        let input = seal(suite, &secret, &[(&[1, 0, 0, 0], 22, 0)]);
        assert_eq!(
            client_finished_for_suite(&input, suite, &secret),
            Err(TlsUniqueError::UnexpectedHandshake(1))
        );

        let short_fin = [HS_FINISHED, 0, 0, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        let input = seal(suite, &secret, &[(&short_fin, 22, 0)]);
        assert_eq!(
            client_finished_for_suite(&input, suite, &secret),
            Err(TlsUniqueError::BadFinishedLength { got: 12, want: 32 })
        );

        let mut input = seal(suite, &secret, &[(&[HS_CERTIFICATE, 0, 0, 0], 22, 0)]);
        input.extend(fake_client_hello());
        assert_eq!(
            client_finished_for_suite(&input, suite, &secret),
            Err(TlsUniqueError::PlaintextAfterEncrypted)
        );

        // Records decrypted with the wrong sequence number fail: sealing skips seq 0 here.
        let good = seal(
            suite,
            &secret,
            &[(&[HS_CERTIFICATE, 0, 0, 0], 22, 0), (&fin, 22, 0)],
        );
        let first_len = fake_client_hello().len();
        let rec0_len = 5 + u16::from_be_bytes([good[first_len + 3], good[first_len + 4]]) as usize;
        let mut skipped = fake_client_hello();
        skipped.extend_from_slice(&good[first_len + rec0_len..]);
        assert_eq!(
            client_finished_for_suite(&skipped, suite, &secret),
            Err(TlsUniqueError::Decrypt)
        );
        assert_eq!(
            client_finished_for_suite(&good, suite, &secret).unwrap(),
            vec![1; 32]
        );
    }
}
