//! The control port's language, without I/O: a command line into a `ControlCommand` (simplexmq
//! `src/Simplex/Messaging/Server/Control.hs`, `ControlProtocol`), the role an `auth` gives, and the
//! texts of the answers that print the reference's values as Haskell's `show` writes them
//! (simplexmq `src/Simplex/Messaging/Server.hs`, the control port client), so that scripts written
//! for the reference read this relay's answers alike.
//!
//! Parse errors are worded as the reference's parser reports them (attoparsec's messages after
//! `error: `), for the failures an operator makes: an unknown command, a missing or extra word, an
//! empty or malformed ID, a bad block reason.

use std::fmt;

use crate::protocol::command::QueueMode;
use crate::protocol::error::{BlockingInfo, BlockingReason};
use crate::store::{EntityId, QueueStatus};

/// The first lines a control connection reads.
pub const GREETING: &str = "SMP server control port\n'help' for supported commands";

/// The answer to `help`, as the reference words it (it lists fewer commands than it serves).
pub const HELP: &str =
    "commands: stats, stats-rts, clients, sockets, socket-threads, threads, server-info, delete, save, help, quit";

/// What a control connection may do (simplexmq `Control.hs`, `CPClientRole`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    None,
    User,
    Admin,
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Role::None => "CPRNone",
            Role::User => "CPRUser",
            Role::Admin => "CPRAdmin",
        })
    }
}

/// One command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ControlCommand {
    Auth(Vec<u8>),
    Suspend,
    Resume,
    Clients,
    Stats,
    StatsRts,
    Threads,
    Sockets,
    SocketThreads,
    ServerInfo,
    /// A sender ID or a link ID, as every queue command of the port takes.
    Delete(EntityId),
    Status(EntityId),
    Block(EntityId, BlockingInfo),
    Unblock(EntityId),
    Save,
    Help,
    Quit,
    /// The empty line: nothing is answered.
    Skip,
}

/// What reading a line left: the rest of the line.
struct Cursor<'a> {
    rest: &'a [u8],
}

const NOT_ENOUGH: &str = "not enough input";

impl<'a> Cursor<'a> {
    /// The next byte must be a space (`A.space`).
    fn space(&mut self) -> Result<(), String> {
        match self.rest.first() {
            None => Err(format!("space: {NOT_ENOUGH}")),
            Some(b) if b.is_ascii_whitespace() || *b == 0x0b => {
                self.rest = &self.rest[1..];
                Ok(())
            }
            Some(_) => Err("space: Failed reading: satisfyWith".into()),
        }
    }

    /// Nothing may follow (`A.endOfInput`).
    fn end(&self) -> Result<(), String> {
        if self.rest.is_empty() {
            Ok(())
        } else {
            Err("endOfInput".into())
        }
    }

