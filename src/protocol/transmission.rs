//! One transmission, the bytes inside a batch item (simplexmq `Protocol.hs`, `transmissionP`):
//! `authorization [serviceSig] [sessionId] corrId entityId command`, and the bytes it signs.
//! Parsing here is structural; the session-id comparison and credential checks are the caller's.

use std::fmt;

use super::encoding::{put_maybe, put_short_unchecked, Reader};
use super::version::{has_service_slot, implies_session_id, Version};
use crate::crypto::keys::{ED25519_SIG_LEN, ED448_SIG_LEN, X25519_AUTHENTICATOR_LEN};

/// A parsed transmission borrowing from the block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawTransmission<'a> {
    /// Empty, or 64 (Ed25519) / 114 (Ed448) / 80 (X25519 authenticator) bytes.
    pub authorization: &'a [u8],
    /// The service signature (64 bytes) when the slot exists (v >= 16 with a non-empty
    /// authorization) and holds `'1'`.
    pub service_sig: Option<&'a [u8]>,
    /// Only at v6, where the session id travels in every transmission.
    pub session_id: Option<&'a [u8]>,
    pub corr_id: &'a [u8],
    pub entity_id: &'a [u8],
    /// The command or response: tag, then optional SP and parameters.
    pub command: &'a [u8],
    /// The wire bytes covered by the authorization after the (implied) session id: at v6 from
    /// the sessionId shortString to the end, at v >= 7 from corrId to the end.
    pub signed: &'a [u8],
}

/// Why a transmission was rejected before its command was looked at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TransmissionError {
    /// Unparsable: answered with `ERR BLOCK` and an empty corrId.
    Block,
    /// Parsable, but the authorization has a length no algorithm has. The reference answers
    /// `ERR BLOCK` with the request's corrId (empty entity), after the v6 session check, so
    /// both are returned.
    BadAuthorization {
        corr_id: Vec<u8>,
        session_id: Option<Vec<u8>>,
    },
}

impl fmt::Display for TransmissionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TransmissionError::Block => f.write_str("unparsable transmission"),
            TransmissionError::BadAuthorization { .. } => {
                f.write_str("authorization of an unknown length")
            }
        }
    }
}

impl std::error::Error for TransmissionError {}

/// Authorization lengths that name an algorithm.
pub fn valid_authorization_len(n: usize) -> bool {
    matches!(
        n,
        0 | ED25519_SIG_LEN | X25519_AUTHENTICATOR_LEN | ED448_SIG_LEN
    )
}

/// Parses one transmission of a session at version `v`.
pub fn parse_transmission(
    v: Version,
    bytes: &[u8],
) -> Result<RawTransmission<'_>, TransmissionError> {
    let mut r = Reader::new(bytes);
    let block = |_| TransmissionError::Block;
    let authorization = r.short().map_err(block)?;
    let service_sig = if has_service_slot(v) && !authorization.is_empty() {
        // The slot holds an Ed25519 signature only; anything else does not parse.
        r.maybe(|r| {
            let s = r.short()?;
            if s.len() == ED25519_SIG_LEN {
                Ok(s)
            } else {
                Err(super::encoding::DecodeError)
            }
        })
        .map_err(block)?
    } else {
        None
    };
    let signed = r.rest();
    let session_id = if implies_session_id(v) {
        None
    } else {
        Some(r.short().map_err(block)?)
    };
    let corr_id = r.short().map_err(block)?;
    let entity_id = r.short().map_err(block)?;
    let command = r.tail();
    if !valid_authorization_len(authorization.len()) {
        return Err(TransmissionError::BadAuthorization {
            corr_id: corr_id.to_vec(),
            session_id: session_id.map(<[u8]>::to_vec),
        });
    }
    Ok(RawTransmission {
        authorization,
        service_sig,
        session_id,
        corr_id,
        entity_id,
        command,
        signed,
    })
}

/// The bytes the authorization covers: v >= 7 prepends `shortString(sessionId)` (implied, not on
/// the wire); at v6 `signed` already starts with it.
pub fn authorized_bytes(v: Version, session_id: &[u8], signed: &[u8]) -> Vec<u8> {
    if implies_session_id(v) {
        let mut out = Vec::with_capacity(1 + session_id.len() + signed.len());
        put_short_unchecked(&mut out, session_id);
        out.extend_from_slice(signed);
        out
    } else {
        signed.to_vec()
    }
}

