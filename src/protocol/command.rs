//! Client commands (simplexmq `Protocol.hs`) and the credential-shape rules applied to them
//! (simplexmq `Protocol.hs`, `checkCredentials`). Parsing is strict: the parameters must be
//! consumed to the end, except where a Tail ends them; an unknown tag is `CMD UNKNOWN`, bad
//! parameters `CMD SYNTAX`.

use std::net::Ipv6Addr;
use std::str::FromStr;

use super::encoding::{
    put_bool, put_int64, put_large_unchecked, put_maybe, put_short_unchecked, put_word16, DResult,
    DecodeError, Reader,
};
use super::error::CommandError;
use super::version::{Version, NEW_NTF_CREDS, RCV_SERVICE, SHORT_LINKS, SND_AUTH_KEY};
use crate::crypto::keys::{x25519_from_spki, x25519_to_spki, PublicAuthKey};

/// `SUBS`/`NSUBS` parameters (v >= 19): the number of queues and the XOR of their ids' MD5.
pub type ServiceSubs = (i64, [u8; 16]);

/// What a bare `SUBS`/`NSUBS` (v16–18) means: count unknown, empty hash.
pub const NO_SERVICE_SUBS: ServiceSubs = (-1, [0u8; 16]);

// NEW is the largest variant (two keys inline); a command lives only while it is handled, so
// boxing it would buy nothing but an allocation.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    New(NewQueue),
    Sub,
    /// `None` for the bare form of v16–18.
    Subs(Option<ServiceSubs>),
    Key(PublicAuthKey),
    RKey(Vec<PublicAuthKey>),
    LSet {
        link_id: Vec<u8>,
        fixed: Vec<u8>,
        user: Vec<u8>,
    },
    LDel,
    NKey {
        key: PublicAuthKey,
        dh: [u8; 32],
    },
    NDel,
    Get,
    Ack(Vec<u8>),
    Off,
    Del,
    Que,
    SKey(PublicAuthKey),
    Send {
        flags: MsgFlags,
        body: Vec<u8>,
    },
    Ping,
    LKey(PublicAuthKey),
    LGet,
    NSub,
    NSubs(Option<ServiceSubs>),
    Prxy {
        server: SmpServer,
        auth: Option<Vec<u8>>,
    },
    PFwd {
        version: Version,
        key: [u8; 32],
        et: Vec<u8>,
    },
    RFwd(Vec<u8>),
    /// The domain, lower-cased as the reference normalises it.
    Rslv(String),
}

/// Who sends a command; it decides which id space the entity id is looked up in and which service
/// role may send it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Party {
    Creator,
    Recipient,
    Sender,
    Notifier,
    LinkClient,
    ProxiedClient,
    ProxyService,
    Resolver,
    RecipientService,
    NotifierService,
    /// `PING`.
    None,
}

/// What a service subscribes to (simplexmq `Protocol.hs`, `SMPServiceRole`), as its handshake
/// names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ServiceRole {
    /// `M`: messages (SUB, SUBS).
    Messaging,
    /// `N`: notifications (NSUB, NSUBS).
    Notifier,
    /// `P`: a proxy forwarding to this relay (RFWD).
    Proxy,
}

impl ServiceRole {
    pub fn byte(self) -> u8 {
        match self {
            ServiceRole::Messaging => b'M',
            ServiceRole::Notifier => b'N',
            ServiceRole::Proxy => b'P',
        }
    }

    pub fn from_byte(b: u8) -> Option<Self> {
        match b {
            b'M' => Some(ServiceRole::Messaging),
            b'N' => Some(ServiceRole::Notifier),
            b'P' => Some(ServiceRole::Proxy),
            _ => None,
        }
    }
}

impl Party {
    /// The service role a service session needs for this party's commands (simplexmq
    /// `Protocol.hs`, `partyClientRole`); `None` for PING, which any session may send.
    pub fn service_role(self) -> Option<ServiceRole> {
        match self {
            Party::Creator
            | Party::Recipient
            | Party::RecipientService
            | Party::Sender
            | Party::LinkClient
            | Party::ProxiedClient
            | Party::Resolver => Some(ServiceRole::Messaging),
            Party::Notifier | Party::NotifierService => Some(ServiceRole::Notifier),
            Party::ProxyService => Some(ServiceRole::Proxy),
            Party::None => None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SubMode {
    /// `'S'`: create and subscribe.
    Subscribe,
    /// `'C'`: create only.
    OnlyCreate,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QueueMode {
    /// `'M'`: one-time invitation; the sender may secure it (`SKEY`).
    Messaging,
    /// `'C'`: contact address.
    Contact,
}

/// Short-link data of a new queue: the sender id the client derived (SHA3-384 of the corrId) and
/// the two opaque encrypted blobs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewLink {
    pub sender_id: Vec<u8>,
    pub fixed: Vec<u8>,
    pub user: Vec<u8>,
}

/// `queueReqData`. At v9–14 only the mode travels (as `Bool sndSecure`), so link data is dropped
/// there and the parser yields `Messaging(None)` / `Contact(None)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QueueReq {
    Messaging(Option<NewLink>),
    /// A contact address; with link data the client also supplies the link id.
    Contact(Option<(Vec<u8>, NewLink)>),
}

impl QueueReq {
    pub fn mode(&self) -> QueueMode {
        match self {
            QueueReq::Messaging(_) => QueueMode::Messaging,
            QueueReq::Contact(_) => QueueMode::Contact,
        }
    }
}

/// `ntfCreds` of `NEW` (v >= 17), or the parameters of `NKEY`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NtfCreds {
    pub key: PublicAuthKey,
    pub dh: [u8; 32],
}

/// `NEW` in all its per-version forms:
/// - v6–8: `['A' basicAuth] subMode` (no `queue_req`, no `ntf_creds`);
/// - v9–14: `Maybe basicAuth, subMode, Bool sndSecure` (`queue_req` is `Some`, mode only);
/// - v15–16: `Maybe basicAuth, subMode, Maybe queueReqData`;
/// - v17+: as v15 plus `Maybe ntfCreds`.
///
/// Fields a version cannot carry are not encoded at that version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewQueue {
    pub rcv_auth_key: PublicAuthKey,
    pub rcv_dh_key: [u8; 32],
    pub basic_auth: Option<Vec<u8>>,
    pub sub_mode: SubMode,
    pub queue_req: Option<QueueReq>,
    pub ntf_creds: Option<NtfCreds>,
}

impl NewQueue {
    /// `None` for a legacy (v6–8) queue, which has no mode.
    pub fn queue_mode(&self) -> Option<QueueMode> {
        self.queue_req.as_ref().map(QueueReq::mode)
    }
}

/// `msgFlags`: the notification Bool, then any bytes up to the next SP (reserved for extension;
/// kept so that re-encoding is exact).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MsgFlags {
    pub notification: bool,
    pub reserved: Vec<u8>,
}

impl MsgFlags {
    pub fn new(notification: bool) -> Self {
        MsgFlags {
            notification,
            reserved: Vec::new(),
        }
    }

