//! A test proxy for private routing (simplexmq `Client.hs`, `Server.hs`): builds forwarded
//! transmissions exactly as a reference client (`proxySMPCommand`) and proxy
//! (`forwardSMPTransmission`) do, and opens `RRES` by the same formulas, so the destination role
//! can be tested without a proxy relay.
//!
//! Here the test plays both the client C and the proxy P; its connection to the destination D is
//! the proxy's session (`proxy_server = true`, or an ordinary one: D does not care). C would learn
//! D's session ID and key from `PKEY`; here they come from the connection itself.
//!
//! The steps are separate functions so that tests can break any one of them on purpose.

use std::fmt;

use rand::RngCore;

use super::rfwd::{open_rres, seal_rfwd, RresError};
use super::{Authorization, Client, ClientError, CommandBody, ServerTransmission, Signer};
use crate::crypto::{auth, sxbox};
use crate::protocol::batch::parse_batch;
use crate::protocol::command::Command;
use crate::protocol::encoding::{put_large, EncodeError};
use crate::protocol::error::ErrorType;
use crate::protocol::forward::{reverse_nonce, FwdTransmission, PADDED_PROXIED_LEN};
use crate::protocol::response::BrokerMsg;
use crate::protocol::transmission::{
    client_signed_bytes, encode_client_transmission, parse_transmission,
};
use crate::protocol::version::{Version, AUTH_CMDS};

/// Why a forwarded command could not be built or its answer read.
#[derive(Debug)]
pub enum ProxyError {
    Client(ClientError),
    /// The connection has no session secret (no hello key) or no server session key.
    NoSessionSecret,
    /// The batch does not fit the padded length (`TELargeMsg` in the reference client).
    LargeMsg,
    /// `RRES` or the inner answer did not open (`PCECryptoError`).
    Crypto,
    /// The opened answer does not parse as `FwdResponse`, or as a batch of one transmission.
    BadResponse,
    /// The destination answered the `RFWD` with something other than `RRES` or `ERR`.
    Unexpected(Box<ServerTransmission>),
}

impl fmt::Display for ProxyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProxyError::Client(e) => write!(f, "{e}"),
            ProxyError::NoSessionSecret => f.write_str("the session has no session secret"),
            ProxyError::LargeMsg => f.write_str("the forwarded batch does not fit 16226 bytes"),
            ProxyError::Crypto => f.write_str("the forwarded answer did not open"),
            ProxyError::BadResponse => f.write_str("the forwarded answer does not parse"),
            ProxyError::Unexpected(t) => write!(f, "unexpected answer to RFWD: {:?}", t.msg),
        }
    }
}

impl std::error::Error for ProxyError {}

impl From<ClientError> for ProxyError {
    fn from(e: ClientError) -> Self {
        ProxyError::Client(e)
    }
}

/// What a proxy needs of its session with the destination.
#[derive(Clone)]
pub struct Destination {
    /// `sessPD`, implied in what the client signs.
    pub session_id: Vec<u8>,
    /// D's session key `dPub` (from its hello; a client gets it through `PKEY`).
    pub server_key: [u8; 32],
    /// `sessSecret` = X25519(P's hello key, dPriv).
    pub sess_secret: [u8; 32],
}

impl Destination {
    pub fn of(client: &Client) -> Result<Destination, ProxyError> {
        Ok(Destination {
            session_id: client.session_id().to_vec(),
            server_key: *client
                .server_session_key()
                .ok_or(ProxyError::NoSessionSecret)?,
            sess_secret: *client.session_secret().ok_or(ProxyError::NoSessionSecret)?,
        })
    }
}

/// The answer of the destination's command, as the client reads it from `PRES`.
#[derive(Debug, Clone, PartialEq)]
pub struct InnerResponse {
    pub corr_id: Vec<u8>,
    pub entity_id: Vec<u8>,
    pub msg: BrokerMsg,
}

