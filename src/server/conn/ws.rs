//! SMP over WebSocket on the dedicated ports (`[TRANSPORT] websockets`, `start --websockets`): after
//! TLS, an HTTP/1.1 upgrade, then every block one binary message each way (simplexmq
//! `src/Simplex/Messaging/Transport/WebSockets.hs`). The SMP session is the one of `conn.rs`,
//! unchanged; only how a block is read and written differs (`Framing`), so a native connection
//! pays one branch per block for it.
//!
//! The relay sends each block as one unfragmented binary frame. It reassembles a client's
//! fragmented messages up to `WS_MAX_MESSAGE_BYTES` and accepts only messages of exactly one block;
//! a text message, a message of another length, an unmasked frame or any other protocol error
//! ends the connection with a close frame saying why. Pings are answered with pongs, a close with
//! a close.
//!
//! Pongs keep the rule that only a connection's writer flushes its stream (`tls_stream.rs`): the
//! reader keeps the latest ping's payload (RFC 6455 §5.5.3 allows answering only the latest) and
//! wakes the writer with an empty output, which writes it before its next flush. A client that
//! pings without reading so holds one pong, not one per ping.

use std::cell::{Cell, RefCell};
use std::io;

use glommio::channels::local_channel::LocalSender;

use crate::limits::{WS_MAX_MESSAGE_BYTES, WS_UPGRADE_MAX_BYTES};
use crate::server::conn::output::Output;
use crate::server::conn::tls_stream::{self, SharedTls, TlsStream};
use crate::transport::block::BLOCK_SIZE;
use crate::transport::websocket::{
    self as wsp, FrameStart, UpgradeError, BLOCK_FRAME_HEADER, CHALLENGE_BYTES, CLOSE_NORMAL,
    CLOSE_PROTOCOL_ERROR, CLOSE_TOO_BIG, CLOSE_UNSUPPORTED_DATA, MAX_CONTROL_PAYLOAD, OP_BINARY,
    OP_CLOSE, OP_CONTINUATION, OP_PING, OP_PONG, OP_TEXT,
};

/// What a listening port serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortKind {
    /// SMP over raw TLS (`[TRANSPORT] port`).
    Smp,
    /// SMP over WebSocket over TLS (`[TRANSPORT] websockets`).
    WebSocket,
    /// An SMP port that also serves web clients (`[WEB] https`): a TLS client naming a host gets
    /// the web certificate and WebSocket, one naming none raw SMP.
    Shared,
}

