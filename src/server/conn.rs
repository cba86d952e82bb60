//! One client connection, from the first TLS byte to the last block: TLS with the tls-unique
//! extraction, the SMP handshake (`reference/smp-wire.md` §2), then a loop that reads a block, has
//! `dispatch` answer its transmissions and writes the answers as few blocks as they fit in.

use std::future::{poll_fn, Future};
use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::task::Poll;
use std::time::Duration;

use futures_lite::{AsyncRead, AsyncWriteExt};
use glommio::net::TcpStream;
use rand::rngs::OsRng;
use x25519_dalek::{PublicKey as X25519Public, StaticSecret};

use super::dispatch;
use super::shard::ShardContext;
use super::tls_stream::TlsStream;
use crate::crypto::{signed_key, sxbox};
use crate::protocol::error::TransportError;
use crate::protocol::handshake::{CertChainPubKey, ClientHello, ServerHello, ServiceResponse};
use crate::protocol::pad;
use crate::protocol::version::{self, Version, VersionRange};
use crate::transport::block::{BlockCodec, BLOCK_SIZE};
use crate::transport::tls::{alpn_versions, AcceptState};

/// Why a connection ended; logged at debug level, never sent to the client.
#[derive(Debug, thiserror::Error)]
pub enum ConnError {
    #[error("i/o: {0}")]
    Io(#[from] io::Error),
    #[error("TLS: {0}")]
    Tls(String),
    #[error("timed out during {0}")]
    Timeout(&'static str),
    #[error("SMP handshake: {0}")]
    Handshake(&'static str),
}

/// What the SMP handshake settled for the rest of the session.
pub struct Session {
    pub version: Version,
    pub session_id: Vec<u8>,
    /// The server's per-connection X25519 key: X25519 authenticators are checked with it.
    pub server_key: StaticSecret,
    /// X25519(server key, client hello key), kept whenever the client sent a key: block encryption
    /// and forwarded commands (RFWD) both need it.
    pub session_secret: Option<[u8; 32]>,
    pub proxy_server: bool,
    pub codec: BlockCodec,
}

pub async fn serve(sock: TcpStream, ctx: Rc<ShardContext>) {
    let peer = sock.peer_addr().ok();
    match run(sock, &ctx).await {
        Ok(()) => tracing::debug!(?peer, "connection closed"),
        Err(e) => tracing::debug!(?peer, error = %e, "connection ended"),
    }
}

async fn run(mut sock: TcpStream, ctx: &ShardContext) -> Result<(), ConnError> {
    // Small handshake blocks would otherwise wait for delayed ACKs.
    sock.set_nodelay(true)
        .map_err(|e| io::Error::other(e.to_string()))?;
    let tls = timed(
        ctx.config.tls_timeout,
        "TLS setup",
        tls_accept(&mut sock, ctx),
    )
    .await?;
    let (conn, session_id) = tls;
    let versions = alpn_versions(conn.alpn_protocol());
    let mut stream = TlsStream::new(sock, conn, ctx.read_scratch.clone());
    let session = timed(
        ctx.config.handshake_timeout,
        "SMP handshake",
        smp_handshake(&mut stream, ctx, versions, session_id),
    )
    .await;
    let mut session = match session {
        Ok(s) => s,
        Err(e) => {
            stream.close().await;
            return Err(e);
        }
    };
    let result = session_loop(&mut stream, &mut session).await;
    stream.close().await;
    result
}

async fn timed<T>(
    limit: Duration,
    what: &'static str,
    f: impl Future<Output = Result<T, ConnError>>,
) -> Result<T, ConnError> {
    futures_lite::future::or(f, async {
        glommio::timer::Timer::new(limit).await;
        Err(ConnError::Timeout(what))
    })
    .await
}

async fn tls_accept(
    sock: &mut TcpStream,
    ctx: &ShardContext,
) -> Result<(rustls::ServerConnection, Vec<u8>), ConnError> {
    let mut state = AcceptState::new(&ctx.tls_config).map_err(|e| ConnError::Tls(e.to_string()))?;
    let mut out = Vec::new();
    loop {
        // Read into the shard's scratch buffer and feed rustls at once, so that a connection
        // waiting for its ClientHello holds no buffer of its own.
        let fed = poll_fn(|cx| {
            let mut buf = ctx.read_scratch.borrow_mut();
            match Pin::new(&mut *sock).poll_read(cx, &mut buf[..]) {
                Poll::Ready(Ok(0)) => {
                    Poll::Ready(Err(ConnError::Io(io::ErrorKind::UnexpectedEof.into())))
                }
                Poll::Ready(Ok(n)) => Poll::Ready(Ok(state.feed(&buf[..n]))),
                Poll::Ready(Err(e)) => Poll::Ready(Err(ConnError::Io(e))),
                Poll::Pending => Poll::Pending,
            }
        })
        .await?;
        // Send what rustls produced even on failure: that is the alert telling the client why.
        state.take_output(&mut out);
        if !out.is_empty() {
            sock.write_all(&out).await?;
            out = Vec::new();
        }
        fed.map_err(|e| ConnError::Tls(e.to_string()))?;
        if !state.is_handshaking() {
            return state.finish().map_err(|e| ConnError::Tls(e.to_string()));
        }
    }
}

async fn smp_handshake(
    stream: &mut TlsStream,
    ctx: &ShardContext,
    versions: VersionRange,
    session_id: Vec<u8>,
) -> Result<Session, ConnError> {
    let server_key = StaticSecret::random_from_rng(OsRng);
    let server_pub = X25519Public::from(&server_key);
    let cert_key = (versions.max >= version::AUTH_CMDS).then(|| CertChainPubKey {
        chain: ctx.credentials.chain_der.clone(),
        signed_key: signed_key::sign_x25519_key(&ctx.credentials.leaf_key, server_pub.as_bytes()),
    });
    let hello = ServerHello {
        versions,
        session_id: session_id.clone(),
        cert_key,
    };
    write_plain_block(stream, &hello.encode()).await?;

    let mut block = Vec::new();
    stream.read_block(&mut block, BLOCK_SIZE).await?;
    let content = pad::unpad(&block).map_err(|_| ConnError::Handshake("unpadded client hello"))?;
    let client = ClientHello::decode(content).map_err(|_| ConnError::Handshake("PARSE"))?;
    // The reference closes without a word on a wrong identity or version.
    if client.key_hash[..] != ctx.credentials.key_hash[..] {
        return Err(ConnError::Handshake("IDENTITY"));
    }
    if !versions.contains(client.version) {
        return Err(ConnError::Handshake("VERSION"));
    }
    if client.service.is_some() {
        // A service must present the chain it signs with as its TLS client certificate; this relay
        // does not ask for one yet, so the chains cannot match (the reference's BAD_AUTH).
        let refusal = ServiceResponse::Err(TransportError::Handshake(
            crate::protocol::error::HandshakeError::BadAuth,
        ));
        write_plain_block(stream, &refusal.encode()).await?;
        return Err(ConnError::Handshake(
            "BAD_AUTH: service without a client certificate",
        ));
    }
    let session_secret = client
        .client_key
        .map(|k| sxbox::dh(&server_key.to_bytes(), &k));
    let encrypt = client.version >= version::ENCRYPTED_BLOCK && !client.proxy_server;
    let codec = match session_secret {
        Some(secret) if encrypt => BlockCodec::server(&session_id, &secret),
        _ => BlockCodec::plain(),
    };
    Ok(Session {
        version: client.version,
        session_id,
        server_key,
        session_secret,
        proxy_server: client.proxy_server,
        codec,
    })
}

async fn write_plain_block(stream: &mut TlsStream, content: &[u8]) -> Result<(), ConnError> {
    let mut block = vec![0u8; BLOCK_SIZE];
    pad::pad_into(content, &mut block).map_err(|_| ConnError::Handshake("hello too large"))?;
    stream.queue(&block)?;
    stream.flush().await?;
    Ok(())
}

async fn session_loop(stream: &mut TlsStream, session: &mut Session) -> Result<(), ConnError> {
    let mut responses: Vec<Vec<u8>> = Vec::new();
    loop {
        // Allocated per block, so that an idle connection holds no block buffers.
        let mut block = Vec::new();
        stream.read_block(&mut block, BLOCK_SIZE).await?;
        let block: &mut [u8; BLOCK_SIZE] = (&mut block[..])
            .try_into()
            .map_err(|_| ConnError::Handshake("short block"))?;
        responses.clear();
        dispatch::process_block(session, block, &mut responses);
        queue_responses(stream, session, &responses)?;
        stream.flush().await?;
        responses = Vec::new();
    }
}

/// Packs, encrypts and queues responses. Synchronous on purpose: the 16 KB block lives on the
/// thread's stack, not in the connection's future, which is kept for the connection's lifetime.
fn queue_responses(
    stream: &mut TlsStream,
    session: &mut Session,
    responses: &[Vec<u8>],
) -> Result<(), ConnError> {
    let mut out_block = [0u8; BLOCK_SIZE];
    for content in dispatch::pack(responses) {
        session
            .codec
            .encode(&content, &mut out_block)
            .map_err(|_| ConnError::Handshake("response block too large"))?;
        stream.queue(&out_block[..])?;
    }
    Ok(())
}
