//! The `ERR` payload (simplexmq `Protocol.hs`, `ErrorType`): error types the relay sends, and the
//! transport errors of the handshake. Encoders apply the per-version downgrades; parsers accept
//! every form the reference parses (legacy `NO_QUEUE`, detailed `NETWORK`).

use std::fmt;

use super::encoding::{put_short_unchecked, DResult, DecodeError, Reader};
use super::version::{Version, BLOCKED_ENTITY, CLIENT_NOTICES};

/// `errorType` of `ERR`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ErrorType {
    Block,
    Session,
    Cmd(CommandError),
    Proxy(ProxyError),
    Auth,
    Blocked(BlockingInfo),
    Service,
    Crypto,
    Quota,
    Store(String),
    NoMsg,
    LargeMsg,
    Expired,
    Internal,
    Name(NameError),
    /// `DUPLICATE_`: never sent by the reference server, parsed for completeness.
    Duplicate,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CommandError {
    Unknown,
    Syntax,
    Prohibited,
    NoAuth,
    HasAuth,
    NoEntity,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProxyError {
    /// An `ERR` the destination relay returned.
    Protocol(Box<ErrorType>),
    Broker(BrokerError),
    BasicAuth,
    NoSession,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BrokerError {
    Response(String),
    Unexpected(String),
    Transport(TransportError),
    /// Always encoded bare (`NETWORK`); the detail is only parsed.
    Network(NetworkError),
    Timeout,
    Host,
    NoService,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NetworkError {
    Connect(String),
    Tls(String),
    UnknownCa,
    Failed,
    Timeout,
    Subscribe(String),
}

/// Transport errors (`TransportError` of `Transport.hs`), also carried by `BROKER TRANSPORT` and
/// the service handshake response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransportError {
    Block,
    Version,
    LargeMsg,
    Session,
    NoAuth,
    Handshake(HandshakeError),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandshakeError {
    Parse,
    Identity,
    BadAuth,
    BadService,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NameError {
    NoResolver,
    NotFound,
    Resolver(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockingReason {
    Spam,
    Content,
}

/// `reason=spam|content[,notice=<json>]`. The notice is kept as raw JSON text (e.g.
/// `{"ttl":3600}`); it is not validated here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockingInfo {
    pub reason: BlockingReason,
    pub notice: Option<String>,
}

/// Bytes up to the next space or the end (`takeTill (== ' ')`).
fn word<'a>(r: &mut Reader<'a>) -> &'a [u8] {
    let rest = r.rest();
    let n = rest.iter().position(|&b| b == b' ').unwrap_or(rest.len());
    r.take(n).unwrap_or_default()
}

/// The rest of the input as text; invalid UTF-8 is replaced, as the reference's
/// `safeDecodeUtf8` does.
fn text(r: &mut Reader<'_>) -> String {
    String::from_utf8_lossy(r.tail()).into_owned()
}

/// `shortString` of UTF-8 text; longer text is cut at a character boundary so the encoding
/// stays valid.
fn put_short_text(out: &mut Vec<u8>, s: &str) {
    let mut end = s.len().min(255);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    put_short_unchecked(out, &s.as_bytes()[..end]);
}

fn short_text(r: &mut Reader<'_>) -> DResult<String> {
    Ok(String::from_utf8_lossy(r.short()?).into_owned())
}

/// Runs a parser and requires it to consume everything.
fn parse_all<T>(bytes: &[u8], f: impl FnOnce(&mut Reader<'_>) -> DResult<T>) -> DResult<T> {
    let mut r = Reader::new(bytes);
    let x = f(&mut r)?;
    r.end()?;
    Ok(x)
}

impl ErrorType {
    /// Encodes for a session at version `v`: `BLOCKED` becomes `AUTH` below 12 and loses its
    /// notice below 18. Errors nested in `PROXY PROTOCOL` are passed on as they are, as the
    /// reference does.
    pub fn encode(&self, v: Version, out: &mut Vec<u8>) {
        match self {
            ErrorType::Blocked(_) if v < BLOCKED_ENTITY => out.extend_from_slice(b"AUTH"),
            ErrorType::Blocked(info) if v < CLIENT_NOTICES => {
                out.extend_from_slice(b"BLOCKED ");
                BlockingInfo {
                    reason: info.reason,
                    notice: None,
                }
                .encode(out);
            }
            e => e.encode_raw(out),
        }
    }

    fn encode_raw(&self, out: &mut Vec<u8>) {
        match self {
            ErrorType::Block => out.extend_from_slice(b"BLOCK"),
            ErrorType::Session => out.extend_from_slice(b"SESSION"),
            ErrorType::Cmd(e) => {
                out.extend_from_slice(b"CMD ");
                out.extend_from_slice(e.as_str().as_bytes());
            }
            ErrorType::Proxy(e) => {
                out.extend_from_slice(b"PROXY ");
                e.encode_raw(out);
            }
            ErrorType::Auth => out.extend_from_slice(b"AUTH"),
            ErrorType::Blocked(info) => {
                out.extend_from_slice(b"BLOCKED ");
                info.encode(out);
            }
            ErrorType::Service => out.extend_from_slice(b"SERVICE"),
            ErrorType::Crypto => out.extend_from_slice(b"CRYPTO"),
            ErrorType::Quota => out.extend_from_slice(b"QUOTA"),
            ErrorType::Store(s) => {
                out.extend_from_slice(b"STORE ");
                out.extend_from_slice(s.as_bytes());
            }
            ErrorType::NoMsg => out.extend_from_slice(b"NO_MSG"),
            ErrorType::LargeMsg => out.extend_from_slice(b"LARGE_MSG"),
            ErrorType::Expired => out.extend_from_slice(b"EXPIRED"),
            ErrorType::Internal => out.extend_from_slice(b"INTERNAL"),
            ErrorType::Name(e) => {
                out.extend_from_slice(b"NAME ");
                e.encode_raw(out);
            }
            ErrorType::Duplicate => out.extend_from_slice(b"DUPLICATE_"),
        }
    }

    /// Parses a whole `errorType`. The syntax does not depend on the version; `v` is kept for
    /// symmetry with `encode`.
    pub fn parse(_v: Version, bytes: &[u8]) -> Result<Self, DecodeError> {
        parse_all(bytes, Self::read)
    }

    /// Reads an `errorType`; some forms (`STORE`, `BLOCKED`, `NAME RESOLVER`) take the rest of
    /// the input.
    pub fn read(r: &mut Reader<'_>) -> DResult<Self> {
        Ok(match word(r) {
            b"BLOCK" => ErrorType::Block,
            b"SESSION" => ErrorType::Session,
            b"CMD" => {
                r.space()?;
                ErrorType::Cmd(CommandError::read(r)?)
            }
            b"PROXY" => {
                r.space()?;
                ErrorType::Proxy(ProxyError::read(r)?)
            }
            b"AUTH" => ErrorType::Auth,
            b"BLOCKED" => {
                r.space()?;
                ErrorType::Blocked(BlockingInfo::read(r)?)
            }
            b"SERVICE" => ErrorType::Service,
            b"CRYPTO" => ErrorType::Crypto,
            b"QUOTA" => ErrorType::Quota,
            b"STORE" => {
                r.space()?;
                ErrorType::Store(text(r))
            }
            b"NO_MSG" => ErrorType::NoMsg,
            b"LARGE_MSG" => ErrorType::LargeMsg,
            b"EXPIRED" => ErrorType::Expired,
            b"INTERNAL" => ErrorType::Internal,
            b"NAME" => {
                r.space()?;
                ErrorType::Name(NameError::read(r)?)
            }
            b"DUPLICATE_" => ErrorType::Duplicate,
            _ => return Err(DecodeError),
        })
    }

    /// The encoding at version `v` as a new vector (convenient in tests and logs).
    pub fn to_bytes(&self, v: Version) -> Vec<u8> {
        let mut out = Vec::new();
        self.encode(v, &mut out);
        out
    }
}

impl fmt::Display for ErrorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = Vec::new();
        self.encode_raw(&mut out);
        f.write_str(&String::from_utf8_lossy(&out))
    }
}

impl std::error::Error for ErrorType {}

impl From<CommandError> for ErrorType {
    fn from(e: CommandError) -> Self {
        ErrorType::Cmd(e)
    }
}

impl CommandError {
    pub fn as_str(&self) -> &'static str {
        match self {
            CommandError::Unknown => "UNKNOWN",
            CommandError::Syntax => "SYNTAX",
            CommandError::Prohibited => "PROHIBITED",
            CommandError::NoAuth => "NO_AUTH",
            CommandError::HasAuth => "HAS_AUTH",
            CommandError::NoEntity => "NO_ENTITY",
        }
    }

    pub fn encode(&self, _v: Version, out: &mut Vec<u8>) {
        out.extend_from_slice(self.as_str().as_bytes());
    }

    pub fn parse(_v: Version, bytes: &[u8]) -> Result<Self, DecodeError> {
        parse_all(bytes, Self::read)
    }

    pub fn read(r: &mut Reader<'_>) -> DResult<Self> {
        Ok(match word(r) {
            b"UNKNOWN" => CommandError::Unknown,
            b"SYNTAX" => CommandError::Syntax,
            b"PROHIBITED" => CommandError::Prohibited,
            b"NO_AUTH" => CommandError::NoAuth,
            b"HAS_AUTH" => CommandError::HasAuth,
            // Older relays called it NO_QUEUE.
            b"NO_ENTITY" | b"NO_QUEUE" => CommandError::NoEntity,
            _ => return Err(DecodeError),
        })
    }
}

impl fmt::Display for CommandError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::error::Error for CommandError {}

impl ProxyError {
    pub fn encode(&self, _v: Version, out: &mut Vec<u8>) {
        self.encode_raw(out)
    }

    fn encode_raw(&self, out: &mut Vec<u8>) {
        match self {
            ProxyError::Protocol(e) => {
                out.extend_from_slice(b"PROTOCOL ");
                e.encode_raw(out);
            }
            ProxyError::Broker(e) => {
                out.extend_from_slice(b"BROKER ");
                e.encode_raw(out);
            }
            ProxyError::BasicAuth => out.extend_from_slice(b"BASIC_AUTH"),
            ProxyError::NoSession => out.extend_from_slice(b"NO_SESSION"),
        }
    }

    pub fn parse(_v: Version, bytes: &[u8]) -> Result<Self, DecodeError> {
        parse_all(bytes, Self::read)
    }

    pub fn read(r: &mut Reader<'_>) -> DResult<Self> {
        Ok(match word(r) {
            b"PROTOCOL" => {
                r.space()?;
                ProxyError::Protocol(Box::new(ErrorType::read(r)?))
            }
            b"BROKER" => {
                r.space()?;
                ProxyError::Broker(BrokerError::read(r)?)
            }
            b"BASIC_AUTH" => ProxyError::BasicAuth,
            b"NO_SESSION" => ProxyError::NoSession,
            _ => return Err(DecodeError),
        })
    }
}

impl BrokerError {
    pub fn encode(&self, _v: Version, out: &mut Vec<u8>) {
        self.encode_raw(out)
    }

    fn encode_raw(&self, out: &mut Vec<u8>) {
        match self {
            BrokerError::Response(s) => {
                out.extend_from_slice(b"RESPONSE ");
                put_short_text(out, s);
            }
            BrokerError::Unexpected(s) => {
                out.extend_from_slice(b"UNEXPECTED ");
                put_short_text(out, s);
            }
            BrokerError::Transport(e) => {
                out.extend_from_slice(b"TRANSPORT ");
                e.encode(out);
            }
            // The reference still emits the bare form so that older clients can parse it.
            BrokerError::Network(_) => out.extend_from_slice(b"NETWORK"),
            BrokerError::Timeout => out.extend_from_slice(b"TIMEOUT"),
            BrokerError::Host => out.extend_from_slice(b"HOST"),
            BrokerError::NoService => out.extend_from_slice(b"NO_SERVICE"),
        }
    }

    pub fn parse(_v: Version, bytes: &[u8]) -> Result<Self, DecodeError> {
        parse_all(bytes, Self::read)
    }

    pub fn read(r: &mut Reader<'_>) -> DResult<Self> {
        Ok(match word(r) {
            b"RESPONSE" => {
                r.space()?;
                BrokerError::Response(short_text(r)?)
            }
            b"UNEXPECTED" => {
                r.space()?;
                BrokerError::Unexpected(short_text(r)?)
            }
            b"TRANSPORT" => {
                r.space()?;
                BrokerError::Transport(TransportError::read(r)?)
            }
            b"NETWORK" => BrokerError::Network(
                r.attempt(|r| {
                    r.space()?;
                    NetworkError::read(r)
                })
                .unwrap_or(NetworkError::Failed),
            ),
            b"TIMEOUT" => BrokerError::Timeout,
            b"HOST" => BrokerError::Host,
            b"NO_SERVICE" => BrokerError::NoService,
            _ => return Err(DecodeError),
        })
    }
}

impl NetworkError {
    /// The detailed form, which only parsers see today (`BROKER NETWORK` is sent bare).
    pub fn encode(&self, _v: Version, out: &mut Vec<u8>) {
        match self {
            NetworkError::Connect(s) => {
                out.extend_from_slice(b"CONNECT ");
                put_short_text(out, s);
            }
            NetworkError::Tls(s) => {
                out.extend_from_slice(b"TLS ");
                put_short_text(out, s);
            }
            NetworkError::UnknownCa => out.extend_from_slice(b"UNKNOWNCA"),
            NetworkError::Failed => out.extend_from_slice(b"FAILED"),
            NetworkError::Timeout => out.extend_from_slice(b"TIMEOUT"),
            NetworkError::Subscribe(s) => {
                out.extend_from_slice(b"SUBSCRIBE ");
                put_short_text(out, s);
            }
        }
    }

    pub fn parse(_v: Version, bytes: &[u8]) -> Result<Self, DecodeError> {
        parse_all(bytes, Self::read)
    }

    pub fn read(r: &mut Reader<'_>) -> DResult<Self> {
        let save = r.clone();
        let res = match word(r) {
            b"CONNECT" => r
                .space()
                .and_then(|_| short_text(r))
                .map(NetworkError::Connect),
            b"TLS" => r.space().and_then(|_| short_text(r)).map(NetworkError::Tls),
            b"UNKNOWNCA" => Ok(NetworkError::UnknownCa),
            b"FAILED" => Ok(NetworkError::Failed),
            b"TIMEOUT" => Ok(NetworkError::Timeout),
            b"SUBSCRIBE" => r
                .space()
                .and_then(|_| short_text(r))
                .map(NetworkError::Subscribe),
            _ => Err(DecodeError),
        };
        if res.is_err() {
            *r = save;
        }
        res
    }
}

impl TransportError {
    pub fn encode(&self, out: &mut Vec<u8>) {
        let s: &[u8] = match self {
            TransportError::Block => b"BLOCK",
            TransportError::Version => b"VERSION",
            TransportError::LargeMsg => b"LARGE_MSG",
            TransportError::Session => b"SESSION",
            TransportError::NoAuth => b"NO_AUTH",
            TransportError::Handshake(e) => {
                out.extend_from_slice(b"HANDSHAKE ");
                e.as_str().as_bytes()
            }
        };
        out.extend_from_slice(s);
    }

    pub fn parse(bytes: &[u8]) -> Result<Self, DecodeError> {
        parse_all(bytes, Self::read)
    }

    pub fn read(r: &mut Reader<'_>) -> DResult<Self> {
        Ok(match word(r) {
            b"BLOCK" => TransportError::Block,
            b"VERSION" => TransportError::Version,
            b"LARGE_MSG" => TransportError::LargeMsg,
            b"SESSION" => TransportError::Session,
            b"NO_AUTH" => TransportError::NoAuth,
            b"HANDSHAKE" => {
                r.space()?;
                TransportError::Handshake(match word(r) {
                    b"PARSE" => HandshakeError::Parse,
                    b"IDENTITY" => HandshakeError::Identity,
                    b"BAD_AUTH" => HandshakeError::BadAuth,
                    b"BAD_SERVICE" => HandshakeError::BadService,
                    _ => return Err(DecodeError),
                })
            }
            _ => return Err(DecodeError),
        })
    }
}

impl fmt::Display for TransportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = Vec::new();
        self.encode(&mut out);
        f.write_str(&String::from_utf8_lossy(&out))
    }
}

