//! SMP client library: connect, handshake at a chosen version, send batches, match responses by corrId.
//!
//! Blocking and single-threaded on purpose: tests and the load generator drive one connection per
//! thread and want to see every block as the server sent it. Escape hatches (`send_raw_block`,
//! `tls_write_raw`, raw commands and authorizations) let the bad-input tests send what a correct client
//! never would.

mod conn;
mod error;
pub mod handshake;
pub mod proxy;
pub mod queue;
pub mod rfwd;
pub mod service;
#[cfg(test)]
mod tests;

use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

pub use error::ClientError;

use crate::crypto::{auth, keys};
use crate::protocol::batch::{parse_batch, BatchWriter};
use crate::protocol::command::Command;
use crate::protocol::handshake::ClientService;
use crate::protocol::response::BrokerMsg;
use crate::protocol::transmission::{
    client_signed_bytes, encode_client_transmission, parse_transmission,
};
use crate::protocol::version::{Version, VersionRange};
use crate::transport::block::{BlockCodec, BLOCK_SIZE};
use conn::TlsConn;
use handshake::{HandshakeError, HandshakeParams, ServiceError};
pub use service::{ClientCert, ServiceSession};

/// The versions this client speaks (the reference's `supportedClientSMPRelayVRange`).
pub const CLIENT_VERSIONS: VersionRange = VersionRange { min: 6, max: 20 };
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// Transmissions received but not yet asked for (events, responses to other requests).
pub const MAX_PENDING: usize = 4096;
pub const CORR_ID_BYTES: usize = 24;

/// How to connect. `Default` is what an ordinary current client does.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// ALPN protocols to offer; `None` sends no ALPN extension (a legacy client).
    pub alpn: Option<Vec<Vec<u8>>>,
    /// Version to send in the client hello, even one the server did not offer; `None` picks the
    /// highest version in common with 6..20.
    pub version: Option<Version>,
    /// Send an X25519 key in the client hello (v≥7), which turns on block encryption at v≥11.
    pub send_key: bool,
    /// Claim to be an SMP proxy (v≥14): no block encryption.
    pub proxy_server: bool,
    /// Service credentials to send in the hello (v≥16), sent as given; the session is then no
    /// service session for signing (no session key is known). Takes precedence over
    /// `service_role`.
    pub service: Option<ClientService>,
    /// A TLS client certificate chain and key, presented when the server asks for one.
    pub tls_cert: Option<ClientCert>,
    /// Act as a service of this role (`service::ROLE_*`) with `tls_cert`, as the reference client
    /// does: only if the chain was actually sent and the negotiated version allows the role
    /// (`service::role_min_version`), the hello offers the chain with a fresh Ed25519 session key
    /// signed by the leaf key, and a service session follows (`Client::service`).
    pub service_role: Option<u8>,
    /// Check the certificate chain against the key hash before answering. Off to send a wrong key
    /// hash on purpose.
    pub check_identity: bool,
    /// Bound on every wait for the server.
    pub timeout: Duration,
    /// Speak SMP over WebSocket (a relay's `websockets` port): this path in the upgrade request.
    /// Pair it with `alpn: Some(vec![b"http/1.1".to_vec()])` or `None`, as web clients offer.
    pub websocket: Option<String>,
    /// Name this host in TLS (SNI), as a browser names the host of its URL. On a relay's shared
    /// port (`[WEB] https`) that makes it a web client's connection, with the web certificate:
    /// with `websocket` the client then sends a challenge in the path and checks the relay's
    /// identity as the reference's web client does (`handshake::HandshakeParams::web_challenge`).
    pub sni: Option<String>,
    /// The TLS suites offered: the apps' (ChaCha20-Poly1305 alone) unless a test or the load
    /// generator plays a web client (`ClientSuites::Web`, as `websocket()` does).
    pub tls_suites: crate::transport::tls::ClientSuites,
    /// Bind the socket to this local address (the kernel picks the port) before connecting. The
    /// relay lets each address have only `limits::MAX_HANDSHAKES_PER_ADDRESS` connections in
    /// their handshake, so a load generator that opens thousands at once spreads them over many
    /// loopback addresses (127.0.0.0/8). `None` lets the kernel choose, as any client does.
    pub local_addr: Option<IpAddr>,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            alpn: Some(vec![b"smp/1".to_vec()]),
            version: None,
            send_key: true,
            proxy_server: false,
            service: None,
            tls_cert: None,
            service_role: None,
            check_identity: true,
            timeout: DEFAULT_TIMEOUT,
            websocket: None,
            sni: None,
            tls_suites: crate::transport::tls::ClientSuites::Apps,
            local_addr: None,
        }
    }
}