    /// The flags as the reference stores them and puts in `MSG` bodies: the Bool only.
    pub fn canonical(&self) -> MsgFlags {
        MsgFlags::new(self.notification)
    }

    pub fn encode(&self, out: &mut Vec<u8>) {
        put_bool(out, self.notification);
        out.extend_from_slice(&self.reserved);
    }

    pub fn read(r: &mut Reader<'_>) -> DResult<Self> {
        let notification = r.bool()?;
        let rest = r.rest();
        let n = rest.iter().position(|&b| b == b' ').unwrap_or(rest.len());
        let reserved = r.take(n)?.to_vec();
        Ok(MsgFlags {
            notification,
            reserved,
        })
    }
}

/// A relay address as `PRXY` carries it: `NonEmpty(shortString host) shortString(port)
/// shortString(keyHash)`. Hosts are kept as sent (IPv4, IPv6, onion or domain text).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SmpServer {
    pub hosts: Vec<String>,
    /// May be empty (default port).
    pub port: String,
    pub key_hash: Vec<u8>,
}

impl SmpServer {
    pub fn encode(&self, out: &mut Vec<u8>) {
        debug_assert!(!self.hosts.is_empty() && self.hosts.len() <= 255);
        let n = self.hosts.len().min(255);
        out.push(n as u8);
        for h in &self.hosts[..n] {
            put_short_unchecked(out, h.as_bytes());
        }
        put_short_unchecked(out, self.port.as_bytes());
        put_short_unchecked(out, &self.key_hash);
    }

    pub fn read(r: &mut Reader<'_>) -> DResult<Self> {
        let hosts = r.list(true, |r| {
            let h = r.short()?;
            if !valid_host(h) {
                return Err(DecodeError);
            }
            utf8(h)
        })?;
        let port = utf8(r.short()?)?;
        let key_hash = r.short()?.to_vec();
        Ok(SmpServer {
            hosts,
            port,
            key_hash,
        })
    }
}

fn utf8(b: &[u8]) -> DResult<String> {
    String::from_utf8(b.to_vec()).map_err(|_| DecodeError)
}

/// The reference's `TransportHost` text parser, as a predicate: an IPv4 or IPv6 address, an
/// onion name, or a domain without separators, each consuming the whole host.
fn valid_host(h: &[u8]) -> bool {
    if h.is_empty() {
        return false;
    }
    if let Some(n) = ipv4_prefix(h) {
        return n == h.len();
    }
    if let Some(n) = ipv6_prefix(h) {
        return n == h.len();
    }
    let k = h
        .iter()
        .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        .count();
    if h[k..].starts_with(b".onion") {
        return k + 6 == h.len();
    }
    let n = h
        .iter()
        .take_while(|c| !b":#,;/ \n\r\t[]".contains(c))
        .count();
    n > 0 && n == h.len() && !h.ends_with(b".onion")
}

fn ipv4_prefix(h: &[u8]) -> Option<usize> {
    let mut pos = 0;
    for i in 0..4 {
        let digits = h[pos..].iter().take_while(|c| c.is_ascii_digit()).count();
        if digits == 0 {
            return None;
        }
        if i < 3 {
            let n: u64 = std::str::from_utf8(&h[pos..pos + digits])
                .ok()?
                .parse()
                .ok()?;
            if n > 255 || h.get(pos + digits) != Some(&b'.') {
                return None;
            }
            pos += digits + 1;
        } else {
            pos += digits;
        }
    }
    Some(pos)
}

fn ipv6_prefix(h: &[u8]) -> Option<usize> {
    let (text, used) = if h.first() == Some(&b'[') {
        let n = h[1..].iter().take_while(|&&c| c != b']').count();
        if n == 0 || h.get(1 + n) != Some(&b']') {
            return None;
        }
        (&h[1..1 + n], n + 2)
    } else {
        let n = h
            .iter()
            .take_while(|c| c.is_ascii_hexdigit() || **c == b':')
            .count();
        (&h[..n], n)
    };
    if text.is_empty() {
        return None;
    }
    let s = std::str::from_utf8(text).ok()?;
    Ipv6Addr::from_str(s).ok().map(|_| used)
}

/// `basicAuth` characters: printable, no space, '@', ':' or '/' (Latin-1 `isPrint`).
fn valid_basic_auth(s: &[u8]) -> bool {
    s.iter().all(|&c| {
        let printable = (0x21..=0x7e).contains(&c) || (c >= 0xa1 && c != 0xad);
        printable && c != b'@' && c != b':' && c != b'/'
    })
}

fn read_basic_auth(r: &mut Reader<'_>) -> DResult<Vec<u8>> {
    let save = r.clone();
    let s = r.short()?;
    if valid_basic_auth(s) {
        Ok(s.to_vec())
    } else {
        *r = save;
        Err(DecodeError)
    }
}

fn read_auth_key(r: &mut Reader<'_>) -> DResult<PublicAuthKey> {
    PublicAuthKey::from_spki(r.short()?).map_err(|_| DecodeError)
}

fn read_dh_key(r: &mut Reader<'_>) -> DResult<[u8; 32]> {
    x25519_from_spki(r.short()?).map_err(|_| DecodeError)
}

fn put_auth_key(out: &mut Vec<u8>, k: &PublicAuthKey) {
    put_short_unchecked(out, &k.to_spki());
}

fn put_dh_key(out: &mut Vec<u8>, k: &[u8; 32]) {
    put_short_unchecked(out, &x25519_to_spki(k));
}

fn read_service_subs(r: &mut Reader<'_>) -> DResult<ServiceSubs> {
    r.space()?;
    let n = r.int64()?;
    let h = r.short()?;
    // The reference accepts a hash of any length (`IdsHash` is any string; its XOR truncates to
    // the shorter): the first 16 bytes, zero-filled, are what a comparison sees.
    let mut hash = [0u8; 16];
    let k = h.len().min(16);
    hash[..k].copy_from_slice(&h[..k]);
    Ok((n, hash))
}

fn put_service_subs(v: Version, out: &mut Vec<u8>, s: &Option<ServiceSubs>) {
    if v >= RCV_SERVICE {
        let (n, h) = s.unwrap_or(NO_SERVICE_SUBS);
        out.push(b' ');
        put_int64(out, n);
        put_short_unchecked(out, &h);
    }
}

/// `RSLV` domain (`SimplexDomain`): at most 253 non-space bytes, dot-separated labels of ASCII
/// letters and digits joined by single hyphens, each label at most 63 bytes, at least two labels.
fn read_domain(r: &mut Reader<'_>) -> DResult<String> {
    let rest = r.rest();
    let n = rest
        .iter()
        .take_while(|&&c| !(c == b' ' || (b'\t'..=b'\r').contains(&c)))
        .count();
    if n == 0 || n > 253 {
        return Err(DecodeError);
    }
    let token = r.take(n)?;
    let labels: Vec<&[u8]> = token.split(|&c| c == b'.').collect();
    let valid_label = |l: &&[u8]| {
        l.len() <= 63
            && l.split(|&c| c == b'-')
                .all(|part| !part.is_empty() && part.iter().all(u8::is_ascii_alphanumeric))
    };
    if labels.len() < 2 || !labels.iter().all(valid_label) {
        return Err(DecodeError);
    }
    Ok(String::from_utf8_lossy(token).to_ascii_lowercase())
}

