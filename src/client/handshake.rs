//! The client's side of the SMP handshake, sans I/O: the reference's `smpClientHandshake`
//! (simplex-chat/simplexmq `src/Simplex/Messaging/Transport.hs`) as pure functions over blocks.
//! The caller reads the server hello block and the TLS facts (tls-unique, the peer's certificate
//! chain); `answer` checks them and returns the client hello block to send with the negotiated
//! session; a service client then reads one more block for `service_response`.
//!
//! Both client stacks drive it: the blocking library (`client::Client::connect`) and the proxy's
//! glommio sessions to destinations (`server::proxy::session`).

use crate::crypto::auth::{self, Authorization};
use crate::crypto::{keys, signed_key, sxbox};
use crate::protocol::error::TransportError;
use crate::protocol::handshake::{
    CertChainPubKey, ClientHello, ClientService, ServerHello, ServiceResponse,
};
use crate::protocol::pad;
use crate::protocol::version::{
    self, Version, VersionRange, DELETED_EVENT, PROXY_SERVER_HANDSHAKE,
};
use crate::transport::block::{BlockCodec, BlockError, BLOCK_SIZE};

/// What the client brings to the handshake.
#[derive(Debug, Clone)]
pub struct HandshakeParams {
    /// The server identity from its address (32 bytes in practice; sent as given).
    pub key_hash: Vec<u8>,
    /// The versions this client speaks.
    pub versions: VersionRange,
    /// Version to send even one the server did not offer; `None` picks the highest in common.
    pub version: Option<Version>,
    /// Send an X25519 key in the client hello (v≥7).
    pub send_key: bool,
    /// Claim to be an SMP proxy (v≥14): no block encryption, and against a server below v14 no
    /// version above 10 (where block encryption would start).
    pub proxy_server: bool,
    /// Service credentials for the hello (v≥16).
    pub service: Option<ClientService>,
    /// Check both chains (TLS and the hello's) against `key_hash`.
    pub check_identity: bool,
    /// The challenge a web client sent in its upgrade request, when it reached the relay through
    /// a host name (SNI) and so holds the web certificate, not the relay's: the hello's own chain
    /// stands for the TLS one, and the hello must carry the proof, the hello leaf's signature of
    /// challenge ‖ session ID, as the reference's web client checks it.
    pub web_challenge: Option<[u8; 32]>,
}

/// Which check failed (the reference's `TransportError` handshake cases).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HandshakeError {
    /// A handshake block does not parse.
    Parse,
    /// The hello's session ID is not the connection's tls-unique.
    BadSession,
    /// A chain does not match the key hash.
    Identity,
    /// The hello's session key is not signed by the TLS leaf, or is no X25519 key.
    BadAuth,
    /// No version in common.
    Version,
    /// The client hello does not fit a block.
    Block(BlockError),
}

/// The session the handshake agreed on.
pub struct Negotiated {
    pub version: Version,
    /// The range the server offered.
    pub server_versions: VersionRange,
    /// The range both sides support (`None` only with a forced version outside it).
    pub versions: Option<VersionRange>,
    /// tls-unique of the connection.
    pub session_id: Vec<u8>,
    /// The server's chain and signed session key from its hello (v≥7).
    pub cert_key: Option<CertChainPubKey>,
    /// The server's per-connection X25519 key, verified.
    pub server_session_key: Option<[u8; 32]>,
    /// X25519(our hello key, the server session key), when both exist (`sessSecret`, which seals
    /// `RFWD`: `client::rfwd`).
    pub session_secret: Option<[u8; 32]>,
    /// Block codec for the session: encrypted at v≥11 with keys on both sides, unless a proxy.
    pub codec: BlockCodec,
    /// A service response block follows the client hello (`service_response`).
    pub expects_service_response: bool,
}

/// The versions to offer: a proxy talking to a server below v14 cannot say it is a proxy, so it
/// stays at or below v10 (`smpClientHandshake`).
fn offer(params: &HandshakeParams, server: VersionRange) -> VersionRange {
    let mut ours = params.versions;
    if params.proxy_server && server.max < PROXY_SERVER_HANDSHAKE {
        ours.max = ours.min.max(DELETED_EVENT);
    }
    ours
}