impl ClientOptions {
    /// A web client: SMP over WebSocket at `/`, offering ALPN `http/1.1`.
    pub fn websocket() -> Self {
        ClientOptions {
            alpn: Some(vec![b"http/1.1".to_vec()]),
            websocket: Some("/".to_string()),
            tls_suites: crate::transport::tls::ClientSuites::Web,
            ..ClientOptions::default()
        }
    }
}

/// A private key that authorizes a transmission (simplexmq `Crypto.hs`).
#[derive(Clone)]
pub enum Signer {
    Ed25519(ed25519_dalek::SigningKey),
    Ed448([u8; 57]),
    /// A queue X25519 private key: the authorization is an authenticator for the server session key.
    X25519([u8; 32]),
}

impl Signer {
    pub fn public_key(&self) -> keys::PublicAuthKey {
        match self {
            Signer::Ed25519(sk) => keys::PublicAuthKey::Ed25519(sk.verifying_key().to_bytes()),
            Signer::Ed448(sk) => keys::PublicAuthKey::Ed448(auth::ed448_public(sk)),
            Signer::X25519(sk) => keys::PublicAuthKey::X25519(
                x25519_dalek::PublicKey::from(&x25519_dalek::StaticSecret::from(*sk)).to_bytes(),
            ),
        }
    }
}

/// How a transmission is authorized.
// Built once per transmission and never stored in bulk: boxing would only cost callers clarity.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Default)]
pub enum Authorization {
    #[default]
    None,
    Sign(Signer),
    /// These exact bytes as the authorization field (any length, for bad-input tests).
    Raw(Vec<u8>),
    /// Signed by the service session key (SUBS, NSUBS; `Client::service_transmission`), with no
    /// service signature. Needs a service session.
    Service,
}

/// The command of a transmission.
#[allow(clippy::large_enum_variant)]
#[derive(Clone)]
pub enum CommandBody {
    Cmd(Command),
    /// Bytes sent as the command verbatim.
    Raw(Vec<u8>),
}

/// One transmission to send.
#[derive(Clone)]
pub struct ClientTransmission {
    pub corr_id: Vec<u8>,
    pub entity_id: Vec<u8>,
    pub command: CommandBody,
    pub auth: Authorization,
    /// The service-signature slot (v≥16, only with a non-empty authorization), sent as given
    /// instead of the one a service session computes.
    pub service_sig: Option<Vec<u8>>,
    /// In a service session, sign NEW, SUB and NSUB as a service (see `service`); `false` signs
    /// them as an ordinary client would. True by default.
    pub service_auth: bool,
    /// v6 only: the session id written into the transmission instead of the real one.
    pub session_id: Option<Vec<u8>>,
}

impl ClientTransmission {
    pub fn new(corr_id: &[u8], entity_id: &[u8], command: Command) -> Self {
        Self::with_body(corr_id, entity_id, CommandBody::Cmd(command))
    }

    pub fn raw(corr_id: &[u8], entity_id: &[u8], command: &[u8]) -> Self {
        Self::with_body(corr_id, entity_id, CommandBody::Raw(command.to_vec()))
    }

    fn with_body(corr_id: &[u8], entity_id: &[u8], command: CommandBody) -> Self {
        ClientTransmission {
            corr_id: corr_id.to_vec(),
            entity_id: entity_id.to_vec(),
            command,
            auth: Authorization::None,
            service_sig: None,
            service_auth: true,
            session_id: None,
        }
    }

    pub fn signed(mut self, signer: Signer) -> Self {
        self.auth = Authorization::Sign(signer);
        self
    }

    pub fn with_auth(mut self, auth: Authorization) -> Self {
        self.auth = auth;
        self
    }
}

/// One transmission received from the server.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerTransmission {
    pub corr_id: Vec<u8>,
    pub entity_id: Vec<u8>,
    /// The response or event as sent (tag and parameters).
    pub command: Vec<u8>,
    /// The parsed response or event, or the raw command bytes when they do not parse.
    pub msg: Result<BrokerMsg, Vec<u8>>,
}

