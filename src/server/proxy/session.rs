//! One session from this relay, as an SMP client with `proxyServer = T`, to a destination relay,
//! shared by every client of the shard that forwards there (simplexmq `Transport.hs`,
//! `Client.hs`: the reference's `getProtocolClient` + `smpClientHandshake`, and
//! `forwardSMPTransmission`).
//!
//! Connecting: pick the host, resolve it off the shard, refuse special addresses, TCP (or SOCKS
//! for `.onion`), TLS with the identity check, then the handshake offering 6..20 (6..10 to a
//! destination below v14, so that no block encryption starts) with our X25519 key. Once up, a
//! reader task matches answers to requests by corrId and a writer task sends one block per
//! request; a monitor pings a quiet destination and closes the session when nobody uses it.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use glommio::channels::local_channel::{self, LocalReceiver, LocalSender};
use glommio::net::TcpStream;
use glommio::sync::Semaphore;
use rustls::ClientConfig;

use super::address::{self, Target};
use super::resolve::Resolver;
use super::socks;
use super::stream::{self, ClientStream, SharedClient};
use crate::client::handshake::{HandshakeError as ClientHandshakeError, HandshakeParams};
use crate::client::rfwd::{open_rres, seal_rfwd, RresError};
use crate::client::{self, new_corr_id, CORR_ID_BYTES};
use crate::config::ProxySettings;
use crate::protocol::batch::parse_batch;
use crate::protocol::command::{Command, SmpServer};
use crate::protocol::encoding::put_large;
use crate::protocol::error::{BrokerError, ErrorType, HandshakeError, ProxyError, TransportError};
use crate::protocol::forward::FwdTransmission;
use crate::protocol::handshake::CertChainPubKey;
use crate::protocol::response::BrokerMsg;
use crate::protocol::transmission::{encode_client_transmission, parse_transmission};
use crate::protocol::version::{Version, VersionRange, PROXIED_VERSIONS, SENDING_PROXY};
use crate::transport::block::{BlockCodec, BLOCK_SIZE};
use crate::transport::identity;

/// What a proxy offers a destination (`supportedProxyClientSMPRelayVRange`).
pub const PROXY_CLIENT_VERSIONS: VersionRange = VersionRange { min: 6, max: 20 };
/// The default SMP port, for an address without one.
pub const DEFAULT_PORT: u16 = 5223;
/// Requests waiting for the destination's answer on one session; beyond, requests wait (within
/// their timeout) for a slot.
pub const MAX_SESSION_IN_FLIGHT: usize = 4096;
/// Blocks queued for the session's writer.
const WRITE_QUEUE_BLOCKS: usize = 64;
/// A destination silent this long is pinged; no answer within the command timeout ends the
/// session (the reference pings every 10 minutes; NAT mappings often last less).
const KEEPALIVE: Duration = Duration::from_secs(60);
/// How often the monitor looks at the session.
const MONITOR_TICK: Duration = Duration::from_secs(1);

/// What went wrong with a destination, as the reference's `SMPClientError`; `to_error` is its
/// `smpProxyError`. The strings are for the log, except where the error carries them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DestError {
    /// `PCENetworkError` (connect, TLS, identity at the TLS level, timeouts while connecting);
    /// the reference always encodes it bare.
    Network(String),
    /// `PCEResponseTimeout`.
    Timeout,
    /// `PCEIncompatibleHost`; here also a destination address this relay refuses.
    Host(String),
    /// `PCETransportError` (handshake, version).
    Transport(TransportError),
    /// `PCEProtocolError`: the destination answered `ERR`.
    Protocol(ErrorType),
    /// `PCEResponseError`: an answer that does not parse.
    Response(String),
    /// `PCEUnexpectedResponse`.
    Unexpected(String),
    /// `PCECryptoError`.
    Crypto,
}

impl DestError {
    pub fn to_error(&self) -> ErrorType {
        let broker = |b| ErrorType::Proxy(ProxyError::Broker(b));
        match self {
            DestError::Network(_) => broker(BrokerError::Network(
                crate::protocol::error::NetworkError::Failed,
            )),
            DestError::Timeout => broker(BrokerError::Timeout),
            DestError::Host(_) => broker(BrokerError::Host),
            DestError::Transport(t) => broker(BrokerError::Transport(*t)),
            DestError::Protocol(e) => ErrorType::Proxy(ProxyError::Protocol(Box::new(e.clone()))),
            DestError::Response(s) => broker(BrokerError::Response(s.clone())),
            DestError::Unexpected(s) => broker(BrokerError::Unexpected(s.clone())),
            DestError::Crypto => ErrorType::Crypto,
        }
    }
}

