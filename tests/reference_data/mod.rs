//! The reference smp-server's data files, written in its formats (simplexmq
//! `src/Simplex/Messaging/Server/StoreLog.hs`, `MsgStore/STM.hs`, `MsgStore/Journal.hs`,
//! `NtfStore.hs`) with keys the tests hold, and the check of what a relay serves after importing
//! them: shared by `reference_import.rs` and `drop_in.rs`.

#![allow(dead_code)]

use std::path::Path;

use crate::common::{self, run_cli, Relay, RelayOptions, TempDir};
use crate::support::*;
use rand::RngCore;
use smp_relay::client::queue::{auth_key, public, KeyAlg, NotifierKeys, RcvMsg, RecipientKeys};
use smp_relay::client::Signer;
use smp_relay::crypto::hash::b64url;
use smp_relay::protocol::command::{Command, QueueMode};
use smp_relay::protocol::error::{BlockingInfo, BlockingReason, ErrorType};
use smp_relay::protocol::response::{BrokerMsg, QueueIds};

pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

pub fn random<const N: usize>() -> [u8; N] {
    let mut b = [0u8; N];
    rand::rngs::OsRng.fill_bytes(&mut b);
    b
}

pub fn spki(s: &Signer) -> String {
    b64url(&public(s).to_spki())
}

/// A message ID the test chooses: the relay must keep it.
pub fn mid(n: u8) -> [u8; 24] {
    let mut id = random::<24>();
    id[0] = n;
    id
}

/// A queue as the reference's store log holds it and its recipient knows it.
pub fn queue(mode: Option<QueueMode>) -> Queue {
    Queue {
        keys: RecipientKeys::generate(KeyAlg::Ed25519),
        ids: QueueIds {
            rcv_id: random::<24>().to_vec(),
            snd_id: random::<24>().to_vec(),
            srv_dh_key: [0; 32],
            queue_mode: mode,
            link_id: None,
            service_id: None,
            srv_ntf_creds: None,
        },
        secret: random(),
    }
}

/// `CREATE rid=… rk=… rdh=… sid=… sk=` and `extra` (the reference's `QueueRec` text).
pub fn create(q: &Queue, extra: &str) -> String {
    format!(
        "CREATE rid={} rk={} rdh={} sid={} sk={extra}",
        b64url(q.rid()),
        spki(q.key()),
        b64url(&q.secret),
        b64url(q.sid()),
    )
}

/// A message line: `<msgId> <ts> flags=<T|F> <body>`.
pub fn message(id: &[u8; 24], ts: i64, ntf: bool, body: &[u8]) -> String {
    let f = if ntf { 'T' } else { 'F' };
    format!("{} {ts} flags={f} {}", b64url(id), b64url(body))
}

pub fn marker(id: &[u8; 24], ts: i64) -> String {
    format!("{} {ts} quota", b64url(id))
}

pub fn read_lines(path: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut lines: Vec<String> = text.lines().map(String::from).collect();
    lines.sort();
    lines
}