pub struct Client {
    conn: TlsConn,
    version: Version,
    server_versions: VersionRange,
    session_id: Vec<u8>,
    /// The server's per-connection X25519 key from its hello (v≥7).
    server_session_key: Option<[u8; 32]>,
    /// X25519(our hello key, the server session key), when both exist: a proxy seals `RFWD` with it.
    session_secret: Option<[u8; 32]>,
    service_id: Option<Vec<u8>>,
    /// Set after a service handshake this client made from `ClientOptions::service_role`.
    service: Option<ServiceSession>,
    codec: BlockCodec,
    pending: VecDeque<ServerTransmission>,
    block: Box<[u8; BLOCK_SIZE]>,
}

impl Client {
    /// TLS, then the SMP handshake (`handshake::answer`): read the server hello, check it, answer
    /// with our hello.
    pub fn connect(
        addr: SocketAddr,
        key_hash: [u8; 32],
        opts: ClientOptions,
    ) -> Result<Client, ClientError> {
        let mut conn = TlsConn::connect(
            addr,
            opts.alpn.as_deref(),
            opts.timeout,
            opts.tls_cert.as_ref(),
            opts.sni.as_deref(),
            opts.tls_suites,
            opts.local_addr,
        )?;
        let web_challenge =
            (opts.sni.is_some() && opts.websocket.is_some()).then(rand::random::<[u8; 32]>);
        if let Some(path) = &opts.websocket {
            let host = opts.sni.clone().unwrap_or_else(|| addr.ip().to_string());
            let path = match web_challenge {
                Some(c) => {
                    use base64::Engine;
                    let c = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(c);
                    let sep = if path.contains('?') { '&' } else { '?' };
                    format!("{path}{sep}challenge={c}")
                }
                None => path.clone(),
            };
            conn.websocket_upgrade(&host, &path)?;
        }
        let mut block = Box::new([0u8; BLOCK_SIZE]);
        conn.read_block(&mut block[..])?;
        let mut params = HandshakeParams {
            key_hash: key_hash.to_vec(),
            versions: CLIENT_VERSIONS,
            version: opts.version,
            send_key: opts.send_key,
            proxy_server: opts.proxy_server,
            service: opts.service,
            check_identity: opts.check_identity,
            web_challenge,
        };
        let handshake_error = |e| match e {
            HandshakeError::Parse => ClientError::HandshakeParse,
            HandshakeError::BadSession => ClientError::BadSession,
            HandshakeError::Identity => ClientError::Identity,
            HandshakeError::BadAuth => ClientError::BadAuth,
            HandshakeError::Version => ClientError::Version,
            HandshakeError::Block(e) => ClientError::Block(e),
        };
        let peer_chain = conn.peer_certificates();
        let mut answered = handshake::answer(&block[..], conn.tls_unique(), &peer_chain, &params)
            .map_err(handshake_error)?;
        // The reference offers service credentials only once it knows the version, and only if
        // the chain went out in the TLS handshake (`smpClientHandshake`): answer again with them.
        let mut pending_service = None;
        if let (None, Some(role), Some(cert)) = (&params.service, opts.service_role, &opts.tls_cert)
        {
            let fingerprint = cert.fingerprint();
            if let Some(fingerprint) = fingerprint.filter(|_| {
                conn.cert_sent() && answered.1.version >= service::role_min_version(role)
            }) {
                let session_key = ed25519_dalek::SigningKey::generate(&mut rand::rngs::OsRng);
                params.service = Some(cert.client_service(role, &session_key.verifying_key()));
                answered = handshake::answer(&block[..], conn.tls_unique(), &peer_chain, &params)
                    .map_err(handshake_error)?;
                pending_service = Some((role, fingerprint, session_key));
            }
        }
        let (hello, session) = answered;
        conn.write_block(&hello[..])?;

        let mut service_id = None;
        if session.expects_service_response {
            conn.read_block(&mut block[..])?;
            service_id = Some(
                handshake::service_response(&block[..]).map_err(|e| match e {
                    ServiceError::Parse => ClientError::HandshakeParse,
                    ServiceError::Refused(e) => {
                        let mut text = Vec::new();
                        e.encode(&mut text);
                        ClientError::ServiceRefused(String::from_utf8_lossy(&text).into_owned())
                    }
                })?,
            );
        }
        let service = match (pending_service, &service_id) {
            (Some((role, fingerprint, session_key)), Some(id)) => Some(ServiceSession {
                role,
                fingerprint,
                session_key,
                service_id: id.clone(),
            }),
            _ => None,
        };
        Ok(Client {
            conn,
            service,
            version: session.version,
            server_versions: session.server_versions,
            session_id: session.session_id,
            server_session_key: session.server_session_key,
            session_secret: session.session_secret,
            service_id,
            codec: session.codec,
            pending: VecDeque::new(),
            block,
        })
    }

