//! The `smp-journal` inspection tool, run as a binary over journals built with the crate's API in
//! temporary data directories: stats, queues and show count what was written; verify is clean,
//! finds a flipped byte before the synced offset, takes a torn tail past it for a warning, and
//! stays clean while another process appends; repair refuses while the data directory is locked
//! and cuts the damage otherwise; compact says that the relay compacts.

mod common;
use common::{splitmix, TempDir};

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use smp_journal::{group_dir, group_of, segment_file_name, Appended, Journal, Options, Record};

// ---------------------------------------------------------------------------------------------
// Helpers

/// A 24-byte ID made from a number (`salt` keeps queues, messages and notifiers apart).
fn id24(salt: u64, n: u64) -> [u8; 24] {
    let mut b = [0u8; 24];
    for (k, chunk) in b.chunks_mut(8).enumerate() {
        chunk.copy_from_slice(&splitmix(salt * 1_000_003 + n * 7 + k as u64).to_le_bytes());
    }
    b
}

fn b64(id: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE.encode(id)
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// Journals of a data directory, one per group, opened as records come (each record goes to its
/// recipient ID's group, as the relay will write it).
struct Writer {
    root: PathBuf,
    opts: Options,
    open: HashMap<u32, Journal>,
}

impl Writer {
    fn new(data_dir: &Path, segment_size: u64) -> Writer {
        Writer {
            root: data_dir.join("journal"),
            opts: Options {
                segment_size,
                initial_segment_size: segment_size,
                ..Options::default()
            },
            open: HashMap::new(),
        }
    }
    fn journal(&mut self, g: u32) -> &mut Journal {
        let (root, opts) = (&self.root, &self.opts);
        self.open
            .entry(g)
            .or_insert_with(|| Journal::open(root, g, opts, |_, _, _| Ok(())).unwrap().0)
    }
    /// Appends to the group of the record's ID (or `group` for notifications).
    fn append_to(&mut self, g: u32, rec: &Record<'_>) -> Appended {
        self.journal(g).append(rec).unwrap()
    }
    fn append(&mut self, rec: &Record<'_>) -> Appended {
        let g = group_of(rec.id().unwrap());
        self.append_to(g, rec)
    }
    fn sync_all(&self) {
        for j in self.open.values() {
            j.sync_handle().sync_all().unwrap();
        }
    }
}

fn create(w: &mut Writer, q: &[u8]) -> Appended {
    w.append(&Record::QueueCreate {
        recipient_id: q,
        data: b"queue record",
    })
}

fn send(w: &mut Writer, q: &[u8], m: &[u8; 24], ts: i64, flags: u8, body: &[u8]) -> Appended {
    w.append(&Record::MsgAppend {
        recipient_id: q,
        msg_id: m,
        ts,
        flags,
        body,
    })
}

fn tool() -> Command {
    Command::new(env!("CARGO_BIN_EXE_smp-journal"))
}

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

fn run(data_dir: &Path, args: &[&str]) -> Out {
    let o = tool()
        .arg("--data-dir")
        .arg(data_dir)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    Out {
        code: o.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

fn json(o: &Out) -> serde_json::Value {
    assert_eq!(o.code, 0, "{}{}", o.stdout, o.stderr);
    serde_json::from_str(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", o.stdout))
}

fn flip_byte(path: &Path, off: u64) {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, off).unwrap();
    f.write_all_at(&[b[0] ^ 0x5a], off).unwrap();
}

fn seg_path(data_dir: &Path, a: &Appended, g: u32) -> PathBuf {
    group_dir(&data_dir.join("journal"), g).join(segment_file_name(a.loc.segment))
}

/// The data directory's lock, held as a running relay holds it.
fn hold_lock(data_dir: &Path) -> File {
    let f = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(data_dir.join("lock"))
        .unwrap();
    // SAFETY: flock on a descriptor `f` owns and keeps open for the call.
    assert_eq!(
        unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) },
        0
    );
    f
}

/// Six queues (queue i gets i + 2 messages), one update, three message deletes, a deleted queue,
/// notifications for two notifiers; everything synced. Returns the queue IDs.
fn build_sample(data_dir: &Path) -> Vec<[u8; 24]> {
    let mut w = Writer::new(data_dir, 64 << 10);
    let qs: Vec<[u8; 24]> = (0..6).map(|i| id24(1, i)).collect();
    let t0 = now();
    for (i, q) in qs.iter().enumerate() {
        create(&mut w, q);
        for k in 0..i + 2 {
            let m = id24(2, (i * 100 + k) as u64);
            let ts = t0 - 10_000 + (k as i64) * 1000;
            let flags = if k == 0 { 1 } else { 0 };
            send(&mut w, q, &m, ts, flags, &vec![k as u8; 10 * (k + 1)]);
        }
    }
    w.append(&Record::QueueUpdate {
        recipient_id: &qs[0],
        data: b"queue record, updated",
    });
    // Queue 1 and 2 lose their first message, queue 3 its second.
    for (i, k) in [(1, 0), (2, 0), (3, 1)] {
        w.append(&Record::MsgDelete {
            recipient_id: &qs[i],
            msg_id: &id24(2, (i * 100 + k) as u64),
        });
    }
    w.append(&Record::QueueDelete {
        recipient_id: &qs[5],
    });
    let g0 = group_of(&qs[0]);
    let (n0, n1) = (id24(3, 0), id24(3, 1));
    for k in 0..3 {
        w.append_to(
            g0,
            &Record::NtfAppend {
                notifier_id: &n0,
                data: &[k],
            },
        );
        w.append_to(
            g0,
            &Record::NtfAppend {
                notifier_id: &n1,
                data: &[k],
            },
        );
    }
    w.append_to(
        g0,
        &Record::NtfDelete {
            notifier_id: &n0,
            msg_id: &id24(2, 0),
        },
    );
    w.append_to(g0, &Record::NtfClear { notifier_id: &n1 });
    w.sync_all();
    qs
}

// ---------------------------------------------------------------------------------------------
// Tests

#[test]
fn stats_queues_and_show_count_what_was_written() {
    let t = TempDir::new("stats");
    let qs = build_sample(t.path());
    let groups: std::collections::BTreeSet<u32> = qs.iter().map(|q| group_of(q)).collect();
    // Live: queues 0..5; messages 2+3+4+5+6 minus 3 deleted; notifications 3 - 1 (n0), 0 (n1).
    let bodies: u64 = (0..5u64)
        .map(|i| (0..i + 2).map(|k| 10 * (k + 1)).sum::<u64>())
        .sum::<u64>()
        - 10
        - 10
        - 20;
    let records = 6 + (2 + 3 + 4 + 5 + 6 + 7) + 1 + 3 + 1 + 6 + 2;

    let v = json(&run(t.path(), &["stats", "--json"]));
    let total = &v["total"];
    assert_eq!(total["queues"], 5, "{v:#}");
    assert_eq!(total["messages"], 17);
    assert_eq!(total["message_bytes"], bodies);
    assert_eq!(total["notifications"], 2);
    assert_eq!(total["records"], records);
    assert_eq!(total["damage"], 0);
    assert_eq!(total["segments"], groups.len());
    assert_eq!(total["records_by_kind"]["msg-delete"], 3);
    assert_eq!(v["groups"].as_array().unwrap().len(), groups.len());
    for g in v["groups"].as_array().unwrap() {
        // Everything was synced: the durable point is the end of the records.
        assert_eq!(g["synced"], g["written"], "{g:#}");
        assert!(g["synced"]["offset"].as_u64().unwrap() > 4096);
    }

    let o = run(t.path(), &["stats"]);
    assert_eq!(o.code, 0, "{}{}", o.stdout, o.stderr);
    let total_line = o.stdout.lines().find(|l| l.starts_with("total")).unwrap();
    let cols: Vec<&str> = total_line.split_whitespace().collect();
    assert_eq!(
        &cols[1..5],
        ["5", "17", &bodies.to_string(), "2"],
        "{}",
        o.stdout
    );
    assert_eq!(cols[6], records.to_string(), "{}", o.stdout);
    for g in &groups {
        assert!(o.stdout.contains(&format!("\ng{g:02} ")), "{}", o.stdout);
    }

    let v = json(&run(t.path(), &["queues", "--json"]));
    let list = v.as_array().unwrap();
    assert_eq!(list.len(), 5, "{v:#}");
    let expect = [2, 2, 3, 4, 6];
    for (i, q) in qs[..5].iter().enumerate() {
        let e = list
            .iter()
            .find(|e| e["recipient_id"] == b64(q))
            .unwrap_or_else(|| panic!("queue {i} missing: {v:#}"));
        assert_eq!(e["messages"], expect[i], "queue {i}: {e}");
        assert_eq!(e["group"], group_of(q));
        // The first live message is 10000 s old (9000 s when the first was deleted), the
        // last (i + 1) * 1000 s newer than the first appended.
        let first_live = if (1..=2).contains(&i) { 1 } else { 0 };
        let oldest = e["oldest_age_secs"].as_i64().unwrap();
        let want = 10_000 - first_live * 1000;
        assert!((want..want + 30).contains(&oldest), "queue {i}: {e}");
        let newest = e["newest_age_secs"].as_i64().unwrap();
        let want = 10_000 - (i as i64 + 1) * 1000;
        assert!((want..want + 30).contains(&newest), "queue {i}: {e}");
    }
    let o = run(t.path(), &["queues"]);
    assert_eq!(o.code, 0);
    assert!(!o.stdout.contains(&b64(&qs[5])), "deleted queue listed");
    let line = o.stdout.lines().find(|l| l.contains(&b64(&qs[4]))).unwrap();
    let cols: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(cols[1], "6", "{line}");
    assert_eq!(cols[2], "2h46m", "{line}");
    assert_eq!(*cols.last().unwrap(), format!("g{:02}", group_of(&qs[4])));
    assert!(o.stdout.contains("5 live queues"), "{}", o.stdout);

    // show: queue 0 (updated), its messages; bodies on request.
    let o = run(t.path(), &["show", &b64(&qs[0])]);
    assert_eq!(o.code, 0, "{}{}", o.stdout, o.stderr);
    assert!(o.stdout.contains(": live"), "{}", o.stdout);
    assert!(o.stdout.contains("seq 1 "), "{}", o.stdout);
    assert!(o.stdout.contains("queue-create"));
    assert!(o.stdout.contains("queue-update"));
    assert!(o.stdout.contains("queue record 21 bytes"), "{}", o.stdout);
    assert!(
        o.stdout.contains("live messages: 2 (30 body bytes)"),
        "{}",
        o.stdout
    );
    assert!(o.stdout.contains(&b64(&id24(2, 0))));
    assert!(o.stdout.contains("flags ntf"), "{}", o.stdout);
    assert!(!o.stdout.contains("body:"));
    let g = group_of(&qs[0]);
    assert!(
        o.stdout
            .contains(&format!("g{g:02}/seg-000000001.jnl @ 4096")),
        "{}",
        o.stdout
    );
    let o = run(t.path(), &["show", &b64(&qs[0]), "--bodies"]);
    assert!(
        o.stdout.contains(&format!("body: {}", "01".repeat(20))),
        "{}",
        o.stdout
    );
    let o = run(t.path(), &["show", &b64(&qs[0]), "--bodies=base64"]);
    assert!(o.stdout.contains(&format!("body: {}", b64(&[1u8; 20]))));
    // Without padding, as IDs are often written.
    let o = run(t.path(), &["show", b64(&qs[3]).trim_end_matches('=')]);
    assert!(o.stdout.contains("live messages: 4"), "{}", o.stdout);
    assert!(
        o.stdout.contains("message records: 5 appended, 1 deleted"),
        "{}",
        o.stdout
    );
    let o = run(t.path(), &["show", &b64(&qs[5])]);
    assert_eq!(o.code, 0);
    assert!(o.stdout.contains(": deleted"), "{}", o.stdout);
    assert!(o.stdout.contains("queue-delete"));
    let o = run(t.path(), &["show", &b64(&id24(9, 9))]);
    assert_eq!(o.code, 1, "{}", o.stdout);
    let o = run(t.path(), &["show", "not base64!"]);
    assert_eq!(o.code, 2);
    assert!(o.stderr.contains("not a base64url"), "{}", o.stderr);

    // --journal-dir names the journal directory itself.
    let o = tool()
        .arg("--journal-dir")
        .arg(t.journal())
        .args(["stats", "--json"])
        .output()
        .unwrap();
    assert!(o.status.success());
    // A data directory without a journal is a usage error.
    let empty = TempDir::new("empty");
    let o = run(empty.path(), &["stats"]);
    assert_eq!(o.code, 2);
    assert!(o.stderr.contains("no journal directory"), "{}", o.stderr);
}

#[test]
fn verify_finds_a_flipped_byte_before_the_synced_offset_and_repair_cuts_it() {
    let t = TempDir::new("verify");
    let mut w = Writer::new(t.path(), 64 << 10);
    let q = id24(1, 0);
    create(&mut w, &q);
    let sent: Vec<Appended> = (0..40)
        .map(|k| send(&mut w, &q, &id24(2, k), now(), 0, &[7u8; 100]))
        .collect();
    w.sync_all();
    drop(w);

    let o = run(t.path(), &["verify"]);
    assert_eq!(o.code, 0, "{}{}", o.stdout, o.stderr);
    assert!(
        o.stdout.contains("clean: 1 groups, 41 records"),
        "{}",
        o.stdout
    );
    let v = json(&run(t.path(), &["verify", "--json"]));
    assert_eq!(v["clean"], true);

    // A byte of message 20's body: damage, named by file and offset.
    let g = group_of(&q);
    let path = seg_path(t.path(), &sent[20], g);
    flip_byte(&path, sent[20].loc.offset + 60);
    let o = run(t.path(), &["verify"]);
    assert_eq!(o.code, 1, "{}{}", o.stdout, o.stderr);
    let off = sent[20].loc.offset;
    assert!(
        o.stdout
            .contains(&format!("{}: damaged at offset {off}", path.display())),
        "{}",
        o.stdout
    );
    assert!(o.stdout.contains("DAMAGE"), "{}", o.stdout);
    let o = run(t.path(), &["stats"]);
    assert_eq!(o.code, 0);
    assert!(o.stdout.contains("damage: "), "{}", o.stdout);

    // Repair refuses while the data directory is locked (a relay runs), then cuts.
    let lock = hold_lock(t.path());
    let o = run(t.path(), &["repair"]);
    assert_eq!(o.code, 2, "{}{}", o.stdout, o.stderr);
    assert!(o.stderr.contains("is locked"), "{}", o.stderr);
    assert!(o.stderr.contains("stop it first"), "{}", o.stderr);
    let o = run(t.path(), &["compact"]);
    assert_eq!(o.code, 2);
    assert!(o.stderr.contains("is locked"), "{}", o.stderr);
    drop(lock);
    let o = run(t.path(), &["repair"]);
    assert_eq!(o.code, 0, "{}{}", o.stdout, o.stderr);
    assert!(
        o.stdout
            .contains(&format!("cut {} at offset {off}", path.display())),
        "{}",
        o.stdout
    );
    assert!(o.stdout.contains("21 records kept"), "{}", o.stdout);
    assert!(o.stdout.contains("1 repaired, 0 still damaged"));
    let o = run(t.path(), &["verify"]);
    assert_eq!(o.code, 0, "{}{}", o.stdout, o.stderr);
    assert!(o.stdout.contains("21 records"), "{}", o.stdout);
    let v = json(&run(t.path(), &["stats", "--json"]));
    assert_eq!(v["total"]["messages"], 20);
    // The repaired journal opens again.
    Journal::open(&t.journal(), g, &Options::default(), |_, _, _| Ok(())).unwrap();

    // Compaction is the relay's: the tool says so and changes nothing.
    let o = run(t.path(), &["compact"]);
    assert_eq!(o.code, 2);
    assert!(o.stderr.contains("compacted by the relay"), "{}", o.stderr);
}

#[test]
fn a_torn_tail_past_the_synced_offset_is_a_warning_not_damage() {
    let t = TempDir::new("torn");
    let mut w = Writer::new(t.path(), 64 << 10);
    let q = id24(1, 0);
    create(&mut w, &q);
    let sent: Vec<Appended> = (0..30)
        .map(|k| send(&mut w, &q, &id24(2, k), now(), 0, &[7u8; 100]))
        .collect();
    let g = group_of(&q);
    w.journal(g).sync_handle().sync_to(sent[19].end).unwrap();
    // The process ends without syncing the rest (as a crash would leave it), and record 25 was
    // torn on its way to the disk.
    drop(w);
    let path = seg_path(t.path(), &sent[25], g);
    flip_byte(&path, sent[25].loc.offset + 60);
    let o = run(t.path(), &["verify"]);
    assert_eq!(o.code, 0, "{}{}", o.stdout, o.stderr);
    let off = sent[25].loc.offset;
    assert!(
        o.stdout.contains(&format!(
            "warning: {}: torn tail at offset {off}, past the synced offset {}",
            path.display(),
            sent[19].end.offset
        )),
        "{}",
        o.stdout
    );
    assert!(
        o.stdout.contains("clean: 1 groups, 26 records"),
        "{}",
        o.stdout
    );
    assert!(o.stdout.contains("not damage"), "{}", o.stdout);
    let v = json(&run(t.path(), &["verify", "--json"]));
    assert_eq!(v["clean"], true);
    assert_eq!(v["warnings"], 1);
}

#[test]
fn records_that_contradict_each_other_are_reported() {
    let t = TempDir::new("index");
    let mut w = Writer::new(t.path(), 64 << 10);
    let (q, ghost) = (id24(1, 0), id24(1, 1));
    create(&mut w, &q);
    send(&mut w, &q, &id24(2, 0), now(), 0, b"x");
    let never = w.append(&Record::MsgDelete {
        recipient_id: &q,
        msg_id: &id24(2, 99),
    });
    let orphan = send(&mut w, &ghost, &id24(2, 1), now(), 0, b"y");
    // A record in a group its recipient ID does not belong to.
    let other = (group_of(&q) + 1) % 64;
    let stray = w.append_to(
        other,
        &Record::QueueCreate {
            recipient_id: &q,
            data: b"",
        },
    );
    w.sync_all();
    drop(w);
    let o = run(t.path(), &["verify"]);
    assert_eq!(o.code, 1, "{}{}", o.stdout, o.stderr);
    let at = |a: &Appended, g: u32| {
        format!(
            "{}: record at offset {}",
            seg_path(t.path(), a, g).display(),
            a.loc.offset
        )
    };
    let lines: Vec<&str> = o.stdout.lines().collect();
    let has = |a: &Appended, g: u32, what: &str| {
        lines
            .iter()
            .any(|l| l.starts_with("inconsistent: ") && l.contains(&at(a, g)) && l.contains(what))
    };
    assert!(has(&never, group_of(&q), "never appended"), "{}", o.stdout);
    assert!(
        has(&orphan, group_of(&ghost), "does not exist"),
        "{}",
        o.stdout
    );
    assert!(
        has(&stray, other, &format!("belongs to group {}", group_of(&q))),
        "{}",
        o.stdout
    );
    assert!(o.stdout.contains("DAMAGE: 3 "), "{}", o.stdout);
}

// ---------------------------------------------------------------------------------------------
// verify beside a process that appends

const CHILD_ENV: &str = "SMP_JOURNAL_TOOL_CHILD";

/// Not a test of its own: the body of the appending child process. Without the environment
/// variable it does nothing.
#[test]
fn child_process() {
    let Ok(dir) = std::env::var(CHILD_ENV) else {
        return;
    };
    let mut w = Writer::new(Path::new(&dir), 32 << 10);
    let mut live: Vec<([u8; 24], Vec<[u8; 24]>)> = Vec::new();
    // The parent kills it; a child left behind by a failed parent stops by itself.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    for i in 0u64.. {
        if std::time::Instant::now() > deadline {
            return;
        }
        let r = splitmix(i);
        if live.len() < 8 || r % 50 == 0 {
            // Queues of two groups only, so that their segments rotate while verify runs.
            let q = (i * 1000..)
                .map(|k| id24(1, k))
                .find(|q| group_of(q) % 32 == 5)
                .unwrap();
            create(&mut w, &q);
            live.push((q, Vec::new()));
        }
        let n = live.len();
        let (q, msgs) = &mut live[(r >> 8) as usize % n];
        if msgs.len() > 5 || (r >> 16) % 3 == 0 && !msgs.is_empty() {
            let m = msgs.remove(0);
            w.append(&Record::MsgDelete {
                recipient_id: q,
                msg_id: &m,
            });
        } else {
            let m = id24(2, i);
            send(
                &mut w,
                q,
                &m,
                now(),
                (r >> 24) as u8 & 3,
                &vec![1u8; (r >> 32) as usize % 300],
            );
            msgs.push(m);
        }
        if (r >> 40) % 200 == 0 && live.len() > 8 {
            let (q, _) = live.remove(0);
            w.append(&Record::QueueDelete { recipient_id: &q });
        }
        if i % 16 == 0 {
            w.sync_all();
        }
        if i == 1000 {
            println!("ready");
        }
        if i % 4 == 0 {
            std::thread::sleep(std::time::Duration::from_micros(100));
        }
    }
}