/// Splits a command or response into its tag (bytes up to the first space) and the parameters,
/// which keep their leading space.
pub fn split_tag(bytes: &[u8]) -> (&[u8], &[u8]) {
    let n = bytes.iter().position(|&b| b == b' ').unwrap_or(bytes.len());
    bytes.split_at(n)
}

/// Parses a command of a session at version `v`.
pub fn parse_command(v: Version, bytes: &[u8]) -> Result<Command, CommandError> {
    let (tag, params) = split_tag(bytes);
    let mut r = Reader::new(params);
    let cmd = match read_params(v, tag, &mut r) {
        None => return Err(CommandError::Unknown),
        Some(res) => res.map_err(|_| CommandError::Syntax)?,
    };
    r.end().map_err(|_| CommandError::Syntax)?;
    Ok(cmd)
}

/// `None` for an unknown tag.
fn read_params(v: Version, tag: &[u8], r: &mut Reader<'_>) -> Option<DResult<Command>> {
    let sp = |r: &mut Reader<'_>| r.space();
    let res = match tag {
        b"NEW" => sp(r).and_then(|_| NewQueue::read(v, r)).map(Command::New),
        b"SUB" => Ok(Command::Sub),
        b"SUBS" => {
            if v >= RCV_SERVICE {
                read_service_subs(r).map(|s| Command::Subs(Some(s)))
            } else {
                Ok(Command::Subs(None))
            }
        }
        b"KEY" => sp(r).and_then(|_| read_auth_key(r)).map(Command::Key),
        b"RKEY" => sp(r)
            .and_then(|_| r.list(true, read_auth_key))
            .map(Command::RKey),
        b"LSET" => sp(r).and_then(|_| {
            Ok(Command::LSet {
                link_id: r.short()?.to_vec(),
                fixed: r.large()?.to_vec(),
                user: r.large()?.to_vec(),
            })
        }),
        b"LDEL" => Ok(Command::LDel),
        b"NKEY" => sp(r).and_then(|_| {
            Ok(Command::NKey {
                key: read_auth_key(r)?,
                dh: read_dh_key(r)?,
            })
        }),
        b"NDEL" => Ok(Command::NDel),
        b"GET" => Ok(Command::Get),
        b"ACK" => sp(r).and_then(|_| Ok(Command::Ack(r.short()?.to_vec()))),
        b"OFF" => Ok(Command::Off),
        b"DEL" => Ok(Command::Del),
        b"QUE" => Ok(Command::Que),
        b"SKEY" => sp(r).and_then(|_| read_auth_key(r)).map(Command::SKey),
        b"SEND" => sp(r).and_then(|_| {
            let flags = MsgFlags::read(r)?;
            r.space()?;
            Ok(Command::Send {
                flags,
                body: r.tail().to_vec(),
            })
        }),
        b"PING" => Ok(Command::Ping),
        b"LKEY" => sp(r).and_then(|_| read_auth_key(r)).map(Command::LKey),
        b"LGET" => Ok(Command::LGet),
        b"NSUB" => Ok(Command::NSub),
        b"NSUBS" => {
            if v >= RCV_SERVICE {
                read_service_subs(r).map(|s| Command::NSubs(Some(s)))
            } else {
                Ok(Command::NSubs(None))
            }
        }
        b"PRXY" => sp(r).and_then(|_| {
            Ok(Command::Prxy {
                server: SmpServer::read(r)?,
                auth: r.maybe(read_basic_auth)?,
            })
        }),
        b"PFWD" => sp(r).and_then(|_| {
            Ok(Command::PFwd {
                version: r.word16()?,
                key: read_dh_key(r)?,
                et: r.tail().to_vec(),
            })
        }),
        b"RFWD" => sp(r).map(|_| Command::RFwd(r.tail().to_vec())),
        b"RSLV" => sp(r).and_then(|_| {
            let d = read_domain(r)?;
            // The reference ignores whatever follows the domain.
            r.tail();
            Ok(Command::Rslv(d))
        }),
        _ => return None,
    };
    Some(res)
}

impl NewQueue {
    /// Reads the parameters after `"NEW "`.
    pub fn read(v: Version, r: &mut Reader<'_>) -> DResult<Self> {
        let rcv_auth_key = read_auth_key(r)?;
        let rcv_dh_key = read_dh_key(r)?;
        let basic_auth = if v >= SND_AUTH_KEY {
            r.maybe(read_basic_auth)?
        } else {
            // Plain presence before v9: 'A' then the password.
            r.attempt(|r| {
                r.char(b'A')?;
                read_basic_auth(r)
            })
        };
        let sub_mode = match r.byte()? {
            b'S' => SubMode::Subscribe,
            b'C' => SubMode::OnlyCreate,
            _ => return Err(DecodeError),
        };
        let queue_req = if v >= SHORT_LINKS {
            r.maybe(read_queue_req)?
        } else if v >= SND_AUTH_KEY {
            Some(if r.bool()? {
                QueueReq::Messaging(None)
            } else {
                QueueReq::Contact(None)
            })
        } else {
            None
        };
        let ntf_creds = if v >= NEW_NTF_CREDS {
            r.maybe(|r| {
                Ok(NtfCreds {
                    key: read_auth_key(r)?,
                    dh: read_dh_key(r)?,
                })
            })?
        } else {
            None
        };
        Ok(NewQueue {
            rcv_auth_key,
            rcv_dh_key,
            basic_auth,
            sub_mode,
            queue_req,
            ntf_creds,
        })
    }

    /// Writes the parameters after `"NEW "` in the form of version `v`.
    pub fn encode(&self, v: Version, out: &mut Vec<u8>) {
        put_auth_key(out, &self.rcv_auth_key);
        put_dh_key(out, &self.rcv_dh_key);
        if v >= SND_AUTH_KEY {
            put_maybe(out, self.basic_auth.as_deref(), put_short_unchecked);
        } else if let Some(a) = &self.basic_auth {
            out.push(b'A');
            put_short_unchecked(out, a);
        }
        out.push(match self.sub_mode {
            SubMode::Subscribe => b'S',
            SubMode::OnlyCreate => b'C',
        });
        if v >= SHORT_LINKS {
            put_maybe(out, self.queue_req.as_ref(), put_queue_req);
        } else if v >= SND_AUTH_KEY {
            put_bool(out, self.queue_mode() == Some(QueueMode::Messaging));
        }
        if v >= NEW_NTF_CREDS {
            put_maybe(out, self.ntf_creds.as_ref(), |o, c| {
                put_auth_key(o, &c.key);
                put_dh_key(o, &c.dh);
            });
        }
    }
}

fn read_new_link(r: &mut Reader<'_>) -> DResult<NewLink> {
    Ok(NewLink {
        sender_id: r.short()?.to_vec(),
        fixed: r.large()?.to_vec(),
        user: r.large()?.to_vec(),
    })
}