    pub fn session_id(&self) -> &[u8] {
        &self.session_id
    }

    pub fn version(&self) -> Version {
        self.version
    }

    /// The range the server offered in its hello.
    pub fn server_versions(&self) -> VersionRange {
        self.server_versions
    }

    /// The ALPN protocol the server selected (`None` in a legacy session).
    pub fn alpn(&self) -> Option<&[u8]> {
        self.conn.alpn_protocol()
    }

    pub fn server_session_key(&self) -> Option<&[u8; 32]> {
        self.server_session_key.as_ref()
    }

    /// The session secret shared with the server (`sessSecret` of simplexmq `Server.hs`,
    /// `processForwardedCommand`), if we sent a hello key.
    pub fn session_secret(&self) -> Option<&[u8; 32]> {
        self.session_secret.as_ref()
    }

    pub fn service_id(&self) -> Option<&[u8]> {
        self.service_id.as_deref()
    }

    /// The service session, after a service handshake made from `ClientOptions::service_role`.
    pub fn service(&self) -> Option<&ServiceSession> {
        self.service.as_ref()
    }

    /// SHA-256 of the service's identity certificate, in a service session.
    pub fn service_fingerprint(&self) -> Option<&[u8; 32]> {
        self.service.as_ref().map(|s| &s.fingerprint)
    }

    /// The service role (`b'M'`, `b'N'` or `b'P'`), in a service session.
    pub fn service_role(&self) -> Option<u8> {
        self.service.as_ref().map(|s| s.role)
    }

    /// Whether the TLS client certificate chain was sent (the server asked for one).
    pub fn cert_sent(&self) -> bool {
        self.conn.cert_sent()
    }

    /// The TLS suite the relay chose for this connection.
    pub fn cipher_suite(&self) -> Option<rustls::CipherSuite> {
        self.conn.cipher_suite()
    }

    /// A transmission for the service itself (SUBS, NSUBS): the service ID as entity ID, signed
    /// by the service session key (`Authorization::Service`).
    pub fn service_transmission(
        &self,
        corr_id: &[u8],
        command: Command,
    ) -> Result<ClientTransmission, ClientError> {
        let s = self.service.as_ref().ok_or(ClientError::NoServiceSession)?;
        Ok(ClientTransmission::new(corr_id, &s.service_id, command)
            .with_auth(Authorization::Service))
    }

    pub fn is_encrypted(&self) -> bool {
        self.codec.is_encrypted()
    }

    pub fn set_timeout(&mut self, timeout: Duration) -> Result<(), ClientError> {
        self.conn.set_read_timeout(timeout)
    }

    /// The wire bytes of one transmission, authorized as it asks.
    pub fn encode_transmission(&self, t: &ClientTransmission) -> Result<Vec<u8>, ClientError> {
        let command = match &t.command {
            CommandBody::Cmd(c) => {
                let mut out = Vec::new();
                c.encode(self.version, &mut out);
                out
            }
            CommandBody::Raw(b) => b.clone(),
        };
        let session_id = t.session_id.as_deref().unwrap_or(&self.session_id);
        let (authorization, service_sig) = authorize(
            self.version,
            session_id,
            t,
            &command,
            self.service.as_ref(),
            self.server_session_key.as_ref(),
        )?;
        Ok(encode_client_transmission(
            self.version,
            session_id,
            &authorization,
            t.service_sig.as_deref().or(service_sig.as_deref()),
            &t.corr_id,
            &t.entity_id,
            &command,
        ))
    }

    /// Sends the transmissions packed greedily into as few blocks as the batch limits allow.
    pub fn send_batch(&mut self, ts: &[ClientTransmission]) -> Result<(), ClientError> {
        let encoded = ts
            .iter()
            .map(|t| self.encode_transmission(t))
            .collect::<Result<Vec<_>, _>>()?;
        self.send_encoded(&encoded)
    }

