//! `smp-relay store import-reference` (`src/store/reference/`, `docs/ARCHITECTURE.md` §5): the
//! reference smp-server's data files, written here in its formats with keys this test holds, are
//! imported into the journal, memory and PostgreSQL stores, and a relay started on the data
//! directory serves them over SMP as the reference would: every message with its ID, time, flags
//! and body in order, the quota marker closing its queue, the notifier's pending notifications, a
//! contact address's link data, blocked and suspended queues. A start on the reference's files
//! without an import is refused, naming the import; an unparseable line is reported with its file
//! and line.

mod common;
mod support;

use std::path::Path;

use common::{run_cli, Relay, RelayOptions, TempDir};
use rand::RngCore;
use smp_relay::client::queue::{auth_key, public, KeyAlg, NotifierKeys, RcvMsg, RecipientKeys};
use smp_relay::client::Signer;
use smp_relay::crypto::hash::b64url;
use smp_relay::protocol::command::{Command, QueueMode};
use smp_relay::protocol::error::{BlockingInfo, BlockingReason, ErrorType};
use smp_relay::protocol::response::{BrokerMsg, QueueIds};
use support::*;

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn random<const N: usize>() -> [u8; N] {
    let mut b = [0u8; N];
    rand::rngs::OsRng.fill_bytes(&mut b);
    b
}

fn spki(s: &Signer) -> String {
    b64url(&public(s).to_spki())
}

/// A message ID the test chooses: the relay must keep it.
fn mid(n: u8) -> [u8; 24] {
    let mut id = random::<24>();
    id[0] = n;
    id
}

