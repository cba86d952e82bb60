//! The journal store's recovery at start, over the relay binary (`docs/ARCHITECTURE.md` §5,
//! `journal/FORMAT.md`): garbage past the synced offset is a torn tail, cut with a warning naming
//! the file; damage before it stops the start with the file and the `smp-journal repair` to run,
//! which then lets the relay start. A replay that starts after removed segments keeps the messages
//! whose queue's record comes after them, and a dead segment is removed only once the record that
//! made it dead is durable, so a power loss after a kill loses nothing synced.

use crate::common;
use crate::support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{Relay, RelayOptions};
use smp_relay::client::queue::{auth_key, KeyAlg};
use smp_relay::client::Client;
use smp_relay::protocol::command::Command;
use smp_relay::protocol::response::BrokerMsg;
use smp_relay::store::group_of;
use support::*;

fn segment_of(dir: &Path, rid: &[u8]) -> PathBuf {
    dir.join("journal")
        .join(format!("g{:02}", group_of(rid)))
        .join("seg-000000001.jnl")
}

/// Where the records of a segment end: after its last non-zero byte, 8-aligned.
fn records_end(bytes: &[u8]) -> usize {
    let last = bytes.iter().rposition(|b| *b != 0).expect("some records");
    (last + 1).div_ceil(8) * 8
}

fn smp_journal() -> PathBuf {
    let p = Path::new(common::BIN).with_file_name("smp-journal");
    assert!(
        p.is_file(),
        "{} is missing: build the workspace (cargo test --workspace)",
        p.display()
    );
    p
}