/// Why a WebSocket connection ended.
#[derive(Debug, thiserror::Error)]
pub enum WsError {
    #[error(transparent)]
    Io(#[from] io::Error),
    #[error("upgrade refused: {0}")]
    Upgrade(UpgradeError),
    #[error("WebSocket protocol: {0}")]
    Protocol(&'static str),
    #[error("the client closed the WebSocket")]
    Closed,
}

/// How a connection's blocks travel.
pub enum Framing {
    /// Each block is 16384 bytes of the TLS stream.
    Raw,
    /// Each block is one binary WebSocket message.
    WebSocket(WsState),
}

/// A WebSocket connection's state between blocks.
#[derive(Default)]
pub struct WsState {
    /// A fragmented message has begun and not yet ended.
    in_message: Cell<bool>,
    /// The payload of the latest ping not yet answered.
    pong: RefCell<Option<Vec<u8>>>,
    /// The status of the close frame to send before the connection is closed.
    close: Cell<Option<u16>>,
}

impl Framing {
    pub fn for_port(kind: PortKind) -> Framing {
        match kind {
            PortKind::Smp | PortKind::Shared => Framing::Raw,
            PortKind::WebSocket => Framing::WebSocket(WsState::default()),
        }
    }
}

/// Reads the client's upgrade request (at most `WS_UPGRADE_MAX_BYTES`) and answers it: `101` and
/// the WebSocket from here on, with the request's identity challenge if it had one; or an HTTP
/// error and `Err` (the caller closes the connection).
pub async fn upgrade(tls: &SharedTls) -> Result<Option<[u8; CHALLENGE_BYTES]>, WsError> {
    let head = read_head(tls, WS_UPGRADE_MAX_BYTES).await?;
    answer_upgrade(tls, head).await
}

/// Reads one request head, its empty line included; `None` when it is longer than `max`.
///
/// One byte at a time, so that nothing after the request's empty line is taken from the stream
/// (a client sends nothing more before the answer, RFC 6455 §4.1, but the SMP layer must start at
/// the first byte after it whatever the client does; a web page's next request must stay in the
/// stream too). A request is small and read once per connection or page.
pub async fn read_head(tls: &SharedTls, max: usize) -> io::Result<Option<Vec<u8>>> {
    let mut head: Vec<u8> = Vec::new();
    let mut byte = Vec::new();
    loop {
        if head.len() >= max {
            return Ok(None);
        }
        tls_stream::read_block(tls, &mut byte, 1).await?;
        head.push(byte[0]);
        if head.ends_with(b"\r\n\r\n") {
            return Ok(Some(head));
        }
    }
}

/// Answers an upgrade request read by `read_head` (`None`: it was too long), as `upgrade` does.
pub async fn answer_upgrade(
    tls: &SharedTls,
    head: Option<Vec<u8>>,
) -> Result<Option<[u8; CHALLENGE_BYTES]>, WsError> {
    let parsed = match head {
        Some(mut head) => {
            head.truncate(head.len().saturating_sub(4));
            wsp::parse_upgrade(&head)
        }
        None => Err(UpgradeError::TooLarge),
    };
    let answer = match &parsed {
        Ok(up) => wsp::switching_protocols(&up.key),
        Err(e) => wsp::refusal(*e),
    };
    tls.borrow_mut().queue(&answer)?;
    tls_stream::flush(tls).await?;
    parsed.map(|up| up.challenge).map_err(WsError::Upgrade)
}

/// Reads one block into `buf`. On a WebSocket, control frames met on the way are answered: by
/// the writer, woken through `writer`, once the session runs; at once before that (the SMP
/// handshake, when no writer task exists).
pub async fn read_block(
    tls: &SharedTls,
    framing: &Framing,
    buf: &mut Vec<u8>,
    writer: Option<&LocalSender<Output>>,
) -> Result<(), WsError> {
    let ws = match framing {
        Framing::Raw => return Ok(tls_stream::read_block(tls, buf, BLOCK_SIZE).await?),
        Framing::WebSocket(ws) => ws,
    };
    buf.clear();
    loop {
        match read_frame(tls, ws, buf).await {
            Ok(Frame::Block) => return Ok(()),
            Ok(Frame::Ping { wake }) => match writer {
                Some(w) => {
                    if wake {
                        let _ = w.try_send(Output {
                            groups: Vec::new(),
                            block_seq: None,
                        });
                    }
                }
                None => {
                    queue_control(&mut tls.borrow_mut(), framing)?;
                    tls_stream::flush(tls).await?;
                }
            },
            Ok(Frame::More) => {}
            Err(e) => return Err(e),
        }
    }
}

enum Frame {
    /// `buf` holds a whole block.
    Block,
    /// A ping to answer; `wake`: no earlier one was waiting, so the writer must be woken.
    Ping { wake: bool },
    /// A fragment, a pong: read on.
    More,
}

/// Reads one frame; the message being assembled is `msg`, kept by the caller across calls.
async fn read_frame(tls: &SharedTls, ws: &WsState, msg: &mut Vec<u8>) -> Result<Frame, WsError> {
    let fail = |code: u16, why: &'static str| {
        ws.close.set(Some(code));
        Err(WsError::Protocol(why))
    };
    let mut head = Vec::new();
    tls_stream::read_block(tls, &mut head, 2).await?;
    let f = FrameStart::parse([head[0], head[1]]);
    if f.rsv != 0 {
        return fail(CLOSE_PROTOCOL_ERROR, "reserved bits set (no extension)");
    }
    if !f.masked {
        // RFC 6455 §5.1: a server closes on an unmasked client frame.
        return fail(CLOSE_PROTOCOL_ERROR, "unmasked client frame");
    }
    let ext = f.extended_len_bytes();
    let len = if ext == 0 {
        u64::from(f.len7)
    } else {
        tls_stream::read_block(tls, &mut head, ext).await?;
        match f.payload_len(&head) {
            Some(n) => n,
            None => return fail(CLOSE_PROTOCOL_ERROR, "bad payload length"),
        }
    };
    if f.is_control() && (!f.fin || len > MAX_CONTROL_PAYLOAD as u64) {
        return fail(CLOSE_PROTOCOL_ERROR, "fragmented or long control frame");
    }
    match f.opcode {
        OP_BINARY if ws.in_message.get() => {
            return fail(CLOSE_PROTOCOL_ERROR, "new message inside a fragmented one")
        }
        OP_CONTINUATION if !ws.in_message.get() => {
            return fail(CLOSE_PROTOCOL_ERROR, "continuation without a message")
        }
        OP_TEXT => return fail(CLOSE_UNSUPPORTED_DATA, "text message"),
        OP_BINARY | OP_CONTINUATION | OP_CLOSE | OP_PING | OP_PONG => {}
        _ => return fail(CLOSE_PROTOCOL_ERROR, "unknown opcode"),
    }
    // The reference's frame limit is one block (`connectionFramePayloadSizeLimit`), its message
    // limit `WS_MAX_MESSAGE_BYTES`; both are checked before the payload is read.
    if !f.is_control()
        && (len > BLOCK_SIZE as u64 || msg.len() as u64 + len > WS_MAX_MESSAGE_BYTES as u64)
    {
        return fail(CLOSE_TOO_BIG, "message too large");
    }
    tls_stream::read_block(tls, &mut head, 4).await?;
    let mask = [head[0], head[1], head[2], head[3]];
    let len = len as usize;
    if f.is_control() {
        let mut payload = Vec::new();
        if len > 0 {
            tls_stream::read_block(tls, &mut payload, len).await?;
            wsp::unmask(&mut payload, mask);
        }
        return match f.opcode {
            OP_PING => Ok(Frame::Ping {
                wake: ws.pong.replace(Some(payload)).is_none(),
            }),
            OP_PONG => Ok(Frame::More),
            _ => {
                // Close: answered with the client's status (RFC 6455 §5.5.1), then the end.
                let code = match payload.len() {
                    0 => CLOSE_NORMAL,
                    1 => return fail(CLOSE_PROTOCOL_ERROR, "close frame of one byte"),
                    _ => u16::from_be_bytes([payload[0], payload[1]]),
                };
                ws.close.set(Some(code));
                Err(WsError::Closed)
            }
        };
    }
    ws.in_message.set(true);
    if len > 0 {
        let start = msg.len();
        if start == 0 {
            // The usual case, one frame per block: straight into the block buffer.
            tls_stream::read_block(tls, msg, len).await?;
        } else {
            let mut part = Vec::new();
            tls_stream::read_block(tls, &mut part, len).await?;
            msg.extend_from_slice(&part);
        }
        wsp::unmask(&mut msg[start..], mask);
    }
    if !f.fin {
        return Ok(Frame::More);
    }
    ws.in_message.set(false);
    if msg.len() != BLOCK_SIZE {
        return fail(CLOSE_UNSUPPORTED_DATA, "message is not one block");
    }
    Ok(Frame::Block)
}

/// Queues one block: as is, or as one binary frame.
pub fn queue_block(tls: &mut TlsStream, framing: &Framing, block: &[u8]) -> io::Result<()> {
    match framing {
        Framing::Raw => tls.queue(block),
        Framing::WebSocket(_) => {
            debug_assert_eq!(block.len(), BLOCK_SIZE);
            tls.queue_parts(&[&BLOCK_FRAME_HEADER, block])
        }
    }
}

/// Queues the pong for the latest ping, if one is waiting (the writer, before each flush).
pub fn queue_control(tls: &mut TlsStream, framing: &Framing) -> io::Result<()> {
    if let Framing::WebSocket(ws) = framing {
        if let Some(payload) = ws.pong.take() {
            tls.queue(&wsp::control_frame(OP_PONG, &payload))?;
        }
    }
    Ok(())
}

/// Queues the close frame, if the connection ends with one (the client's close, answered, or a
/// protocol error); the caller closes TLS after it.
pub fn queue_close(tls: &SharedTls, framing: &Framing) {
    if let Framing::WebSocket(ws) = framing {
        if let Some(code) = ws.close.take() {
            let _ = tls.borrow_mut().queue(&wsp::close_frame(code));
        }
    }
}