/// What the destination answered to an `RFWD`.
#[derive(Debug, Clone, PartialEq)]
pub enum RfwdAnswer {
    /// `RRES`, opened down to the inner answer.
    Rres(InnerResponse),
    /// A plain `ERR` to the proxy (never reaches the client in the reference).
    Err(ErrorType),
}

/// The client's side of one forwarded command (simplexmq `Client.hs`, `proxySMPCommand`): the
/// version, the nonce that is also the inner corrId, and the per-command key pair.
pub struct ForwardedCommand {
    pub version: Version,
    pub nonce: [u8; 24],
    pub cmd_public: [u8; 32],
    /// `cmdSecret` = X25519(dPub, kPriv).
    pub cmd_secret: [u8; 32],
}

impl ForwardedCommand {
    pub fn new(version: Version, dest: &Destination) -> ForwardedCommand {
        let mut nonce = [0u8; 24];
        rand::rngs::OsRng.fill_bytes(&mut nonce);
        let mut k_priv = [0u8; 32];
        rand::rngs::OsRng.fill_bytes(&mut k_priv);
        ForwardedCommand {
            version,
            nonce,
            cmd_public: sxbox::x25519_public(&k_priv),
            cmd_secret: sxbox::dh(&k_priv, &dest.server_key),
        }
    }

    /// The inner transmission at `version`, corrId = nonce, `sessPD` implied in what is signed;
    /// an X25519 authenticator is made for `dPub`.
    pub fn transmission(
        &self,
        dest: &Destination,
        entity_id: &[u8],
        command: &CommandBody,
        authorization: &Authorization,
    ) -> Vec<u8> {
        let v = self.version;
        let command = match command {
            CommandBody::Cmd(c) => c.to_bytes(v),
            CommandBody::Raw(b) => b.clone(),
        };
        let corr_id = &self.nonce[..];
        let a: Vec<u8> = match authorization {
            // Proxied commands are never signed as a service (simplexmq `Client.hs`, where
            // `authTransmission` gets no service for them): no authorization.
            Authorization::None | Authorization::Service => Vec::new(),
            Authorization::Raw(b) => b.clone(),
            Authorization::Sign(signer) => {
                let signed = client_signed_bytes(v, &dest.session_id, corr_id, entity_id, &command);
                match signer {
                    Signer::Ed25519(sk) => auth::sign_ed25519(sk, &signed).to_vec(),
                    Signer::Ed448(sk) => auth::sign_ed448(sk, &signed).to_vec(),
                    Signer::X25519(sk) => {
                        auth::x25519_authenticator(sk, &dest.server_key, corr_id, &signed).to_vec()
                    }
                }
            }
        };
        // The proxy session implies the session ID at any forwarded version.
        encode_client_transmission(
            v.max(AUTH_CMDS),
            &dest.session_id,
            &a,
            None,
            corr_id,
            entity_id,
            &command,
        )
    }

    /// `et` = SXbox(cmdSecret, nonce, pad(b, 16226)).
    pub fn seal(&self, batch: &[u8]) -> Result<Vec<u8>, ProxyError> {
        sxbox::seal_padded(&self.cmd_secret, &self.nonce, batch, PADDED_PROXIED_LEN)
            .map_err(|_| ProxyError::LargeMsg)
    }

    /// The proxy's `FwdTransmission` carrying `et` (step 3).
    pub fn fwd(&self, et: &[u8]) -> Vec<u8> {
        FwdTransmission {
            corr_id: &self.nonce,
            version: self.version,
            key: self.cmd_public,
            et,
        }
        .to_bytes()
    }