    /// At least one byte while `p` holds (`A.takeWhile1`).
    fn take_while1(&mut self, p: impl Fn(u8) -> bool) -> Result<&'a [u8], String> {
        if self.rest.is_empty() {
            return Err(NOT_ENOUGH.into());
        }
        let n = self.rest.iter().take_while(|b| p(**b)).count();
        if n == 0 {
            return Err("Failed reading: takeWhile1".into());
        }
        let (taken, rest) = self.rest.split_at(n);
        self.rest = rest;
        Ok(taken)
    }

    /// A literal (attoparsec's `string`).
    fn literal(&mut self, s: &str) -> Result<(), String> {
        match self.rest.strip_prefix(s.as_bytes()) {
            Some(rest) => {
                self.rest = rest;
                Ok(())
            }
            None if s.as_bytes().starts_with(self.rest) => Err(NOT_ENOUGH.into()),
            None => Err("string".into()),
        }
    }

    /// A base64url entity ID (simplexmq `Encoding/String.hs`, `base64urlP`): unpadded or padded.
    fn entity_id(&mut self) -> Result<EntityId, String> {
        let text = self.take_while1(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')?;
        let pad = self.rest.iter().take_while(|b| **b == b'=').count();
        let (pad_bytes, rest) = self.rest.split_at(pad);
        self.rest = rest;
        let mut all = text.to_vec();
        all.extend_from_slice(pad_bytes);
        base64url(&all).map_err(|e| format!("Failed reading: {e}"))
    }

    /// `reason=spam|content[,notice=<json>]` (simplexmq `Protocol.hs`, `BlockingInfo`). A notice
    /// that is not a JSON object with an optional integer `ttl` is not part of the info, so the
    /// line fails at its end, as the reference's parser does.
    fn blocking_info(&mut self) -> Result<BlockingInfo, String> {
        self.literal("reason=")?;
        let reason = if self.literal("spam").is_ok() {
            BlockingReason::Spam
        } else {
            self.literal("content")?;
            BlockingReason::Content
        };
        let notice = match self.rest.strip_prefix(b",notice=") {
            Some(json) => match notice_ttl(json) {
                Some(ttl) => {
                    self.rest = &[];
                    Some(match ttl {
                        Some(t) => format!("{{\"ttl\":{t}}}"),
                        None => "{}".to_string(),
                    })
                }
                None => None,
            },
            None => None,
        };
        Ok(BlockingInfo { reason, notice })
    }
}

/// Decodes base64url letters followed by `=`s as the reference's decoder does (base64-bytestring's
/// `Data.ByteString.Base64.URL.decode`: padding optional, canonical), with its error texts.
fn base64url(text: &[u8]) -> Result<Vec<u8>, String> {
    let mut t = text.to_vec();
    match t.len() % 4 {
        1 => return Err("Base64-encoded bytestring has invalid size".into()),
        3 if t.last() == Some(&b'=') => {
            return Err("Base64-encoded bytestring has invalid padding".into())
        }
        2 => t.extend_from_slice(b"=="),
        3 => t.push(b'='),
        _ => {}
    }
    let last = t.len() - 4;
    for (i, &b) in t.iter().enumerate() {
        let pad_ok = i >= last + 2 && (i == t.len() - 1 || t[t.len() - 1] == b'=');
        if b == b'=' && !pad_ok {
            return Err(if i == last + 2 {
                // `c` padded but not `d`: the reference reports `d`.
                format!("invalid character at offset: {}", last + 3)
            } else {
                format!("invalid padding at offset: {i}")
            });
        }
    }
    // Bits the padding drops must be zero.
    let value = |b: u8| crate::crypto::hash::b64url_decode(&(b as char).to_string().repeat(4));
    let sextet = |b: u8| value(b).map_or(0, |v| v[0] >> 2);
    let (c, d) = (t[last + 2], t[last + 3]);
    if c == b'=' && sextet(t[last + 1]) & 0x0f != 0 {
        return Err(format!(
            "non-canonical encoding detected at offset: {}",
            last + 1
        ));
    }
    if c != b'=' && d == b'=' && sextet(c) & 0x03 != 0 {
        return Err(format!(
            "non-canonical encoding detected at offset: {}",
            last + 2
        ));
    }
    crate::crypto::hash::b64url_decode(&String::from_utf8_lossy(&t))
        .ok_or_else(|| "invalid character at offset: 0".to_string())
}

/// The `ttl` of a notice (`Some(None)`: none or null), or `None` if the text is not a notice
/// (simplexmq `Protocol/Types.hs`, `ClientNotice`: other fields are ignored).
fn notice_ttl(json: &[u8]) -> Option<Option<i64>> {
    let v: serde_json::Value = serde_json::from_slice(json).ok()?;
    let obj = v.as_object()?;
    match obj.get("ttl") {
        None | Some(serde_json::Value::Null) => Some(None),
        Some(t) => t.as_i64().map(Some),
    }
}