impl std::error::Error for TransportError {}

impl HandshakeError {
    pub fn as_str(&self) -> &'static str {
        match self {
            HandshakeError::Parse => "PARSE",
            HandshakeError::Identity => "IDENTITY",
            HandshakeError::BadAuth => "BAD_AUTH",
            HandshakeError::BadService => "BAD_SERVICE",
        }
    }
}

impl NameError {
    pub fn encode(&self, _v: Version, out: &mut Vec<u8>) {
        self.encode_raw(out)
    }

    fn encode_raw(&self, out: &mut Vec<u8>) {
        match self {
            NameError::NoResolver => out.extend_from_slice(b"NO_RESOLVER"),
            NameError::NotFound => out.extend_from_slice(b"NOT_FOUND"),
            NameError::Resolver(s) => {
                out.extend_from_slice(b"RESOLVER ");
                out.extend_from_slice(s.as_bytes());
            }
        }
    }

    pub fn parse(_v: Version, bytes: &[u8]) -> Result<Self, DecodeError> {
        parse_all(bytes, Self::read)
    }

    pub fn read(r: &mut Reader<'_>) -> DResult<Self> {
        Ok(match word(r) {
            b"NO_RESOLVER" => NameError::NoResolver,
            b"NOT_FOUND" => NameError::NotFound,
            b"RESOLVER" => {
                r.space()?;
                NameError::Resolver(text(r))
            }
            _ => return Err(DecodeError),
        })
    }
}