/// A destination as `PRXY` names it; sessions are shared per key (the reference's `SMPServer`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DestKey {
    pub hosts: Vec<String>,
    pub port: String,
    pub key_hash: Vec<u8>,
}

impl DestKey {
    pub fn of(s: &SmpServer) -> Self {
        DestKey {
            hosts: s.hosts.clone(),
            port: s.port.clone(),
            key_hash: s.key_hash.clone(),
        }
    }
}

/// What the proxy needs to reach destinations.
pub struct Connector {
    pub settings: ProxySettings,
    pub tls: Arc<ClientConfig>,
    pub resolver: Resolver,
    /// Where this shard's destination sessions read from their sockets (see `tls_stream`).
    pub read_scratch: crate::server::conn::tls_stream::ReadScratch,
}

/// An answer from the destination.
struct Answer {
    entity_id: Vec<u8>,
    /// The parsed message, or the raw command when it does not parse.
    msg: Result<BrokerMsg, Vec<u8>>,
}

pub struct DestSession {
    pub key: DestKey,
    /// tls-unique of this connection (`sessPD`).
    pub session_id: Vec<u8>,
    pub version: Version,
    /// The range both sides support (the reference's client-side `thServerVRange`).
    pub versions: VersionRange,
    /// The destination's chain and signed session key from its hello, for `PKEY`.
    pub cert_key: Option<CertChainPubKey>,
    /// X25519(our hello key, the destination's session key): seals `RFWD`.
    sess_secret: Option<[u8; 32]>,
    stream: SharedClient,
    out_tx: LocalSender<Vec<u8>>,
    out_rx: RefCell<Option<LocalReceiver<Vec<u8>>>>,
    close_tx: LocalSender<()>,
    close_rx: RefCell<Option<LocalReceiver<()>>>,
    pending: RefCell<HashMap<Vec<u8>, LocalSender<Answer>>>,
    slots: Semaphore,
    closed: Cell<bool>,
    /// Last PRXY or PFWD that used the session.
    last_used: Cell<Instant>,
    last_received: Cell<Instant>,
    command_timeout: Duration,
    idle_close: Duration,
}

/// Races `f` against `limit`.
pub async fn timed<T>(limit: Duration, f: impl std::future::Future<Output = T>) -> Option<T> {
    futures_lite::future::or(async { Some(f.await) }, async {
        glommio::timer::Timer::new(limit).await;
        None
    })
    .await
}

impl DestSession {
    /// Connects to `server` (bounded by the connect timeout) and returns the session, not yet
    /// running: the caller runs `run` in a task of its own.
    pub async fn connect(c: &Connector, server: &SmpServer) -> Result<Rc<DestSession>, DestError> {
        let limit = c.settings.connect_timeout;
        match timed(limit, connect(c, server)).await {
            Some(r) => r,
            None => Err(DestError::Network(format!(
                "no session within {} s",
                limit.as_secs()
            ))),
        }
    }

    pub fn is_closed(&self) -> bool {
        self.closed.get()
    }

    pub fn in_flight(&self) -> usize {
        self.pending.borrow().len()
    }

    pub fn last_used(&self) -> Instant {
        self.last_used.get()
    }

    pub fn touch(&self) {
        self.last_used.set(Instant::now());
    }

    /// Ends the session (its `run` returns).
    pub fn close(&self) {
        self.closed.set(true);
        let _ = self.close_tx.try_send(());
    }

    /// `PKEY` for this session: the common range capped to 8..20, as the reference's
    /// `proxyResp`; a destination below v8 is `TRANSPORT VERSION`.
    pub fn pkey(&self) -> Result<BrokerMsg, DestError> {
        match self.versions.intersect(&PROXIED_VERSIONS) {
            Some(vr) if self.version >= SENDING_PROXY => match &self.cert_key {
                Some(ck) => Ok(BrokerMsg::Pkey {
                    session_id: self.session_id.clone(),
                    versions: vr,
                    cert_key: ck.clone(),
                }),
                None => Err(DestError::Transport(TransportError::NoAuth)),
            },
            _ => Err(DestError::Transport(TransportError::Version)),
        }
    }

