//! The forwarded-transmission codecs of private routing: what a proxy seals into `RFWD`
//! (`FwdTransmission`) and what the destination seals back into `RRES` (`FwdResponse`), as the
//! reference (simplex-chat/simplexmq `src/Simplex/Messaging/Protocol.hs`) encodes them. The
//! client stack (`client::rfwd`, `client::proxy`) and the destination role (`server::forward`)
//! both use them.

use super::encoding::{put_short_unchecked, put_word16, DecodeError, Reader};
use super::version::Version;
use crate::crypto::keys::{x25519_from_spki, x25519_to_spki};
use crate::crypto::sxbox::NONCE_LEN;

/// The padded length of a forwarded transmission and of its answer (`paddedProxiedTLength`). The
/// largest SEND (16048 bytes, Ed448-signed, v20) in a batch of one fills it exactly.
pub const PADDED_PROXIED_LEN: usize = 16226;

/// `reverseNonce`: the answer's nonce is the request's, bytes reversed (not "+1" as the spec says).
pub fn reverse_nonce(nonce: &[u8; NONCE_LEN]) -> [u8; NONCE_LEN] {
    let mut r = *nonce;
    r.reverse();
    r
}

/// `FwdTransmission`: what a proxy seals for the destination in `RFWD`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FwdTransmission<'a> {
    /// The client's corrId (24 random bytes); its `cbNonce` seals `et`.
    pub corr_id: &'a [u8],
    pub version: Version,
    /// The client's per-command X25519 key.
    pub key: [u8; 32],
    /// `SXbox(cmdSecret, nonce, pad(batch, 16226))`.
    pub et: &'a [u8],
}

impl<'a> FwdTransmission<'a> {
    /// `shortString corrId ‖ Word16 version ‖ shortString(SPKI key) ‖ Tail et`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        put_short_unchecked(out, self.corr_id);
        put_word16(out, self.version);
        put_short_unchecked(out, &x25519_to_spki(&self.key));
        out.extend_from_slice(self.et);
    }

    /// The encoded bytes, sized for `et`.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.et.len() + 80);
        self.encode(&mut out);
        out
    }

    pub fn parse(bytes: &'a [u8]) -> Result<Self, DecodeError> {
        let mut r = Reader::new(bytes);
        let corr_id = r.short()?;
        let version = r.word16()?;
        let key = x25519_from_spki(r.short()?).map_err(|_| DecodeError)?;
        let et = r.tail();
        Ok(FwdTransmission {
            corr_id,
            version,
            key,
            et,
        })
    }
}

/// `FwdResponse`: the client's corrId echoed, then the answer sealed for the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FwdResponse<'a> {
    pub corr_id: &'a [u8],
    /// `SXbox(cmdSecret, reverse(nonce), pad(batch, 16226))`.
    pub r2: &'a [u8],
}

impl<'a> FwdResponse<'a> {
    pub fn encode(&self, out: &mut Vec<u8>) {
        put_short_unchecked(out, self.corr_id);
        out.extend_from_slice(self.r2);
    }

    pub fn parse(bytes: &'a [u8]) -> Result<Self, DecodeError> {
        let mut r = Reader::new(bytes);
        let corr_id = r.short()?;
        Ok(FwdResponse {
            corr_id,
            r2: r.tail(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reverse_nonce_reverses_the_bytes() {
        let n: [u8; 24] = std::array::from_fn(|i| i as u8);
        let r = reverse_nonce(&n);
        assert_eq!(r[0], 23);
        assert_eq!(r[23], 0);
        assert_eq!(reverse_nonce(&r), n);
    }

    #[test]
    fn fwd_transmission_layout() {
        let key = [1u8; 32];
        let t = FwdTransmission {
            corr_id: &[2u8; 24],
            version: 17,
            key,
            et: b"ET",
        };
        let mut out = Vec::new();
        t.encode(&mut out);
        let mut expect = vec![24];
        expect.extend_from_slice(&[2u8; 24]);
        expect.extend_from_slice(&[0, 17, 44]);
        expect.extend_from_slice(&x25519_to_spki(&key));
        expect.extend_from_slice(b"ET");
        assert_eq!(out, expect);
        assert_eq!(FwdTransmission::parse(&out), Ok(t));
        let mut fr = Vec::new();
        FwdResponse {
            corr_id: b"abc",
            r2: b"R2",
        }
        .encode(&mut fr);
        assert_eq!(fr, b"\x03abcR2");
    }
}