#[test]
fn a_torn_tail_is_cut_with_a_warning_and_damage_stops_the_start_until_repaired() {
    let mut r = Relay::start();
    let (q, body) = {
        let mut c = r.client();
        let q = create_only(&mut c);
        send_ok(&mut c, &q, None, b"before the tail");
        (q, b"before the tail".to_vec())
    };
    let status = r.stop();
    assert!(status.success(), "clean stop");
    let seg = segment_of(r.dir.path(), q.rid());
    let mut bytes = std::fs::read(&seg).expect("the queue's segment");
    let end = records_end(&bytes);

    // A torn tail: what looks like the start of a record, then garbage, past the synced end.
    bytes[end..end + 4].copy_from_slice(b"JRec");
    bytes[end + 4..end + 64].fill(0xA5);
    std::fs::write(&seg, &bytes).expect("write");
    r.restart_with(&[]);
    let log = r.log_text();
    assert!(
        log.contains(&seg.display().to_string()) && log.contains("torn"),
        "the cut names the file:\n{log}"
    );
    {
        let mut c = r.client();
        let m = sub_with_msg(&mut c, &q);
        assert_eq!(
            m.msg.body(),
            Some(&body[..]),
            "the message before the tail is kept"
        );
    }
    assert!(r.stop().success());

    // Damage: a byte of the message's record flipped, before the synced end.
    let mut bytes = std::fs::read(&seg).expect("segment");
    let at = bytes
        .windows(body.len())
        .position(|w| w == &body[..])
        .expect("the body is in the segment");
    bytes[at] ^= 1;
    std::fs::write(&seg, &bytes).expect("write");
    let out = r.failed_start(&[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "a damaged journal stops the start:\n{err}"
    );
    assert!(
        err.contains(&seg.display().to_string()) && err.contains("smp-journal repair"),
        "names the file and the repair:\n{err}"
    );

    // `smp-journal verify` says so; `repair` cuts the damage; the relay starts, its queue kept.
    let dir = r.dir.path().to_str().expect("utf-8").to_string();
    let verify = std::process::Command::new(smp_journal())
        .args(["--data-dir", &dir, "--quiet", "verify"])
        .output()
        .expect("smp-journal verify");
    assert_eq!(verify.status.code(), Some(1), "verify reports damage");
    let repair = std::process::Command::new(smp_journal())
        .args(["--data-dir", &dir, "--quiet", "repair"])
        .output()
        .expect("smp-journal repair");
    assert!(
        repair.status.success(),
        "repair: {}",
        String::from_utf8_lossy(&repair.stderr)
    );
    r.restart_with(&[]);
    let mut c = r.client();
    sub_empty(&mut c, &q);
}

/// Two queues whose recipient IDs fall in one partition group: queues are created until a group
/// repeats (64 groups: at most 65 NEWs).
fn two_of_one_group(c: &mut Client) -> (Queue, Queue) {
    let mut seen: std::collections::HashMap<u32, Queue> = std::collections::HashMap::new();
    loop {
        let q = create_only(c);
        let g = group_of(q.rid());
        match seen.remove(&g) {
            Some(first) => return (first, q),
            None => {
                seen.insert(g, q);
            }
        }
    }
}

/// Segment `n` of the group of `rid`.
fn segment_n(dir: &Path, rid: &[u8], n: u64) -> PathBuf {
    dir.join("journal")
        .join(format!("g{:02}", group_of(rid)))
        .join(format!("seg-{n:09}.jnl"))
}

/// The segment files of every group, `<data-dir>/journal/gNN/seg-*.jnl`.
fn all_segments(dir: &Path) -> Vec<PathBuf> {
    let mut v = Vec::new();
    for g in std::fs::read_dir(dir.join("journal")).expect("journal directory") {
        let g = g.expect("entry").path();
        if !g.is_dir() {
            continue;
        }
        for f in std::fs::read_dir(&g).expect("group directory") {
            let f = f.expect("entry").path();
            if f.extension().is_some_and(|x| x == "jnl") {
                v.push(f);
            }
        }
    }
    v.sort();
    v
}

/// SENDs of 15 KB to `f`, received by nobody, until its group's first segment (256 KiB) is full:
/// the SEND that does not fit there opens segment 2.
fn fill_first_segment(c: &mut Client, f: &Queue, dir: &Path) {
    let body = vec![0x46; 15_000];
    let second = segment_n(dir, f.rid(), 2);
    for _ in 0..40 {
        send_ok(c, f, None, &body);
        if second.exists() {
            return;
        }
    }
    panic!("40 SENDs of 15 KB did not fill the group's first segment");
}

/// Waits (at most 5 s) until the relay has removed the segment `path` (it unlinks dead segments
/// off the shard's thread).
fn wait_removed(path: &Path) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while path.exists() {
        assert!(
            Instant::now() < deadline,
            "{} was not removed",
            path.display()
        );
        common::sleep(Duration::from_millis(10));
    }
}

/// CRC32C (Castagnoli, reflected 0x82F63B78), bit by bit: the `crc32c` crate is the journal
/// crate's dependency, not one the tests can use.
fn crc32c(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0x82F6_3B78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// A segment's synced offset (`journal/FORMAT.md` "Sync slots"): of the slots at 512 and 1024,
/// the valid one (count not 0, CRC32C right: of its first 16 bytes, and from format version 3 on
/// of its flags at 20..24 too) with the higher count; 4096 when neither is valid.
fn synced_end(segment: &[u8]) -> usize {
    assert_eq!(crc32c(b"123456789"), 0xE306_9283, "the CRC32C check value");
    let version = u32::from_le_bytes(segment[8..12].try_into().unwrap());
    let slot = |at: usize| {
        let s = &segment[at..at + 24];
        let count = u64::from_le_bytes(s[0..8].try_into().unwrap());
        let end = u64::from_le_bytes(s[8..16].try_into().unwrap());
        let crc = u32::from_le_bytes(s[16..20].try_into().unwrap());
        let covered = if version >= 3 {
            [&s[..16], &s[20..24]].concat()
        } else {
            s[..16].to_vec()
        };
        (count != 0 && crc == crc32c(&covered)).then_some((count, end))
    };
    [slot(512), slot(1024)]
        .into_iter()
        .flatten()
        .max()
        .map_or(4096, |(_, end)| end as usize)
}

/// Waits (at most 10 s) until every segment of the group of `rid` is synced to the end of its
/// records: everything the relay answered there is durable.
fn wait_synced(dir: &Path, rid: &[u8]) {
    let group = dir.join("journal").join(format!("g{:02}", group_of(rid)));
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let behind: Vec<PathBuf> = all_segments(dir)
            .into_iter()
            .filter(|p| p.starts_with(&group))
            .filter(|p| {
                let bytes = std::fs::read(p).expect("segment");
                synced_end(&bytes) < records_end(&bytes)
            })
            .collect();
        if behind.is_empty() {
            return;
        }
        assert!(Instant::now() < deadline, "never synced: {behind:?}");
        common::sleep(Duration::from_millis(20));
    }
}

