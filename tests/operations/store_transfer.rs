//! `smp-relay store export` / `store import` (`src/store/transfer.rs`, `docs/ARCHITECTURE.md` §5)
//! over real relays: a stopped relay's store is exported, imported into a second data directory and
//! served from there with every queue, message (IDs, times, bodies, the quota marker) and pending
//! notification as the first relay serves them; the export of the imported store is the same bytes;
//! a truncated or corrupted stream, or one whose counts disagree, is refused naming the byte offset
//! and leaves the target empty; neither command runs on a running relay's data directory, and
//! import refuses a store that already holds queues.

use crate::common;
use crate::support;

use std::path::{Path, PathBuf};

use common::{run_cli, Relay, RelayOptions, TempDir};
use md5::Digest;
use smp_relay::client::queue::{auth_key, KeyAlg, RcvMsg};
use smp_relay::client::service::ROLE_MESSAGING;
use smp_relay::client::{new_corr_id, Client, ClientCert, ClientOptions};
use smp_relay::crypto::hash::b64url;
use smp_relay::protocol::command::Command;
use smp_relay::protocol::error::ErrorType;
use smp_relay::protocol::response::BrokerMsg;
use support::*;

const QUOTA: &str = "3";

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn options() -> RelayOptions {
    RelayOptions {
        extra_args: vec!["--quota".into(), QUOTA.into()],
        ..Default::default()
    }
}

fn stop_cleanly(relay: &mut Relay) {
    let status = relay.stop();
    assert!(
        status.success(),
        "clean stop: {status:?}\n{}",
        relay.log_text()
    );
}

