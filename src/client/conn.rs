//! A blocking TLS connection for the client: TCP with read/write timeouts, a rustls client session,
//! and the client's own tls-unique (the verify_data of the Finished it wrote, simplexmq
//! `Transport.hs`, `tlsUnique`), computed by `transport::tls::ClientCapture` from the bytes the
//! client wrote.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use rustls::ClientConnection;

use super::error::ClientError;
use crate::transport::tls;

pub struct TlsConn {
    sock: TcpStream,
    tls: ClientConnection,
    tls_unique: Vec<u8>,
}

impl TlsConn {
    /// TCP connect, TLS handshake offering `alpn` (no extension when `None`), then the client's
    /// tls-unique.
    pub fn connect(
        addr: SocketAddr,
        alpn: Option<&[Vec<u8>]>,
        timeout: Duration,
    ) -> Result<Self, ClientError> {
        let mut sock = TcpStream::connect_timeout(&addr, timeout)?;
        sock.set_read_timeout(Some(timeout))?;
        sock.set_write_timeout(Some(timeout))?;
        sock.set_nodelay(true)?;
        let config = tls::client_config(alpn.map(|a| a.to_vec()).unwrap_or_default())?;
        let name = rustls::pki_types::ServerName::IpAddress(addr.ip().into());
        let mut capture = tls::ClientCapture::new(&config, name)?;
        capture.handshake_blocking(&mut sock)?;
        let (tls, tls_unique) = capture.finish()?;
        Ok(TlsConn {
            sock,
            tls,
            tls_unique,
        })
    }

    pub fn tls_unique(&self) -> &[u8] {
        &self.tls_unique
    }

    pub fn peer_certificates(&self) -> Vec<Vec<u8>> {
        self.tls
            .peer_certificates()
            .map(|cs| cs.iter().map(|c| c.as_ref().to_vec()).collect())
            .unwrap_or_default()
    }

    pub fn alpn_protocol(&self) -> Option<&[u8]> {
        self.tls.alpn_protocol()
    }

    pub fn set_read_timeout(&mut self, timeout: Duration) -> Result<(), ClientError> {
        Ok(self.sock.set_read_timeout(Some(timeout))?)
    }

    /// Writes application data and flushes it to the socket.
    pub fn write_all(&mut self, data: &[u8]) -> Result<(), ClientError> {
        self.tls.writer().write_all(data)?;
        self.flush()
    }

    fn flush(&mut self) -> Result<(), ClientError> {
        while self.tls.wants_write() {
            match self.tls.write_tls(&mut self.sock) {
                Ok(_) => {}
                // A signal arrived during the write (e.g. a child process of the test exiting).
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// Writes bytes straight to the TCP socket, bypassing TLS (bad-input tests).
    pub fn write_raw_tcp(&mut self, data: &[u8]) -> Result<(), ClientError> {
        self.sock.write_all(data)?;
        Ok(())
    }

    /// Sends a TLS close_notify and shuts the TCP write side: the server sees end of stream.
    pub fn close_write(&mut self) -> Result<(), ClientError> {
        self.tls.send_close_notify();
        self.flush()?;
        self.sock.shutdown(std::net::Shutdown::Write)?;
        Ok(())
    }

    /// Reads exactly `buf.len()` bytes of application data.
    pub fn read_exact(&mut self, buf: &mut [u8]) -> Result<(), ClientError> {
        let mut filled = 0;
        while filled < buf.len() {
            match self.tls.reader().read(&mut buf[filled..]) {
                Ok(0) => return Err(ClientError::Closed),
                Ok(n) => {
                    filled += n;
                    continue;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e.into()),
            }
            let n = match self.tls.read_tls(&mut self.sock) {
                Ok(n) => n,
                // A signal arrived during the read: not the peer's doing, read again.
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e.into()),
            };
            if n == 0 {
                return Err(ClientError::Closed);
            }
            let state = self.tls.process_new_packets();
            // Alerts go out before the error is reported, as a real client would.
            let _ = self.flush();
            state?;
        }
        Ok(())
    }

    /// Waits until the server closes the connection, discarding what it sends. Returns the number of
    /// application bytes received before the close; times out with the socket's read timeout.
    pub fn read_until_closed(&mut self, max_bytes: usize) -> Result<usize, ClientError> {
        let mut got = 0;
        let mut buf = [0u8; 4096];
        loop {
            match self.read_exact(&mut buf[..1]) {
                Ok(()) => {
                    got += 1;
                    if got > max_bytes {
                        return Ok(got);
                    }
                }
                Err(e) if e.is_closed() => return Ok(got),
                Err(e) => return Err(e),
            }
        }
    }
}