/// A queue as the reference's store log holds it and its recipient knows it.
fn queue(mode: Option<QueueMode>) -> Queue {
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
fn create(q: &Queue, extra: &str) -> String {
    format!(
        "CREATE rid={} rk={} rdh={} sid={} sk={extra}",
        b64url(q.rid()),
        spki(q.key()),
        b64url(&q.secret),
        b64url(q.sid()),
    )
}

/// A message line: `<msgId> <ts> flags=<T|F> <body>`.
fn message(id: &[u8; 24], ts: i64, ntf: bool, body: &[u8]) -> String {
    let f = if ntf { 'T' } else { 'F' };
    format!("{} {ts} flags={f} {}", b64url(id), b64url(body))
}

fn marker(id: &[u8; 24], ts: i64) -> String {
    format!("{} {ts} quota", b64url(id))
}

fn read_lines(path: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut lines: Vec<String> = text.lines().map(String::from).collect();
    lines.sort();
    lines
}

fn write_lines(path: &Path, lines: &[String]) {
    let mut text = lines.join("\n");
    text.push('\n');
    std::fs::write(path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

/// Where the reference keeps messages.
#[derive(Clone, Copy, PartialEq)]
enum Messages {
    /// `smp-server-messages.log` (store_messages: memory).
    Log,
    /// `messages/` (store_messages: journal).
    Journal,
}

/// The reference's data: a secured messaging queue with a notifier, three messages and the quota
/// marker, and two pending notifications; a contact address with link data; a blocked queue and
/// a suspended queue with one message each; a deleted queue with a message left in the log; a
/// line that does not parse.
struct Fixture {
    full: Queue,
    sender: Signer,
    notifier: Notifier,
    msgs: Vec<([u8; 24], i64, bool, &'static [u8])>,
    marker: ([u8; 24], i64),
    ntfs: Vec<([u8; 24], i64)>,
    contact: Queue,
    link: (Vec<u8>, Vec<u8>, Vec<u8>),
    blocked: Queue,
    off: Queue,
    off_msg: [u8; 24],
}

/// The store log's line that does not parse (1-based).
const BAD_LINE: usize = 4;

const SERVICE_ID: [u8; 24] = [0x5e; 24];

fn write_fixture(dir: &Path, messages: Messages) -> Fixture {
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
fn journal_queue(root: &Path, q: &Queue, files: &[(&str, &[String])], state: &str) {
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
fn data_dir(tag: &str) -> TempDir {
    let dir = TempDir::new(tag);
    common::init(dir.path());
    dir
}

fn cli(dir: &Path, args: &[&str]) -> (bool, String) {
    let out = run_cli(dir, args);
    (
        out.status.success(),
        format!("{}{}", text(&out.stdout), text(&out.stderr)),
    )
}

fn import(dir: &Path, args: &[&str]) -> String {
    let mut all = vec!["store", "import-reference"];
    all.extend_from_slice(args);
    let (ok, out) = cli(dir, &all);
    assert!(ok, "{all:?} failed: {out}");
    out
}

fn start(dir: TempDir, store: &[&str]) -> Relay {
    Relay::start_in(
        dir,
        RelayOptions {
            extra_args: store.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        },
    )
}

/// What a relay on the imported data serves, checked against the fixture.
fn check_served(relay: &Relay, f: &Fixture, all: bool) {
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

fn summary_counts(out: &str, counts: &str) {
    assert!(
        out.contains(&format!("read {counts}; written {counts}")),
        "counts in the summary: {out}"
    );
}

/// The memory store's files (store log, message log, notification log) into the journal store,
/// in the data directory the reference's files are in: before the import a start is refused,
/// naming the import; after it the relay serves everything and warns that the reference's files
/// are not read.
#[test]
fn the_reference_memory_store_moves_into_the_journal_store() {
    let dir = data_dir("ref-journal");
    let f = write_fixture(dir.path(), Messages::Log);

    let port = common::free_port().to_string();
    let (ok, out) = cli(
        dir.path(),
        &["start", "--port", &port, "--store", "journal"],
    );
    assert!(
        !ok,
        "a start beside the reference's files without an import"
    );
    assert!(
        out.contains("holds the reference smp-server's data")
            && out.contains(&format!(
                "smp-relay --log-dir {} store import-reference --store journal",
                dir.path().display()
            )),
        "the refusal names the import: {out}"
    );

    let out = import(dir.path(), &["--store", "journal"]);
    summary_counts(&out, "4 queues, 6 messages, 2 notifications, 1 services");
    let log = dir.path().join("smp-server-store.log");
    assert!(
        out.contains(&format!("{}:{BAD_LINE}: ", log.display())),
        "the unparseable line with its number: {out}"
    );
    assert!(
        out.contains("1 lines skipped as unparseable, 2 records left out"),
        "{out}"
    );
    assert!(out.contains("which the store log does not hold"), "{out}");
    assert!(
        dir.path().join("smp-server-messages.log").is_file(),
        "the reference's files stay"
    );
    let (ok, out) = cli(dir.path(), &["store", "import-reference"]);
    assert!(
        !ok && out.contains("already holds"),
        "a second import: {out}"
    );

    let mut relay = start(dir, &["--store", "journal"]);
    check_served(&relay, &f, true);
    assert!(
        relay.log_shows("also holds the reference smp-server's data"),
        "{}",
        relay.log_text()
    );
    let status = relay.stop();
    assert!(status.success());
}

/// The journal store's directory `messages/` into the memory store, read from another directory
/// (`--from`), after an interrupted compaction (`smp-server-store.log.start` is the complete log);
/// a journal's acknowledged lines before the read position are not imported.
#[test]
fn the_reference_journal_store_moves_into_the_memory_store() {
    let from = TempDir::new("ref-from");
    let f = write_fixture(from.path(), Messages::Journal);
    let log = from.path().join("smp-server-store.log");
    let start_file = from.path().join("smp-server-store.log.start");
    std::fs::rename(&log, &start_file).expect("rename");
    std::fs::write(&log, "CREATE rid=").expect("a compaction cut short");
    let dir = data_dir("ref-memory");
    let out = import(
        dir.path(),
        &["--store", "memory", "--from", from.path().to_str().unwrap()],
    );
    summary_counts(&out, "4 queues, 6 messages, 2 notifications, 1 services");
    assert!(
        out.contains(&format!("queues from {}", start_file.display())),
        "{out}"
    );
    assert!(
        out.contains(&format!(
            "messages from {}",
            from.path().join("messages").display()
        )),
        "{out}"
    );
    let relay = start(dir, &["--store", "memory"]);
    check_served(&relay, &f, true);
}

/// Into PostgreSQL, as `store import` goes there.
#[test]
fn the_reference_data_moves_into_postgres() {
    let dir = data_dir("ref-pg");
    let f = write_fixture(dir.path(), Messages::Log);
    let database = common::pg_database();
    let out = import(
        dir.path(),
        &["--store", "postgres", "--database", &database],
    );
    summary_counts(&out, "4 queues, 6 messages, 2 notifications, 1 services");
    let relay = start(dir, &["--store", "postgres", "--database", &database]);
    check_served(&relay, &f, false);
}

/// Both message stores' files present: the reference starts on neither, and nothing is imported.
#[test]
fn both_message_stores_present_are_refused() {
    let dir = data_dir("ref-both");
    write_fixture(dir.path(), Messages::Log);
    std::fs::create_dir_all(dir.path().join("messages")).expect("messages/");
    let (ok, out) = cli(dir.path(), &["store", "import-reference"]);
    assert!(!ok, "{out}");
    assert!(
        out.contains("holds both smp-server-messages.log and messages/"),
        "{out}"
    );
    let empty = TempDir::new("ref-none");
    let (ok, out) = cli(
        dir.path(),
        &[
            "store",
            "import-reference",
            "--from",
            empty.path().to_str().unwrap(),
        ],
    );
    assert!(
        !ok && out.contains("holds none of the reference smp-server's files"),
        "{out}"
    );
}

/// The way back: `store export-reference` writes the reference's files, whose message and
/// notification lines are the ones imported, and which import again into the same store (the
/// `store export` streams are the same bytes).
#[test]
fn export_reference_gives_back_what_was_imported() {
    let dir = data_dir("ref-back");
    write_fixture(dir.path(), Messages::Log);
    import(dir.path(), &["--store", "journal"]);
    let files = TempDir::new("ref-back-files");
    let stream = |d: &Path, store: &str, name: &str| {
        let out = files.path().join(name);
        let (ok, text) = cli(
            d,
            &[
                "store",
                "export",
                "--store",
                store,
                "--output",
                out.to_str().unwrap(),
            ],
        );
        assert!(ok, "{text}");
        std::fs::read(&out).expect("the stream")
    };
    let first = stream(dir.path(), "journal", "first.smpx");
    let back = TempDir::new("ref-back-to");
    let (ok, out) = cli(
        dir.path(),
        &[
            "store",
            "export-reference",
            "--to",
            back.path().to_str().unwrap(),
        ],
    );
    assert!(ok, "{out}");
    assert!(
        out.contains("exported 4 queues, 6 messages, 2 notifications, 1 services"),
        "{out}"
    );

    // The message and notification lines are the reference's own, those of live queues.
    let mut imported = read_lines(&dir.path().join("smp-server-messages.log"));
    imported.retain(|l| !l.ends_with(&b64url(b"lost")));
    assert_eq!(
        read_lines(&back.path().join("smp-server-messages.log")),
        imported
    );
    assert_eq!(
        read_lines(&back.path().join("smp-server-ntfs.log")),
        read_lines(&dir.path().join("smp-server-ntfs.log"))
    );
    // The reference reads a blocking notice to the end of its line: the service goes after it.
    let log = read_lines(&back.path().join("smp-server-store.log"));
    assert_eq!(log.iter().filter(|l| l.starts_with("CREATE ")).count(), 4);
    assert_eq!(
        log.iter().filter(|l| l.starts_with("NEW_SERVICE ")).count(),
        1
    );
    assert!(
        log.iter().any(|l| l.starts_with("QUEUE_SERVICE ")
            && l.ends_with(&format!(" R {}", b64url(&SERVICE_ID)))),
        "{log:?}"
    );
    let (ok, out) = cli(
        dir.path(),
        &[
            "store",
            "export-reference",
            "--to",
            back.path().to_str().unwrap(),
        ],
    );
    assert!(
        !ok && out.contains("exists"),
        "never over the reference's files: {out}"
    );

    let again = data_dir("ref-back-again");
    let out = import(
        again.path(),
        &["--store", "memory", "--from", back.path().to_str().unwrap()],
    );
    summary_counts(&out, "4 queues, 6 messages, 2 notifications, 1 services");
    assert!(
        out.contains("0 lines skipped as unparseable, 0 records left out"),
        "{out}"
    );
    assert!(
        stream(again.path(), "memory", "second.smpx") == first,
        "the same store after the way back and forth"
    );
}