fn read_queue_req(r: &mut Reader<'_>) -> DResult<QueueReq> {
    match r.byte()? {
        b'M' => Ok(QueueReq::Messaging(r.maybe(read_new_link)?)),
        b'C' => Ok(QueueReq::Contact(r.maybe(|r| {
            let link_id = r.short()?.to_vec();
            Ok((link_id, read_new_link(r)?))
        })?)),
        _ => Err(DecodeError),
    }
}

fn put_new_link(out: &mut Vec<u8>, l: &NewLink) {
    put_short_unchecked(out, &l.sender_id);
    put_large_unchecked(out, &l.fixed);
    put_large_unchecked(out, &l.user);
}

fn put_queue_req(out: &mut Vec<u8>, q: &QueueReq) {
    match q {
        QueueReq::Messaging(l) => {
            out.push(b'M');
            put_maybe(out, l.as_ref(), put_new_link);
        }
        QueueReq::Contact(l) => {
            out.push(b'C');
            put_maybe(out, l.as_ref(), |o, (id, l)| {
                put_short_unchecked(o, id);
                put_new_link(o, l);
            });
        }
    }
}

impl Command {
    /// Encodes the command in the form of version `v`.
    pub fn encode(&self, v: Version, out: &mut Vec<u8>) {
        out.extend_from_slice(self.tag().as_bytes());
        match self {
            Command::New(q) => {
                out.push(b' ');
                q.encode(v, out);
            }
            Command::Subs(s) | Command::NSubs(s) => put_service_subs(v, out, s),
            Command::Key(k) | Command::SKey(k) | Command::LKey(k) => {
                out.push(b' ');
                put_auth_key(out, k);
            }
            Command::RKey(ks) => {
                out.push(b' ');
                debug_assert!(!ks.is_empty() && ks.len() <= 255);
                let n = ks.len().min(255);
                out.push(n as u8);
                for k in &ks[..n] {
                    put_auth_key(out, k);
                }
            }
            Command::LSet {
                link_id,
                fixed,
                user,
            } => {
                out.push(b' ');
                put_short_unchecked(out, link_id);
                put_large_unchecked(out, fixed);
                put_large_unchecked(out, user);
            }
            Command::NKey { key, dh } => {
                out.push(b' ');
                put_auth_key(out, key);
                put_dh_key(out, dh);
            }
            Command::Ack(id) => {
                out.push(b' ');
                put_short_unchecked(out, id);
            }
            Command::Send { flags, body } => {
                out.push(b' ');
                flags.encode(out);
                out.push(b' ');
                out.extend_from_slice(body);
            }
            Command::Prxy { server, auth } => {
                out.push(b' ');
                server.encode(out);
                put_maybe(out, auth.as_deref(), put_short_unchecked);
            }
            Command::PFwd { version, key, et } => {
                out.push(b' ');
                put_word16(out, *version);
                put_dh_key(out, key);
                out.extend_from_slice(et);
            }
            Command::RFwd(et) => {
                out.push(b' ');
                out.extend_from_slice(et);
            }
            Command::Rslv(d) => {
                out.push(b' ');
                out.extend_from_slice(d.as_bytes());
            }
            Command::Sub
            | Command::LDel
            | Command::NDel
            | Command::Get
            | Command::Off
            | Command::Del
            | Command::Que
            | Command::Ping
            | Command::LGet
            | Command::NSub => {}
        }
    }

    /// The encoding at version `v` as a new vector.
    pub fn to_bytes(&self, v: Version) -> Vec<u8> {
        let mut out = Vec::new();
        self.encode(v, &mut out);
        out
    }

    pub fn tag(&self) -> &'static str {
        match self {
            Command::New(_) => "NEW",
            Command::Sub => "SUB",
            Command::Subs(_) => "SUBS",
            Command::Key(_) => "KEY",
            Command::RKey(_) => "RKEY",
            Command::LSet { .. } => "LSET",
            Command::LDel => "LDEL",
            Command::NKey { .. } => "NKEY",
            Command::NDel => "NDEL",
            Command::Get => "GET",
            Command::Ack(_) => "ACK",
            Command::Off => "OFF",
            Command::Del => "DEL",
            Command::Que => "QUE",
            Command::SKey(_) => "SKEY",
            Command::Send { .. } => "SEND",
            Command::Ping => "PING",
            Command::LKey(_) => "LKEY",
            Command::LGet => "LGET",
            Command::NSub => "NSUB",
            Command::NSubs(_) => "NSUBS",
            Command::Prxy { .. } => "PRXY",
            Command::PFwd { .. } => "PFWD",
            Command::RFwd(_) => "RFWD",
            Command::Rslv(_) => "RSLV",
        }
    }

    pub fn party(&self) -> Party {
        self.facts().party
    }

    /// Everything the relay decides about a command before running it, in one place: dispatch,
    /// forwarding, credential checks and batch verification read it.
    pub fn facts(&self) -> CommandFacts {
        use BatchKey as B;
        use Credentials as C;
        use EntityKind as E;
        use Runs as R;
        let f = |party, entity, runs, credentials, forwarded, batch_key| CommandFacts {
            party,
            entity,
            runs,
            credentials,
            forwarded,
            batch_key,
        };
        match self {
            Command::New(_) => f(
                Party::Creator,
                E::NewQueue,
                R::Owner,
                C::NewQueue,
                false,
                B::None,
            ),
            Command::Sub
            | Command::Key(_)
            | Command::RKey(_)
            | Command::LSet { .. }
            | Command::LDel
            | Command::NKey { .. }
            | Command::NDel
            | Command::Get
            | Command::Ack(_)
            | Command::Off
            | Command::Del
            | Command::Que => f(
                Party::Recipient,
                E::Recipient,
                R::Owner,
                C::Signed,
                false,
                B::Recipient,
            ),
            // Answered by the connection: `ERR SERVICE` outside a service session, else over every
            // shard (server/conn/services.rs).
            Command::Subs(_) => f(
                Party::RecipientService,
                E::Service,
                R::Connection,
                C::Signed,
                false,
                B::None,
            ),
            Command::NSubs(_) => f(
                Party::NotifierService,
                E::Service,
                R::Connection,
                C::Signed,
                false,
                B::None,
            ),
            // SKEY carries the key it is signed with, so there is no stored key to batch with.
            Command::SKey(_) => f(Party::Sender, E::Sender, R::Owner, C::Signed, true, B::None),
            Command::Send { .. } => f(
                Party::Sender,
                E::Sender,
                R::Owner,
                C::SignedOnceSecured,
                true,
                B::Sender,
            ),
            Command::Ping => f(Party::None, E::None, R::Connection, C::None, false, B::None),
            Command::LKey(_) => f(
                Party::LinkClient,
                E::Link,
                R::Owner,
                C::Signed,
                true,
                B::None,
            ),
            Command::LGet => f(
                Party::LinkClient,
                E::Link,
                R::Owner,
                C::Unsigned,
                true,
                B::None,
            ),
            Command::NSub => f(
                Party::Notifier,
                E::Notifier,
                R::Owner,
                C::Signed,
                false,
                B::Notifier,
            ),
            Command::Prxy { .. } => f(
                Party::ProxiedClient,
                E::None,
                R::Proxy,
                C::None,
                false,
                B::None,
            ),
            Command::PFwd { .. } => f(
                Party::ProxiedClient,
                E::ProxySession,
                R::Proxy,
                C::Unsigned,
                false,
                B::None,
            ),
            Command::RFwd(_) => f(
                Party::ProxyService,
                E::None,
                R::Forwarded,
                C::None,
                false,
                B::None,
            ),
            // The names role is off: RSLV is answered where it arrives, also inside an RFWD.
            Command::Rslv(_) => f(
                Party::Resolver,
                E::None,
                R::Connection,
                C::None,
                true,
                B::None,
            ),
        }
    }
}