/// A power loss after the relay was killed: of every segment, only what its sync slot calls
/// durable reached the disk; the records area past its synced offset reads as zeros again.
fn lose_what_was_not_synced(dir: &Path) {
    for p in all_segments(dir) {
        let mut bytes = std::fs::read(&p).expect("segment");
        let from = synced_end(&bytes).min(bytes.len());
        if bytes[from..].iter().any(|b| *b != 0) {
            bytes[from..].fill(0);
            std::fs::write(&p, &bytes).expect("write");
        }
    }
}

/// A relay on the journal store, one shard, synced as `fsync` says.
fn journal_relay(fsync: &str) -> Relay {
    Relay::start_with(RelayOptions {
        cores: 1,
        extra_args: ["--store", "journal", "--fsync", fsync]
            .map(String::from)
            .to_vec(),
    })
}

/// A full replay keeps a message whose queue's record was rewritten after it. F and Q share a
/// group; F's unfetched messages fill the group's first segment, then Q gets m1 and an NKEY (a
/// record of Q after m1, in segment 2), and DEL F leaves segment 1 dead, so it is removed. After
/// a SIGKILL the replay starts at segment 2, where m1 comes before any record of Q: SUB Q
/// delivers m1.
#[test]
fn a_full_replay_keeps_a_message_whose_queue_record_was_rewritten_after_it() {
    let mut r = journal_relay("every-batch");
    let dir = r.dir.path().to_path_buf();
    let q = {
        let mut c = r.client();
        let (f, q) = two_of_one_group(&mut c);
        fill_first_segment(&mut c, &f, &dir);
        send_ok(&mut c, &q, None, b"m1");
        nkey(&mut c, &q);
        assert_eq!(
            signed(&mut c, f.key(), f.rid(), Command::Del),
            BrokerMsg::Ok,
            "DEL F"
        );
        wait_removed(&segment_n(&dir, q.rid(), 1));
        q
    };
    r.kill();
    r.restart();
    let mut c = r.client();
    let m = sub_with_msg(&mut c, &q);
    assert_eq!(m.msg.body(), Some(&b"m1"[..]), "m1 is delivered");
}

