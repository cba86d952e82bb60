//! The reference's notification log, `smp-server-ntfs.log`: the notifiers' pending notifications,
//! written at a clean stop and read at start (simplexmq `src/Simplex/Messaging/Server.hs`,
//! `saveServerNtfs`, `restoreServerNtfs`; `Server/NtfStore.hs`, `NLRv1`). One line per
//! notification, oldest first within a notifier:
//! `v1 <nId> <msgId> <unix seconds> <nonce> <encMeta>`, each base64url but the time.

use super::text::{b64, fixed, int, shorten, Fields};
use crate::crypto::hash::b64url;
use crate::store::{EntityId, MsgNtf};

/// Parses one line: the notifier ID and its notification.
pub fn parse_line(line: &str) -> Result<(EntityId, MsgNtf), String> {
    let mut f = Fields::new(line);
    match f.next("the version")? {
        "v1" => {}
        v => return Err(format!("unknown version {:?} (v1 expected)", shorten(v))),
    }
    let nid = b64(f.next("the notifier ID")?, "the notifier ID")?;
    let msg_id = fixed(f.next("the message ID")?, "the message ID")?;
    let ts = int(f.next("the time")?, "the time")?;
    let nonce = fixed(f.next("the nonce")?, "the nonce")?;
    let enc_meta = b64(f.next("the sealed metadata")?, "the sealed metadata")?;
    f.end()?;
    Ok((
        nid,
        MsgNtf {
            msg_id,
            ts,
            nonce,
            enc_meta,
        },
    ))
}

/// The line of a notification of the notifier `nid` (`NLRv1`'s `strEncode`).
pub fn encode_line(nid: &[u8], n: &MsgNtf) -> String {
    format!(
        "v1 {} {} {} {} {}",
        b64url(nid),
        b64url(&n.msg_id),
        n.ts,
        b64url(&n.nonce),
        b64url(&n.enc_meta)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_notification_line() {
        let id = "AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEB";
        let nonce = "AgICAgICAgICAgICAgICAgICAgICAgIC";
        let (nid, n) = parse_line(&format!("v1 bmlk {id} 1700000000 {nonce} AwMD")).unwrap();
        assert_eq!(nid, b"nid");
        assert_eq!(
            n,
            MsgNtf {
                msg_id: [1; 24],
                ts: 1_700_000_000,
                nonce: [2; 24],
                enc_meta: vec![3; 3],
            }
        );
        assert_eq!(
            encode_line(b"nid", &n),
            format!("v1 bmlk {id} 1700000000 {nonce} AwMD")
        );
        assert!(parse_line(&format!("v1 bmlk {id} 1 {nonce}"))
            .unwrap_err()
            .contains("sealed metadata"));
        assert!(parse_line("v2 bmlk")
            .unwrap_err()
            .contains("unknown version"));
    }
}
