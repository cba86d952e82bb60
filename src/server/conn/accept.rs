//! A TLS server handshake over a glommio socket: the ClientHello read into the shard's scratch
//! buffer (a connection waiting for it holds no buffer of its own), rustls fed, its output sent,
//! until the connection is established. Shared by the SMP connections (`conn/mod.rs`) and the web
//! site's HTTPS port (`server/web.rs`).

use std::future::poll_fn;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;

use futures_lite::{AsyncRead, AsyncWriteExt};
use glommio::net::TcpStream;

use super::tls_stream::ReadScratch;
use crate::transport::tls::AcceptState;

/// Why a TLS handshake failed.
#[derive(Debug)]
pub enum AcceptError {
    Io(io::Error),
    Tls(String),
}

impl std::fmt::Display for AcceptError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AcceptError::Io(e) => write!(f, "i/o: {e}"),
            AcceptError::Tls(e) => write!(f, "TLS: {e}"),
        }
    }
}

impl From<io::Error> for AcceptError {
    fn from(e: io::Error) -> Self {
        AcceptError::Io(e)
    }
}

/// The handshake with `tls_config`, or with `web` for a ClientHello that names a host
/// (`AcceptState::with_web`); returns the connection and its session ID (tls-unique).
pub async fn tls_accept(
    sock: &mut TcpStream,
    scratch: &ReadScratch,
    tls_config: &Arc<rustls::ServerConfig>,
    web: Option<&Arc<rustls::ServerConfig>>,
) -> Result<(rustls::ServerConnection, Vec<u8>), AcceptError> {
    let mut state = AcceptState::new(tls_config)
        .map_err(|e| AcceptError::Tls(e.to_string()))?
        .with_web(web);
    let mut out = Vec::new();
    loop {
        // Read into the shard's scratch buffer and feed rustls at once, so that a connection
        // waiting for its ClientHello holds no buffer of its own.
        let fed = poll_fn(|cx| {
            let mut buf = scratch.borrow_mut();
            match Pin::new(&mut *sock).poll_read(cx, &mut buf[..]) {
                Poll::Ready(Ok(0)) => {
                    Poll::Ready(Err(AcceptError::Io(io::ErrorKind::UnexpectedEof.into())))
                }
                Poll::Ready(Ok(n)) => Poll::Ready(Ok(state.feed(&buf[..n]))),
                Poll::Ready(Err(e)) => Poll::Ready(Err(AcceptError::Io(e))),
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
        fed.map_err(|e| AcceptError::Tls(e.to_string()))?;
        if !state.is_handshaking() {
            return state.finish().map_err(|e| AcceptError::Tls(e.to_string()));
        }
    }
}
