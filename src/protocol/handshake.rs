//! The plaintext handshake blocks (simplexmq `Transport.hs`): server hello, client hello and
//! the service response. Decoders ignore bytes after the last field they know, so that peers
//! can extend the messages; padding is the caller's (`pad(·, 16384)`).

use super::encoding::{
    put_bool, put_large_unchecked, put_maybe, put_short_unchecked, put_word16, DResult,
    DecodeError, Reader,
};
use super::error::TransportError;
use super::version::{
    Version, VersionRange, AUTH_CMDS, PROXY_SERVER_HANDSHAKE, SERVICE_CERTS, WEB_PROOF,
};
use crate::crypto::keys::{x25519_from_spki, x25519_to_spki};

/// A certificate chain and a key signed by its leaf (`CertChainPubKey`): the server hello's
/// session key, `PKEY`, and a service's key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertChainPubKey {
    /// DER certificates, leaf first. 1..=255 of them, each under 64 KiB (not validated here).
    pub chain: Vec<Vec<u8>>,
    /// The DER "signed object" wrapping the key (simplexmq `Crypto.hs`).
    pub signed_key: Vec<u8>,
}

impl CertChainPubKey {
    /// `byte(count) 1*(Large certDER)  Large signedKey`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        encode_chain(&self.chain, out);
        put_large_unchecked(out, &self.signed_key);
    }

    pub fn read(r: &mut Reader<'_>) -> DResult<Self> {
        let save = r.clone();
        let res = (|| {
            let chain = read_chain(r)?;
            let signed_key = r.large()?.to_vec();
            Ok(CertChainPubKey { chain, signed_key })
        })();
        if res.is_err() {
            *r = save;
        }
        res
    }
}

pub fn encode_chain(chain: &[Vec<u8>], out: &mut Vec<u8>) {
    debug_assert!(
        !chain.is_empty() && chain.len() <= 255,
        "chain of 1..=255 certs"
    );
    let n = chain.len().min(255);
    out.push(n as u8);
    for c in &chain[..n] {
        put_large_unchecked(out, c);
    }
}

pub fn read_chain(r: &mut Reader<'_>) -> DResult<Vec<Vec<u8>>> {
    r.list(true, |r| r.large().map(<[u8]>::to_vec))
}

/// The server's first block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerHello {
    pub versions: VersionRange,
    /// tls-unique of the connection (simplexmq `Transport.hs`, `tlsUnique`).
    pub session_id: Vec<u8>,
    /// Written only when `versions.max >= 7` (absent from the legacy 6..6 hello).
    pub cert_key: Option<CertChainPubKey>,
    /// A web client's identity proof: the online key's signature of its challenge followed by the
    /// session ID, written only when `versions.max >= 19` (`version::RCV_SERVICE`, the reference's
    /// `webClientSMPVersion`; simplexmq `Transport.hs`, `encodeWebIdentityProof`).
    pub web_proof: Option<Vec<u8>>,
}

impl ServerHello {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(1024);
        self.versions.encode(&mut out);
        put_short_unchecked(&mut out, &self.session_id);
        if self.versions.max >= AUTH_CMDS {
            if let Some(k) = &self.cert_key {
                k.encode(&mut out);
            }
        }
        if self.versions.max >= WEB_PROOF {
            if let Some(sig) = &self.web_proof {
                put_short_unchecked(&mut out, sig);
            }
        }
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let mut r = Reader::new(bytes);
        let versions = VersionRange::decode(&mut r)?;
        let session_id = r.short()?.to_vec();
        // Optional with backtracking, as the reference parses it.
        let cert_key = if versions.max >= AUTH_CMDS {
            r.attempt(CertChainPubKey::read)
        } else {
            None
        };
        let web_proof = if versions.max >= WEB_PROOF {
            // A signature's length (Ed25519 64, Ed448 114 bytes), or nothing, as the reference's
            // `webIdentityProofP` (an optional `decodeSignature`).
            r.attempt(|r| match r.short()? {
                sig if sig.len() == 64 || sig.len() == 114 => Ok(sig.to_vec()),
                _ => Err(DecodeError),
            })
        } else {
            None
        };
        Ok(ServerHello {
            versions,
            session_id,
            cert_key,
            web_proof,
        })
    }
}