impl BlockingInfo {
    /// The full form; version downgrades are `ErrorType::encode`'s job.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(b"reason=");
        out.extend_from_slice(match self.reason {
            BlockingReason::Spam => b"spam",
            BlockingReason::Content => b"content",
        });
        if let Some(n) = &self.notice {
            out.extend_from_slice(b",notice=");
            out.extend_from_slice(n.as_bytes());
        }
    }

    pub fn parse(_v: Version, bytes: &[u8]) -> Result<Self, DecodeError> {
        parse_all(bytes, Self::read)
    }

    pub fn read(r: &mut Reader<'_>) -> DResult<Self> {
        let rest = r.rest();
        let after = rest.strip_prefix(b"reason=").ok_or(DecodeError)?;
        let (reason, n) = if after.starts_with(b"spam") {
            (BlockingReason::Spam, 4)
        } else if after.starts_with(b"content") {
            (BlockingReason::Content, 7)
        } else {
            return Err(DecodeError);
        };
        r.take(7 + n)?;
        let notice = match r.rest().strip_prefix(b",notice=") {
            // The notice is JSON and takes the rest of the input.
            Some(json) if !json.is_empty() => {
                let s = std::str::from_utf8(json)
                    .map_err(|_| DecodeError)?
                    .to_owned();
                r.tail();
                Some(s)
            }
            _ => None,
        };
        Ok(BlockingInfo { reason, notice })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enc(e: &ErrorType, v: Version) -> String {
        String::from_utf8(e.to_bytes(v)).unwrap()
    }

    fn blocked(notice: Option<&str>) -> ErrorType {
        ErrorType::Blocked(BlockingInfo {
            reason: BlockingReason::Spam,
            notice: notice.map(str::to_owned),
        })
    }

    #[test]
    fn every_error_encoding() {
        let cases: Vec<(ErrorType, &str)> = vec![
            (ErrorType::Block, "BLOCK"),
            (ErrorType::Session, "SESSION"),
            (ErrorType::Cmd(CommandError::Unknown), "CMD UNKNOWN"),
            (ErrorType::Cmd(CommandError::Syntax), "CMD SYNTAX"),
            (ErrorType::Cmd(CommandError::Prohibited), "CMD PROHIBITED"),
            (ErrorType::Cmd(CommandError::NoAuth), "CMD NO_AUTH"),
            (ErrorType::Cmd(CommandError::HasAuth), "CMD HAS_AUTH"),
            (ErrorType::Cmd(CommandError::NoEntity), "CMD NO_ENTITY"),
            (
                ErrorType::Proxy(ProxyError::Protocol(Box::new(ErrorType::Auth))),
                "PROXY PROTOCOL AUTH",
            ),
            (
                ErrorType::Proxy(ProxyError::Broker(BrokerError::Response("bad".into()))),
                "PROXY BROKER RESPONSE \x03bad",
            ),
            (
                ErrorType::Proxy(ProxyError::Broker(BrokerError::Unexpected("x y".into()))),
                "PROXY BROKER UNEXPECTED \x03x y",
            ),
            (
                ErrorType::Proxy(ProxyError::Broker(BrokerError::Transport(
                    TransportError::Version,
                ))),
                "PROXY BROKER TRANSPORT VERSION",
            ),
            (
                ErrorType::Proxy(ProxyError::Broker(BrokerError::Transport(
                    TransportError::Handshake(HandshakeError::Identity),
                ))),
                "PROXY BROKER TRANSPORT HANDSHAKE IDENTITY",
            ),
            (
                ErrorType::Proxy(ProxyError::Broker(BrokerError::Network(
                    NetworkError::Connect("refused".into()),
                ))),
                "PROXY BROKER NETWORK",
            ),
            (
                ErrorType::Proxy(ProxyError::Broker(BrokerError::Timeout)),
                "PROXY BROKER TIMEOUT",
            ),
            (
                ErrorType::Proxy(ProxyError::Broker(BrokerError::Host)),
                "PROXY BROKER HOST",
            ),
            (
                ErrorType::Proxy(ProxyError::Broker(BrokerError::NoService)),
                "PROXY BROKER NO_SERVICE",
            ),
            (ErrorType::Proxy(ProxyError::BasicAuth), "PROXY BASIC_AUTH"),
            (ErrorType::Proxy(ProxyError::NoSession), "PROXY NO_SESSION"),
            (ErrorType::Auth, "AUTH"),
            (blocked(None), "BLOCKED reason=spam"),
            (
                blocked(Some("{\"ttl\":3600}")),
                "BLOCKED reason=spam,notice={\"ttl\":3600}",
            ),
            (
                ErrorType::Blocked(BlockingInfo {
                    reason: BlockingReason::Content,
                    notice: None,
                }),
                "BLOCKED reason=content",
            ),
            (ErrorType::Service, "SERVICE"),
            (ErrorType::Crypto, "CRYPTO"),
            (ErrorType::Quota, "QUOTA"),
            (ErrorType::Store("disk full".into()), "STORE disk full"),
            (ErrorType::NoMsg, "NO_MSG"),
            (ErrorType::LargeMsg, "LARGE_MSG"),
            (ErrorType::Expired, "EXPIRED"),
            (ErrorType::Internal, "INTERNAL"),
            (ErrorType::Name(NameError::NoResolver), "NAME NO_RESOLVER"),
            (ErrorType::Name(NameError::NotFound), "NAME NOT_FOUND"),
            (
                ErrorType::Name(NameError::Resolver("rpc down".into())),
                "NAME RESOLVER rpc down",
            ),
            (ErrorType::Duplicate, "DUPLICATE_"),
        ];
        for (e, s) in &cases {
            assert_eq!(enc(e, 20), *s, "{e:?}");
            let parsed = ErrorType::parse(20, s.as_bytes()).unwrap();
            // NETWORK is sent bare, so its detail does not survive the round trip.
            if !s.ends_with("NETWORK") {
                assert_eq!(&parsed, e);
            }
        }
    }

    #[test]
    fn blocked_downgrades_by_version() {
        let b = blocked(Some("{\"ttl\":60}"));
        assert_eq!(enc(&b, 6), "AUTH");
        assert_eq!(enc(&b, 11), "AUTH");
        assert_eq!(enc(&b, 12), "BLOCKED reason=spam");
        assert_eq!(enc(&b, 17), "BLOCKED reason=spam");
        assert_eq!(enc(&b, 18), "BLOCKED reason=spam,notice={\"ttl\":60}");
        // nested errors are not rewritten, as in the reference
        let p = ErrorType::Proxy(ProxyError::Protocol(Box::new(blocked(None))));
        assert_eq!(enc(&p, 6), "PROXY PROTOCOL BLOCKED reason=spam");
    }

    #[test]
    fn lenient_and_strict_parsing() {
        assert_eq!(
            ErrorType::parse(20, b"CMD NO_QUEUE"),
            Ok(ErrorType::Cmd(CommandError::NoEntity))
        );
        assert_eq!(
            ErrorType::parse(20, b"PROXY BROKER NETWORK"),
            Ok(ErrorType::Proxy(ProxyError::Broker(BrokerError::Network(
                NetworkError::Failed
            ))))
        );
        assert_eq!(
            ErrorType::parse(20, b"PROXY BROKER NETWORK TLS \x03bad"),
            Ok(ErrorType::Proxy(ProxyError::Broker(BrokerError::Network(
                NetworkError::Tls("bad".into())
            ))))
        );
        assert_eq!(
            ErrorType::parse(20, b"PROXY BROKER NETWORK UNKNOWNCA"),
            Ok(ErrorType::Proxy(ProxyError::Broker(BrokerError::Network(
                NetworkError::UnknownCa
            ))))
        );
        for bad in [
            &b"AUTH "[..],
            b"AUTHX",
            b"CMD",
            b"CMD FOO",
            b"CMD SYNTAX ",
            b"STORE",
            b"BLOCKED",
            b"BLOCKED reason=other",
            b"BLOCKED reason=spam,x",
            b"PROXY BROKER RESPONSE \x09ab",
            b"NAME",
            b"",
            b"ERR AUTH",
        ] {
            assert!(ErrorType::parse(20, bad).is_err(), "{bad:?}");
        }
        let mut out = Vec::new();
        NetworkError::Subscribe("s".into()).encode(20, &mut out);
        assert_eq!(out, b"SUBSCRIBE \x01s");
        assert_eq!(
            TransportError::parse(b"HANDSHAKE BAD_SERVICE"),
            Ok(TransportError::Handshake(HandshakeError::BadService))
        );
        assert!(TransportError::parse(b"HANDSHAKE").is_err());
    }
}