    /// Whether this destination's version takes forwarded commands (v8+); below it `forward`
    /// answers `TRANSPORT VERSION`.
    pub fn can_forward(&self) -> bool {
        self.version >= SENDING_PROXY
    }

    /// Forwards a client's `PFWD` as `RFWD` with a fresh nonce and opens the `RRES` (the proxy's
    /// part: simplexmq `Client.hs` `forwardSMPTransmission`, `Server.hs`): returns `r2`, for
    /// `PRES`.
    pub async fn forward(
        &self,
        client_corr_id: &[u8],
        version: Version,
        key: [u8; 32],
        et: &[u8],
    ) -> Result<Vec<u8>, DestError> {
        if !self.can_forward() {
            return Err(DestError::Transport(TransportError::Version));
        }
        let secret = self
            .sess_secret
            .ok_or(DestError::Transport(TransportError::NoAuth))?;
        let fwd = FwdTransmission {
            corr_id: client_corr_id,
            version,
            key,
            et,
        }
        .to_bytes();
        let n2 = new_corr_id();
        let body = seal_rfwd(&secret, &n2, &fwd);
        drop(fwd);
        let answer = self.request(n2, Command::RFwd(body)).await?;
        if !answer.entity_id.is_empty() {
            return Err(DestError::Unexpected(describe(&answer.msg)));
        }
        match answer.msg {
            Ok(BrokerMsg::Rres(efr)) => match open_rres(&secret, &n2, &efr) {
                Ok((_, r2)) => Ok(r2),
                Err(RresError::Crypto) => Err(DestError::Crypto),
                Err(RresError::Parse) => Err(DestError::Response("BLOCK".into())),
            },
            Ok(BrokerMsg::Err(e)) => Err(DestError::Protocol(e)),
            other => Err(unexpected(other)),
        }
    }

    /// Sends one command and waits for the answer with its corrId.
    async fn request(
        &self,
        corr_id: [u8; CORR_ID_BYTES],
        cmd: Command,
    ) -> Result<Answer, DestError> {
        if self.closed.get() {
            return Err(DestError::Network("session closed".into()));
        }
        let timeout = self.command_timeout;
        let deadline = Instant::now() + timeout;
        let permit = match timed(timeout, self.slots.acquire_permit(1)).await {
            Some(Ok(p)) => p,
            Some(Err(_)) => return Err(DestError::Network("session closed".into())),
            None => return Err(DestError::Timeout),
        };
        let t = encode_client_transmission(
            self.version,
            &self.session_id,
            &[],
            None,
            &corr_id,
            b"",
            &cmd.to_bytes(self.version),
        );
        drop(cmd);
        let mut content = Vec::with_capacity(t.len() + 3);
        content.push(1);
        if put_large(&mut content, &t).is_err() || content.len() > BLOCK_SIZE - 2 {
            return Err(DestError::Transport(TransportError::LargeMsg));
        }
        drop(t);
        let (tx, rx) = local_channel::new_bounded(1);
        self.pending.borrow_mut().insert(corr_id.to_vec(), tx);
        let left = deadline.saturating_duration_since(Instant::now());
        let answer = timed(left, async {
            self.out_tx.send(content).await.ok()?;
            rx.recv().await
        })
        .await;
        self.pending.borrow_mut().remove(&corr_id[..]);
        drop(permit);
        match answer {
            Some(Some(a)) => Ok(a),
            Some(None) => Err(DestError::Network("connection lost".into())),
            None => Err(DestError::Timeout),
        }
    }