/// Checks the server hello block against the connection and answers it: the client hello block
/// to send, and the session.
pub fn answer(
    server_hello_block: &[u8],
    tls_unique: &[u8],
    peer_chain: &[Vec<u8>],
    params: &HandshakeParams,
) -> Result<(Box<[u8; BLOCK_SIZE]>, Negotiated), HandshakeError> {
    let hello_bytes = pad::unpad(server_hello_block).map_err(|_| HandshakeError::Parse)?;
    let hello = ServerHello::decode(hello_bytes).map_err(|_| HandshakeError::Parse)?;
    if hello.session_id != tls_unique {
        return Err(HandshakeError::BadSession);
    }
    let peer_chain = match &params.web_challenge {
        Some(challenge) => web_identity(&hello, challenge)?,
        None => peer_chain,
    };
    let kh = &params.key_hash;
    if params.check_identity && !chain_matches(peer_chain, kh) {
        return Err(HandshakeError::Identity);
    }
    let mut server_session_key = None;
    if let Some(ck) = &hello.cert_key {
        if params.check_identity && !chain_matches(&ck.chain, kh) {
            return Err(HandshakeError::Identity);
        }
        let leaf = peer_chain.first().ok_or(HandshakeError::BadAuth)?;
        let leaf_key = leaf_public_key(leaf).ok_or(HandshakeError::BadAuth)?;
        let spki = signed_key::verify_signed_key(&ck.signed_key, &leaf_key)
            .map_err(|_| HandshakeError::BadAuth)?;
        server_session_key =
            Some(keys::x25519_from_spki(&spki).map_err(|_| HandshakeError::BadAuth)?);
    }

    let versions = hello.versions.intersect(&offer(params, hello.versions));
    let version = match params.version {
        Some(v) => v,
        None => versions.map(|r| r.max).ok_or(HandshakeError::Version)?,
    };
    let client_secret = x25519_dalek::StaticSecret::random_from_rng(rand::rngs::OsRng);
    let client_public = x25519_dalek::PublicKey::from(&client_secret).to_bytes();
    let client_key = (params.send_key && version >= version::AUTH_CMDS).then_some(client_public);
    let client_hello = ClientHello {
        version,
        key_hash: kh.to_vec(),
        client_key,
        proxy_server: params.proxy_server,
        service: params.service.clone(),
    };
    let mut out = Box::new([0u8; BLOCK_SIZE]);
    BlockCodec::plain()
        .encode(&client_hello.encode(), &mut out)
        .map_err(HandshakeError::Block)?;

    let session_secret = client_key
        .and(server_session_key)
        .map(|k| sxbox::dh(client_secret.as_bytes(), &k));
    let codec = match session_secret {
        Some(secret) if version >= version::ENCRYPTED_BLOCK && !params.proxy_server => {
            BlockCodec::client(&hello.session_id, &secret)
        }
        _ => BlockCodec::plain(),
    };
    let negotiated = Negotiated {
        version,
        server_versions: hello.versions,
        versions,
        session_id: hello.session_id,
        cert_key: hello.cert_key,
        server_session_key,
        session_secret,
        codec,
        expects_service_response: params.service.is_some() && version >= version::SERVICE_CERTS,
    };
    Ok((out, negotiated))
}

/// Why the service handshake block did not give a service ID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServiceError {
    Parse,
    /// The server refused the service (it closes after this).
    Refused(TransportError),
}

/// The service ID from the third handshake block (`ServiceResponse`, `protocol::handshake`).
pub fn service_response(block: &[u8]) -> Result<Vec<u8>, ServiceError> {
    let bytes = pad::unpad(block).map_err(|_| ServiceError::Parse)?;
    match ServiceResponse::decode(bytes).map_err(|_| ServiceError::Parse)? {
        ServiceResponse::Ok(id) => Ok(id),
        ServiceResponse::Err(e) => Err(ServiceError::Refused(e)),
    }
}

/// The chain's identity certificate (the 2nd of 2–4) hashes to `key_hash` (the reference's
/// `chainIdCaCerts`, simplex-chat/simplexmq `src/Simplex/Messaging/Transport.hs`).
fn chain_matches(chain: &[Vec<u8>], key_hash: &[u8]) -> bool {
    crate::transport::identity::matches_key_hash(chain, key_hash).is_ok()
}

/// The leaf certificate's public key, which signs the hello's session key (Ed25519 or Ed448).
/// The hello's chain, once its leaf is found to have signed the challenge and the session ID.
fn web_identity<'h>(
    hello: &'h ServerHello,
    challenge: &[u8; 32],
) -> Result<&'h [Vec<u8>], HandshakeError> {
    let chain = &hello
        .cert_key
        .as_ref()
        .ok_or(HandshakeError::BadAuth)?
        .chain;
    let leaf = chain.first().ok_or(HandshakeError::BadAuth)?;
    let key = leaf_public_key(leaf).ok_or(HandshakeError::BadAuth)?;
    let proof = hello.web_proof.as_deref().ok_or(HandshakeError::BadAuth)?;
    let proof = Authorization::from_bytes(proof).ok_or(HandshakeError::BadAuth)?;
    let signed = [&challenge[..], &hello.session_id].concat();
    match auth::verify(&key, &proof, &signed, None, &[]) {
        true => Ok(chain),
        false => Err(HandshakeError::BadAuth),
    }
}

