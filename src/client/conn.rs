//! A blocking TLS connection for the client: TCP with read/write timeouts, a rustls client session,
//! and the client's own tls-unique (the verify_data of the Finished it wrote, simplexmq
//! `Transport.hs`, `tlsUnique`), computed by `transport::tls::ClientCapture` from the bytes the
//! client wrote. Optionally a WebSocket over it (`websocket_upgrade`): then every block is one
//! masked binary frame out and one binary message in (simplexmq
//! `src/Simplex/Messaging/Transport/WebSockets.hs`). The framing here is the client's own, written
//! from RFC 6455, not the relay's (`server/conn/ws.rs`), so that a bug in one is not hidden by the other.

use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::time::Duration;

use rustls::ClientConnection;

use super::error::ClientError;
use super::service::ClientCert;
use crate::transport::tls;

pub struct TlsConn {
    sock: TcpStream,
    tls: ClientConnection,
    tls_unique: Vec<u8>,
    /// Blocks travel as WebSocket messages.
    websocket: bool,
    /// The client certificate chain was sent in the TLS handshake.
    cert_sent: bool,
}

/// Bytes of the server's upgrade answer read at most.
const MAX_UPGRADE_ANSWER: usize = 8192;
/// The largest message the client reassembles (the reference's limit).
const MAX_WS_MESSAGE: usize = 65536;

impl TlsConn {
    /// TCP connect (from `local` when given), TLS handshake offering `alpn` (no extension when
    /// `None`) and presenting `cert` if the server asks, then the client's tls-unique.
    pub fn connect(
        addr: SocketAddr,
        alpn: Option<&[Vec<u8>]>,
        timeout: Duration,
        cert: Option<&ClientCert>,
        sni: Option<&str>,
        suites: tls::ClientSuites,
        local: Option<IpAddr>,
    ) -> Result<Self, ClientError> {
        let mut sock = match local {
            None => TcpStream::connect_timeout(&addr, timeout)?,
            Some(ip) => connect_from(ip, addr, timeout)?,
        };
        sock.set_read_timeout(Some(timeout))?;
        sock.set_write_timeout(Some(timeout))?;
        sock.set_nodelay(true)?;
        let alpn = alpn.map(|a| a.to_vec()).unwrap_or_default();
        let (config, sent) = match cert {
            _ if sni.is_some() => (tls::web_client_config(alpn, suites)?, None),
            None => (tls::client_config_offering(alpn, suites)?, None),
            Some(c) => {
                let (config, sent) =
                    tls::client_config_with_cert_sent(alpn, c.chain.clone(), &c.key, suites)?;
                (config, Some(sent))
            }
        };
        // No SNI (as SMP clients), unless a host name is given (`web_client_config`).
        let name = match sni {
            Some(host) => rustls::pki_types::ServerName::try_from(host.to_string())
                .map_err(|e| ClientError::TlsSetup(format!("host name {host}: {e}")))?,
            None => rustls::pki_types::ServerName::IpAddress(addr.ip().into()),
        };
        let mut capture = tls::ClientCapture::new(&config, name)?;
        capture.handshake_blocking(&mut sock)?;
        let (tls, tls_unique) = capture.finish()?;
        Ok(TlsConn {
            sock,
            tls,
            tls_unique,
            websocket: false,
            cert_sent: sent.is_some_and(|s| s.get()),
        })
    }

    /// The WebSocket opening handshake (RFC 6455 §4.1) for `path` on `host`; blocks are framed
    /// from here on.
    pub fn websocket_upgrade(&mut self, host: &str, path: &str) -> Result<(), ClientError> {
        use base64::Engine;
        let b64 = &base64::engine::general_purpose::STANDARD;
        let key = b64.encode(rand::random::<[u8; 16]>());
        let request = format!(
            "GET {path} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
        );
        self.write_all(request.as_bytes())?;
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            if head.len() >= MAX_UPGRADE_ANSWER {
                return Err(ClientError::WebSocket("upgrade answer too long".into()));
            }
            self.read_exact(&mut byte)?;
            head.push(byte[0]);
        }
        let head = String::from_utf8_lossy(&head);
        if !head.starts_with("HTTP/1.1 101 ") {
            let status = head.lines().next().unwrap_or("").to_string();
            return Err(ClientError::WebSocket(format!("upgrade refused: {status}")));
        }
        let mut sha1 = ring::digest::Context::new(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY);
        sha1.update(key.as_bytes());
        sha1.update(b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11");
        let expected = b64.encode(sha1.finish().as_ref());
        let accepted = head.lines().any(|l| {
            l.split_once(':').is_some_and(|(n, v)| {
                n.eq_ignore_ascii_case("sec-websocket-accept") && v.trim() == expected
            })
        });
        if !accepted {
            return Err(ClientError::WebSocket("wrong Sec-WebSocket-Accept".into()));
        }
        self.websocket = true;
        Ok(())
    }