/// Parses one line, without its line end (a trailing CR is removed here, as the reference does).
/// The error is the reference parser's message.
pub fn parse(line: &[u8]) -> Result<ControlCommand, String> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let word_len = line.iter().position(|b| *b == b' ').unwrap_or(line.len());
    let (word, rest) = line.split_at(word_len);
    let mut c = Cursor { rest };
    let cmd = match word {
        b"auth" => {
            c.space()?;
            let pw = c.take_while1(|b| b != b'@')?;
            let valid = |b: &u8| {
                b.is_ascii_graphic() && *b != b'@' && *b != b':' && *b != b'/' || *b >= 0xa0
            };
            if !pw.iter().all(valid) {
                return Err("Failed reading: invalid character in BasicAuth".into());
            }
            ControlCommand::Auth(pw.to_vec())
        }
        b"suspend" => ControlCommand::Suspend,
        b"resume" => ControlCommand::Resume,
        b"clients" => ControlCommand::Clients,
        b"stats" => ControlCommand::Stats,
        b"stats-rts" => ControlCommand::StatsRts,
        b"threads" => ControlCommand::Threads,
        b"sockets" => ControlCommand::Sockets,
        b"socket-threads" => ControlCommand::SocketThreads,
        b"server-info" => ControlCommand::ServerInfo,
        b"delete" | b"status" | b"unblock" | b"block" => {
            c.space()?;
            let id = c.entity_id()?;
            match word {
                b"delete" => ControlCommand::Delete(id),
                b"status" => ControlCommand::Status(id),
                b"unblock" => ControlCommand::Unblock(id),
                _ => {
                    c.space()?;
                    ControlCommand::Block(id, c.blocking_info()?)
                }
            }
        }
        b"save" => ControlCommand::Save,
        b"help" => ControlCommand::Help,
        b"quit" => ControlCommand::Quit,
        b"" => ControlCommand::Skip,
        _ => return Err("Failed reading: bad ControlProtocol command".into()),
    };
    c.end()?;
    Ok(cmd)
}

/// `auth`: the role `password` gives and the answer. The first `auth` that names a role sets it
/// for the connection; later ones cannot change it (simplexmq `Server.hs`, `controlPortAuth`).
pub fn authenticate(
    current: Role,
    password: &[u8],
    user: Option<&[u8]>,
    admin: Option<&[u8]>,
) -> (Role, String) {
    let named = if admin == Some(password) {
        Role::Admin
    } else if user == Some(password) {
        Role::User
    } else {
        Role::None
    };
    match current {
        Role::None => (named, format!("Current role is {named}")),
        r if r == named => (r, format!("Current role is {r}")),
        r => (
            r,
            format!("Current role is {r}, start new session to change."),
        ),
    }
}

/// Haskell's `show` of a `BlockingInfo` (a record).
pub fn show_blocking_info(info: &BlockingInfo) -> String {
    let reason = match info.reason {
        BlockingReason::Spam => "BRSpam",
        BlockingReason::Content => "BRContent",
    };
    let notice = match info.notice.as_deref().map(|n| notice_ttl(n.as_bytes())) {
        None | Some(None) => "Nothing".to_string(),
        Some(Some(ttl)) => format!("Just (ClientNotice {{ttl = {}}})", show_maybe_int(ttl)),
    };
    format!("BlockingInfo {{reason = {reason}, notice = {notice}}}")
}

fn show_maybe_int(v: Option<i64>) -> String {
    match v {
        None => "Nothing".into(),
        Some(n) if n < 0 => format!("Just ({n})"),
        Some(n) => format!("Just {n}"),
    }
}

/// Haskell's `show` of a queue status (`ServerEntityStatus`).
pub fn show_status(status: &QueueStatus) -> String {
    match status {
        QueueStatus::Active => "EntityActive".into(),
        QueueStatus::Off => "EntityOff".into(),
        QueueStatus::Blocked(info) => format!("EntityBlocked ({})", show_blocking_info(info)),
    }
}

