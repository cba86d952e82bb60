//! WebSocket (RFC 6455) for SMP, sans-I/O: the server's side of the HTTP/1.1 upgrade and the frame
//! layout. The reference serves SMP over WebSocket with every 16384-byte block one binary message,
//! frames of at most one block, messages of at most 65536 bytes, no compression and no subprotocol
//! (simplexmq `src/Simplex/Messaging/Transport/WebSockets.hs`, `websocketsOpts`, `cGet`, `cPut`).
//! The I/O around it is `server/conn/ws.rs`.

use base64::Engine;

use crate::limits::WS_UPGRADE_MAX_HEADERS;
use crate::transport::block::BLOCK_SIZE;

/// Appended to the client's key before hashing (RFC 6455 §1.3).
const ACCEPT_GUID: &[u8] = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

pub const OP_CONTINUATION: u8 = 0x0;
pub const OP_TEXT: u8 = 0x1;
pub const OP_BINARY: u8 = 0x2;
pub const OP_CLOSE: u8 = 0x8;
pub const OP_PING: u8 = 0x9;
pub const OP_PONG: u8 = 0xA;

/// Control frames carry at most this much (RFC 6455 §5.5).
pub const MAX_CONTROL_PAYLOAD: usize = 125;

/// Close status codes (RFC 6455 §7.4.1).
pub const CLOSE_NORMAL: u16 = 1000;
pub const CLOSE_PROTOCOL_ERROR: u16 = 1002;
pub const CLOSE_UNSUPPORTED_DATA: u16 = 1003;
pub const CLOSE_TOO_BIG: u16 = 1009;

/// The header of every frame the relay sends with a block: FIN, binary, the 16-bit length form,
/// 16384, unmasked (a server never masks, RFC 6455 §5.1).
pub const BLOCK_FRAME_HEADER: [u8; 4] = {
    let len = (BLOCK_SIZE as u16).to_be_bytes();
    [0x80 | OP_BINARY, 126, len[0], len[1]]
};
const _: () = assert!(BLOCK_SIZE > 125 && BLOCK_SIZE <= u16::MAX as usize);

/// `Sec-WebSocket-Accept` for a client's `Sec-WebSocket-Key`: base64(SHA-1(key ‖ GUID)).
pub fn accept_key(key: &str) -> String {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY);
    ctx.update(key.as_bytes());
    ctx.update(ACCEPT_GUID);
    base64::engine::general_purpose::STANDARD.encode(ctx.finish().as_ref())
}

/// Why an upgrade request is refused; each has its HTTP answer (`refusal`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum UpgradeError {
    #[error("not an HTTP/1.1 GET request")]
    RequestLine,
    #[error("malformed header")]
    Header,
    #[error("more than {WS_UPGRADE_MAX_HEADERS} headers")]
    TooManyHeaders,
    #[error("request headers too large")]
    TooLarge,
    #[error("no Host header")]
    NoHost,
    #[error("not a WebSocket upgrade (Upgrade/Connection headers)")]
    NotUpgrade,
    #[error("missing or malformed Sec-WebSocket-Key")]
    Key,
    #[error("Sec-WebSocket-Version is not 13")]
    Version,
}

/// A web client's identity challenge: 32 random bytes the relay signs in its server hello.
pub const CHALLENGE_BYTES: usize = 32;

/// An accepted upgrade request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upgrade {
    /// `Sec-WebSocket-Key`, for the answer's `Sec-WebSocket-Accept`.
    pub key: String,
    /// The request target's `challenge=` value (`challenge`).
    pub challenge: Option<[u8; CHALLENGE_BYTES]>,
}

/// The identity challenge of a request target, as the reference's web transport reads it
/// (simplexmq `Transport/WebSockets.hs`, `parseChallenge`): the text after the first
/// `challenge=` anywhere in the target, up to the next `&`, must be unpadded base64url of exactly
/// 32 bytes; anything else is no challenge (the session goes on, without a proof).
pub fn challenge(target: &str) -> Option<[u8; CHALLENGE_BYTES]> {
    let (_, rest) = target.split_once("challenge=")?;
    let value = rest.split('&').next().unwrap_or("");
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(value)
        .ok()?;
    bytes.try_into().ok()
}