    /// Runs the session until the connection fails, it is idle or closed; then it is closed and
    /// every waiting request fails.
    pub async fn run(self: &Rc<Self>) {
        let out_rx = self.out_rx.borrow_mut().take();
        let close_rx = self.close_rx.borrow_mut().take();
        let (Some(out_rx), Some(close_rx)) = (out_rx, close_rx) else {
            return;
        };
        let why = futures_lite::future::or(
            self.read_loop(),
            futures_lite::future::or(
                self.write_loop(out_rx),
                futures_lite::future::or(self.monitor(), async {
                    close_rx.recv().await;
                    "closed".to_string()
                }),
            ),
        )
        .await;
        tracing::debug!(host = ?self.key.hosts, reason = %why, "proxy session ended");
        self.closed.set(true);
        // Dropping the senders fails every waiting request at once.
        self.pending.borrow_mut().clear();
        self.slots.close();
        let _ = timed(Duration::from_secs(1), stream::close(&self.stream)).await;
    }

    async fn read_loop(&self) -> String {
        let mut codec = BlockCodec::plain();
        loop {
            let mut block = Vec::new();
            if let Err(e) = stream::read_block(&self.stream, &mut block, BLOCK_SIZE).await {
                return format!("read: {e}");
            }
            self.last_received.set(Instant::now());
            let Ok(block) = <&mut [u8; BLOCK_SIZE]>::try_from(&mut block[..]) else {
                return "short block".into();
            };
            let Ok(content) = codec.decode(block) else {
                return "bad block".into();
            };
            let Ok(items) = parse_batch(content) else {
                return "bad batch".into();
            };
            for item in items {
                let Ok(t) = parse_transmission(self.version, item) else {
                    // The reference client reports it as an event nobody waits for.
                    tracing::debug!("proxy session: unparsable transmission");
                    continue;
                };
                if t.corr_id.is_empty() {
                    // Events (END and the like) mean nothing to a proxy session.
                    continue;
                }
                let waiter = self.pending.borrow_mut().remove(t.corr_id);
                if let Some(w) = waiter {
                    let msg =
                        BrokerMsg::parse(self.version, t.command).map_err(|_| t.command.to_vec());
                    let _ = w.try_send(Answer {
                        entity_id: t.entity_id.to_vec(),
                        msg,
                    });
                }
            }
        }
    }

    async fn write_loop(&self, rx: LocalReceiver<Vec<u8>>) -> String {
        let mut codec = BlockCodec::plain();
        let mut block = Box::new([0u8; BLOCK_SIZE]);
        while let Some(content) = rx.recv().await {
            if codec.encode(&content, &mut block).is_err() {
                // Sizes are checked before queueing; never reached.
                continue;
            }
            drop(content);
            if let Err(e) = self.stream.borrow_mut().queue(&block[..]) {
                return format!("write: {e}");
            }
            if let Err(e) = stream::flush(&self.stream).await {
                return format!("write: {e}");
            }
        }
        "writer closed".into()
    }

    async fn monitor(&self) -> String {
        loop {
            glommio::timer::Timer::new(MONITOR_TICK).await;
            if self.closed.get() {
                return "closed".into();
            }
            if self.pending.borrow().is_empty() && self.last_used.get().elapsed() >= self.idle_close
            {
                return "idle".into();
            }
            if self.last_received.get().elapsed() >= KEEPALIVE {
                match self.request(new_corr_id(), Command::Ping).await {
                    Ok(Answer {
                        msg: Ok(BrokerMsg::Pong),
                        ..
                    }) => {}
                    Ok(_) => return "unexpected answer to PING".into(),
                    Err(e) => return format!("PING: {e:?}"),
                }
            }
        }
    }
}

/// The reference puts `take 32 (show response)` in `UNEXPECTED`; the tag is what we can show.
fn describe(msg: &Result<BrokerMsg, Vec<u8>>) -> String {
    let s = match msg {
        Ok(m) => m.tag().to_string(),
        Err(raw) => String::from_utf8_lossy(&raw[..raw.len().min(32)]).into_owned(),
    };
    s.chars().take(32).collect()
}

fn unexpected(msg: Result<BrokerMsg, Vec<u8>>) -> DestError {
    match msg {
        // An answer that does not parse: the reference's `PCEResponseError (CMD SYNTAX)`.
        Err(_) => DestError::Response("CMD SYNTAX".into()),
        ok => DestError::Unexpected(describe(&ok)),
    }
}

