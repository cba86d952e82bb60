//! Why a client operation failed. Handshake failures name the check that failed (the reference's
//! `TransportError` cases), so tests can tell "the server closed" from "the server lied".

use std::io;

use crate::transport::block::BlockError;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("i/o error: {0}")]
    Io(io::Error),
    #[error("timed out waiting for the server")]
    Timeout,
    #[error("the server closed the connection")]
    Closed,
    #[error("TLS error: {0}")]
    Tls(#[from] rustls::Error),
    #[error("TLS setup failed: {0}")]
    TlsSetup(String),
    #[error("the session id in the server hello is not this client's tls-unique")]
    BadSession,
    #[error("the server certificate chain does not match the key hash")]
    Identity,
    #[error("the server's signed session key (or a web client's identity proof) does not verify with its leaf certificate")]
    BadAuth,
    #[error("no SMP version in common with the server")]
    Version,
    #[error("a handshake block does not parse")]
    HandshakeParse,
    #[error("the server refused the service handshake: {0}")]
    ServiceRefused(String),
    #[error("block error: {0:?}")]
    Block(BlockError),
    #[error("a transmission does not fit in a block")]
    LargeMsg,
    #[error("the server sent a block that does not parse as a batch of transmissions")]
    BadBlock,
    #[error("an X25519 authenticator needs the server session key, which this session lacks")]
    NoServerKey,
    #[error("service authorization needs a service session")]
    NoServiceSession,
    #[error("WebSocket: {0}")]
    WebSocket(String),
    #[error("more than {0} unmatched transmissions are waiting")]
    TooManyPending(usize),
}

impl From<io::Error> for ClientError {
    fn from(e: io::Error) -> Self {
        match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => ClientError::Timeout,
            io::ErrorKind::UnexpectedEof
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe => ClientError::Closed,
            _ => match e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) {
                Some(t) => ClientError::Tls(t.clone()),
                None => ClientError::Io(e),
            },
        }
    }
}

impl From<ClientError> for io::Error {
    fn from(e: ClientError) -> Self {
        match e {
            ClientError::Io(e) => e,
            ClientError::Timeout => io::Error::new(io::ErrorKind::TimedOut, e),
            ClientError::Closed => io::Error::new(io::ErrorKind::UnexpectedEof, e),
            other => io::Error::other(other),
        }
    }
}

impl ClientError {
    /// True when the server ended the session: a TCP close or reset, or a TLS alert.
    pub fn is_closed(&self) -> bool {
        matches!(self, ClientError::Closed | ClientError::Tls(_))
    }
}

impl From<crate::transport::tls::TlsError> for ClientError {
    fn from(e: crate::transport::tls::TlsError) -> Self {
        use crate::transport::tls::TlsError;
        match e {
            TlsError::Rustls(e) => ClientError::Tls(e),
            TlsError::Io(e) => e.into(),
            TlsError::UnexpectedEof => ClientError::Closed,
            other => ClientError::TlsSetup(other.to_string()),
        }
    }
}
