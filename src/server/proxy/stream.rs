//! The proxy's TLS client connection over a glommio socket, driven by hand as the server side is
//! (`server::tls_stream`): rustls is sans-I/O, the handshake captures what the client writes to
//! compute its own tls-unique (`transport::tls::ClientCapture`), and afterwards a reader task and
//! a writer task share the stream through `RefCell`, each borrowing it for one synchronous poll.

use std::cell::RefCell;
use std::future::poll_fn;
use std::io::{self, Read, Write};
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures_lite::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use glommio::net::TcpStream;
use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ClientConnection};

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

pub struct ClientStream {
    sock: TcpStream,
    tls: ClientConnection,
    /// Ciphertext read from the socket that rustls could not take yet.
    pending: Vec<u8>,
    out: Vec<u8>,
    out_pos: usize,
}

pub type SharedClient = Rc<RefCell<ClientStream>>;

impl ClientStream {
    pub fn new(sock: TcpStream, tls: ClientConnection) -> Self {
        ClientStream {
            sock,
            tls,
            pending: Vec::new(),
            out: Vec::new(),
            out_pos: 0,
        }
    }

    fn poll_read_block(
        &mut self,
        cx: &mut Context<'_>,
        buf: &mut Vec<u8>,
        len: usize,
    ) -> Poll<io::Result<()>> {
        loop {
            let available = self
                .tls
                .process_new_packets()
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?
                .plaintext_bytes_to_read();
            if available > 0 {
                let filled = buf.len();
                buf.resize(len, 0);
                match self.tls.reader().read(&mut buf[filled..]) {
                    Ok(n) => buf.truncate(filled + n),
                    Err(e) => {
                        buf.truncate(filled);
                        return Poll::Ready(Err(e));
                    }
                }
                if buf.len() == len {
                    return Poll::Ready(Ok(()));
                }
                continue;
            }
            if self.tls.wants_read() || !self.pending.is_empty() {
                match self.poll_receive(cx) {
                    Poll::Ready(Ok(())) => continue,
                    other => return other,
                }
            }
            return Poll::Ready(Err(io::ErrorKind::UnexpectedEof.into()));
        }
    }

    fn poll_receive(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if !self.pending.is_empty() {
            let mut rest = &self.pending[..];
            self.tls.read_tls(&mut rest)?;
            let used = self.pending.len() - rest.len();
            self.pending.drain(..used);
        } else {
            let mut buf = [0u8; READ_CHUNK_BYTES];
            match Pin::new(&mut self.sock).poll_read(cx, &mut buf[..]) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::UnexpectedEof.into())),
                Poll::Ready(Ok(n)) => {
                    let mut rest = &buf[..n];
                    self.tls.read_tls(&mut rest)?;
                    self.pending.extend_from_slice(rest);
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
        self.drain_tls()?;
        Poll::Ready(Ok(()))
    }

    /// Encrypts `data` into the output buffer; `flush` sends it.
    pub fn queue(&mut self, data: &[u8]) -> io::Result<()> {
        self.tls.writer().write_all(data)?;
        self.drain_tls()
    }

    fn drain_tls(&mut self) -> io::Result<()> {
        while self.tls.wants_write() {
            self.tls.write_tls(&mut self.out)?;
        }
        Ok(())
    }

    fn poll_flush(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.out_pos < self.out.len() {
            match Pin::new(&mut self.sock).poll_write(cx, &self.out[self.out_pos..]) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Poll::Ready(Ok(n)) => self.out_pos += n,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
        self.out.clear();
        self.out_pos = 0;
        Poll::Ready(Ok(()))
    }

    fn poll_close(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.sock).poll_close(cx)
    }
}

/// Reads one block of `len` plaintext bytes into `buf` (cleared first).
pub async fn read_block(s: &SharedClient, buf: &mut Vec<u8>, len: usize) -> io::Result<()> {
    buf.clear();
    poll_fn(|cx| s.borrow_mut().poll_read_block(cx, buf, len)).await
}

/// Sends everything queued. Only one task may flush a stream (its writer).
pub async fn flush(s: &SharedClient) -> io::Result<()> {
    poll_fn(|cx| s.borrow_mut().poll_flush(cx)).await
}

/// close_notify, what is queued, then the socket; errors no longer matter.
pub async fn close(s: &SharedClient) {
    {
        let mut t = s.borrow_mut();
        t.tls.send_close_notify();
        let _ = t.drain_tls();
    }
    let _ = flush(s).await;
    let _ = poll_fn(|cx| s.borrow_mut().poll_close(cx)).await;
}
