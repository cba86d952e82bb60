//! A TLS session over a glommio socket, driven by hand: rustls is sans-I/O, so this reads ciphertext
//! from the socket only when rustls has no plaintext to give, and writes what rustls produced when the
//! connection flushes. Reading and writing whole 16384-byte blocks is all SMP needs.

use std::io::{self, Read, Write};

use futures_lite::{AsyncReadExt, AsyncWriteExt};
use glommio::net::TcpStream;
use rustls::ServerConnection;

use crate::limits::SOCKET_READ_BYTES;

pub struct TlsStream {
    sock: TcpStream,
    tls: ServerConnection,
    /// Ciphertext read from the socket and not yet given to rustls.
    pending: Vec<u8>,
    pending_pos: usize,
    /// Ciphertext rustls produced, waiting for `flush`.
    out: Vec<u8>,
}

impl TlsStream {
    /// `leftover` is ciphertext that arrived after the handshake bytes (a client may send its first
    /// records right behind its Finished).
    pub fn new(sock: TcpStream, tls: ServerConnection, leftover: Vec<u8>) -> Self {
        TlsStream {
            sock,
            tls,
            pending: leftover,
            pending_pos: 0,
            out: Vec::with_capacity(SOCKET_READ_BYTES),
        }
    }

    pub fn connection(&self) -> &ServerConnection {
        &self.tls
    }

    /// Fills `buf` with plaintext. A clean close or a reset before `buf` is full is `UnexpectedEof`.
    pub async fn read_exact(&mut self, buf: &mut [u8]) -> io::Result<()> {
        let mut filled = 0;
        while filled < buf.len() {
            match self.tls.reader().read(&mut buf[filled..]) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => filled += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.receive().await?,
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Gives rustls one more slice of ciphertext, reading the socket if none is pending.
    async fn receive(&mut self) -> io::Result<()> {
        if self.pending_pos >= self.pending.len() {
            self.pending.clear();
            self.pending_pos = 0;
            self.pending.resize(SOCKET_READ_BYTES, 0);
            let n = self.sock.read(&mut self.pending).await?;
            self.pending.truncate(n);
            if n == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
        }
        let mut rest = &self.pending[self.pending_pos..];
        let before = rest.len();
        self.tls.read_tls(&mut rest)?;
        self.pending_pos += before - rest.len();
        if let Err(e) = self.tls.process_new_packets() {
            // Tell the peer why before closing, as a TLS stack should (the alert is best-effort).
            let _ = self.drain_tls();
            let _ = self.flush().await;
            return Err(io::Error::new(io::ErrorKind::InvalidData, e));
        }
        // rustls may have produced records of its own (alerts, key updates).
        self.drain_tls()
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

    pub async fn flush(&mut self) -> io::Result<()> {
        if !self.out.is_empty() {
            self.sock.write_all(&self.out).await?;
            self.out.clear();
        }
        Ok(())
    }

    /// Sends close_notify and shuts the socket; errors are of no interest at that point.
    pub async fn close(mut self) {
        self.tls.send_close_notify();
        let _ = self.drain_tls();
        let _ = self.flush().await;
        let _ = self.sock.close().await;
    }
}