/// The upgrade request head (request line and headers, up to and without the empty line) of a
/// WebSocket handshake (RFC 6455 §4.2.1); any path is accepted.
pub fn parse_upgrade(head: &[u8]) -> Result<Upgrade, UpgradeError> {
    let head = std::str::from_utf8(head).map_err(|_| UpgradeError::Header)?;
    let mut lines = head.split("\r\n");
    let request = lines.next().unwrap_or("");
    let mut parts = request.split(' ');
    let (method, target, http) = (parts.next(), parts.next(), parts.next());
    let version_ok = matches!(http, Some("HTTP/1.1"));
    if method != Some("GET")
        || target.is_none_or(str::is_empty)
        || !version_ok
        || parts.next().is_some()
    {
        return Err(UpgradeError::RequestLine);
    }
    let (mut host, mut upgrade, mut connection, mut key, mut version) =
        (false, false, false, None, None);
    for (n, line) in lines.enumerate() {
        if n >= WS_UPGRADE_MAX_HEADERS {
            return Err(UpgradeError::TooManyHeaders);
        }
        // Obsolete line folding (a line starting with white space) is refused (RFC 9112 §5.2).
        if line.starts_with([' ', '\t']) {
            return Err(UpgradeError::Header);
        }
        let (name, value) = line.split_once(':').ok_or(UpgradeError::Header)?;
        if name.is_empty() || name.contains([' ', '\t']) {
            return Err(UpgradeError::Header);
        }
        let value = value.trim_matches([' ', '\t']);
        let has_token = |token: &str| {
            value
                .split(',')
                .any(|t| t.trim_matches([' ', '\t']).eq_ignore_ascii_case(token))
        };
        match name.to_ascii_lowercase().as_str() {
            "host" => host = true,
            "upgrade" => upgrade |= has_token("websocket"),
            "connection" => connection |= has_token("upgrade"),
            "sec-websocket-key" => key = Some(value.to_string()),
            "sec-websocket-version" => version = Some(value.to_string()),
            // Extensions (permessage-deflate) and subprotocols are declined by not naming them in
            // the answer (RFC 6455 §9.1, §11.3.4); other headers do not matter.
            _ => {}
        }
    }
    if !host {
        return Err(UpgradeError::NoHost);
    }
    if !upgrade || !connection {
        return Err(UpgradeError::NotUpgrade);
    }
    let key = key.ok_or(UpgradeError::Key)?;
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(&key)
        .map_err(|_| UpgradeError::Key)?;
    if decoded.len() != 16 {
        return Err(UpgradeError::Key);
    }
    if version.as_deref() != Some("13") {
        return Err(UpgradeError::Version);
    }
    Ok(Upgrade {
        key,
        challenge: target.and_then(challenge),
    })
}

/// `101 Switching Protocols` for a client's key: no extension, no subprotocol.
pub fn switching_protocols(key: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Accept: {}\r\n\r\n",
        accept_key(key)
    )
    .into_bytes()
}

/// The HTTP answer to a refused upgrade; the connection is closed after it.
pub fn refusal(e: UpgradeError) -> Vec<u8> {
    let (status, extra) = match e {
        // RFC 6455 §4.4: say which version this server speaks.
        UpgradeError::Version => ("426 Upgrade Required", "Sec-WebSocket-Version: 13\r\n"),
        UpgradeError::TooLarge | UpgradeError::TooManyHeaders => {
            ("431 Request Header Fields Too Large", "")
        }
        _ => ("400 Bad Request", ""),
    };
    format!("HTTP/1.1 {status}\r\n{extra}Connection: close\r\nContent-Length: 0\r\n\r\n")
        .into_bytes()
}

/// The first two bytes of a frame (RFC 6455 §5.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameStart {
    pub fin: bool,
    /// RSV1–3: no extension is negotiated, so they must be 0.
    pub rsv: u8,
    pub opcode: u8,
    pub masked: bool,
    /// 0–125: the length; 126: a 16-bit length follows; 127: a 64-bit length follows.
    pub len7: u8,
}

impl FrameStart {
    pub fn parse(b: [u8; 2]) -> FrameStart {
        FrameStart {
            fin: b[0] & 0x80 != 0,
            rsv: (b[0] >> 4) & 0x7,
            opcode: b[0] & 0x0f,
            masked: b[1] & 0x80 != 0,
            len7: b[1] & 0x7f,
        }
    }