/// The answer to `status`: the queue's status, the day it was last updated (`updatedAt`, a
/// `Maybe SystemDate`) and its mode (`Maybe QueueMode`).
pub fn status_line(
    status: &QueueStatus,
    updated_at: Option<i64>,
    mode: Option<QueueMode>,
) -> String {
    let updated = match updated_at {
        None => "Nothing".to_string(),
        Some(t) if t < 0 => format!("Just (RoundedSystemTime {{roundedSeconds = ({t})}})"),
        Some(t) => format!("Just (RoundedSystemTime {{roundedSeconds = {t}}})"),
    };
    let mode = match mode {
        None => "Nothing",
        Some(QueueMode::Messaging) => "Just QMMessaging",
        Some(QueueMode::Contact) => "Just QMContact",
    };
    format!(
        "status: {}, updatedAt: {updated}, queueMode: {mode}",
        show_status(status)
    )
}

/// The daily limit on `block` (`[AUTH] daily_block_queue_quota`): 0 unlimited, -1 (any negative)
/// no blocking at all; the count starts again at 0:00 UTC.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockQuota {
    pub quota: i64,
    day: i64,
    blocked: i64,
}

impl BlockQuota {
    pub fn new(quota: i64) -> Self {
        BlockQuota {
            quota,
            day: i64::MIN,
            blocked: 0,
        }
    }

    fn roll(&mut self, now_secs: i64) {
        let day = now_secs.div_euclid(86400);
        if day != self.day {
            self.day = day;
            self.blocked = 0;
        }
    }

    /// Counts one block, or refuses it if no more queues may be blocked today (simplexmq
    /// `Server.hs`: the count is compared before the queue is looked up).
    pub fn take(&mut self, now_secs: i64) -> Result<(), String> {
        self.roll(now_secs);
        if self.blocked >= self.quota && self.quota != 0 {
            Err(format!(
                "error: reached limit of {} queues blocked daily",
                self.quota
            ))
        } else {
            self.blocked += 1;
            Ok(())
        }
    }

    /// Gives back a block `take` counted at `counted_on` that blocked no active queue (the
    /// reference counts only those), unless its day is over.
    pub fn give_back(&mut self, counted_on: i64) {
        if counted_on.div_euclid(86400) == self.day {
            self.blocked = (self.blocked - 1).max(0);
        }
    }