/// A service client's credentials in the client hello (v >= 16).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientService {
    /// `b'M'` (messaging), `b'N'` (notifier) or `b'P'` (proxy).
    pub role: u8,
    pub chain: Vec<Vec<u8>>,
    /// The service's Ed25519 key signed by the service's TLS leaf key.
    pub signed_key: Vec<u8>,
}

impl ClientService {
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.push(self.role);
        encode_chain(&self.chain, out);
        put_large_unchecked(out, &self.signed_key);
    }

    pub fn read(r: &mut Reader<'_>) -> DResult<Self> {
        let save = r.clone();
        let res = (|| {
            let role = r.byte()?;
            if !matches!(role, b'M' | b'N' | b'P') {
                return Err(DecodeError);
            }
            let chain = read_chain(r)?;
            let signed_key = r.large()?.to_vec();
            Ok(ClientService {
                role,
                chain,
                signed_key,
            })
        })();
        if res.is_err() {
            *r = save;
        }
        res
    }
}

/// The client's answer to the server hello.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientHello {
    /// The version the session runs at.
    pub version: Version,
    /// The server identity from its address (32 bytes in practice).
    pub key_hash: Vec<u8>,
    /// The client's X25519 key; sent only at v >= 7.
    pub client_key: Option<[u8; 32]>,
    /// "I am an SMP proxy"; sent only at v >= 14, false below.
    pub proxy_server: bool,
    /// Sent (as `Maybe`) only at v >= 16.
    pub service: Option<ClientService>,
}

impl ClientHello {
    pub fn encode(&self) -> Vec<u8> {
        let v = self.version;
        let mut out = Vec::with_capacity(128);
        put_word16(&mut out, v);
        put_short_unchecked(&mut out, &self.key_hash);
        if v >= AUTH_CMDS {
            if let Some(k) = &self.client_key {
                put_short_unchecked(&mut out, &x25519_to_spki(k));
            }
        }
        if v >= PROXY_SERVER_HANDSHAKE {
            put_bool(&mut out, self.proxy_server);
        }
        if v >= SERVICE_CERTS {
            put_maybe(&mut out, self.service.as_ref(), |o, s| s.encode(o));
        }
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let mut r = Reader::new(bytes);
        let version = r.word16()?;
        let key_hash = r.short()?.to_vec();
        // Plain presence, not Maybe: if the next field is not an X25519 key, it is the proxy
        // flag, so the key is parsed optionally with backtracking.
        let client_key = if version >= AUTH_CMDS {
            r.attempt(|r| x25519_from_spki(r.short()?).map_err(|_| DecodeError))
        } else {
            None
        };
        let proxy_server = if version >= PROXY_SERVER_HANDSHAKE {
            r.bool()?
        } else {
            false
        };
        let service = if version >= SERVICE_CERTS {
            r.maybe(ClientService::read)?
        } else {
            None
        };
        Ok(ClientHello {
            version,
            key_hash,
            client_key,
            proxy_server,
            service,
        })
    }
}

/// The third handshake block, sent only to service clients (simplexmq `Transport.hs`,
/// `SMPServerHandshakeResponse`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServiceResponse {
    /// `'R' shortString serviceId`.
    Ok(Vec<u8>),
    /// `'E' transportError`; the server closes after it.
    Err(TransportError),
}