    /// Sends already-encoded transmissions, packed as `send_batch` does.
    pub fn send_encoded(&mut self, ts: &[Vec<u8>]) -> Result<(), ClientError> {
        let mut batch = BatchWriter::new();
        for t in ts {
            if !batch.try_push(t) {
                if batch.is_empty() {
                    return Err(ClientError::LargeMsg);
                }
                self.send_content(&batch.content())?;
                batch.clear();
                if !batch.try_push(t) {
                    return Err(ClientError::LargeMsg);
                }
            }
        }
        if !batch.is_empty() {
            self.send_content(&batch.content())?;
        }
        Ok(())
    }

    /// Sends one block carrying `content` as its (unpadded) payload, encrypted if the session is.
    pub fn send_content(&mut self, content: &[u8]) -> Result<(), ClientError> {
        let mut out = Box::new([0u8; BLOCK_SIZE]);
        self.codec
            .encode(content, &mut out)
            .map_err(ClientError::Block)?;
        self.conn.write_block(&out[..])
    }

    /// Sends `block` as the next block verbatim. In an encrypted session the send chain still
    /// advances, as it does on the server when it fails to decrypt, so the chains stay in step.
    pub fn send_raw_block(&mut self, block: &[u8; BLOCK_SIZE]) -> Result<(), ClientError> {
        if self.codec.is_encrypted() {
            let mut scratch = Box::new([0u8; BLOCK_SIZE]);
            self.codec
                .encode(&[], &mut scratch)
                .map_err(ClientError::Block)?;
        }
        self.conn.write_block(&block[..])
    }

    /// Writes bytes as TLS application data, outside any block framing.
    pub fn tls_write_raw(&mut self, data: &[u8]) -> Result<(), ClientError> {
        self.conn.write_all(data)
    }

    /// Writes bytes to the TCP socket under TLS (not a valid TLS record).
    pub fn tcp_write_raw(&mut self, data: &[u8]) -> Result<(), ClientError> {
        self.conn.write_raw_tcp(data)
    }

    /// Ends the client's side of the stream (TLS close_notify, TCP shutdown of writes).
    pub fn close_write(&mut self) -> Result<(), ClientError> {
        self.conn.close_write()
    }

    /// Reads one block and returns its transmissions in order (pending ones are not included).
    pub fn recv_block(&mut self) -> Result<Vec<ServerTransmission>, ClientError> {
        self.conn.read_block(&mut self.block[..])?;
        let content = self
            .codec
            .decode(&mut self.block)
            .map_err(ClientError::Block)?;
        let items = parse_batch(content).map_err(|_| ClientError::BadBlock)?;
        let mut out = Vec::with_capacity(items.len());
        for item in items {
            let t = parse_transmission(self.version, item).map_err(|_| ClientError::BadBlock)?;
            if let Some(sid) = t.session_id {
                if sid != self.session_id.as_slice() {
                    return Err(ClientError::BadSession);
                }
            }
            out.push(ServerTransmission {
                corr_id: t.corr_id.to_vec(),
                entity_id: t.entity_id.to_vec(),
                command: t.command.to_vec(),
                msg: BrokerMsg::parse(self.version, t.command).map_err(|_| t.command.to_vec()),
            });
        }
        Ok(out)
    }

    /// The next transmission: a pending one first, otherwise from the next block.
    pub fn recv(&mut self) -> Result<ServerTransmission, ClientError> {
        loop {
            if let Some(t) = self.pending.pop_front() {
                return Ok(t);
            }
            let ts = self.recv_block()?;
            self.pend(ts)?;
        }
    }

    fn pend(&mut self, ts: Vec<ServerTransmission>) -> Result<(), ClientError> {
        if self.pending.len() + ts.len() > MAX_PENDING {
            return Err(ClientError::TooManyPending(MAX_PENDING));
        }
        self.pending.extend(ts);
        Ok(())
    }