/// Which ID a command's entity ID is, and so where its queue is found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntityKind {
    /// The command names no entity.
    None,
    /// NEW: the relay chooses the recipient ID.
    NewQueue,
    Recipient,
    /// Looked up in the sender ID space.
    Sender,
    /// Looked up in the link ID space.
    Link,
    /// Looked up in the notifier ID space.
    Notifier,
    /// A service ID (SUBS, NSUBS).
    Service,
    /// The proxy's session with a destination relay (PFWD).
    ProxySession,
}

/// Where a command is executed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Runs {
    /// The connection's shard answers it (PING, RSLV, refused service commands).
    Connection,
    /// The owner of its queue.
    Owner,
    /// The proxy role (PRXY, PFWD).
    Proxy,
    /// The destination role: opened on the connection, its inner command routed on (RFWD).
    Forwarded,
}

/// The credential shape a command must carry (`check_credentials`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Credentials {
    /// An authorization and an entity ID.
    Signed,
    /// NEW: an authorization (proof of the new key) and no entity ID.
    NewQueue,
    /// SEND: an entity ID; the authorization is checked against the queue (none until secured).
    SignedOnceSecured,
    /// An entity ID and no authorization.
    Unsigned,
    /// Neither.
    None,
}

/// The key a block part's batch verification checks this command's signature with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchKey {
    /// Not batched: verified when it runs.
    None,
    /// The queue's recipient key (the one that verified last).
    Recipient,
    /// The queue's sender key.
    Sender,
    /// The queue's notifier key.
    Notifier,
}

/// What `Command::facts` says of a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommandFacts {
    pub party: Party,
    pub entity: EntityKind,
    pub runs: Runs,
    pub credentials: Credentials,
    /// Whether an RFWD may carry it (the reference's `allowedForwardedCommand` plus RSLV, which
    /// is answered inside the RRES).
    pub forwarded: bool,
    pub batch_key: BatchKey,
}