pub fn write_lines(path: &Path, lines: &[String]) {
    let mut text = lines.join("\n");
    text.push('\n');
    std::fs::write(path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

/// Where the reference keeps messages.
#[derive(Clone, Copy, PartialEq)]
pub enum Messages {
    /// `smp-server-messages.log` (store_messages: memory).
    Log,
    /// `messages/` (store_messages: journal).
    Journal,
}

/// The reference's data: a secured messaging queue with a notifier, three messages and the quota
/// marker, and two pending notifications; a contact address with link data; a blocked queue and
/// a suspended queue with one message each; a deleted queue with a message left in the log; a
/// line that does not parse.
pub struct Fixture {
    pub full: Queue,
    pub sender: Signer,
    pub notifier: Notifier,
    pub msgs: Vec<([u8; 24], i64, bool, &'static [u8])>,
    pub marker: ([u8; 24], i64),
    pub ntfs: Vec<([u8; 24], i64)>,
    pub contact: Queue,
    pub link: (Vec<u8>, Vec<u8>, Vec<u8>),
    pub blocked: Queue,
    pub off: Queue,
    pub off_msg: [u8; 24],
}

/// The store log's line that does not parse (1-based).
pub const BAD_LINE: usize = 4;

pub const SERVICE_ID: [u8; 24] = [0x5e; 24];

pub fn write_fixture(dir: &Path, messages: Messages) -> Fixture {
    let ts = now_secs() - 3600;
    let day = ts / 86400 * 86400;
    let full = queue(Some(QueueMode::Messaging));
    let sender = auth_key(KeyAlg::Ed25519);
    let nkeys = NotifierKeys::generate(KeyAlg::Ed25519);
    let notifier = Notifier {
        nid: random::<24>().to_vec(),
        secret: random(),
        keys: nkeys,
    };
    let contact = queue(Some(QueueMode::Contact));
    let link = (
        random::<24>().to_vec(),
        b"fixed data".to_vec(),
        b"user data".to_vec(),
    );
    let blocked = queue(None);
    let off = queue(Some(QueueMode::Messaging));
    let gone = queue(Some(QueueMode::Messaging));
    let store_log = vec![
        create(
            &full,
            &format!(
                " queue_mode=M notifier={} {} {} updated_at={day}",
                b64url(&notifier.nid),
                spki(&notifier.keys.auth),
                b64url(&notifier.secret)
            ),
        ),
        format!("SECURE {} {}", b64url(full.rid()), spki(&sender)),
        create(
            &contact,
            &format!(
                " queue_mode=C link_id={} queue_data={} {}",
                b64url(&link.0),
                b64url(&link.1),
                b64url(&link.2)
            ),
        ),
        // BAD_LINE: a CREATE cut short.
        format!("CREATE rid={} rk=", b64url(&random::<24>())),
        create(&blocked, " sndSecure=T"),
        format!(
            "BLOCK {} reason=spam,notice={{\"ttl\":3600}}",
            b64url(blocked.rid())
        ),
        // A messaging service (its certificate as opaque DER) and a queue associated with it.
        format!(
            "NEW_SERVICE service_id={} role=M cert={} cert_hash={} created_at={day}",
            b64url(&SERVICE_ID),
            b64url(b"0\x03cert"),
            b64url(&[7u8; 32])
        ),
        format!(
            "QUEUE_SERVICE {} R {}",
            b64url(blocked.rid()),
            b64url(&SERVICE_ID)
        ),
        create(&off, " queue_mode=M"),
        format!("SUSPEND {}", b64url(off.rid())),
        create(&gone, " queue_mode=M"),
        format!("DELETE {}", b64url(gone.rid())),
        // Ignored, as the reference ignores it: the queue was deleted.
        format!("TIME {} {day}", b64url(gone.rid())),
    ];
    write_lines(&dir.join("smp-server-store.log"), &store_log);

    let msgs: Vec<([u8; 24], i64, bool, &'static [u8])> = vec![
        (mid(1), ts, false, b"one"),
        (mid(2), ts + 1, true, b"two"),
        (mid(3), ts + 2, false, b"three"),
    ];
    let quota = (mid(4), ts + 3);
    let mut full_lines: Vec<String> = msgs
        .iter()
        .map(|(id, t, n, b)| message(id, *t, *n, b))
        .collect();
    full_lines.push(marker(&quota.0, quota.1));
    let blocked_line = message(&mid(5), ts, false, b"blocked message");
    let off_msg = mid(6);
    let off_line = message(&off_msg, ts, false, b"off message");
    match messages {
        Messages::Log => {
            let v3 = |q: &Queue, l: &String| format!("v3 {} {l}", b64url(q.rid()));
            let mut lines: Vec<String> = full_lines.iter().map(|l| v3(&full, l)).collect();
            lines.push(v3(&blocked, &blocked_line));
            lines.push(v3(&off, &off_line));
            lines.push(v3(&gone, &message(&mid(7), ts, false, b"lost")));
            write_lines(&dir.join("smp-server-messages.log"), &lines);
        }
        Messages::Journal => {
            let root = dir.join("messages");
            // Two journal files: the read journal holds an acknowledged message before the read
            // position, then "one"; the write journal the rest.
            let acked = message(&mid(9), ts - 10, false, b"acknowledged");
            let read_file = [acked.clone(), full_lines[0].clone()];
            let write_file = full_lines[1..].to_vec();
            let len = |ls: &[String]| ls.iter().map(|l| l.len() + 1).sum::<usize>();
            let state = format!(
                "write=BBBBBBBBBBBBBBBB,3,3,{w},{w} read=AAAAAAAAAAAAAAAA,1,2,{p},{r} canWrite=F size=4",
                w = len(&write_file),
                p = acked.len() + 1,
                r = len(&read_file),
            );
            journal_queue(
                &root,
                &full,
                &[
                    ("AAAAAAAAAAAAAAAA", &read_file[..]),
                    ("BBBBBBBBBBBBBBBB", &write_file),
                ],
                &state,
            );
            for (q, line) in [(&blocked, &blocked_line), (&off, &off_line)] {
                let l = std::slice::from_ref(line);
                let state = format!(
                    "write=CCCCCCCCCCCCCCCC,1,1,{n},{n} read=CCCCCCCCCCCCCCCC,0,1,0,{n} canWrite=T size=1",
                    n = len(l)
                );
                journal_queue(&root, q, &[("CCCCCCCCCCCCCCCC", l)], &state);
            }
        }
    }
    let ntfs = vec![(msgs[1].0, msgs[1].1), (mid(8), ts + 5)];
    let ntf_lines: Vec<String> = ntfs
        .iter()
        .map(|(id, t)| {
            let nonce = random::<24>();
            let mut meta = vec![24u8];
            meta.extend_from_slice(id);
            meta.extend_from_slice(&t.to_be_bytes());
            let sealed =
                smp_relay::crypto::sxbox::seal_padded(&notifier.secret, &nonce, &meta, 128)
                    .expect("seal");
            format!(
                "v1 {} {} {t} {} {}",
                b64url(&notifier.nid),
                b64url(id),
                b64url(&nonce),
                b64url(&sealed)
            )
        })
        .collect();
    write_lines(&dir.join("smp-server-ntfs.log"), &ntf_lines);
    let mut contact = contact;
    contact.ids.link_id = Some(link.0.clone());
    Fixture {
        full,
        sender,
        notifier,
        msgs,
        marker: quota,
        ntfs,
        contact,
        link,
        blocked,
        off,
        off_msg,
    }
}

/// A queue's directory in the reference's journal store: `ab/cd/ef/gh/<rest>/` of base64url(rId),
/// its state file (with an older state line before the current one) and its journal files.
pub fn journal_queue(root: &Path, q: &Queue, files: &[(&str, &[String])], state: &str) {
    let enc = b64url(q.rid());
    let dir = root
        .join(&enc[0..2])
        .join(&enc[2..4])
        .join(&enc[4..6])
        .join(&enc[6..8])
        .join(&enc[8..]);
    std::fs::create_dir_all(&dir).expect("queue directory");
    for (jid, lines) in files {
        write_lines(&dir.join(format!("messages.{jid}.log")), lines);
    }
    let old = "write=AAAAAAAAAAAAAAAA,0,0,0,0 read=AAAAAAAAAAAAAAAA,0,0,0,0 canWrite=T size=0";
    write_lines(
        &dir.join(format!("queue_state.{enc}.log")),
        &[old.to_string(), state.to_string()],
    );
}

/// A data directory with the relay's identity (`smp-relay init`).
pub fn data_dir(tag: &str) -> TempDir {
    let dir = TempDir::new(tag).expect("a temp dir");
    common::init(dir.path());
    dir
}

pub fn cli(dir: &Path, args: &[&str]) -> (bool, String) {
    let out = run_cli(dir, args);
    (
        out.status.success(),
        format!("{}{}", text(&out.stdout), text(&out.stderr)),
    )
}

pub fn import(dir: &Path, args: &[&str]) -> String {
    let mut all = vec!["store", "import-reference"];
    all.extend_from_slice(args);
    let (ok, out) = cli(dir, &all);
    assert!(ok, "{all:?} failed: {out}");
    out
}

pub fn start(dir: TempDir, store: &[&str]) -> Relay {
    Relay::start_in(
        dir,
        RelayOptions {
            extra_args: store.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        },
    )
}

/// What a relay on the imported data serves, checked against the fixture.
pub fn check_served(relay: &Relay, f: &Fixture, all: bool) {
    let mut r = relay.client();
    let mut s = relay.client();
    // The marker closes the queue until it is drained.
    assert_eq!(
        send(&mut s, &f.full, Some(&f.sender), b"too many"),
        ERR_QUOTA,
        "a queue that ends with its marker takes nothing"
    );
    let mut m = sub_with_msg(&mut r, &f.full);
    for (i, (id, ts, ntf, body)) in f.msgs.iter().enumerate() {
        assert_eq!(m.msg_id, id, "message {i} keeps its ID");
        assert_eq!(
            m.msg,
            RcvMsg::Message {
                ts: *ts,
                notification: *ntf,
                reserved_flags: vec![],
                body: body.to_vec(),
            },
            "message {i}"
        );
        m = msg_of(&f.full, ack(&mut r, &f.full, &m.msg_id));
    }
    assert_eq!(m.msg_id, f.marker.0, "the marker keeps its ID");
    assert_eq!(m.msg, RcvMsg::Quota { ts: f.marker.1 });
    assert_eq!(ack(&mut r, &f.full, &m.msg_id), BrokerMsg::Ok, "drained");
    send_ok(&mut s, &f.full, Some(&f.sender), b"after the marker");
    expect_body(&mut r, &f.full, b"after the marker");

    let mut n = relay.client();
    assert_eq!(nsub(&mut n, &f.notifier), sok(&n));
    for (id, ts) in &f.ntfs {
        let meta = expect_nmsg(&mut n, &f.notifier);
        assert_eq!(
            (&meta.msg_id[..], meta.ts),
            (&id[..], *ts),
            "a pending notification"
        );
    }
    if !all {
        return;
    }
    let (link_id, fixed, user) = &f.link;
    assert_eq!(
        unsigned(&mut s, link_id, Command::LGet),
        BrokerMsg::Lnk {
            sender_id: f.contact.sid().to_vec(),
            fixed: fixed.clone(),
            user: user.clone(),
        },
        "the contact address's link data"
    );
    assert_eq!(
        signed(&mut r, f.blocked.key(), f.blocked.rid(), Command::Sub),
        BrokerMsg::Err(ErrorType::Blocked(BlockingInfo {
            reason: BlockingReason::Spam,
            notice: Some("{\"ttl\":3600}".into()),
        })),
        "a blocked queue"
    );
    assert_eq!(
        send(&mut s, &f.off, None, b"x"),
        ERR_AUTH,
        "a suspended queue takes no messages"
    );
    let m = sub_with_msg(&mut r, &f.off);
    assert_eq!(m.msg_id, f.off_msg, "but its recipient still gets them");
}

pub fn summary_counts(out: &str, counts: &str) {
    assert!(
        out.contains(&format!("read {counts}; written {counts}")),
        "counts in the summary: {out}"
    );
}