    /// Writes one block: as is, or as one masked binary frame.
    pub fn write_block(&mut self, block: &[u8]) -> Result<(), ClientError> {
        if !self.websocket {
            return self.write_all(block);
        }
        let frame = client_frame(0x2, block);
        self.write_all(&frame)
    }

    /// Reads one block: `buf.len()` bytes, or one WebSocket message of exactly that length
    /// (answering pings on the way).
    pub fn read_block(&mut self, buf: &mut [u8]) -> Result<(), ClientError> {
        if !self.websocket {
            return self.read_exact(buf);
        }
        let bad = |why: &str| Err(ClientError::WebSocket(why.to_string()));
        let mut msg: Vec<u8> = Vec::new();
        loop {
            let mut h = [0u8; 2];
            self.read_exact(&mut h)?;
            let (fin, opcode, masked) = (h[0] & 0x80 != 0, h[0] & 0x0f, h[1] & 0x80 != 0);
            if h[0] & 0x70 != 0 || masked {
                return bad("reserved bits or a masked server frame");
            }
            let len = match h[1] & 0x7f {
                126 => {
                    let mut l = [0u8; 2];
                    self.read_exact(&mut l)?;
                    u16::from_be_bytes(l) as usize
                }
                127 => {
                    let mut l = [0u8; 8];
                    self.read_exact(&mut l)?;
                    u64::from_be_bytes(l) as usize
                }
                n => n as usize,
            };
            if len > MAX_WS_MESSAGE || msg.len() + len > MAX_WS_MESSAGE {
                return bad("message too large");
            }
            let mut payload = vec![0u8; len];
            self.read_exact(&mut payload)?;
            match opcode {
                0x8 => return Err(ClientError::Closed),
                0x9 => self.write_all(&client_frame(0xA, &payload))?,
                0xA => {}
                0x0 | 0x2 => {
                    msg.extend_from_slice(&payload);
                    if fin {
                        if msg.len() != buf.len() {
                            return bad("message is not one block");
                        }
                        buf.copy_from_slice(&msg);
                        return Ok(());
                    }
                }
                _ => return bad("unexpected opcode"),
            }
        }
    }

    pub fn tls_unique(&self) -> &[u8] {
        &self.tls_unique
    }

    /// Whether the client certificate chain was sent (the server asked for one).
    pub fn cert_sent(&self) -> bool {
        self.cert_sent
    }

    /// The TLS suite the server chose.
    pub fn cipher_suite(&self) -> Option<rustls::CipherSuite> {
        self.tls.negotiated_cipher_suite().map(|s| s.suite())
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

/// One final client frame: masked with a random key (RFC 6455 §5.3).
fn client_frame(opcode: u8, payload: &[u8]) -> Vec<u8> {
    let mut f = vec![0x80 | opcode];
    match payload.len() {
        n if n < 126 => f.push(0x80 | n as u8),
        n if n <= u16::MAX as usize => {
            f.push(0x80 | 126);
            f.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            f.push(0x80 | 127);
            f.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    let mask: [u8; 4] = rand::random();
    f.extend_from_slice(&mask);
    f.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    f
}

/// A TCP connection to `addr` from the local address `local` (port chosen by the kernel): bind,
/// then connect, within `timeout`.
fn connect_from(local: IpAddr, addr: SocketAddr, timeout: Duration) -> io::Result<TcpStream> {
    use socket2::{Domain, Protocol, Socket, Type};
    let sock = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    sock.bind(&SocketAddr::new(local, 0).into())?;
    sock.connect_timeout(&addr.into(), timeout)?;
    Ok(sock.into())
}