/// Kills the child when the test ends, passed or failed.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn verify_stays_clean_while_another_process_appends_and_syncs() {
    let t = TempDir::new("live");
    let mut child = KillOnDrop(
        Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "child_process",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_ENV, t.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap(),
    );
    let mut lines = BufReader::new(child.0.stdout.take().unwrap()).lines();
    loop {
        match lines.next() {
            // libtest prints "test child_process ... " before the child's own output.
            Some(Ok(l)) if l.ends_with("ready") => break,
            Some(Ok(_)) => {}
            other => panic!("child ended before it was ready: {other:?}"),
        }
    }
    let mut records = Vec::new();
    for _ in 0..20 {
        let o = run(t.path(), &["verify"]);
        assert_eq!(o.code, 0, "{}{}", o.stdout, o.stderr);
        assert!(o.stdout.contains("clean: "), "{}", o.stdout);
        let n: u64 = o
            .stdout
            .split(" groups, ")
            .nth(1)
            .and_then(|s| s.split(' ').next())
            .unwrap()
            .parse()
            .unwrap();
        records.push(n);
    }
    drop(child);
    assert!(
        records.last() > records.first(),
        "the child appended while verify ran: {records:?}"
    );
    // Segments rotated while verify ran (32 KiB segments).
    let v = json(&run(t.path(), &["stats", "--json"]));
    assert!(
        v["total"]["segments"].as_u64().unwrap() > v["groups"].as_array().unwrap().len() as u64,
        "{:#}",
        v["total"]
    );
}