    /// Bytes of the extended length that follow (0, 2 or 8).
    pub fn extended_len_bytes(&self) -> usize {
        match self.len7 {
            126 => 2,
            127 => 8,
            _ => 0,
        }
    }

    /// The payload length from the extended length bytes; `None` when the 64-bit form has its most
    /// significant bit set (RFC 6455 §5.2) or a longer form than needed is used.
    pub fn payload_len(&self, ext: &[u8]) -> Option<u64> {
        match self.len7 {
            126 => {
                let n = u16::from_be_bytes(ext.try_into().ok()?) as u64;
                (n >= 126).then_some(n)
            }
            127 => {
                let n = u64::from_be_bytes(ext.try_into().ok()?);
                (n >> 63 == 0 && n > u16::MAX as u64).then_some(n)
            }
            n => Some(n as u64),
        }
    }

    pub fn is_control(&self) -> bool {
        self.opcode & 0x8 != 0
    }
}

/// XORs `data` with the 4-byte masking key (RFC 6455 §5.3).
pub fn unmask(data: &mut [u8], mask: [u8; 4]) {
    for (i, b) in data.iter_mut().enumerate() {
        *b ^= mask[i & 3];
    }
}

/// An unmasked control frame from the server (payload at most 125 bytes, cut if longer).
pub fn control_frame(opcode: u8, payload: &[u8]) -> Vec<u8> {
    let payload = &payload[..payload.len().min(MAX_CONTROL_PAYLOAD)];
    let mut f = Vec::with_capacity(2 + payload.len());
    f.push(0x80 | opcode);
    f.push(payload.len() as u8);
    f.extend_from_slice(payload);
    f
}