/// Retiring a dead segment waits until the record that made it dead is durable. F and Q share a
/// group; Q is secured (KEY), F's unfetched messages fill the first segment, Q gets m1 (in
/// segment 2), F is deleted, and everything is synced; then Q's NKEY (its record in segment 2)
/// leaves segment 1 dead, and once it is removed the relay is killed, and the power fails:
/// what was not synced is lost. At the next start Q, created and synced long before, is there
/// with m1: SUB Q answers SOK and delivers it.
#[test]
fn a_dead_segment_is_removed_only_after_the_record_that_made_it_dead_is_durable() {
    let mut r = journal_relay("interval-ms 3000");
    let dir = r.dir.path().to_path_buf();
    let q = {
        let mut c = r.client();
        let (f, q) = two_of_one_group(&mut c);
        let sender = auth_key(KeyAlg::Ed25519);
        assert_eq!(
            signed(&mut c, q.key(), q.rid(), Command::Key(sender.public_key())),
            BrokerMsg::Ok,
            "KEY Q"
        );
        fill_first_segment(&mut c, &f, &dir);
        send_ok(&mut c, &q, Some(&sender), b"m1");
        assert_eq!(
            signed(&mut c, f.key(), f.rid(), Command::Del),
            BrokerMsg::Ok,
            "DEL F"
        );
        // Synced by the interval (within 3 s); the next sync is then 3 s away, long after the
        // NKEY and the kill below.
        wait_synced(&dir, q.rid());
        nkey(&mut c, &q);
        wait_removed(&segment_n(&dir, q.rid(), 1));
        q
    };
    r.kill();
    lose_what_was_not_synced(&dir);
    r.restart();
    let mut c = r.client();
    let m = sub_with_msg(&mut c, &q);
    assert_eq!(m.msg.body(), Some(&b"m1"[..]), "m1 as it was synced");
}

/// Every message of `q`, by GET and ACK, until GET finds none.
fn drain(c: &mut Client, q: &Queue) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        match signed(c, q.key(), q.rid(), Command::Get) {
            BrokerMsg::Ok => return out,
            m @ BrokerMsg::Msg { .. } => {
                let rm = msg_of(q, m);
                out.push(rm.msg.body().expect("a message").to_vec());
                assert_eq!(ack(c, q, &rm.msg_id), BrokerMsg::Ok, "ACK after GET");
            }
            other => panic!("GET answered {other:?}"),
        }
    }
}

/// `smp-journal ARGS` on the relay's data directory.
fn tool(dir: &Path, args: &[&str]) -> std::process::Output {
    let d = dir.to_str().expect("utf-8");
    std::process::Command::new(smp_journal())
        .args(["--data-dir", d, "--quiet"])
        .args(args)
        .output()
        .expect("smp-journal")
}

