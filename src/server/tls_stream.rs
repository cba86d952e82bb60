//! A TLS session over a glommio socket, driven by hand: rustls is sans-I/O, so this reads ciphertext
//! only when rustls has no plaintext to give, and writes what rustls produced when the connection
//! flushes. Reading and writing whole 16384-byte blocks is all SMP needs.
//!
//! Idle connections must cost little (`DESIGN.md` §1: tens of thousands per shard), so a connection
//! owns no read buffer while it waits: glommio's reads are readiness-based, and the bytes land in one
//! scratch buffer per shard that is handed to rustls at once. Only what rustls cannot take yet is
//! copied into the connection, and output buffers are released after each flush.

use std::cell::RefCell;
use std::future::poll_fn;
use std::io::{self, Read, Write};
use std::pin::Pin;
use std::rc::Rc;
use std::task::Poll;

use futures_lite::{AsyncRead, AsyncWriteExt};
use glommio::net::TcpStream;
use rustls::ServerConnection;

/// One per shard: the destination of every socket read on that shard.
pub type ReadScratch = Rc<RefCell<Vec<u8>>>;

pub fn new_scratch() -> ReadScratch {
    Rc::new(RefCell::new(vec![0u8; crate::limits::SOCKET_READ_BYTES]))
}

pub struct TlsStream {
    sock: TcpStream,
    tls: ServerConnection,
    scratch: ReadScratch,
    /// Ciphertext read from the socket that rustls could not take yet (usually empty).
    pending: Vec<u8>,
    /// Ciphertext rustls produced, waiting for `flush`.
    out: Vec<u8>,
}

impl TlsStream {
    pub fn new(sock: TcpStream, tls: ServerConnection, scratch: ReadScratch) -> Self {
        TlsStream {
            sock,
            tls,
            scratch,
            pending: Vec::new(),
            out: Vec::new(),
        }
    }

    pub fn connection(&self) -> &ServerConnection {
        &self.tls
    }

    /// Reads one block of `buf.len()` plaintext bytes into `buf`, which is cleared first and only
    /// grown once the first byte of the block is there. A close before the block is complete is
    /// `UnexpectedEof`.
    pub async fn read_block(&mut self, buf: &mut Vec<u8>, len: usize) -> io::Result<()> {
        buf.clear();
        while self
            .tls
            .process_new_packets()
            .map_err(invalid)?
            .plaintext_bytes_to_read()
            == 0
        {
            self.receive().await?;
        }
        buf.resize(len, 0);
        let mut filled = 0;
        while filled < len {
            match self.tls.reader().read(&mut buf[filled..]) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => filled += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.receive().await?,
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Gives rustls more ciphertext: what is pending, or else what the socket has.
    async fn receive(&mut self) -> io::Result<()> {
        if self.pending.is_empty() {
            let TlsStream {
                sock,
                tls,
                scratch,
                pending,
                ..
            } = self;
            poll_fn(|cx| {
                let mut buf = scratch.borrow_mut();
                match Pin::new(&mut *sock).poll_read(cx, &mut buf[..]) {
                    Poll::Ready(Ok(0)) => Poll::Ready(Err(io::ErrorKind::UnexpectedEof.into())),
                    Poll::Ready(Ok(n)) => {
                        let mut rest = &buf[..n];
                        // rustls takes what fits its buffer; keep the remainder for later.
                        if let Err(e) = tls.read_tls(&mut rest) {
                            return Poll::Ready(Err(e));
                        }
                        pending.extend_from_slice(rest);
                        Poll::Ready(Ok(()))
                    }
                    Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
                    Poll::Pending => Poll::Pending,
                }
            })
            .await?;
        } else {
            let mut rest = &self.pending[..];
            self.tls.read_tls(&mut rest)?;
            let used = self.pending.len() - rest.len();
            self.pending.drain(..used);
            if self.pending.is_empty() {
                self.pending = Vec::new();
            }
        }
        if let Err(e) = self.tls.process_new_packets() {
            // Tell the peer why before closing, as a TLS stack should (the alert is best-effort).
            let _ = self.drain_tls();
            let _ = self.flush().await;
            return Err(invalid(e));
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
            let out = std::mem::take(&mut self.out);
            self.sock.write_all(&out).await?;
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

fn invalid(e: rustls::Error) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}