impl ServiceResponse {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(32);
        match self {
            ServiceResponse::Ok(id) => {
                out.push(b'R');
                put_short_unchecked(&mut out, id);
            }
            ServiceResponse::Err(e) => {
                out.push(b'E');
                e.encode(&mut out);
            }
        }
        out
    }

    /// Trailing bytes are ignored, except that an error's last word runs to the next space.
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let mut r = Reader::new(bytes);
        match r.byte()? {
            b'R' => Ok(ServiceResponse::Ok(r.short()?.to_vec())),
            b'E' => TransportError::read(&mut r).map(ServiceResponse::Err),
            _ => Err(DecodeError),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::error::HandshakeError;
    use crate::protocol::pad::{pad, unpad};

    fn service() -> ClientService {
        ClientService {
            role: b'N',
            chain: vec![vec![1u8; 300], vec![2u8; 200]],
            signed_key: vec![3u8; 120],
        }
    }

    #[test]
    fn client_hello_v20_layout() {
        // As simplexmq `Transport.hs` encodes it:
        // `00 14 | 20 <32 keyHash> | 2c <44-byte X25519 SPKI> | 46 | 30` = 82 bytes.
        let h = ClientHello {
            version: 20,
            key_hash: vec![0xab; 32],
            client_key: Some([0x42; 32]),
            proxy_server: false,
            service: None,
        };
        let b = h.encode();
        assert_eq!(b.len(), 82);
        assert_eq!(&b[..3], &[0x00, 0x14, 0x20]);
        assert_eq!(&b[3..35], &[0xab; 32]);
        assert_eq!(b[35], 0x2c);
        assert_eq!(&b[36..48], &crate::crypto::keys::X25519_SPKI_PREFIX);
        assert_eq!(&b[48..80], &[0x42; 32]);
        assert_eq!(&b[80..], b"F0");
        // padded to a block and back; padding is ignored as trailing bytes
        let block = pad(&b, 16384).unwrap();
        assert_eq!(ClientHello::decode(unpad(&block).unwrap()).unwrap(), h);
        assert_eq!(ClientHello::decode(&block[2..]).unwrap(), h);
    }

    #[test]
    fn client_hello_per_version() {
        for v in 6..=20u16 {
            for key in [None, Some([7u8; 32])] {
                for proxy in [false, true] {
                    for svc in [None, Some(service())] {
                        let h = ClientHello {
                            version: v,
                            key_hash: vec![9; 32],
                            client_key: key,
                            proxy_server: proxy,
                            service: svc.clone(),
                        };
                        let expect = ClientHello {
                            version: v,
                            key_hash: vec![9; 32],
                            client_key: if v >= 7 { key } else { None },
                            proxy_server: v >= 14 && proxy,
                            service: if v >= 16 { svc } else { None },
                        };
                        assert_eq!(ClientHello::decode(&h.encode()), Ok(expect), "v{v}");
                    }
                }
            }
        }
        // v6: only version and key hash
        let h = ClientHello {
            version: 6,
            key_hash: vec![1; 32],
            client_key: Some([1; 32]),
            proxy_server: true,
            service: Some(service()),
        };
        assert_eq!(h.encode().len(), 35);
        // v14 without a key: the proxy flag follows the key hash directly
        let mut b = vec![0, 14, 1, 0xee];
        b.push(b'T');
        let h = ClientHello::decode(&b).unwrap();
        assert_eq!(h.client_key, None);
        assert!(h.proxy_server);
        // v14 with a key that is not X25519: backtracks, then the length byte is no Bool
        let mut b = vec![0, 14, 1, 0xee, 44];
        b.extend_from_slice(&crate::crypto::keys::ed25519_to_spki(&[1; 32]));
        b.push(b'F');
        assert!(ClientHello::decode(&b).is_err());
        // v16 missing the service Maybe
        assert!(ClientHello::decode(&[0, 16, 1, 0xee, b'F']).is_err());
        assert!(ClientHello::decode(&[0, 16, 1, 0xee, b'F', b'1', b'X']).is_err());
        assert!(ClientHello::decode(&[0]).is_err());
    }

    #[test]
    fn server_hello_layout() {
        // As simplexmq `Transport.hs` encodes it:
        // `00 06 00 14 | 20 <32 sessionId> | 02 | <Word16 len><leaf> <Word16 len><CA> | 00 78 <120>`.
        let h = ServerHello {
            versions: VersionRange::new(6, 20).unwrap(),
            session_id: vec![0x5e; 32],
            cert_key: Some(CertChainPubKey {
                chain: vec![vec![0xa1; 300], vec![0xa2; 290]],
                signed_key: vec![0x77; 120],
            }),
            web_proof: None,
        };
        let b = h.encode();
        assert_eq!(&b[..5], &[0x00, 0x06, 0x00, 0x14, 0x20]);
        assert_eq!(&b[5..37], &[0x5e; 32]);
        assert_eq!(&b[37..40], &[0x02, 0x01, 0x2c]);
        assert_eq!(&b[40 + 300..40 + 302], &[0x01, 0x22]);
        assert_eq!(&b[40 + 302 + 290..40 + 302 + 292], &[0x00, 0x78]);
        assert_eq!(b.len(), 40 + 302 + 292 + 120);
        assert_eq!(ServerHello::decode(&b).unwrap(), h);
        let block = pad(&b, 16384).unwrap();
        assert_eq!(ServerHello::decode(&block[2..]).unwrap(), h);

        // legacy 6..6: no cert part even if one is given
        let legacy = ServerHello {
            versions: VersionRange::new(6, 6).unwrap(),
            session_id: vec![1; 32],
            cert_key: h.cert_key.clone(),
            web_proof: Some(vec![9; 64]),
        };
        let b = legacy.encode();
        assert_eq!(b.len(), 4 + 33);
        assert_eq!(ServerHello::decode(&b).unwrap().cert_key, None);
        // an unparsable cert part is treated as absent (optional parse)
        let mut b = h.encode();
        b.truncate(200);
        let d = ServerHello::decode(&b).unwrap();
        assert_eq!(d.cert_key, None);
        assert!(ServerHello::decode(&[0, 7, 0, 6, 0]).is_err());

        // A web identity proof follows the signed key from version 19 on: `40 <64 bytes>`.
        let proven = ServerHello {
            web_proof: Some(vec![0x3c; 64]),
            ..h.clone()
        };
        let b = proven.encode();
        assert_eq!(b.len(), 40 + 302 + 292 + 120 + 65);
        assert_eq!(&b[b.len() - 65..b.len() - 63], &[0x40, 0x3c]);
        assert_eq!(ServerHello::decode(&b).unwrap(), proven);
        // Not below 19; a short string of another length is no proof.
        let old = ServerHello {
            versions: VersionRange::new(6, 18).unwrap(),
            ..proven.clone()
        };
        assert_eq!(old.encode().len(), 40 + 302 + 292 + 120);
        let mut odd = h.encode();
        odd.extend_from_slice(&[3, 1, 2, 3]);
        assert_eq!(ServerHello::decode(&odd).unwrap().web_proof, None);
    }

    #[test]
    fn service_response() {
        let ok = ServiceResponse::Ok(vec![4; 24]);
        let b = ok.encode();
        assert_eq!(b[0], b'R');
        assert_eq!(b[1], 24);
        assert_eq!(ServiceResponse::decode(&b).unwrap(), ok);
        let err = ServiceResponse::Err(TransportError::Handshake(HandshakeError::BadAuth));
        assert_eq!(err.encode(), b"EHANDSHAKE BAD_AUTH");
        assert_eq!(ServiceResponse::decode(&err.encode()).unwrap(), err);
        assert_eq!(
            ServiceResponse::decode(b"EVERSION"),
            Ok(ServiceResponse::Err(TransportError::Version))
        );
        let padded = pad(&ok.encode(), 16384).unwrap();
        assert_eq!(ServiceResponse::decode(&padded[2..]).unwrap(), ok);
        assert!(ServiceResponse::decode(b"X").is_err());
        assert!(ServiceResponse::decode(b"").is_err());
    }
}