/// A close frame with a status code.
pub fn close_frame(code: u16) -> Vec<u8> {
    control_frame(OP_CLOSE, &code.to_be_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(lines: &[&str]) -> Vec<u8> {
        lines.join("\r\n").into_bytes()
    }

    const GOOD: [&str; 6] = [
        "GET /any/path?x=1 HTTP/1.1",
        "Host: relay.example",
        "Upgrade: websocket",
        "Connection: keep-alive, Upgrade",
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
        "Sec-WebSocket-Version: 13",
    ];

    #[test]
    fn accept_key_is_the_rfc_example() {
        // RFC 6455 §1.3.
        assert_eq!(
            accept_key("dGhlIHNhbXBsZSBub25jZQ=="),
            "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
        );
        let answer = String::from_utf8(switching_protocols("dGhlIHNhbXBsZSBub25jZQ==")).unwrap();
        assert!(answer.starts_with("HTTP/1.1 101 Switching Protocols\r\n"));
        assert!(answer.contains("\r\nSec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n"));
        assert!(!answer.contains("Extensions") && !answer.contains("Protocol:"));
        assert!(answer.ends_with("\r\n\r\n"));
    }

    #[test]
    fn upgrade_requests() {
        assert_eq!(
            parse_upgrade(&request(&GOOD)),
            Ok(Upgrade {
                key: "dGhlIHNhbXBsZSBub25jZQ==".into(),
                challenge: None
            })
        );
        // Header names are case-insensitive, and extensions offered are simply not taken.
        let mut lower: Vec<String> = GOOD.iter().map(|l| l.to_string()).collect();
        lower[2] = "upgrade: WebSocket".into();
        lower.push("Sec-WebSocket-Extensions: permessage-deflate".into());
        let lower: Vec<&str> = lower.iter().map(String::as_str).collect();
        assert!(parse_upgrade(&request(&lower)).is_ok());
        let without = |i: usize| {
            let mut l = GOOD.to_vec();
            l.remove(i);
            parse_upgrade(&request(&l))
        };
        assert_eq!(without(1), Err(UpgradeError::NoHost));
        assert_eq!(without(2), Err(UpgradeError::NotUpgrade));
        assert_eq!(without(3), Err(UpgradeError::NotUpgrade));
        assert_eq!(without(4), Err(UpgradeError::Key));
        assert_eq!(without(5), Err(UpgradeError::Version));
        let with = |i: usize, line: &str| {
            let mut l = GOOD.to_vec();
            l[i] = line;
            parse_upgrade(&request(&l))
        };
        assert_eq!(
            with(5, "Sec-WebSocket-Version: 8"),
            Err(UpgradeError::Version)
        );
        assert_eq!(
            with(4, "Sec-WebSocket-Key: c2hvcnQ="),
            Err(UpgradeError::Key)
        );
        assert_eq!(with(0, "POST / HTTP/1.1"), Err(UpgradeError::RequestLine));
        assert_eq!(with(0, "GET / HTTP/1.0"), Err(UpgradeError::RequestLine));
        assert_eq!(with(1, " folded"), Err(UpgradeError::Header));
        let mut many = GOOD.to_vec();
        many.extend(std::iter::repeat_n("X-A: b", WS_UPGRADE_MAX_HEADERS));
        assert_eq!(
            parse_upgrade(&request(&many)),
            Err(UpgradeError::TooManyHeaders)
        );
        let refused = String::from_utf8(refusal(UpgradeError::Version)).unwrap();
        assert!(refused.starts_with("HTTP/1.1 426 "));
        assert!(refused.contains("\r\nSec-WebSocket-Version: 13\r\n"));
    }

    #[test]
    fn challenges() {
        let bytes: Vec<u8> = (0..32).collect();
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(&bytes);
        assert_eq!(b64.len(), 43);
        let want = Some(<[u8; 32]>::try_from(bytes.as_slice()).unwrap());
        assert_eq!(challenge(&format!("/?challenge={b64}")), want);
        assert_eq!(challenge(&format!("/smp?a=1&challenge={b64}&b=2")), want);
        // The first `challenge=` anywhere in the target counts, as the reference's substring search.
        assert_eq!(challenge(&format!("/xchallenge={b64}")), want);
        assert_eq!(
            challenge(&format!("/?challenge={b64}&challenge=AAAA")),
            want
        );
        // Padded, standard alphabet, 31 or 33 bytes, empty, absent: no challenge.
        let padded = base64::engine::general_purpose::URL_SAFE.encode(&bytes);
        assert_eq!(challenge(&format!("/?challenge={padded}")), None);
        let odd: Vec<u8> = vec![0xfb; 32];
        let std_alphabet = base64::engine::general_purpose::STANDARD_NO_PAD.encode(&odd);
        assert!(std_alphabet.contains('+') || std_alphabet.contains('/'));
        assert_eq!(challenge(&format!("/?challenge={std_alphabet}")), None);
        for n in [31, 33] {
            let b = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(vec![7u8; n]);
            assert_eq!(challenge(&format!("/?challenge={b}")), None);
        }
        assert_eq!(challenge("/?challenge="), None);
        assert_eq!(challenge("/smp"), None);
        let mut with_challenge = GOOD.to_vec();
        let line = format!("GET /smp?challenge={b64} HTTP/1.1");
        with_challenge[0] = &line;
        assert_eq!(
            parse_upgrade(&request(&with_challenge)).unwrap().challenge,
            want
        );
    }

    #[test]
    fn frame_headers() {
        let f = FrameStart::parse(BLOCK_FRAME_HEADER[..2].try_into().unwrap());
        assert!(f.fin && !f.masked && f.rsv == 0 && f.opcode == OP_BINARY);
        assert_eq!(f.payload_len(&BLOCK_FRAME_HEADER[2..]), Some(16384));
        let f = FrameStart::parse([0x01, 0xff]);
        assert!(!f.fin && f.masked && f.opcode == OP_TEXT);
        assert_eq!(f.extended_len_bytes(), 8);
        assert_eq!(f.payload_len(&[0x80, 0, 0, 0, 0, 0, 0, 0]), None);
        assert_eq!(f.payload_len(&[0, 0, 0, 0, 0, 1, 0, 0]), Some(65536));
        // The shortest form must be used.
        assert_eq!(f.payload_len(&[0, 0, 0, 0, 0, 0, 0, 5]), None);
        assert_eq!(FrameStart::parse([0x82, 0xfe]).payload_len(&[0, 5]), None);
        assert_eq!(FrameStart::parse([0xc2, 0x80]).rsv, 4);
        let mut data = *b"abcdef";
        unmask(&mut data, [1, 2, 3, 4]);
        unmask(&mut data, [1, 2, 3, 4]);
        assert_eq!(&data, b"abcdef");
        assert_eq!(close_frame(1002), vec![0x88, 2, 0x03, 0xea]);
    }
}