/// Appends a server response or event: empty authorization (no service slot), the session id at
/// v6, corrId, entityId, then the encoded message.
pub fn encode_server_transmission(
    v: Version,
    session_id: &[u8],
    corr_id: &[u8],
    entity_id: &[u8],
    msg: &[u8],
    out: &mut Vec<u8>,
) {
    out.push(0);
    if !implies_session_id(v) {
        put_short_unchecked(out, session_id);
    }
    put_short_unchecked(out, corr_id);
    put_short_unchecked(out, entity_id);
    out.extend_from_slice(msg);
}

/// A client command transmission. `service_sig` is written only where the slot exists
/// (v >= 16 with a non-empty authorization).
pub fn encode_client_transmission(
    v: Version,
    session_id: &[u8],
    authorization: &[u8],
    service_sig: Option<&[u8]>,
    corr_id: &[u8],
    entity_id: &[u8],
    command: &[u8],
) -> Vec<u8> {
    let mut out = Vec::with_capacity(
        4 + authorization.len()
            + 66
            + session_id.len()
            + corr_id.len()
            + entity_id.len()
            + command.len(),
    );
    put_short_unchecked(&mut out, authorization);
    if has_service_slot(v) && !authorization.is_empty() {
        put_maybe(&mut out, service_sig, put_short_unchecked);
    }
    if !implies_session_id(v) {
        put_short_unchecked(&mut out, session_id);
    }
    put_short_unchecked(&mut out, corr_id);
    put_short_unchecked(&mut out, entity_id);
    out.extend_from_slice(command);
    out
}