/// The addresses to try for `target`, each checked; `.onion` goes through SOCKS unresolved.
async fn connect_tcp(c: &Connector, target: &Target, port: u16) -> Result<TcpStream, DestError> {
    let s = &c.settings;
    let addrs: Vec<SocketAddr> = match target {
        Target::Onion(name) => {
            let Some(socks_addr) = s.socks_proxy else {
                return Err(DestError::Host(format!(
                    "{name}: .onion destinations need --socks-proxy"
                )));
            };
            let mut sock = TcpStream::connect(socks_addr)
                .await
                .map_err(|e| DestError::Network(format!("SOCKS proxy {socks_addr}: {e}")))?;
            socks::connect(&mut sock, name, port)
                .await
                .map_err(|e| DestError::Network(format!("{name} via SOCKS: {e}")))?;
            return Ok(sock);
        }
        Target::Ip(ip) => vec![SocketAddr::new(*ip, port)],
        Target::Name(name) => c
            .resolver
            .resolve(name, port)
            .await
            .map_err(|e| DestError::Network(e.to_string()))?,
    };
    // Every address is checked before any is tried: a name must not reach a private address,
    // even as a fallback.
    if !s.allow_private {
        if let Some(a) = addrs.iter().find(|a| address::is_forbidden(a.ip())) {
            return Err(DestError::Host(format!(
                "{target:?} resolves to {}, a loopback, private or special address (--proxy-allow-private allows it)",
                a.ip()
            )));
        }
    }
    let mut last = String::new();
    for a in addrs {
        match TcpStream::connect(a).await {
            Ok(sock) => return Ok(sock),
            Err(e) => last = format!("{a}: {e}"),
        }
    }
    Err(DestError::Network(last))
}

async fn connect(c: &Connector, server: &SmpServer) -> Result<Rc<DestSession>, DestError> {
    let target = address::choose_host(&server.hosts)
        .ok_or_else(|| DestError::Host("the address has no host".into()))?;
    let port = if server.port.is_empty() {
        DEFAULT_PORT
    } else {
        server
            .port
            .parse::<u16>()
            .map_err(|_| DestError::Network(format!("bad port {:?}", server.port)))?
    };
    let mut sock = connect_tcp(c, &target, port).await?;
    let _ = sock.set_nodelay(true);
    // SNI is off, so the name only feeds rustls' own checks, which the identity check replaces.
    let name = match &target {
        Target::Ip(ip) => rustls::pki_types::ServerName::IpAddress((*ip).into()),
        _ => rustls::pki_types::ServerName::IpAddress(IpAddr::from([0u8, 0, 0, 0]).into()),
    };
    let (tls, tls_unique) = stream::handshake(&mut sock, &c.tls, name)
        .await
        .map_err(|e| DestError::Network(format!("TLS: {e}")))?;
    let peer_chain: Vec<Vec<u8>> = tls
        .peer_certificates()
        .map(|cs| cs.iter().map(|c| c.as_ref().to_vec()).collect())
        .unwrap_or_default();
    // The reference checks the chain inside TLS: a mismatch is a TLS failure (NETWORK).
    identity::verify_chain(&peer_chain, &server.key_hash)
        .map_err(|e| DestError::Network(format!("identity: {e}")))?;
    let stream: SharedClient = Rc::new(RefCell::new(ClientStream::new(
        sock,
        tls,
        c.read_scratch.clone(),
    )));
    match handshake(c, server, &stream, &tls_unique, &peer_chain).await {
        Ok(s) => Ok(s),
        Err(e) => {
            let _ = timed(Duration::from_secs(1), stream::close(&stream)).await;
            Err(e)
        }
    }
}

