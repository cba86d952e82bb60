//! A TLS session over a glommio socket, driven by hand: rustls is sans-I/O, so this reads ciphertext
//! only when rustls has no plaintext to give, and writes what rustls produced when the connection
//! flushes. Reading and writing whole 16384-byte blocks is all SMP needs. Both sides use it: client
//! connections of the relay (`ServerConnection`) and the proxy's sessions to destination relays
//! (`ClientConnection`).
//!
//! A connection's reader and writer are two tasks sharing one `TlsStream` through `RefCell`; every
//! method borrows it for one synchronous poll only, never across an await.
//!
//! Idle connections must cost little (`docs/ARCHITECTURE.md` §4: tens of thousands per shard), so a
//! connection owns no read buffer while it waits: glommio's reads are readiness-based, and the
//! bytes land in one scratch buffer per shard that is handed to rustls at once. Only what rustls
//! cannot take yet is copied into the connection, and output buffers are released after each flush.

use std::cell::RefCell;
use std::future::poll_fn;
use std::io::{self, Read, Write};
use std::ops::DerefMut;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};

use futures_lite::{AsyncRead, AsyncWrite};
use glommio::net::TcpStream;
use rustls::{ConnectionCommon, ServerConnection};

/// One per shard: the destination of every socket read on that shard.
pub type ReadScratch = Rc<RefCell<Vec<u8>>>;

pub fn new_scratch() -> ReadScratch {
    Rc::new(RefCell::new(vec![0u8; crate::limits::SOCKET_READ_BYTES]))
}

pub struct TlsStream<C = ServerConnection> {
    sock: TcpStream,
    tls: C,
    scratch: ReadScratch,
    /// Ciphertext read from the socket that rustls could not take yet (usually empty).
    pending: Vec<u8>,
    /// Ciphertext rustls produced while reading (alerts, key updates), and how much of it the
    /// socket took; application records are written from rustls to the socket directly.
    out: Vec<u8>,
    out_pos: usize,
    /// Bytes the socket has taken so far: how the slow-reader watchdog tells a slow reader from
    /// one that does not read.
    written: u64,
}

pub type SharedTls<C = ServerConnection> = Rc<RefCell<TlsStream<C>>>;