    /// Queues blocked today (the reference's `qBlocked`).
    pub fn blocked_today(&mut self, now_secs: i64) -> i64 {
        self.roll(now_secs);
        self.blocked
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> EntityId {
        crate::crypto::hash::b64url_decode(s).unwrap()
    }

    #[test]
    fn commands_without_arguments() {
        for (line, cmd) in [
            ("suspend", ControlCommand::Suspend),
            ("resume", ControlCommand::Resume),
            ("clients", ControlCommand::Clients),
            ("stats", ControlCommand::Stats),
            ("stats-rts", ControlCommand::StatsRts),
            ("threads", ControlCommand::Threads),
            ("sockets", ControlCommand::Sockets),
            ("socket-threads", ControlCommand::SocketThreads),
            ("server-info", ControlCommand::ServerInfo),
            ("save", ControlCommand::Save),
            ("help", ControlCommand::Help),
            ("quit", ControlCommand::Quit),
            ("", ControlCommand::Skip),
            ("stats\r", ControlCommand::Stats),
        ] {
            assert_eq!(parse(line.as_bytes()), Ok(cmd), "{line:?}");
        }
    }

    #[test]
    fn queue_commands_take_a_base64url_id() {
        let sid = "AQIDBAUGBwgJCgsMDQ4PEBESExQVFhcY";
        assert_eq!(
            parse(format!("delete {sid}").as_bytes()),
            Ok(ControlCommand::Delete(id(sid)))
        );
        assert_eq!(
            parse(format!("status {sid}").as_bytes()),
            Ok(ControlCommand::Status(id(sid)))
        );
        assert_eq!(
            parse(format!("unblock {sid}").as_bytes()),
            Ok(ControlCommand::Unblock(id(sid)))
        );
        assert_eq!(
            parse(b"status AQID"),
            Ok(ControlCommand::Status(vec![1, 2, 3]))
        );
        assert_eq!(
            parse(b"status AQI="),
            Ok(ControlCommand::Status(vec![1, 2]))
        );
    }

    #[test]
    fn block_takes_a_reason_and_an_optional_notice() {
        let b = |line: &str| parse(line.as_bytes());
        assert_eq!(
            b("block AQID reason=spam"),
            Ok(ControlCommand::Block(
                vec![1, 2, 3],
                BlockingInfo {
                    reason: BlockingReason::Spam,
                    notice: None
                }
            ))
        );
        assert_eq!(
            b("block AQID reason=content,notice={\"ttl\": 3600, \"x\": 1}"),
            Ok(ControlCommand::Block(
                vec![1, 2, 3],
                BlockingInfo {
                    reason: BlockingReason::Content,
                    notice: Some("{\"ttl\":3600}".into())
                }
            ))
        );
        assert_eq!(
            b("block AQID reason=spam,notice={}"),
            Ok(ControlCommand::Block(
                vec![1, 2, 3],
                BlockingInfo {
                    reason: BlockingReason::Spam,
                    notice: Some("{}".into())
                }
            ))
        );
        // A notice that is not one leaves text behind the info.
        assert_eq!(
            b("block AQID reason=spam,notice=[1]"),
            Err("endOfInput".into())
        );
        assert_eq!(
            b("block AQID reason=spam,notice={\"ttl\":\"x\"}"),
            Err("endOfInput".into())
        );
        assert_eq!(b("block AQID reason=ham"), Err("string".into()));
        assert_eq!(b("block AQID spam"), Err("string".into()));
        assert_eq!(b("block AQID"), Err("space: not enough input".into()));
        assert_eq!(b("block AQID reason="), Err("not enough input".into()));
    }

    #[test]
    fn errors_are_the_reference_parser_s() {
        let e = |line: &str| parse(line.as_bytes()).unwrap_err();
        assert_eq!(e("hello"), "Failed reading: bad ControlProtocol command");
        assert_eq!(e("STATS"), "Failed reading: bad ControlProtocol command");
        // The empty first word is the empty line's, which must end there.
        assert_eq!(e(" stats"), "endOfInput");
        assert_eq!(e("stats now"), "endOfInput");
        assert_eq!(e("stats "), "endOfInput");
        assert_eq!(e("delete"), "space: not enough input");
        assert_eq!(e("delete "), "not enough input");
        assert_eq!(e("delete !!"), "Failed reading: takeWhile1");
        assert_eq!(e("delete AQID extra"), "endOfInput");
        assert_eq!(
            e("delete A"),
            "Failed reading: Base64-encoded bytestring has invalid size"
        );
        assert_eq!(
            e("delete AA="),
            "Failed reading: Base64-encoded bytestring has invalid padding"
        );
        assert_eq!(
            e("delete A==="),
            "Failed reading: invalid padding at offset: 1"
        );
        assert_eq!(
            e("delete AB"),
            "Failed reading: non-canonical encoding detected at offset: 1"
        );
        assert_eq!(
            e("delete AAB"),
            "Failed reading: non-canonical encoding detected at offset: 2"
        );
        assert_eq!(
            e("delete AAAA===="),
            "Failed reading: invalid padding at offset: 4"
        );
        assert_eq!(e("auth"), "space: not enough input");
        assert_eq!(e("auth "), "not enough input");
        assert_eq!(
            e("auth two words"),
            "Failed reading: invalid character in BasicAuth"
        );
        assert_eq!(
            e("auth a:b"),
            "Failed reading: invalid character in BasicAuth"
        );
        assert_eq!(e("auth a@b"), "endOfInput");
    }

    #[test]
    fn auth_sets_the_role_once() {
        let (user, admin) = (Some(&b"u-pw"[..]), Some(&b"a-pw"[..]));
        assert_eq!(
            parse(b"auth a-pw"),
            Ok(ControlCommand::Auth(b"a-pw".to_vec()))
        );
        let a = |role, pw: &[u8]| authenticate(role, pw, user, admin);
        assert_eq!(
            a(Role::None, b"a-pw"),
            (Role::Admin, "Current role is CPRAdmin".into())
        );
        assert_eq!(
            a(Role::None, b"u-pw"),
            (Role::User, "Current role is CPRUser".into())
        );
        assert_eq!(
            a(Role::None, b"wrong"),
            (Role::None, "Current role is CPRNone".into())
        );
        assert_eq!(
            a(Role::User, b"u-pw"),
            (Role::User, "Current role is CPRUser".into())
        );
        assert_eq!(
            a(Role::User, b"a-pw"),
            (
                Role::User,
                "Current role is CPRUser, start new session to change.".into()
            )
        );
        assert_eq!(
            a(Role::Admin, b"wrong"),
            (
                Role::Admin,
                "Current role is CPRAdmin, start new session to change.".into()
            )
        );
        // Without passwords configured, no password gives a role.
        assert_eq!(authenticate(Role::None, b"x", None, None).0, Role::None);
    }

    #[test]
    fn statuses_are_shown_as_haskell_shows_them() {
        let spam = BlockingInfo {
            reason: BlockingReason::Spam,
            notice: None,
        };
        assert_eq!(
            show_status(&QueueStatus::Blocked(spam)),
            "EntityBlocked (BlockingInfo {reason = BRSpam, notice = Nothing})"
        );
        let content = BlockingInfo {
            reason: BlockingReason::Content,
            notice: Some("{\"ttl\":3600}".into()),
        };
        assert_eq!(
            show_blocking_info(&content),
            "BlockingInfo {reason = BRContent, notice = Just (ClientNotice {ttl = Just 3600})}"
        );
        assert_eq!(
            status_line(&QueueStatus::Active, Some(1_733_097_600), Some(QueueMode::Messaging)),
            "status: EntityActive, updatedAt: Just (RoundedSystemTime {roundedSeconds = 1733097600}), queueMode: Just QMMessaging"
        );
        assert_eq!(
            status_line(&QueueStatus::Off, None, None),
            "status: EntityOff, updatedAt: Nothing, queueMode: Nothing"
        );
    }

    #[test]
    fn the_block_quota_counts_per_utc_day() {
        let day = 20_000 * 86400;
        let mut q = BlockQuota::new(2);
        assert_eq!(q.take(day), Ok(()));
        assert_eq!(q.take(day + 10), Ok(()));
        let full = Err("error: reached limit of 2 queues blocked daily".to_string());
        assert_eq!(q.take(day + 86399), full);
        // A block that found the queue inactive gives its count back.
        q.give_back(day + 10);
        assert_eq!(q.blocked_today(day + 20), 1);
        assert_eq!(q.take(day + 30), Ok(()));
        assert_eq!(q.take(day + 40), full);
        assert_eq!(q.take(day + 86400), Ok(()), "a new day starts at 0:00 UTC");
        assert_eq!(q.blocked_today(day + 86400), 1);
        // Yesterday's block does not give back today's count.
        q.give_back(day + 40);
        assert_eq!(q.blocked_today(day + 86400), 1);
        let mut unlimited = BlockQuota::new(0);
        for _ in 0..100 {
            assert_eq!(unlimited.take(day), Ok(()));
        }
        assert_eq!(
            BlockQuota::new(-1).take(day),
            Err("error: reached limit of -1 queues blocked daily".into())
        );
    }
}