/// Runs a command line that must succeed; returns its stderr (where the summary goes).
fn cli_ok(dir: &Path, args: &[&str]) -> String {
    let out = run_cli(dir, args);
    assert!(
        out.status.success(),
        "{args:?} failed: {}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stderr)
}

/// Runs a command line that must fail; returns its stderr.
fn cli_fails(dir: &Path, args: &[&str]) -> String {
    let out = run_cli(dir, args);
    assert!(
        !out.status.success(),
        "{args:?} must fail; stderr:\n{}",
        text(&out.stderr)
    );
    let err = text(&out.stderr);
    assert!(!err.trim().is_empty(), "{args:?} says why");
    err
}

fn export(dir: &Path, file: &Path) -> Vec<u8> {
    let err = cli_ok(
        dir,
        &["store", "export", "--output", file.to_str().unwrap()],
    );
    assert!(err.contains("exported"), "summary on stderr: {err}");
    std::fs::read(file).expect("the export file")
}

fn import(dir: &Path, file: &Path) -> String {
    cli_ok(dir, &["store", "import", "--input", file.to_str().unwrap()])
}

/// A data directory with `from`'s identity (keys, fingerprint, configuration) and no store: where
/// an operator moves a relay to, keeping its address.
fn dir_with_identity_of(from: &Path, tag: &str) -> TempDir {
    let dir = TempDir::new(tag).expect("a temp dir");
    for f in [
        "ca.key",
        "ca.crt",
        "server.key",
        "server.crt",
        "fingerprint",
        "smp-server.ini",
    ] {
        std::fs::copy(from.join(f), dir.path().join(f)).unwrap_or_else(|e| panic!("copy {f}: {e}"));
    }
    dir
}

/// What the store summary of an empty store says.
fn assert_store_empty(dir: &Path) {
    let out = TempDir::new("transfer-check").expect("a temp dir");
    let file = out.path().join("check.bin");
    let err = cli_ok(
        dir,
        &["store", "export", "--output", file.to_str().unwrap()],
    );
    assert!(
        err.contains("exported 0 queues, 0 messages, 0 notifications"),
        "{} must hold nothing: {err}",
        dir.display()
    );
}

/// The queues of the main scenario, as their recipients and the notification server know them.
struct Scenario {
    /// Secured, at quota: 3 messages and the marker.
    full: Queue,
    full_sender: smp_relay::client::Signer,
    /// A notifier and 2 messages with their 2 notifications, never NSUBscribed.
    ntf: Queue,
    notifier: Notifier,
    /// Blocked offline after the stop, with 1 message.
    blocked: Queue,
    /// The first of 3 messages ACKed: 2 left.
    plain: Queue,
    empty: Queue,
}

fn set_up(relay: &Relay) -> Scenario {
    let mut c = relay.client();
    let full_sender = auth_key(KeyAlg::Ed25519);
    let full = create_secured(&mut c, &full_sender);
    let mut s = relay.client();
    for i in 1..=3 {
        send_ok(
            &mut s,
            &full,
            Some(&full_sender),
            format!("full {i}").as_bytes(),
        );
    }
    assert_eq!(
        send(&mut s, &full, Some(&full_sender), b"full 4"),
        ERR_QUOTA,
        "the 4th leaves the marker"
    );
    drop(c); // its subscription ends; the messages stay

    let mut c = relay.client();
    let ntf = create_only(&mut c);
    let notifier = nkey(&mut c, &ntf);
    for i in 1..=2 {
        let body = format!("ntf {i}");
        let r = send_as(&mut s, ntf.sid(), None, send_ntf_cmd(body.as_bytes()));
        assert_eq!(r, BrokerMsg::Ok, "SEND {body}");
    }
    let blocked = create_only(&mut c);
    send_ok(&mut s, &blocked, None, b"blocked 1");
    let plain = create_only(&mut c);
    for i in 1..=3 {
        send_ok(&mut s, &plain, None, format!("plain {i}").as_bytes());
    }
    let first = msg_of(
        &plain,
        signed(&mut c, plain.key(), plain.rid(), Command::Get),
    );
    assert_eq!(first.msg.body(), Some(&b"plain 1"[..]));
    assert_eq!(ack(&mut c, &plain, &first.msg_id), BrokerMsg::Ok);
    let empty = create_only(&mut c);
    Scenario {
        full,
        full_sender,
        ntf,
        notifier,
        blocked,
        plain,
        empty,
    }
}

/// GET and ACK until GET finds nothing (`OK`): every message left, in order, with its ID.
fn drain(c: &mut Client, q: &Queue) -> Vec<(Vec<u8>, RcvMsg)> {
    let mut out = Vec::new();
    loop {
        let r = signed(c, q.key(), q.rid(), Command::Get);
        if r == BrokerMsg::Ok {
            return out;
        }
        let m = msg_of(q, r);
        assert_eq!(ack(c, q, &m.msg_id), BrokerMsg::Ok);
        out.push((m.msg_id, m.msg));
        assert!(out.len() <= 10, "more messages than the scenario sent");
    }
}

/// Everything a relay serves of the scenario's queues, consuming it.
#[derive(Debug, PartialEq)]
struct Served {
    full: Vec<(Vec<u8>, RcvMsg)>,
    ntfs: Vec<(Vec<u8>, i64)>,
    ntf_msgs: Vec<(Vec<u8>, RcvMsg)>,
    plain: Vec<(Vec<u8>, RcvMsg)>,
    empty: Vec<(Vec<u8>, RcvMsg)>,
}

fn served(relay: &Relay, sc: &Scenario) -> Served {
    let mut c = relay.client();
    // The marker keeps the full queue closed to writes until drained.
    assert_eq!(
        send(&mut c, &sc.full, Some(&sc.full_sender), b"full 5"),
        ERR_QUOTA,
        "the restored marker closes the queue"
    );
    let mut n = relay.client();
    assert_eq!(nsub(&mut n, &sc.notifier), BrokerMsg::Sok(None));
    let ntfs = (0..2)
        .map(|_| {
            let m = expect_nmsg(&mut n, &sc.notifier);
            (m.msg_id, m.ts)
        })
        .collect();
    expect_nothing(&mut n, "only the two stored notifications");
    match signed(&mut c, sc.blocked.key(), sc.blocked.rid(), Command::Get) {
        BrokerMsg::Err(ErrorType::Blocked(_)) => {}
        r => panic!("the blocked queue answers GET with {r:?}"),
    }
    let out = Served {
        full: drain(&mut c, &sc.full),
        ntfs,
        ntf_msgs: drain(&mut c, &sc.ntf),
        plain: drain(&mut c, &sc.plain),
        empty: drain(&mut c, &sc.empty),
    };
    // Drained, the full queue takes messages again.
    send_ok(&mut c, &sc.full, Some(&sc.full_sender), b"full 6");
    out
}

fn bodies(msgs: &[(Vec<u8>, RcvMsg)]) -> Vec<String> {
    msgs.iter()
        .map(|(_, m)| match m {
            RcvMsg::Message { body, .. } => String::from_utf8_lossy(body).into_owned(),
            RcvMsg::Quota { .. } => "QUOTA".into(),
        })
        .collect()
}

/// Export, import into a second data directory, serve from there: the same queues, messages with
/// their IDs and times, marker and notifications as the first relay serves after the export; the
/// export of the imported store is the same bytes.
#[test]
fn a_store_moves_to_another_data_dir_with_everything_in_it() {
    let mut a = Relay::start_with(options());
    let sc = set_up(&a);
    stop_cleanly(&mut a);
    cli_ok(
        a.dir.path(),
        &["block", &b64url(sc.blocked.sid()), "--reason", "spam"],
    );

    let files = TempDir::new("transfer-files").expect("a temp dir");
    let first = files.path().join("first.bin");
    let stream = export(a.dir.path(), &first);
    assert!(
        stream.starts_with(b"SMPRXFR\0\x00\x02"),
        "magic and version 2"
    );
    assert!(
        !files.path().join("first.bin.partial").exists(),
        "the partial file was renamed"
    );

    let b_dir = dir_with_identity_of(a.dir.path(), "transfer-b");
    let summary = import(b_dir.path(), &first);
    for part in [
        "read 5 queues, 9 messages, 2 notifications",
        "written 5 queues, 9 messages, 2 notifications",
        "trailer records 5 queues, 9 messages, 2 notifications",
    ] {
        assert!(summary.contains(part), "{part:?} in: {summary}");
    }

    let second = files.path().join("second.bin");
    let again = export(b_dir.path(), &second);
    assert!(
        again == stream,
        "the export of the imported store is byte-identical ({} and {} bytes)",
        again.len(),
        stream.len()
    );

    let mut b = Relay::start_in(b_dir, options());
    let from_b = served(&b, &sc);
    stop_cleanly(&mut b);

    // The exported relay still has its store: it serves the same, IDs and times included.
    a.restart();
    let from_a = served(&a, &sc);
    assert_eq!(
        from_b, from_a,
        "the imported store serves what the exported one does"
    );

    assert_eq!(
        bodies(&from_b.full),
        ["full 1", "full 2", "full 3", "QUOTA"]
    );
    assert_eq!(bodies(&from_b.ntf_msgs), ["ntf 1", "ntf 2"]);
    assert_eq!(bodies(&from_b.plain), ["plain 2", "plain 3"]);
    assert!(from_b.empty.is_empty());
    let ntf_ids: Vec<&Vec<u8>> = from_b.ntfs.iter().map(|(id, _)| id).collect();
    let msg_ids: Vec<&Vec<u8>> = from_b.ntf_msgs.iter().map(|(id, _)| id).collect();
    assert_eq!(ntf_ids, msg_ids, "each notification names its message");
    // The marker took the rejected 4th message's place: its time is not before the 3rd's.
    assert!(from_b.full[3].1.ts() >= from_b.full[2].1.ts());
}

/// A stopped relay with two queues and a few messages, and its export.
fn small_export(files: &TempDir) -> (Relay, PathBuf, Vec<u8>) {
    let mut relay = Relay::start();
    {
        let (mut c, mut s) = (relay.client(), relay.client());
        for q in 0..2 {
            let queue = create_only(&mut c);
            for i in 0..3 {
                send_ok(
                    &mut s,
                    &queue,
                    None,
                    format!("queue {q} message {i}").as_bytes(),
                );
            }
        }
    }
    stop_cleanly(&mut relay);
    let file = files.path().join("good.bin");
    let bytes = export(relay.dir.path(), &file);
    (relay, file, bytes)
}

/// The byte offsets where the stream's records start (after the 10-byte header), with their kinds.
fn record_offsets(stream: &[u8]) -> Vec<(usize, u8)> {
    let mut out = Vec::new();
    let mut at = 10;
    while at < stream.len() {
        let len = u32::from_be_bytes(stream[at + 1..at + 5].try_into().unwrap()) as usize;
        out.push((at, stream[at]));
        at += 1 + 4 + len + 4;
    }
    assert_eq!(at, stream.len(), "records tile the stream");
    out
}

/// A truncated stream, a flipped byte and a trailer whose counts disagree (with a valid CRC) are
/// each refused, naming the byte offset or the counts, and leave the target empty; the good stream
/// then imports into that same directory.
#[test]
fn a_damaged_stream_is_refused_naming_the_offset_and_leaves_the_target_empty() {
    let files = TempDir::new("transfer-damaged").expect("a temp dir");
    let (_relay, good, stream) = small_export(&files);
    let records = record_offsets(&stream);
    assert_eq!(
        records.iter().map(|r| r.1).collect::<Vec<_>>(),
        b"QMMMQMMME",
        "two queues of three messages, then the trailer"
    );
    let target = TempDir::new("transfer-target").expect("a temp dir");

    // Cut inside the last message record.
    let cut = records[7].0 + 9;
    let file = files.path().join("truncated.bin");
    std::fs::write(&file, &stream[..cut]).unwrap();
    let err = cli_fails(
        target.path(),
        &["store", "import", "--input", file.to_str().unwrap()],
    );
    assert!(err.contains("truncated"), "{err}");
    assert!(
        err.contains(&format!("ends at byte offset {cut}"))
            && err.contains(&format!(
                "record that starts at byte offset {}",
                records[7].0
            )),
        "names where: {err}"
    );
    assert_store_empty(target.path());

    // Cut exactly before the trailer: the export did not finish.
    std::fs::write(&file, &stream[..records[8].0]).unwrap();
    let err = cli_fails(
        target.path(),
        &["store", "import", "--input", file.to_str().unwrap()],
    );
    assert!(
        err.contains(&format!("ends at byte offset {}", records[8].0))
            && err.contains("before the trailer"),
        "{err}"
    );
    assert_store_empty(target.path());

    // One flipped bit in the body of the second queue's first message.
    let (msg_at, _) = records[5];
    let mut flipped = stream.clone();
    flipped[msg_at + 40] ^= 0x10;
    let file = files.path().join("flipped.bin");
    std::fs::write(&file, &flipped).unwrap();
    let err = cli_fails(
        target.path(),
        &["store", "import", "--input", file.to_str().unwrap()],
    );
    assert!(
        err.contains(&format!("corrupt at byte offset {msg_at}")) && err.contains("CRC"),
        "{err}"
    );
    assert_store_empty(target.path());

    // A trailer claiming one more message, with its CRC made to match.
    let (end_at, _) = records[8];
    let mut lying = stream.clone();
    let messages_at = end_at + 5 + 8;
    let n = u64::from_be_bytes(lying[messages_at..messages_at + 8].try_into().unwrap());
    lying[messages_at..messages_at + 8].copy_from_slice(&(n + 1).to_be_bytes());
    let crc = crc32fast::hash(&lying[end_at..lying.len() - 4]);
    let len = lying.len();
    lying[len - 4..].copy_from_slice(&crc.to_be_bytes());
    let file = files.path().join("lying.bin");
    std::fs::write(&file, &lying).unwrap();
    let err = cli_fails(
        target.path(),
        &["store", "import", "--input", file.to_str().unwrap()],
    );
    assert!(
        err.contains("count check failed")
            && err.contains(&format!("trailer records 2 queues, {} messages", n + 1))
            && err.contains("read 2 queues, 6 messages"),
        "{err}"
    );
    assert_store_empty(target.path());

    // Left empty, the target takes the good stream.
    let summary = import(target.path(), &good);
    assert!(
        summary.contains("written 2 queues, 6 messages, 0 notifications"),
        "{summary}"
    );
}

/// Neither command touches a running relay's data directory; import refuses a store that already
/// holds queues, naming the directory.
#[test]
fn refused_on_a_running_relay_and_into_a_non_empty_store() {
    let files = TempDir::new("transfer-refused").expect("a temp dir");
    let (mut stopped, good, _) = small_export(&files);

    let running = Relay::start();
    let err = cli_fails(
        running.dir.path(),
        &["store", "import", "--input", good.to_str().unwrap()],
    );
    assert!(
        err.contains("running") && err.contains(&running.dir.path().display().to_string()),
        "{err}"
    );
    let out_file = files.path().join("from-running.bin");
    let err = cli_fails(
        running.dir.path(),
        &["store", "export", "--output", out_file.to_str().unwrap()],
    );
    assert!(err.contains("running"), "{err}");
    assert!(!out_file.exists(), "no export file from a refused export");
    running.assert_serves();

    // The stopped relay's own store holds the two queues: importing into it is refused.
    let err = cli_fails(
        stopped.dir.path(),
        &["store", "import", "--input", good.to_str().unwrap()],
    );
    assert!(
        err.contains("already holds 2 queues, 6 messages")
            && err.contains(&stopped.dir.path().display().to_string()),
        "{err}"
    );
    // And it still has them, unchanged.
    let again = files.path().join("again.bin");
    assert!(export(stopped.dir.path(), &again) == std::fs::read(&good).unwrap());
    stopped.restart();
    stopped.assert_serves();
}

/// `-` streams through stdout and stdin (a pipe between two machines).
#[test]
fn export_and_import_stream_through_stdout_and_stdin() {
    use std::io::Write;
    use std::process::{Command as Process, Stdio};
    let files = TempDir::new("transfer-pipe").expect("a temp dir");
    let (relay, good, stream) = small_export(&files);
    let out = Process::new(common::BIN)
        .args(["--data-dir", relay.dir.path().to_str().unwrap()])
        .args(["store", "export", "--quiet"])
        .stdin(Stdio::null())
        .output()
        .expect("run export");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        out.stdout == stream,
        "stdout carries the same bytes as --output"
    );
    assert!(out.stderr.is_empty(), "--quiet: {}", text(&out.stderr));

    let target = TempDir::new("transfer-pipe-target").expect("a temp dir");
    let mut child = Process::new(common::BIN)
        .args(["--data-dir", target.path().to_str().unwrap()])
        .args(["store", "import", "--input", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn import");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(&out.stdout)
        .expect("feed stdin");
    let done = common::wait_output(child, common::COMMAND_TIMEOUT);
    assert!(done.status.success(), "{}", text(&done.stderr));
    assert!(
        text(&done.stderr).contains("written 2 queues, 6 messages"),
        "{}",
        text(&done.stderr)
    );
    let check = files.path().join("check.bin");
    assert!(export(target.path(), &check) == std::fs::read(good).unwrap());
}

/// The journal's store moves into PostgreSQL (`store import --store postgres --database …`) with
/// everything in it: the export of the imported database is the same stream, and a relay on it
/// serves what the journal relay serves.
#[test]
fn a_store_moves_into_postgres_with_everything_in_it() {
    let mut a = Relay::start_with(RelayOptions {
        extra_args: vec![
            "--quota".into(),
            QUOTA.into(),
            "--store".into(),
            "journal".into(),
        ],
        ..Default::default()
    });
    let sc = set_up(&a);
    stop_cleanly(&mut a);
    cli_ok(
        a.dir.path(),
        &["block", &b64url(sc.blocked.sid()), "--reason", "spam"],
    );
    let files = TempDir::new("transfer-pg-files").expect("a temp dir");
    let first = files.path().join("first.bin");
    let stream = export(a.dir.path(), &first);

    let database = common::pg_database();
    let b_dir = dir_with_identity_of(a.dir.path(), "transfer-pg");
    let summary = cli_ok(
        b_dir.path(),
        &[
            "store",
            "import",
            "--store",
            "postgres",
            "--database",
            &database,
            "--input",
            first.to_str().unwrap(),
        ],
    );
    assert!(
        summary.contains("written 5 queues, 9 messages, 2 notifications"),
        "{summary}"
    );
    let second = files.path().join("second.bin");
    cli_ok(
        b_dir.path(),
        &[
            "store",
            "export",
            "--store",
            "postgres",
            "--database",
            &database,
            "--output",
            second.to_str().unwrap(),
        ],
    );
    assert!(
        std::fs::read(&second).expect("second export") == stream,
        "the export of the imported database is byte-identical"
    );
    let mut b = Relay::start_in(
        b_dir,
        RelayOptions {
            extra_args: vec![
                "--quota".into(),
                QUOTA.into(),
                "--store".into(),
                "postgres".into(),
                "--database".into(),
                database.clone(),
            ],
            ..Default::default()
        },
    );
    let from_b = served(&b, &sc);
    stop_cleanly(&mut b);
    a.restart();
    assert_eq!(
        served(&a, &sc),
        from_b,
        "PostgreSQL serves what the journal does"
    );
}

/// A messaging service of `cert` on `relay`.
fn service_client(relay: &Relay, cert: &ClientCert) -> Client {
    let c = relay
        .connect(ClientOptions {
            tls_cert: Some(cert.clone()),
            service_role: Some(ROLE_MESSAGING),
            ..Default::default()
        })
        .unwrap_or_else(|e| panic!("service connection: {e}\n{}", relay.log_text()));
    assert!(c.service().is_some(), "a service session");
    c
}

/// `SUBS` with the count and hash the service expects; its `SOKS` count and hash.
fn service_count(c: &mut Client, expect: (i64, [u8; 16])) -> (i64, [u8; 16]) {
    let corr = new_corr_id();
    let t = c
        .service_transmission(&corr, Command::Subs(Some(expect)))
        .expect("SUBS");
    c.send_batch(&[t]).expect("send SUBS");
    loop {
        let t = c.recv().expect("an answer to SUBS");
        if t.corr_id == corr {
            match t.msg {
                Ok(BrokerMsg::Soks { count, ids_hash }) => return (count, ids_hash),
                other => panic!("SUBS answered {other:?}"),
            }
        }
    }
}

/// A relay's services move with its store (export format version 2): imported into the memory
/// store and into PostgreSQL, each service keeps its ID, so that reconnecting with its certificate
/// it finds its queues (SOKS with their count and hash), as the reference's store keeps them.
#[test]
fn services_and_their_queues_move_with_the_store() {
    let mut a = Relay::start_with(RelayOptions {
        extra_args: vec!["--store".into(), "journal".into()],
        ..Default::default()
    });
    let cert = ClientCert::self_signed().expect("certificate");
    let mut rc = a.client();
    let qs = [create(&mut rc), create(&mut rc)];
    let mut svc = service_client(&a, &cert);
    let service_id = svc.service_id().expect("service ID").to_vec();
    for q in &qs {
        assert_eq!(
            signed(&mut svc, q.key(), q.rid(), Command::Sub),
            BrokerMsg::Sok(Some(service_id.clone()))
        );
    }
    let mut hash = [0u8; 16];
    for q in &qs {
        let d: [u8; 16] = md5::Md5::digest(q.rid()).into();
        hash.iter_mut().zip(d).for_each(|(h, d)| *h ^= d);
    }
    drop((svc, rc));
    stop_cleanly(&mut a);
    let files = TempDir::new("transfer-services").expect("a temp dir");
    let stream_file = files.path().join("services.bin");
    let stream = export(a.dir.path(), &stream_file);
    assert!(stream.starts_with(b"SMPRXFR\0\x00\x02"), "version 2");

    // Into the memory store of a new directory, into PostgreSQL, and in place into the memory
    // store of the journal relay's directory (whose services file is already there).
    let database = common::pg_database();
    let into: [(&str, Vec<String>, bool); 3] = [
        ("memory", vec![], false),
        ("postgres", vec!["--database".into(), database], false),
        ("memory", vec![], true),
    ];
    for (kind, extra, in_place) in into {
        let dir = match in_place {
            true => std::mem::replace(
                &mut a.dir,
                TempDir::new("transfer-services-moved").expect("a temp dir"),
            ),
            false => dir_with_identity_of(a.dir.path(), "transfer-services-b"),
        };
        let mut args = vec!["store", "import", "--store", kind];
        args.extend(extra.iter().map(String::as_str));
        args.extend(["--input", stream_file.to_str().unwrap()]);
        let summary = cli_ok(dir.path(), &args);
        assert!(
            summary.contains("written 2 queues, 0 messages, 0 notifications, 1 services"),
            "{summary}"
        );
        if in_place {
            // As the README's move in place: the old store set aside.
            let j = dir.path().join("journal");
            std::fs::rename(&j, dir.path().join("journal.moved")).expect("move the journal");
        }
        let mut store_args = vec!["--store".to_string(), kind.to_string()];
        store_args.extend(extra.iter().cloned());
        let b = Relay::start_in(
            dir,
            RelayOptions {
                extra_args: store_args,
                ..Default::default()
            },
        );
        let mut svc = service_client(&b, &cert);
        assert_eq!(svc.service_id(), Some(&service_id[..]), "{kind}: same ID");
        assert_eq!(service_count(&mut svc, (2, hash)), (2, hash), "{kind}");
    }
}