impl<C, D> TlsStream<C>
where
    C: DerefMut<Target = ConnectionCommon<D>>,
{
    pub fn new(sock: TcpStream, mut tls: C, scratch: ReadScratch) -> Self {
        // Records stay in rustls until the socket takes them (no copy into a buffer of ours);
        // what a connection may have queued is bounded by its output limit (`conn.rs`), so
        // rustls' own 64 KB limit would only turn a full buffer into a write error.
        tls.set_buffer_limit(None);
        TlsStream {
            sock,
            tls,
            scratch,
            pending: Vec::new(),
            out: Vec::new(),
            out_pos: 0,
            written: 0,
        }
    }

    pub fn connection(&self) -> &C {
        &self.tls
    }

    /// Moves plaintext into `buf` until it holds `len` bytes. `buf` grows only once plaintext is
    /// there, so a connection waiting for its next block holds no block buffer.
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
                .map_err(|e| self.fail(e))?
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
            // rustls has seen close_notify: the peer closed cleanly mid-block or between blocks.
            return Poll::Ready(Err(io::ErrorKind::UnexpectedEof.into()));
        }
    }

    /// Gives rustls more ciphertext: what is pending, or else what the socket has.
    fn poll_receive(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if !self.pending.is_empty() {
            let mut rest = &self.pending[..];
            self.tls.read_tls(&mut rest)?;
            let used = self.pending.len() - rest.len();
            self.pending.drain(..used);
            if self.pending.is_empty() {
                self.pending = Vec::new();
            }
        } else {
            let mut buf = self.scratch.borrow_mut();
            match Pin::new(&mut self.sock).poll_read(cx, &mut buf[..]) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::UnexpectedEof.into())),
                Poll::Ready(Ok(n)) => {
                    let mut rest = &buf[..n];
                    // rustls takes what fits its buffer; keep the remainder for later.
                    self.tls.read_tls(&mut rest)?;
                    self.pending.extend_from_slice(rest);
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => {
                    // Nothing to read: rustls may give its record buffer back meanwhile.
                    release_tls_buffer(&mut self.tls);
                    return Poll::Pending;
                }
            }
        }
        // rustls may have produced records of its own (alerts, key updates).
        self.drain_tls()?;
        Poll::Ready(Ok(()))
    }

    /// A TLS error: queue the alert that tells the peer why (sent by the next flush).
    fn fail(&mut self, e: rustls::Error) -> io::Error {
        let _ = self.drain_tls();
        io::Error::new(io::ErrorKind::InvalidData, e)
    }

    /// Encrypts `data` into rustls' record buffer; a flush sends it.
    pub fn queue(&mut self, data: &[u8]) -> io::Result<()> {
        self.tls.writer().write_all(data)
    }

    /// Encrypts `parts` as one piece of plaintext (a WebSocket frame header and its block go into
    /// the same records rather than a record of 4 bytes each time).
    pub fn queue_parts(&mut self, parts: &[&[u8]]) -> io::Result<()> {
        let slices: Vec<io::IoSlice<'_>> = parts.iter().map(|p| io::IoSlice::new(p)).collect();
        let mut done = self.tls.writer().write_vectored(&slices)?;
        // rustls takes all of it (no buffer limit, see `new`); should it take less, the rest
        // follows in order.
        for p in parts {
            if done >= p.len() {
                done -= p.len();
                continue;
            }
            self.tls.writer().write_all(&p[done..])?;
            done = 0;
        }
        Ok(())
    }

    fn drain_tls(&mut self) -> io::Result<()> {
        while self.tls.wants_write() {
            self.tls.write_tls(&mut self.out)?;
        }
        Ok(())
    }

    pub fn written_bytes(&self) -> u64 {
        self.written
    }

    pub fn has_output(&self) -> bool {
        self.out_pos < self.out.len() || self.tls.wants_write()
    }

    /// Writes `out` (it is older), then rustls' records straight from rustls to the socket.
    fn poll_flush(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.out_pos < self.out.len() {
            match Pin::new(&mut self.sock).poll_write(cx, &self.out[self.out_pos..]) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Poll::Ready(Ok(n)) => {
                    self.out_pos += n;
                    self.written += n as u64;
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
        if !self.out.is_empty() {
            self.out = Vec::new();
            self.out_pos = 0;
        }
        while self.tls.wants_write() {
            let mut sock = SocketWriter {
                sock: &mut self.sock,
                cx,
            };
            match self.tls.write_tls(&mut sock) {
                Ok(0) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Ok(n) => self.written += n as u64,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Poll::Pending,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
        Poll::Ready(Ok(()))
    }

    fn poll_close(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.sock).poll_close(cx)
    }
}

/// The socket as a synchronous writer for rustls' `write_tls`, within one poll: "would block"
/// when the socket is full (the task is then woken by the socket, as for any poll).
struct SocketWriter<'a, 'b> {
    sock: &'a mut TcpStream,
    cx: &'a mut Context<'b>,
}

impl Write for SocketWriter<'_, '_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match Pin::new(&mut *self.sock).poll_write(self.cx, buf) {
            Poll::Ready(r) => r,
            Poll::Pending => Err(io::ErrorKind::WouldBlock.into()),
        }
    }

    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        match Pin::new(&mut *self.sock).poll_write_vectored(self.cx, bufs) {
            Poll::Ready(r) => r,
            Poll::Pending => Err(io::ErrorKind::WouldBlock.into()),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Gives back rustls' record buffer while the socket has nothing to read. rustls grows it to
/// hold a whole record (a 16 KB block's grows it to 32 KiB) and makes it small again (4 KiB)
/// only when it next reads with nothing buffered: an idle connection kept the 32 KiB of its
/// last block, most of its memory. A read that would block is that next read: rustls
/// resizes its buffer, takes no byte and changes no other state (rustls 0.23
/// `DeframerVecBuffer::prepare_read`; a partial record is kept whole). Done each time the socket
/// has nothing more, so the memory goes back before the next connection's handshake needs it (a
/// release only after some idle time came too late: by then the freed buffers lay between live
/// allocations and the process's memory did not shrink); a busy connection regrows the buffer
/// once per pause, a few copies of at most 28 KiB for a block of up to 16 KB.
fn release_tls_buffer<D>(tls: &mut ConnectionCommon<D>) {
    struct WouldBlock;
    impl Read for WouldBlock {
        fn read(&mut self, _: &mut [u8]) -> io::Result<usize> {
            Err(io::ErrorKind::WouldBlock.into())
        }
    }
    let _ = tls.read_tls(&mut WouldBlock);
}

/// Reads one block of `len` plaintext bytes into `buf` (cleared first).
pub async fn read_block<C, D>(s: &SharedTls<C>, buf: &mut Vec<u8>, len: usize) -> io::Result<()>
where
    C: DerefMut<Target = ConnectionCommon<D>>,
{
    buf.clear();
    poll_fn(|cx| s.borrow_mut().poll_read_block(cx, buf, len)).await
}

/// Sends everything queued. Only one task may flush a stream (its writer).
pub async fn flush<C, D>(s: &SharedTls<C>) -> io::Result<()>
where
    C: DerefMut<Target = ConnectionCommon<D>>,
{
    poll_fn(|cx| s.borrow_mut().poll_flush(cx)).await
}

/// Sends close_notify and what is queued, then closes the socket; errors no longer matter.
pub async fn close<C, D>(s: &SharedTls<C>)
where
    C: DerefMut<Target = ConnectionCommon<D>>,
{
    {
        let mut t = s.borrow_mut();
        t.tls.send_close_notify();
        let _ = t.drain_tls();
    }
    let _ = flush(s).await;
    let _ = poll_fn(|cx| s.borrow_mut().poll_close(cx)).await;
}