    /// Opens `r2` with cmdSecret and reverse(nonce): a batch of exactly one transmission at
    /// `version` (step 6, client side).
    pub fn open_response(&self, r2: &[u8]) -> Result<InnerResponse, ProxyError> {
        let b = sxbox::open_padded(&self.cmd_secret, &reverse_nonce(&self.nonce), r2)
            .map_err(|_| ProxyError::Crypto)?;
        let items = parse_batch(&b).map_err(|_| ProxyError::BadResponse)?;
        let [item] = items[..] else {
            return Err(ProxyError::BadResponse);
        };
        let v = self.version;
        let t = parse_transmission(v.max(AUTH_CMDS), item).map_err(|_| ProxyError::BadResponse)?;
        let msg = BrokerMsg::parse(v, t.command).map_err(|_| ProxyError::BadResponse)?;
        Ok(InnerResponse {
            corr_id: t.corr_id.to_vec(),
            entity_id: t.entity_id.to_vec(),
            msg,
        })
    }
}

/// Batch content `byte(n) ‖ Large(t)…` (a client forwards a batch of one).
pub fn batch_of(ts: &[Vec<u8>]) -> Result<Vec<u8>, EncodeError> {
    let n = u8::try_from(ts.len()).map_err(|_| EncodeError)?;
    let mut out = vec![n];
    for t in ts {
        put_large(&mut out, t)?;
    }
    Ok(out)
}

/// Sends `RFWD body` with a fresh corrId `n2` and returns `n2` and the destination's answer.
pub fn send_rfwd(
    client: &mut Client,
    body: Vec<u8>,
) -> Result<([u8; 24], ServerTransmission), ClientError> {
    let n2 = super::new_corr_id();
    let r = request_rfwd(client, n2, body)?;
    Ok((n2, r))
}

/// Sends `RFWD body` with the corrId `n2` and waits for its answer.
fn request_rfwd(
    client: &mut Client,
    n2: [u8; 24],
    body: Vec<u8>,
) -> Result<ServerTransmission, ClientError> {
    let t = super::ClientTransmission::new(&n2, b"", Command::RFwd(body));
    client.send_batch(std::slice::from_ref(&t))?;
    client.recv_for(&n2)
}

/// Forwards a prepared inner batch (`b`) over `client` and opens the answer.
pub fn forward_batch(
    client: &mut Client,
    dest: &Destination,
    fc: &ForwardedCommand,
    batch: &[u8],
) -> Result<RfwdAnswer, ProxyError> {
    let et = fc.seal(batch)?;
    let fwd = fc.fwd(&et);
    let n2 = super::new_corr_id();
    let body = seal_rfwd(&dest.sess_secret, &n2, &fwd);
    let r = request_rfwd(client, n2, body)?;
    match &r.msg {
        Ok(BrokerMsg::Rres(efr)) => {
            let (corr_id, r2) = open_rres(&dest.sess_secret, &n2, efr).map_err(|e| match e {
                RresError::Crypto => ProxyError::Crypto,
                RresError::Parse => ProxyError::BadResponse,
            })?;
            if corr_id != fc.nonce {
                return Err(ProxyError::BadResponse);
            }
            fc.open_response(&r2).map(RfwdAnswer::Rres)
        }
        Ok(BrokerMsg::Err(e)) => Ok(RfwdAnswer::Err(e.clone())),
        _ => Err(ProxyError::Unexpected(Box::new(r))),
    }
}

/// Forwards one command to the entity `entity_id` at `version`, authorized as asked, the way a
/// reference client and proxy do (simplexmq `Client.hs`, `proxySMPCommand` and
/// `forwardSMPTransmission`).
pub fn forward(
    client: &mut Client,
    version: Version,
    entity_id: &[u8],
    command: Command,
    authorization: Authorization,
) -> Result<RfwdAnswer, ProxyError> {
    let dest = Destination::of(client)?;
    let fc = ForwardedCommand::new(version, &dest);
    let t = fc.transmission(&dest, entity_id, &CommandBody::Cmd(command), &authorization);
    let b = batch_of(&[t]).map_err(|_| ProxyError::LargeMsg)?;
    forward_batch(client, &dest, &fc, &b)
}