/// The SMP handshake as a proxy (`smpClientHandshake` with `proxyServer = True`), driven over the
/// session's stream: the checks and the answer are the client stack's (`client::handshake`).
async fn handshake(
    c: &Connector,
    server: &SmpServer,
    stream: &SharedClient,
    tls_unique: &[u8],
    peer_chain: &[Vec<u8>],
) -> Result<Rc<DestSession>, DestError> {
    let mut block = Vec::new();
    stream::read_block(stream, &mut block, BLOCK_SIZE)
        .await
        .map_err(|e| DestError::Network(format!("hello: {e}")))?;
    let params = HandshakeParams {
        key_hash: server.key_hash.clone(),
        versions: PROXY_CLIENT_VERSIONS,
        version: None,
        send_key: true,
        proxy_server: true,
        service: None,
        // The TLS chain is verified in full before (`identity::verify_chain`); this checks the
        // hello's chain too, whose mismatch is `BAD_AUTH`.
        check_identity: true,
        web_challenge: None,
    };
    let handshake_err = |e| DestError::Transport(TransportError::Handshake(e));
    let (hello, session) = client::handshake::answer(&block, tls_unique, peer_chain, &params)
        .map_err(|e| match e {
            ClientHandshakeError::Parse | ClientHandshakeError::Block(_) => {
                handshake_err(HandshakeError::Parse)
            }
            ClientHandshakeError::BadSession => DestError::Transport(TransportError::Session),
            ClientHandshakeError::Identity | ClientHandshakeError::BadAuth => {
                handshake_err(HandshakeError::BadAuth)
            }
            ClientHandshakeError::Version => DestError::Transport(TransportError::Version),
        })?;
    let versions = session
        .versions
        .ok_or(DestError::Transport(TransportError::Version))?;
    drop(block);
    stream
        .borrow_mut()
        .queue(&hello[..])
        .map_err(|e| DestError::Network(format!("hello: {e}")))?;
    stream::flush(stream)
        .await
        .map_err(|e| DestError::Network(format!("hello: {e}")))?;
    let (out_tx, out_rx) = local_channel::new_bounded(WRITE_QUEUE_BLOCKS);
    let (close_tx, close_rx) = local_channel::new_bounded(1);
    let now = Instant::now();
    Ok(Rc::new(DestSession {
        key: DestKey::of(server),
        session_id: session.session_id,
        version: session.version,
        versions,
        cert_key: session.cert_key,
        sess_secret: session.session_secret,
        stream: stream.clone(),
        out_tx,
        out_rx: RefCell::new(Some(out_rx)),
        close_tx,
        close_rx: RefCell::new(Some(close_rx)),
        pending: RefCell::new(HashMap::new()),
        slots: Semaphore::new(MAX_SESSION_IN_FLIGHT as u64),
        closed: Cell::new(false),
        last_used: Cell::new(now),
        last_received: Cell::new(now),
        command_timeout: c.settings.command_timeout,
        idle_close: c.settings.idle_close,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::error::NetworkError;

    fn encoded(e: &DestError) -> String {
        let mut out = Vec::new();
        e.to_error().encode(20, &mut out);
        String::from_utf8_lossy(&out).into_owned()
    }

    /// `smpProxyError` of the reference, as encoded on the wire.
    #[test]
    fn errors_map_as_the_reference() {
        assert_eq!(
            encoded(&DestError::Network("refused".into())),
            "PROXY BROKER NETWORK"
        );
        assert_eq!(encoded(&DestError::Timeout), "PROXY BROKER TIMEOUT");
        assert_eq!(encoded(&DestError::Host("x".into())), "PROXY BROKER HOST");
        assert_eq!(
            encoded(&DestError::Transport(TransportError::Version)),
            "PROXY BROKER TRANSPORT VERSION"
        );
        assert_eq!(
            encoded(&DestError::Transport(TransportError::Handshake(
                HandshakeError::BadAuth
            ))),
            "PROXY BROKER TRANSPORT HANDSHAKE BAD_AUTH"
        );
        assert_eq!(
            encoded(&DestError::Protocol(ErrorType::Auth)),
            "PROXY PROTOCOL AUTH"
        );
        assert_eq!(
            encoded(&DestError::Unexpected("PONG".into())),
            // `shortString`, as the grammar has it.
            "PROXY BROKER UNEXPECTED \u{4}PONG"
        );
        assert_eq!(encoded(&DestError::Crypto), "CRYPTO");
        assert!(matches!(
            DestError::Network(String::new()).to_error(),
            ErrorType::Proxy(ProxyError::Broker(BrokerError::Network(
                NetworkError::Failed
            )))
        ));
    }

    #[test]
    fn unparsable_answers_are_response_errors() {
        assert_eq!(
            unexpected(Err(b"WHAT".to_vec())),
            DestError::Response("CMD SYNTAX".into())
        );
        assert_eq!(
            unexpected(Ok(BrokerMsg::Ok)),
            DestError::Unexpected("OK".into())
        );
    }
}