    /// Waits for the transmission with this corrId; others received meanwhile stay pending.
    pub fn recv_for(&mut self, corr_id: &[u8]) -> Result<ServerTransmission, ClientError> {
        if let Some(i) = self.pending.iter().position(|t| t.corr_id == corr_id) {
            return Ok(self.pending.remove(i).expect("index from position"));
        }
        loop {
            let mut ts = self.recv_block()?;
            if let Some(i) = ts.iter().position(|t| t.corr_id == corr_id) {
                let t = ts.remove(i);
                self.pend(ts)?;
                return Ok(t);
            }
            self.pend(ts)?;
        }
    }

    /// Removes and returns what was received but not asked for (events, mostly).
    pub fn take_pending(&mut self) -> Vec<ServerTransmission> {
        self.pending.drain(..).collect()
    }

    /// Sends one transmission with a fresh random corrId and returns the matching response.
    pub fn request(
        &mut self,
        entity_id: &[u8],
        command: Command,
        auth: Authorization,
    ) -> Result<ServerTransmission, ClientError> {
        let corr_id = new_corr_id();
        let t = ClientTransmission::new(&corr_id, entity_id, command).with_auth(auth);
        self.send_batch(std::slice::from_ref(&t))?;
        self.recv_for(&corr_id)
    }

    /// PING → the response (a correct server answers `PONG`).
    pub fn ping(&mut self) -> Result<ServerTransmission, ClientError> {
        self.request(&[], Command::Ping, Authorization::None)
    }

    /// Waits for the server to close the connection, returning how many application bytes came first
    /// (stops counting past `max_bytes`).
    pub fn wait_closed(&mut self, max_bytes: usize) -> Result<usize, ClientError> {
        self.conn.read_until_closed(max_bytes)
    }
}

/// The commands a service session signs with both keys (simplexmq `Protocol.hs`,
/// `useServiceAuth`): NEW, SUB and NSUB. Raw commands are recognised by their tag.
fn uses_service_auth(command: &CommandBody) -> bool {
    match command {
        CommandBody::Cmd(c) => matches!(c, Command::New(_) | Command::Sub | Command::NSub),
        CommandBody::Raw(b) => b == b"SUB" || b == b"NSUB" || b.starts_with(b"NEW "),
    }
}

/// The authorization and the computed service signature of one transmission (simplexmq
/// `Client.hs`, `authTransmission`). In a service session, for NEW, SUB and NSUB signed with a
/// queue key, the service session key signs the authorized bytes and the queue key signs
/// `fingerprint ‖ authorized` (an X25519 authenticator is computed over those bytes too).
fn authorize(
    version: Version,
    session_id: &[u8],
    t: &ClientTransmission,
    command: &[u8],
    service: Option<&ServiceSession>,
    server_session_key: Option<&[u8; 32]>,
) -> Result<(Vec<u8>, Option<Vec<u8>>), ClientError> {
    let authorized = || client_signed_bytes(version, session_id, &t.corr_id, &t.entity_id, command);
    match &t.auth {
        Authorization::None => Ok((Vec::new(), None)),
        Authorization::Raw(b) => Ok((b.clone(), None)),
        Authorization::Service => {
            let s = service.ok_or(ClientError::NoServiceSession)?;
            Ok((
                auth::sign_ed25519(&s.session_key, &authorized()).to_vec(),
                None,
            ))
        }
        Authorization::Sign(signer) => {
            let signed = authorized();
            let dual = service.filter(|_| t.service_auth && uses_service_auth(&t.command));
            let (message, service_sig) = match dual {
                Some(s) => {
                    let mut m = Vec::with_capacity(32 + signed.len());
                    m.extend_from_slice(&s.fingerprint);
                    m.extend_from_slice(&signed);
                    (
                        m,
                        Some(auth::sign_ed25519(&s.session_key, &signed).to_vec()),
                    )
                }
                None => (signed, None),
            };
            let authorization = match signer {
                Signer::Ed25519(sk) => auth::sign_ed25519(sk, &message).to_vec(),
                Signer::Ed448(sk) => auth::sign_ed448(sk, &message).to_vec(),
                Signer::X25519(sk) => {
                    let server = server_session_key.ok_or(ClientError::NoServerKey)?;
                    auth::x25519_authenticator(sk, server, &t.corr_id, &message).to_vec()
                }
            };
            Ok((authorization, service_sig))
        }
    }
}

/// 24 random bytes, as clients use (also the proxy sessions' corrIds and `RFWD` nonces `n2`).
pub fn new_corr_id() -> [u8; CORR_ID_BYTES] {
    rand::random()
}