fn text(o: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Numbered 15 KB bodies: message `i` of a scenario.
fn body(i: usize) -> Vec<u8> {
    let mut b = vec![b'a' + (i % 26) as u8; 15_000];
    b[..8].copy_from_slice(&(i as u64).to_be_bytes());
    b
}

/// A queue whose unfetched messages fill its group's first segment and go on into the second
/// (`n2` of them there), and a clean stop: the group's checkpoint covers both segments. Returns
/// the queue and how many messages went to the first segment.
fn two_segments_of_messages(r: &mut Relay, n2: usize) -> (Queue, usize) {
    let dir = r.dir.path().to_path_buf();
    let mut c = r.client();
    let q = create_only(&mut c);
    let second = segment_n(&dir, q.rid(), 2);
    let mut sent = 0;
    while !second.exists() {
        send_ok(&mut c, &q, None, &body(sent));
        sent += 1;
        assert!(sent < 40, "40 SENDs did not fill the first segment");
    }
    // The SEND that opened segment 2 is in it.
    let in_first = sent - 1;
    for i in 0..n2.saturating_sub(1) {
        send_ok(&mut c, &q, None, &body(sent + i));
    }
    drop(c);
    assert!(r.stop().success(), "clean stop");
    (q, in_first)
}

/// A deleted last segment is not served in silence. The relay stopped cleanly with a queue's
/// messages in two segments; the second file is deleted. `smp-journal verify` reports the missing
/// segment; start refuses, naming it, `smp-journal repair` and the queue whose messages the
/// group's checkpoint placed there; after `repair` (which says what it accepted) verify is clean
/// and the relay serves the messages of the first segment, in order.
#[test]
fn a_deleted_last_segment_stops_the_start_naming_the_queue_until_repaired() {
    let mut r = journal_relay("every-batch");
    let dir = r.dir.path().to_path_buf();
    let (q, in_first) = two_segments_of_messages(&mut r, 3);
    let second = segment_n(&dir, q.rid(), 2);
    std::fs::remove_file(&second).expect("delete the last segment");

    let verify = tool(&dir, &["verify"]);
    assert_eq!(verify.status.code(), Some(1), "{}", text(&verify));
    assert!(
        text(&verify).contains("seg-000000002.jnl"),
        "{}",
        text(&verify)
    );
    let out = r.failed_start(&[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the start is refused:\n{err}");
    for want in [
        "seg-000000002.jnl",
        "smp-journal repair",
        &smp_relay::crypto::hash::b64url(q.rid()),
    ] {
        assert!(err.contains(want), "names {want}:\n{err}");
    }
    let repair = tool(&dir, &["repair"]);
    assert!(repair.status.success(), "{}", text(&repair));
    assert!(
        text(&repair).contains("seg-000000002.jnl"),
        "{}",
        text(&repair)
    );
    let verify = tool(&dir, &["verify"]);
    assert_eq!(verify.status.code(), Some(0), "{}", text(&verify));
    r.restart_with(&[]);
    let mut c = r.client();
    let want: Vec<Vec<u8>> = (0..in_first).map(body).collect();
    assert_eq!(drain(&mut c, &q), want, "the first segment's messages");
}

/// A deleted first segment is not served in silence either. Queue Q's record is in the group's
/// first segment, another queue's messages fill it, and Q's messages follow in the second; the
/// relay stops cleanly and the first file is deleted. Start refuses, naming the missing segments
/// and Q; `smp-journal repair` accepts the loss and names Q; then the relay starts, and Q, whose
/// record is lost, answers AUTH (its messages are dropped with it) rather than an error per try.
#[test]
fn a_deleted_first_segment_stops_the_start_naming_its_queues_until_repaired() {
    let mut r = journal_relay("every-batch");
    let dir = r.dir.path().to_path_buf();
    let q = {
        let mut c = r.client();
        let (q, f) = two_of_one_group(&mut c);
        fill_first_segment(&mut c, &f, &dir);
        send_ok(&mut c, &q, None, b"q1");
        send_ok(&mut c, &q, None, b"q2");
        q
    };
    assert!(r.stop().success(), "clean stop");
    std::fs::remove_file(segment_n(&dir, q.rid(), 1)).expect("delete the first segment");

    let out = r.failed_start(&[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the start is refused:\n{err}");
    for want in [
        "segments before it are missing",
        "smp-journal repair",
        &smp_relay::crypto::hash::b64url(q.rid()),
    ] {
        assert!(err.contains(want), "names {want}:\n{err}");
    }
    let repair = tool(&dir, &["repair"]);
    assert!(repair.status.success(), "{}", text(&repair));
    assert!(
        text(&repair).contains(&smp_relay::crypto::hash::b64url(q.rid())),
        "repair names the queue that lost its record:\n{}",
        text(&repair)
    );
    r.restart_with(&[]);
    let mut c = r.client();
    assert_eq!(signed(&mut c, q.key(), q.rid(), Command::Sub), ERR_AUTH);
}

/// A segment cut short has a way out. The relay stopped cleanly with a queue's messages in its
/// group's first segment (and one in the second); the first file is cut to 100,000 bytes.
/// Verify and start name the file and both lengths; `smp-journal repair` extends it and cuts the
/// journal where its records end, reporting the queue's lost messages; then verify is clean, the
/// relay starts and serves the messages before the cut, in order.
#[test]
fn a_truncated_segment_is_repaired_and_the_messages_before_the_cut_served() {
    let mut r = journal_relay("every-batch");
    let dir = r.dir.path().to_path_buf();
    let (q, _) = two_segments_of_messages(&mut r, 1);
    let first = segment_n(&dir, q.rid(), 1);
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&first)
        .expect("first segment");
    f.set_len(100_000).expect("truncate");
    drop(f);

    let verify = tool(&dir, &["verify"]);
    assert_eq!(verify.status.code(), Some(1), "{}", text(&verify));
    assert!(
        text(&verify).contains("100000") && text(&verify).contains("262144"),
        "both lengths:\n{}",
        text(&verify)
    );
    let out = r.failed_start(&[]);
    assert!(!out.status.success(), "the start is refused");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(&first.display().to_string()),
        "names the file:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let repair = tool(&dir, &["repair"]);
    assert!(repair.status.success(), "{}", text(&repair));
    assert!(
        text(&repair).contains(&smp_relay::crypto::hash::b64url(q.rid())),
        "repair names the queue that lost messages:\n{}",
        text(&repair)
    );
    let verify = tool(&dir, &["verify"]);
    assert_eq!(verify.status.code(), Some(0), "{}", text(&verify));
    r.restart_with(&[]);
    let mut c = r.client();
    let got = drain(&mut c, &q);
    // 15 KB records from offset 4096 on: those wholly within 100,000 bytes.
    assert!(!got.is_empty() && got.len() < 7, "{} messages", got.len());
    let want: Vec<Vec<u8>> = (0..got.len()).map(body).collect();
    assert_eq!(got, want, "the messages before the cut, in order");
}

/// One bad byte: `repair` cuts the group there (a record after a gap in the chain cannot be
/// trusted) and says, per queue, what the cut dropped: the record it could not read, the messages
/// sent after it, and the acknowledged ones that come back. Then the relay serves exactly that.
#[test]
fn repair_of_a_bad_byte_names_per_queue_what_it_dropped() {
    let mut r = journal_relay("every-batch");
    let dir = r.dir.path().to_path_buf();
    let (q, p) = {
        let mut c = r.client();
        let (q, p) = two_of_one_group(&mut c);
        for i in 0..4 {
            send_ok(&mut c, &q, None, &body(i));
        }
        // Q's first message is acknowledged after the bad byte (below): the cut brings it back.
        for i in 0..3 {
            send_ok(&mut c, &p, None, &body(10 + i));
        }
        let m = sub_with_msg(&mut c, &q);
        assert!(
            matches!(ack(&mut c, &q, &m.msg_id), BrokerMsg::Msg { .. }),
            "ACK of a subscribed queue answers with its next message"
        );
        (q, p)
    };
    assert!(r.stop().success(), "clean stop");
    let seg = segment_n(&dir, q.rid(), 1);
    let mut bytes = std::fs::read(&seg).expect("segment");
    // A byte of P's first message: the records from there on are cut.
    let at = bytes
        .windows(body(10).len())
        .position(|w| w == &body(10)[..])
        .expect("P's first message is in the segment");
    bytes[at + 100] ^= 1;
    std::fs::write(&seg, &bytes).expect("write");

    let repair = tool(&dir, &["repair"]);
    let out = text(&repair);
    assert!(repair.status.success(), "{out}");
    let line = |rid: &[u8]| {
        let id = smp_relay::crypto::hash::b64url(rid);
        out.lines()
            .find(|l| l.contains(&id))
            .unwrap_or_else(|| panic!("no line for queue {id}:\n{out}"))
            .to_string()
    };
    // The record with the bad byte cannot be read (what it was is not known); the two after it
    // are P's.
    assert!(
        out.contains("cannot be read") && line(p.rid()).contains("2 message(s) lost"),
        "P's messages after the bad byte:\n{out}"
    );
    assert!(
        line(q.rid()).contains("1 acknowledged message(s) may be delivered again"),
        "Q's acknowledged message comes back:\n{out}"
    );
    assert_eq!(tool(&dir, &["verify"]).status.code(), Some(0));
    r.restart_with(&[]);
    let mut c = r.client();
    let want: Vec<Vec<u8>> = (0..4).map(body).collect();
    assert_eq!(
        drain(&mut c, &q),
        want,
        "Q's messages, the acknowledged one back"
    );
    assert_eq!(
        drain(&mut c, &p),
        Vec::<Vec<u8>>::new(),
        "P's messages are gone"
    );
}
