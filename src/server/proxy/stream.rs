//! The proxy's TLS client connection over a glommio socket: the handshake captures what the client
//! writes to compute its own tls-unique (`transport::tls::ClientCapture`); afterwards the stream is
//! the relay's own TLS driver (`server::tls_stream`), whose reader and writer tasks share it through
//! `RefCell`, each borrowing it for one synchronous poll.

use std::sync::Arc;

use futures_lite::{AsyncReadExt, AsyncWriteExt};
use glommio::net::TcpStream;
use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ClientConnection};

use crate::server::conn::tls_stream::{SharedTls, TlsStream};
use crate::transport::tls::{ClientCapture, TlsError};

/// Bytes read from the socket in one call.
const READ_CHUNK_BYTES: usize = 16 * 1024;

/// TLS 1.3 handshake as a client; returns the connection and the client's tls-unique.
pub async fn handshake(
    sock: &mut TcpStream,
    config: &Arc<ClientConfig>,
    server_name: ServerName<'static>,
) -> Result<(ClientConnection, Vec<u8>), TlsError> {
    let mut capture = ClientCapture::new(config, server_name)?;
    let mut out = Vec::new();
    let mut buf = vec![0u8; READ_CHUNK_BYTES];
    loop {
        while capture.connection().wants_write() {
            capture.write_tls_to(&mut out)?;
        }
        if !out.is_empty() {
            sock.write_all(&out).await?;
            out.clear();
        }
        if !capture.is_handshaking() {
            return capture.finish();
        }
        let n = sock.read(&mut buf).await?;
        if n == 0 {
            return Err(TlsError::UnexpectedEof);
        }
        let mut rest = &buf[..n];
        while !rest.is_empty() {
            if let Err(e) = capture.read_tls_from(&mut rest) {
                // Tell the server why (an alert), best effort.
                while capture.connection().wants_write() {
                    if capture.write_tls_to(&mut out).is_err() {
                        break;
                    }
                }
                let _ = sock.write_all(&out).await;
                return Err(e);
            }
        }
    }
}

/// The session's stream once the handshake is done: the relay's own TLS driver, client side.
pub type ClientStream = TlsStream<ClientConnection>;
pub type SharedClient = SharedTls<ClientConnection>;

pub use crate::server::conn::tls_stream::{close, flush, read_block};