/// The credential shape a command requires (simplexmq `Protocol.hs`, `checkCredentials`), checked
/// after parsing and before any lookup or verification.
pub fn check_credentials(
    cmd: &Command,
    has_auth: bool,
    entity_empty: bool,
) -> Result<(), CommandError> {
    use CommandError::{HasAuth, NoAuth, NoEntity};
    match cmd.facts().credentials {
        // Proof of possession of the new queue's key, and no queue yet.
        Credentials::NewQueue if !has_auth => Err(NoAuth),
        Credentials::NewQueue if !entity_empty => Err(HasAuth),
        Credentials::NewQueue => Ok(()),
        // Unsigned SEND is allowed until the queue is secured.
        Credentials::SignedOnceSecured if entity_empty => Err(NoEntity),
        Credentials::SignedOnceSecured => Ok(()),
        Credentials::Unsigned if entity_empty => Err(NoEntity),
        Credentials::Unsigned if has_auth => Err(HasAuth),
        Credentials::Unsigned => Ok(()),
        Credentials::None if has_auth || !entity_empty => Err(HasAuth),
        Credentials::None => Ok(()),
        Credentials::Signed if !has_auth || entity_empty => Err(NoAuth),
        Credentials::Signed => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypto::keys::{ED25519_SPKI_PREFIX, X25519_SPKI_PREFIX, X448_SPKI_PREFIX};

    fn ed() -> PublicAuthKey {
        PublicAuthKey::Ed25519([1; 32])
    }
    fn ed448() -> PublicAuthKey {
        PublicAuthKey::Ed448([2; 57])
    }
    fn x() -> PublicAuthKey {
        PublicAuthKey::X25519([3; 32])
    }
    fn link(s: u8) -> NewLink {
        NewLink {
            sender_id: vec![s; 24],
            fixed: vec![s + 1; 300],
            user: vec![s + 2; 40],
        }
    }
    fn new_queue(q: Option<QueueReq>, ntf: bool, auth: bool) -> NewQueue {
        NewQueue {
            rcv_auth_key: ed(),
            rcv_dh_key: [4; 32],
            basic_auth: auth.then(|| b"pass%word".to_vec()),
            sub_mode: SubMode::Subscribe,
            queue_req: q,
            ntf_creds: ntf.then(|| NtfCreds {
                key: x(),
                dh: [5; 32],
            }),
        }
    }

    /// What survives encoding `NEW` at version `v`.
    fn new_at(v: Version, q: &NewQueue) -> NewQueue {
        let mut e = q.clone();
        if v < SND_AUTH_KEY {
            e.queue_req = None;
        } else if v < SHORT_LINKS {
            e.queue_req = Some(match q.queue_mode() {
                Some(QueueMode::Messaging) => QueueReq::Messaging(None),
                _ => QueueReq::Contact(None),
            });
        }
        if v < NEW_NTF_CREDS {
            e.ntf_creds = None;
        }
        e
    }

    fn all_commands() -> Vec<Command> {
        let mut cmds = vec![];
        for q in [
            None,
            Some(QueueReq::Messaging(None)),
            Some(QueueReq::Contact(None)),
            Some(QueueReq::Messaging(Some(link(10)))),
            Some(QueueReq::Contact(Some((vec![9; 24], link(20))))),
        ] {
            for ntf in [false, true] {
                for auth in [false, true] {
                    cmds.push(Command::New(new_queue(q.clone(), ntf, auth)));
                }
            }
        }
        let mut only_create = new_queue(None, false, false);
        only_create.sub_mode = SubMode::OnlyCreate;
        only_create.rcv_auth_key = ed448();
        cmds.push(Command::New(only_create));
        cmds.extend([
            Command::Sub,
            Command::Subs(Some((42, [7; 16]))),
            Command::Key(ed()),
            Command::Key(ed448()),
            Command::Key(x()),
            Command::RKey(vec![ed(), x(), ed448()]),
            Command::LSet {
                link_id: vec![1; 24],
                fixed: vec![2; 1000],
                user: vec![],
            },
            Command::LDel,
            Command::NKey {
                key: ed(),
                dh: [6; 32],
            },
            Command::NDel,
            Command::Get,
            Command::Ack(vec![8; 24]),
            Command::Ack(vec![]),
            Command::Off,
            Command::Del,
            Command::Que,
            Command::SKey(x()),
            Command::Send {
                flags: MsgFlags::new(true),
                body: b"hello world".to_vec(),
            },
            Command::Send {
                flags: MsgFlags {
                    notification: false,
                    reserved: b"xyz".to_vec(),
                },
                body: vec![],
            },
            Command::Ping,
            Command::LKey(ed()),
            Command::LGet,
            Command::NSub,
            Command::NSubs(Some((-5, [1; 16]))),
            Command::Prxy {
                server: SmpServer {
                    hosts: vec!["smp.example.com".into(), "abcdef.onion".into()],
                    port: "5223".into(),
                    key_hash: vec![0xaa; 32],
                },
                auth: Some(b"secret".to_vec()),
            },
            Command::Prxy {
                server: SmpServer {
                    hosts: vec!["1.2.3.4".into(), "::1".into(), "[fe80::1]".into()],
                    port: String::new(),
                    key_hash: vec![0xbb; 32],
                },
                auth: None,
            },
            Command::PFwd {
                version: 17,
                key: [9; 32],
                et: vec![0xee; 500],
            },
            Command::RFwd(vec![0xdd; 300]),
            Command::Rslv("privacy.simplex".into()),
        ]);
        cmds
    }

    /// The command a version-`v` peer reads back.
    fn expected_at(v: Version, c: &Command) -> Command {
        match c {
            Command::New(q) => Command::New(new_at(v, q)),
            Command::Subs(s) => Command::Subs(if v >= RCV_SERVICE {
                Some(s.unwrap_or(NO_SERVICE_SUBS))
            } else {
                None
            }),
            Command::NSubs(s) => Command::NSubs(if v >= RCV_SERVICE {
                Some(s.unwrap_or(NO_SERVICE_SUBS))
            } else {
                None
            }),
            c => c.clone(),
        }
    }

    #[test]
    fn every_command_round_trips_at_every_version() {
        for v in 6..=20u16 {
            for c in all_commands() {
                let b = c.to_bytes(v);
                assert_eq!(
                    parse_command(v, &b),
                    Ok(expected_at(v, &c)),
                    "v{v} {}",
                    String::from_utf8_lossy(&b)
                );
                // a trailing byte is always a syntax error, except where a Tail or the RSLV
                // ignored rest absorbs it
                let mut extra = b.clone();
                extra.extend_from_slice(b" 0");
                let absorbs = matches!(
                    c,
                    Command::Send { .. } | Command::PFwd { .. } | Command::RFwd(_)
                );
                if !absorbs && !matches!(c, Command::Rslv(_)) {
                    assert_eq!(
                        parse_command(v, &extra),
                        Err(CommandError::Syntax),
                        "v{v} {c:?}"
                    );
                }
            }
        }
    }

    fn new_prefix() -> Vec<u8> {
        let mut b = b"NEW ".to_vec();
        b.push(44);
        b.extend_from_slice(&ED25519_SPKI_PREFIX);
        b.extend_from_slice(&[1; 32]);
        b.push(44);
        b.extend_from_slice(&X25519_SPKI_PREFIX);
        b.extend_from_slice(&[4; 32]);
        b
    }

    #[test]
    fn new_wire_forms_per_version() {
        let q = new_queue(Some(QueueReq::Messaging(None)), true, true);
        let tail = |v| Command::New(q.clone()).to_bytes(v)[new_prefix().len()..].to_vec();
        assert_eq!(
            new_prefix(),
            Command::New(q.clone()).to_bytes(6)[..94].to_vec()
        );
        assert_eq!(tail(6), b"A\x09pass%wordS");
        assert_eq!(tail(8), b"A\x09pass%wordS");
        assert_eq!(tail(9), b"1\x09pass%wordST");
        assert_eq!(tail(14), b"1\x09pass%wordST");
        assert_eq!(tail(15), b"1\x09pass%wordS1M0");
        assert_eq!(tail(16), b"1\x09pass%wordS1M0");
        let mut t17 = b"1\x09pass%wordS1M01\x2c".to_vec();
        t17.extend_from_slice(&X25519_SPKI_PREFIX);
        t17.extend_from_slice(&[3; 32]);
        t17.push(0x2c);
        t17.extend_from_slice(&X25519_SPKI_PREFIX);
        t17.extend_from_slice(&[5; 32]);
        assert_eq!(tail(17), t17);
        // the form of the syntax tests: no auth, subscribe, messaging, no ntf creds
        let mut b = new_prefix();
        b.extend_from_slice(b"0S1M00");
        assert!(matches!(parse_command(20, &b), Ok(Command::New(_))));
        // that form is wrong at other versions
        assert_eq!(parse_command(16, &b), Err(CommandError::Syntax));
        assert_eq!(parse_command(8, &b), Err(CommandError::Syntax));
        // v6-8 without the 'A' part
        let mut b = new_prefix();
        b.push(b'C');
        let Ok(Command::New(n)) = parse_command(6, &b) else {
            panic!("NEW v6")
        };
        assert_eq!(
            (n.basic_auth, n.sub_mode, n.queue_req),
            (None, SubMode::OnlyCreate, None)
        );
        // v9-14 contact queue
        let mut b = new_prefix();
        b.extend_from_slice(b"0SF");
        let Ok(Command::New(n)) = parse_command(12, &b) else {
            panic!("NEW v12")
        };
        assert_eq!(n.queue_req, Some(QueueReq::Contact(None)));
    }

    #[test]
    fn new_rejects_bad_parameters() {
        let v = 20;
        for tail in [
            &b"0X1M00"[..],  // bad sub mode
            b"0S1X00",       // bad queue mode
            b"0S1M0",        // missing ntf creds Maybe
            b"2S1M00",       // bad Maybe tag
            b"1\x02a@S1M00", // '@' not allowed in basic auth
            b"1\x02a S1M00", // nor space
        ] {
            let mut b = new_prefix();
            b.extend_from_slice(tail);
            assert_eq!(parse_command(v, &b), Err(CommandError::Syntax), "{tail:?}");
        }
        // X448 or garbage as the auth key, and a non-X25519 DH key
        let mut x448 = X448_SPKI_PREFIX.to_vec();
        x448.extend_from_slice(&[1; 56]);
        let mut b = b"NEW ".to_vec();
        b.push(x448.len() as u8);
        b.extend_from_slice(&x448);
        b.extend_from_slice(&new_prefix()[4 + 45..]);
        b.extend_from_slice(b"0S1M00");
        assert_eq!(parse_command(v, &b), Err(CommandError::Syntax));
        let mut b = new_prefix();
        let n = b.len();
        b[n - 33 - 12 + 9] = 0x70; // turn the X25519 OID into Ed25519
        b.extend_from_slice(b"0S1M00");
        assert_eq!(parse_command(v, &b), Err(CommandError::Syntax));
        assert_eq!(parse_command(v, b"NEW"), Err(CommandError::Syntax));
        assert_eq!(parse_command(v, b"NEW "), Err(CommandError::Syntax));
    }

    #[test]
    fn send_flags_and_body() {
        let c = parse_command(7, b"SEND T  body with spaces ").unwrap();
        assert_eq!(
            c,
            Command::Send {
                flags: MsgFlags::new(true),
                body: b" body with spaces ".to_vec()
            }
        );
        let c = parse_command(7, b"SEND Fabc x").unwrap();
        let Command::Send { flags, body } = &c else {
            panic!()
        };
        assert_eq!(
            (flags.notification, &flags.reserved[..], &body[..]),
            (false, &b"abc"[..], &b"x"[..])
        );
        assert_eq!(flags.canonical(), MsgFlags::new(false));
        assert_eq!(c.to_bytes(7), b"SEND Fabc x");
        assert_eq!(
            parse_command(7, b"SEND F "),
            Ok(Command::Send {
                flags: MsgFlags::new(false),
                body: vec![]
            })
        );
        for bad in [
            &b"SEND"[..],
            b"SEND ",
            b"SEND F",
            b"SEND X body",
            b"SEND  F body",
            b"SENDF body",
        ] {
            assert!(parse_command(7, bad).is_err(), "{bad:?}");
        }
        assert_eq!(parse_command(7, b"SENDF body"), Err(CommandError::Unknown));
    }

    #[test]
    fn subs_per_version() {
        assert_eq!(parse_command(16, b"SUBS"), Ok(Command::Subs(None)));
        assert_eq!(parse_command(18, b"NSUBS"), Ok(Command::NSubs(None)));
        // params are a syntax error before v19, and required from v19
        let mut p = b"SUBS ".to_vec();
        p.extend_from_slice(&3i64.to_be_bytes());
        p.push(16);
        p.extend_from_slice(&[0xab; 16]);
        assert_eq!(parse_command(18, &p), Err(CommandError::Syntax));
        assert_eq!(
            parse_command(19, &p),
            Ok(Command::Subs(Some((3, [0xab; 16]))))
        );
        assert_eq!(parse_command(19, b"SUBS"), Err(CommandError::Syntax));
        assert_eq!(Command::Subs(Some((3, [0xab; 16]))).to_bytes(18), b"SUBS");
        assert_eq!(Command::Subs(Some((3, [0xab; 16]))).to_bytes(19), p);
        // a hash that is not 16 bytes parses, as the reference's (any string): zero-filled here
        let mut p = b"NSUBS ".to_vec();
        p.extend_from_slice(&3i64.to_be_bytes());
        p.push(2);
        p.extend_from_slice(&[0xab; 2]);
        let mut short = [0u8; 16];
        short[..2].copy_from_slice(&[0xab; 2]);
        assert_eq!(parse_command(20, &p), Ok(Command::NSubs(Some((3, short)))));
        // anything after the hash is still a syntax error
        p.push(b'x');
        assert_eq!(parse_command(20, &p), Err(CommandError::Syntax));
    }

    #[test]
    fn prxy_hosts_and_auth() {
        let enc = |hosts: &[&str], auth: Option<&[u8]>| {
            let mut b = b"PRXY ".to_vec();
            b.push(hosts.len() as u8);
            for h in hosts {
                b.push(h.len() as u8);
                b.extend_from_slice(h.as_bytes());
            }
            b.extend_from_slice(b"\x03443\x20");
            b.extend_from_slice(&[1; 32]);
            match auth {
                None => b.push(b'0'),
                Some(a) => {
                    b.push(b'1');
                    b.push(a.len() as u8);
                    b.extend_from_slice(a);
                }
            }
            b
        };
        for ok in [
            &["a.b"][..],
            &["10.0.0.1"],
            &["xyz234.onion", "h"],
            &["[::1]"],
            &["dead:beef::1"],
        ] {
            assert!(parse_command(8, &enc(ok, None)).is_ok(), "{ok:?}");
        }
        for bad in [
            &[][..],
            &[""],
            &["a b"],
            &["a/b"],
            &["1.2.3.4x"],
            &["x.onion."],
            &["Ab.onion"],
            &["[zz]"],
        ] {
            assert_eq!(
                parse_command(8, &enc(bad, None)),
                Err(CommandError::Syntax),
                "{bad:?}"
            );
        }
        assert!(parse_command(8, &enc(&["h"], Some(b"pw"))).is_ok());
        assert_eq!(
            parse_command(8, &enc(&["h"], Some(b"p:w"))),
            Err(CommandError::Syntax)
        );
    }

    #[test]
    fn rslv_domain_rules() {
        assert_eq!(
            parse_command(20, b"RSLV Privacy.SimpleX"),
            Ok(Command::Rslv("privacy.simplex".into()))
        );
        // the rest of the input after the domain is ignored
        assert_eq!(
            parse_command(20, b"RSLV a-1.b junk \x00"),
            Ok(Command::Rslv("a-1.b".into()))
        );
        let long_label = format!("RSLV {}.simplex", "a".repeat(64));
        let long_name = format!("RSLV {}.simplex", vec!["a".repeat(60); 5].join("."));
        for bad in [
            "RSLV",
            "RSLV ",
            "RSLV simplex",
            "RSLV a..b",
            "RSLV a.b.",
            "RSLV -a.b",
            "RSLV a-.b",
            "RSLV a--b.c",
            "RSLV a_b.c",
            "RSLV  a.b",
            &long_label,
            &long_name,
        ] {
            assert_eq!(
                parse_command(20, bad.as_bytes()),
                Err(CommandError::Syntax),
                "{bad}"
            );
        }
    }

    #[test]
    fn unknown_tags() {
        for t in [
            &b"HELLO"[..],
            b"OK",
            b"SUB=",
            b"PONG",
            b"IDS",
            b"",
            b" SUB",
            b"sub",
            b"ERR AUTH",
        ] {
            assert_eq!(parse_command(20, t), Err(CommandError::Unknown), "{t:?}");
        }
        // the tag ends at the first space: a known tag with junk params is a syntax error
        assert_eq!(parse_command(20, b"SUB "), Err(CommandError::Syntax));
        assert_eq!(parse_command(20, b"PING x"), Err(CommandError::Syntax));
    }

    #[test]
    fn credential_table() {
        use CommandError::*;
        let new = Command::New(new_queue(None, false, false));
        let send = Command::Send {
            flags: MsgFlags::new(false),
            body: vec![],
        };
        let pfwd = Command::PFwd {
            version: 8,
            key: [0; 32],
            et: vec![],
        };
        let prxy = parse_command(8, b"PRXY \x01\x01h\x00\x000").unwrap();
        // (command, [auth+entity, auth only, entity only, neither])
        let table: Vec<(Command, [Result<(), CommandError>; 4])> = vec![
            (new, [Err(HasAuth), Ok(()), Err(NoAuth), Err(NoAuth)]),
            (send, [Ok(()), Err(NoEntity), Ok(()), Err(NoEntity)]),
            (
                Command::Ping,
                [Err(HasAuth), Err(HasAuth), Err(HasAuth), Ok(())],
            ),
            (prxy, [Err(HasAuth), Err(HasAuth), Err(HasAuth), Ok(())]),
            (
                Command::RFwd(vec![]),
                [Err(HasAuth), Err(HasAuth), Err(HasAuth), Ok(())],
            ),
            (
                Command::Rslv("a.b".into()),
                [Err(HasAuth), Err(HasAuth), Err(HasAuth), Ok(())],
            ),
            (
                Command::LGet,
                [Err(HasAuth), Err(NoEntity), Ok(()), Err(NoEntity)],
            ),
            (pfwd, [Err(HasAuth), Err(NoEntity), Ok(()), Err(NoEntity)]),
        ];
        let mut others = all_commands();
        others.retain(|c| {
            !matches!(
                c,
                Command::New(_)
                    | Command::Send { .. }
                    | Command::Ping
                    | Command::Prxy { .. }
                    | Command::RFwd(_)
                    | Command::Rslv(_)
                    | Command::LGet
                    | Command::PFwd { .. }
            )
        });
        assert!(others.len() >= 17);
        let table = table.into_iter().chain(
            others
                .into_iter()
                .map(|c| (c, [Ok(()), Err(NoAuth), Err(NoAuth), Err(NoAuth)])),
        );
        for (c, expect) in table {
            let got = [
                check_credentials(&c, true, false),
                check_credentials(&c, true, true),
                check_credentials(&c, false, false),
                check_credentials(&c, false, true),
            ];
            assert_eq!(got, expect, "{}", c.tag());
        }
    }

    #[test]
    fn parties_and_tags() {
        assert_eq!(Command::Ping.party(), Party::None);
        assert_eq!(Command::LGet.party(), Party::LinkClient);
        assert_eq!(Command::Subs(None).party(), Party::RecipientService);
        assert_eq!(Command::NSubs(None).party(), Party::NotifierService);
        assert_eq!(Command::RFwd(vec![]).party(), Party::ProxyService);
        assert_eq!(Command::SKey(ed()).party(), Party::Sender);
        assert_eq!(Command::Rslv("a.b".into()).party(), Party::Resolver);
        for c in all_commands() {
            assert!(c.to_bytes(20).starts_with(c.tag().as_bytes()));
        }
    }
}

/// `serverSyntaxTests` of the reference (simplexmq `tests/ServerTests.hs`) at the level this
/// module decides: transmission parse, command parse, credential shape.
#[cfg(test)]
mod syntax_table {
    use super::*;
    use crate::protocol::transmission::{encode_client_transmission, parse_transmission};
    use base64::Engine;

    fn b64(s: &str) -> Vec<u8> {
        base64::engine::general_purpose::STANDARD.decode(s).unwrap()
    }

    /// What the relay answers before looking up any queue: a command error, or "passes" (the
    /// reference then answers AUTH for an unknown queue, or PONG).
    fn run(v: Version, auth: &[u8], corr: &[u8], entity: &[u8], cmd: &[u8]) -> &'static str {
        let t = encode_client_transmission(v, &[7; 32], auth, None, corr, entity, cmd);
        let raw = parse_transmission(v, &t).expect("transmission parses");
        let res = parse_command(v, raw.command).and_then(|c| {
            check_credentials(&c, !raw.authorization.is_empty(), raw.entity_id.is_empty())
        });
        match res {
            Ok(()) => "passes",
            Err(e) => e.as_str(),
        }
    }

    #[test]
    fn server_syntax_tests() {
        let sig = b64("e8JK+8V3fq6kOLqco/SaKlpNaQ7i1gfOrXoqekEl42u4mF8Bgu14T5j0189CGcUhJHw2RwCMvON+qbvQ9ecJAA==");
        assert_eq!(sig.len(), 64);
        let key = b64("MCowBQYDK2VwAyEAfAOflyvbJv1fszgzkQ6buiZJVgSpQWsucXq7U6zjMgY=");
        let dh = b64("MCowBQYDK2VuAyEAriy+HcARIhqsgSjVnjKqoft+y6pxrxdY68zn4+LjYhQ=");
        let cat = |parts: &[&[u8]]| parts.concat();
        let sk = cat(&[&[key.len() as u8], &key]);
        let sdh = cat(&[&[dh.len() as u8], &dh]);
        let new_ok = cat(&[b"NEW ", &sk, &sdh, b"0S1M00"]);
        let no = b"";
        for v in [20u16, 18, 16] {
            let s = &sig[..];
            assert_eq!(run(v, no, b"abcd", b"1234", b"HELLO"), "UNKNOWN");
            assert_eq!(run(v, s, b"bcda", no, b"NEW"), "SYNTAX");
            assert_eq!(
                run(v, s, b"cdab", no, &cat(&[b"NEW \x01A", &sk, &sdh])),
                "SYNTAX"
            );
            let new_v = if v >= NEW_NTF_CREDS {
                new_ok.clone()
            } else {
                cat(&[b"NEW ", &sk, &sdh, b"0S1M0"])
            };
            assert_eq!(run(v, no, b"dabc", no, &new_v), "NO_AUTH");
            assert_eq!(run(v, s, b"abcd", b"12345678", &new_v), "HAS_AUTH");
            assert_eq!(run(v, s, b"abcd", no, &new_v), "passes");

            let key_ok = cat(&[b"KEY ", &sk]);
            assert_eq!(run(v, s, b"bcda", b"12345678", &key_ok), "passes");
            assert_eq!(run(v, s, b"cdab", b"12345678", b"KEY"), "SYNTAX");
            assert_eq!(
                run(v, s, b"dabc", b"12345678", &cat(&[b"KEY \x01A", &sk])),
                "SYNTAX"
            );
            assert_eq!(run(v, no, b"abcd", b"12345678", &key_ok), "NO_AUTH");
            assert_eq!(run(v, s, b"bcda", no, &key_ok), "NO_AUTH");

            for tag in [&b"SUB"[..], b"OFF", b"DEL"] {
                assert_eq!(run(v, s, b"abcd", b"12345678", tag), "passes");
                assert_eq!(
                    run(v, s, b"bcda", b"12345678", &cat(&[tag, b"="])),
                    "UNKNOWN"
                );
                assert_eq!(run(v, no, b"cdab", b"12345678", tag), "NO_AUTH");
                assert_eq!(run(v, s, b"dabc", no, tag), "NO_AUTH");
            }

            assert_eq!(run(v, s, b"cdab", b"12345678", b"SEND F hello"), "passes");
            assert_eq!(run(v, s, b"abcd", b"12345678", b"SEND"), "SYNTAX");
            assert_eq!(run(v, s, b"bcda", no, b"SEND F hello"), "NO_ENTITY");

            assert_eq!(run(v, s, b"cdab", b"12345678", b"ACK \x041234"), "passes");
            assert_eq!(run(v, s, b"abcd", b"12345678", b"ACK"), "SYNTAX");
            assert_eq!(run(v, s, b"bcda", no, b"ACK \x041234"), "NO_AUTH");
            assert_eq!(run(v, no, b"cdab", b"12345678", b"ACK \x041234"), "NO_AUTH");

            assert_eq!(run(v, no, b"abcd", no, b"PING"), "passes");
            assert_eq!(run(v, s, b"bcda", b"12345678", b"OK"), "UNKNOWN");
        }
    }
}
