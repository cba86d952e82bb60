//! The reference's message log, `smp-server-messages.log`: the memory store's messages, written
//! at a clean stop and read at start (simplexmq `src/Simplex/Messaging/Server.hs`,
//! `exportMessages`, `importMessages`; `Server/MsgStore.hs`, `MLRv3`). One line per message,
//! oldest first within a queue: `v3 <base64url rId> <message>`, where `<message>` is also a
//! journal line (`Protocol.hs`, `Message`'s `strEncode`):
//!
//! ```text
//! <msgId> <unix seconds> flags=<T|F> <body>     a message (`flags=` may be absent: older lines)
//! <msgId> <unix seconds> quota                   the quota marker
//! ```

use std::rc::Rc;

use super::text::{b64, b64_or_empty, fixed, int, shorten, Fields};
use crate::crypto::hash::b64url;
use crate::store::{EntityId, Message};

/// Parses `v3 <rId> <message>`.
pub fn parse_line(line: &str) -> Result<(EntityId, Message), String> {
    let mut f = Fields::new(line);
    match f.next("the version")? {
        "v3" => {}
        v => return Err(format!("unknown version {:?} (v3 expected)", shorten(v))),
    }
    let rid = b64(f.next("the recipient ID")?, "the recipient ID")?;
    Ok((rid, parse_message(&mut f)?))
}

/// One message (the rest of `f`).
pub fn parse_message(f: &mut Fields<'_>) -> Result<Message, String> {
    let msg_id = fixed(f.next("the message ID")?, "the message ID")?;
    let ts = int(f.next("the message time")?, "the message time")?;
    if f.at("quota") && !f.at("quota=") {
        if f.next("quota")? != "quota" {
            return Err("unexpected text after the message time".into());
        }
        f.end()?;
        return Ok(Message::Quota { msg_id, ts });
    }
    let notification = if f.at("flags=") {
        // The first character is the notification flag; the reference ignores the rest of the
        // field (room for more flags).
        match f.named("flags=")?.as_bytes().first() {
            Some(b'T') => true,
            Some(b'F') => false,
            _ => return Err("the message flags are not T or F".into()),
        }
    } else {
        false
    };
    let body = b64_or_empty(f.next("the message body")?, "the message body")?;
    f.end()?;
    Ok(Message::Message {
        msg_id,
        ts,
        notification,
        body: Rc::from(body),
    })
}

/// The line of a message of the queue `rid` (`MLRv3`'s `strEncode`).
pub fn encode_line(rid: &[u8], m: &Message) -> String {
    format!("v3 {} {}", b64url(rid), encode_message(m))
}

/// A message's text, as the message log and the journal files hold it.
pub fn encode_message(m: &Message) -> String {
    match m {
        Message::Message {
            msg_id,
            ts,
            notification,
            body,
        } => format!(
            "{} {ts} flags={} {}",
            b64url(msg_id),
            if *notification { 'T' } else { 'F' },
            b64url(body)
        ),
        Message::Quota { msg_id, ts } => format!("{} {ts} quota", b64url(msg_id)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_markers_and_old_lines_without_flags() {
        let id = "AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEB"; // 24 × 0x01
        let line = format!("v3 cmlk {id} 1700000000 flags=T aGVsbG8=");
        let (rid, m) = parse_line(&line).unwrap();
        assert_eq!(rid, b"rid");
        assert_eq!(encode_line(&rid, &m), line);
        assert_eq!(
            m,
            Message::Message {
                msg_id: [1; 24],
                ts: 1_700_000_000,
                notification: true,
                body: Rc::from(&b"hello"[..]),
            }
        );
        let (_, m) = parse_line(&format!("v3 cmlk {id} 1700000001 aGk")).unwrap();
        assert!(
            matches!(m, Message::Message { notification: false, ref body, .. } if &**body == b"hi")
        );
        // Written back with its flags, as the reference writes every line now.
        assert_eq!(
            encode_line(b"rid", &m),
            format!("v3 cmlk {id} 1700000001 flags=F aGk=")
        );
        let (_, m) = parse_line(&format!("v3 cmlk {id} 1700000002 quota")).unwrap();
        assert_eq!(
            encode_line(b"rid", &m),
            format!("v3 cmlk {id} 1700000002 quota")
        );
        assert_eq!(
            m,
            Message::Quota {
                msg_id: [1; 24],
                ts: 1_700_000_002
            }
        );
    }

    #[test]
    fn damaged_lines_say_what_is_wrong() {
        let id = "AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEB";
        for (line, why) in [
            ("v2 cmlk", "unknown version"),
            ("v3 cmlk AQID 1 flags=F aGk", "has 3 bytes, not 24"),
            (&format!("v3 cmlk {id} soon flags=F aGk"), "not a number"),
            (&format!("v3 cmlk {id} 1 flags=X aGk"), "not T or F"),
            (
                &format!("v3 cmlk {id} 1 flags=F aGk extra"),
                "unexpected text",
            ),
            (
                &format!("v3 cmlk {id} 1"),
                "the line ends where the message body",
            ),
        ] {
            let e = parse_line(line).unwrap_err();
            assert!(e.contains(why), "{line}: {e}");
        }
    }
}