fn leaf_public_key(der: &[u8]) -> Option<keys::PublicAuthKey> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    keys::PublicAuthKey::from_spki(cert.public_key().raw).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::error::HandshakeError as WireHandshakeError;

    const SID: [u8; 32] = [0x5e; 32];

    fn hello_block(versions: VersionRange, session_id: &[u8]) -> Vec<u8> {
        let hello = ServerHello {
            versions,
            session_id: session_id.to_vec(),
            cert_key: None,
            web_proof: None,
        };
        pad::pad(&hello.encode(), BLOCK_SIZE).unwrap()
    }

    fn params(proxy_server: bool) -> HandshakeParams {
        HandshakeParams {
            key_hash: vec![0xab; 32],
            versions: VersionRange::new(6, 20).unwrap(),
            version: None,
            send_key: true,
            proxy_server,
            service: None,
            check_identity: false,
            web_challenge: None,
        }
    }

    fn sent_hello(block: &[u8; BLOCK_SIZE]) -> ClientHello {
        ClientHello::decode(pad::unpad(&block[..]).unwrap()).unwrap()
    }

    #[test]
    fn answers_with_the_highest_common_version() {
        let block = hello_block(VersionRange::new(6, 18).unwrap(), &SID);
        let (out, s) = answer(&block, &SID, &[], &params(false)).unwrap();
        assert_eq!((s.version, s.versions), (18, VersionRange::new(6, 18)));
        assert_eq!(s.session_id, SID);
        // No session key in the hello: no secret, no block encryption.
        assert_eq!((s.server_session_key, s.session_secret), (None, None));
        assert!(!s.codec.is_encrypted());
        assert!(!s.expects_service_response);
        let ch = sent_hello(&out);
        assert_eq!((ch.version, ch.key_hash), (18, vec![0xab; 32]));
        assert!(ch.client_key.is_some());
    }

    #[test]
    fn a_proxy_stays_at_v10_below_the_proxy_handshake() {
        let block = hello_block(VersionRange::new(6, 13).unwrap(), &SID);
        let (_, s) = answer(&block, &SID, &[], &params(true)).unwrap();
        assert_eq!(s.version, 10);
        let (_, s) = answer(&block, &SID, &[], &params(false)).unwrap();
        assert_eq!(s.version, 13);
        let block = hello_block(VersionRange::new(6, 14).unwrap(), &SID);
        let (out, s) = answer(&block, &SID, &[], &params(true)).unwrap();
        assert_eq!(s.version, 14);
        assert!(sent_hello(&out).proxy_server);
    }

    #[test]
    fn a_forced_version_is_sent_as_given() {
        let block = hello_block(VersionRange::new(6, 18).unwrap(), &SID);
        let p = HandshakeParams {
            version: Some(21),
            ..params(false)
        };
        let (out, s) = answer(&block, &SID, &[], &p).unwrap();
        assert_eq!((s.version, sent_hello(&out).version), (21, 21));
    }

    #[test]
    fn a_web_challenge_needs_the_proof() {
        // No chain and no proof in the hello: a web client cannot tell who answered.
        let block = hello_block(VersionRange::new(6, 20).unwrap(), &SID);
        let p = HandshakeParams {
            web_challenge: Some([7; 32]),
            ..params(false)
        };
        assert_eq!(
            answer(&block, &SID, &[], &p).err(),
            Some(HandshakeError::BadAuth)
        );
        assert!(answer(&block, &SID, &[], &params(false)).is_ok());
    }

    #[test]
    fn failed_checks() {
        let block = hello_block(VersionRange::new(6, 18).unwrap(), &SID);
        let err = |block: &[u8], sid: &[u8], p: &HandshakeParams| answer(block, sid, &[], p).err();
        assert_eq!(
            err(&block, &[1; 32], &params(false)),
            Some(HandshakeError::BadSession)
        );
        assert_eq!(
            err(&[0xff; BLOCK_SIZE], &SID, &params(false)),
            Some(HandshakeError::Parse)
        );
        let checked = HandshakeParams {
            check_identity: true,
            ..params(false)
        };
        assert_eq!(err(&block, &SID, &checked), Some(HandshakeError::Identity));
        let block = hello_block(VersionRange::new(21, 22).unwrap(), &SID);
        assert_eq!(
            err(&block, &SID, &params(false)),
            Some(HandshakeError::Version)
        );
    }

    #[test]
    fn service_responses() {
        let block = |r: ServiceResponse| pad::pad(&r.encode(), BLOCK_SIZE).unwrap();
        assert_eq!(
            service_response(&block(ServiceResponse::Ok(vec![4; 24]))),
            Ok(vec![4; 24])
        );
        let refused = TransportError::Handshake(WireHandshakeError::BadAuth);
        assert_eq!(
            service_response(&block(ServiceResponse::Err(refused))),
            Err(ServiceError::Refused(refused))
        );
        assert_eq!(
            service_response(&pad::pad(b"X", BLOCK_SIZE).unwrap()),
            Err(ServiceError::Parse)
        );
    }
}