/// What a client signs (or authenticates) for a command, at every version:
/// `shortString(sessionId) ‖ shortString(corrId) ‖ shortString(entityId) ‖ command`.
pub fn client_signed_bytes(
    _v: Version,
    session_id: &[u8],
    corr_id: &[u8],
    entity_id: &[u8],
    command: &[u8],
) -> Vec<u8> {
    let mut out =
        Vec::with_capacity(3 + session_id.len() + corr_id.len() + entity_id.len() + command.len());
    put_short_unchecked(&mut out, session_id);
    put_short_unchecked(&mut out, corr_id);
    put_short_unchecked(&mut out, entity_id);
    out.extend_from_slice(command);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::batch::{parse_batch, BatchWriter};

    const SESS: [u8; 32] = [0x5a; 32];

    #[test]
    fn ping_block_layout() {
        // As simplexmq `Protocol.hs` encodes it, at v >= 7:
        // `01 | 00 1f | 00 | 18 <24 corrId> | 00 | "PING"`.
        let corr = [0xc1u8; 24];
        let t = encode_client_transmission(20, &SESS, b"", None, &corr, b"", b"PING");
        let mut w = BatchWriter::new();
        assert!(w.try_push(&t));
        let content = w.content();
        let mut expect = vec![0x01, 0x00, 0x1f, 0x00, 0x18];
        expect.extend_from_slice(&corr);
        expect.extend_from_slice(b"\x00PING");
        assert_eq!(content, expect);
        // The PONG the server sends back has the same shape.
        let mut pong = Vec::new();
        encode_server_transmission(20, &SESS, &corr, b"", b"PONG", &mut pong);
        let mut expect_pong = vec![0x00, 0x18];
        expect_pong.extend_from_slice(&corr);
        expect_pong.extend_from_slice(b"\x00PONG");
        assert_eq!(pong, expect_pong);

        let items = parse_batch(&content).unwrap();
        let raw = parse_transmission(20, items[0]).unwrap();
        assert_eq!(raw.authorization, b"");
        assert_eq!(raw.service_sig, None);
        assert_eq!(raw.session_id, None);
        assert_eq!(raw.corr_id, &corr);
        assert_eq!(raw.entity_id, b"");
        assert_eq!(raw.command, b"PING");
    }

    #[test]
    fn signed_send_layout_v16() {
        // As simplexmq `Protocol.hs` encodes it:
        // `40 <64 sig> | 30 | 18 <corrId> | 18 <sndId> | "SEND F " <body>`.
        let sig = [0x11u8; 64];
        let corr = [0x22u8; 24];
        let snd = [0x33u8; 24];
        let cmd = b"SEND F hello";
        let t = encode_client_transmission(16, &SESS, &sig, None, &corr, &snd, cmd);
        let mut expect = vec![0x40];
        expect.extend_from_slice(&sig);
        expect.push(b'0');
        expect.push(0x18);
        expect.extend_from_slice(&corr);
        expect.push(0x18);
        expect.extend_from_slice(&snd);
        expect.extend_from_slice(cmd);
        assert_eq!(t, expect);

        let raw = parse_transmission(16, &t).unwrap();
        assert_eq!(raw.authorization, &sig);
        assert_eq!(raw.service_sig, None);
        assert_eq!(raw.command, cmd);
        assert_eq!(raw.signed, &t[66..]);
        // The signature covers `20 <sessionId> 18 <corrId> 18 <sndId> "SEND F " <body>`.
        let mut signed = vec![0x20];
        signed.extend_from_slice(&SESS);
        signed.extend_from_slice(&t[66..]);
        assert_eq!(authorized_bytes(16, &SESS, raw.signed), signed);
        assert_eq!(client_signed_bytes(16, &SESS, &corr, &snd, cmd), signed);
    }

    #[test]
    fn v6_carries_and_signs_the_session_id() {
        let sig = [0x11u8; 64];
        let t =
            encode_client_transmission(6, &SESS, &sig, Some(&[9u8; 64]), b"abcd", b"1234", b"SUB");
        // no service slot before v16, even when a signature is offered
        assert_eq!(t.len(), 65 + 33 + 5 + 5 + 3);
        let raw = parse_transmission(6, &t).unwrap();
        assert_eq!(raw.session_id, Some(&SESS[..]));
        assert_eq!(raw.corr_id, b"abcd");
        assert_eq!(raw.entity_id, b"1234");
        assert_eq!(raw.service_sig, None);
        assert_eq!(raw.signed, &t[65..]);
        assert_eq!(
            authorized_bytes(6, &SESS, raw.signed),
            client_signed_bytes(6, &SESS, b"abcd", b"1234", b"SUB")
        );
        let mut resp = Vec::new();
        encode_server_transmission(6, &SESS, b"abcd", b"1234", b"OK", &mut resp);
        assert_eq!(resp[0], 0);
        assert_eq!(&resp[1..34], &[&[32u8][..], &SESS[..]].concat()[..]);
    }

    #[test]
    fn service_slot_only_with_authorization_at_v16() {
        let sig = [1u8; 64];
        let ssig = [2u8; 64];
        let t = encode_client_transmission(16, &SESS, &sig, Some(&ssig), b"c", b"e", b"SUB");
        let raw = parse_transmission(16, &t).unwrap();
        assert_eq!(raw.service_sig, Some(&ssig[..]));
        assert_eq!(raw.command, b"SUB");
        // at v15 the same bytes mean something else: '1' would be read as the corrId length
        assert_ne!(
            parse_transmission(15, &t).map(|r| r.command.to_vec()),
            Ok(b"SUB".to_vec())
        );
        // unsigned: no slot even at v20
        let t = encode_client_transmission(20, &SESS, b"", Some(&ssig), b"c", b"", b"PING");
        assert_eq!(t, b"\x00\x01c\x00PING");
        // a service signature of the wrong length or a bad Maybe tag does not parse
        let mut bad = vec![64];
        bad.extend_from_slice(&sig);
        bad.extend_from_slice(b"1\x03abc\x01c\x01eSUB");
        assert_eq!(parse_transmission(16, &bad), Err(TransmissionError::Block));
        let mut bad = vec![64];
        bad.extend_from_slice(&sig);
        bad.extend_from_slice(b"2\x01c\x01eSUB");
        assert_eq!(parse_transmission(16, &bad), Err(TransmissionError::Block));
    }

    #[test]
    fn authorization_lengths() {
        for n in [0usize, 64, 80, 114] {
            let auth = vec![7u8; n];
            let t = encode_client_transmission(20, &SESS, &auth, None, b"c", b"e", b"X");
            assert!(parse_transmission(20, &t).is_ok(), "{n}");
        }
        for n in [1usize, 63, 65, 79, 81, 113, 115, 255] {
            let auth = vec![7u8; n];
            let t = encode_client_transmission(20, &SESS, &auth, None, b"cc", b"e", b"X");
            assert_eq!(
                parse_transmission(20, &t),
                Err(TransmissionError::BadAuthorization {
                    corr_id: b"cc".to_vec(),
                    session_id: None
                }),
                "{n}"
            );
        }
    }

    #[test]
    fn truncated_input_is_a_block_error() {
        let t = encode_client_transmission(6, &SESS, &[1u8; 64], None, b"abcd", b"1234", b"SUB");
        for cut in 0..(65 + 33 + 5 + 5) {
            assert_eq!(
                parse_transmission(6, &t[..cut]),
                Err(TransmissionError::Block),
                "{cut}"
            );
        }
        assert!(parse_transmission(6, &t[..65 + 33 + 10]).is_ok());
    }
}
