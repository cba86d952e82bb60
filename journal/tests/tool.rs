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
    // The orphan stays parked to the end, as in the relay's replay, which drops it.
    assert!(
        has(
            &orphan,
            group_of(&ghost),
            &format!(
                "1 message(s) of queue {}, which has no record: the relay drops them",
                b64(&ghost)
            )
        ),
        "{}",
        o.stdout
    );
    assert!(o.stdout.contains("DAMAGE: 4 "), "{}", o.stdout);
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

// ---------------------------------------------------------------------------------------------
// Missing and cut-short segments: verify names them, repair gives them a way out

/// `n` recipient IDs (salt `salt`) of group `g`.
fn ids_in_group(salt: u64, g: u32, n: usize) -> Vec<[u8; 24]> {
    (0..)
        .map(|k| id24(salt, k))
        .filter(|id| group_of(id) == g)
        .take(n)
        .collect()
}

/// Every segment file of a group directory (`.cut` ones too) with its bytes.
fn snapshot(dir: &Path) -> std::collections::BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_name().to_string_lossy().starts_with("seg-"))
        .map(|e| {
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect()
}

/// The repair of an already repaired group changes nothing, by the tool or the library.
fn assert_repair_is_idempotent(data_dir: &Path, g: u32) {
    let dir = group_dir(&data_dir.join("journal"), g);
    let before = snapshot(&dir);
    let o = run(data_dir, &["repair"]);
    assert_eq!(o.code, 0, "{}{}", o.stdout, o.stderr);
    assert!(
        o.stdout.contains("0 repaired, 0 still damaged\n"),
        "{}",
        o.stdout
    );
    let r = smp_journal::repair(&data_dir.join("journal"), g).unwrap();
    assert!(!r.changed(), "{r}");
    assert!(r.to_string().contains("no damage found"), "{r}");
    assert_eq!(snapshot(&dir), before, "a second repair changed files");
}

/// Records replayed by `Journal::open` of group `g`: (sequence number, kind name, ID).
fn replayed(data_dir: &Path, g: u32) -> Vec<(u64, &'static str, Vec<u8>)> {
    let mut got = Vec::new();
    Journal::open(
        &data_dir.join("journal"),
        g,
        &Options::default(),
        |_, seq, rec| {
            got.push((
                seq,
                rec.kind().name(),
                rec.id().unwrap_or_default().to_vec(),
            ));
            Ok(())
        },
    )
    .unwrap();
    got
}

/// Bytes of a queue record that fits an empty 32 KiB segment before its reserve, but not one
/// that holds 2 KiB of records already.
const BIG: usize = 23_900;

/// Two queues of one group whose first segment is dead once the second is written when `dead`
/// (their creates are overwritten by updates, their messages there deleted), and holds live
/// messages of queue A otherwise. Returns the group, the queue IDs and the records of segment 2.
fn build_two_segments(data_dir: &Path, dead: bool) -> (u32, [u8; 24], [u8; 24], u64) {
    let mut w = Writer::new(data_dir, 32 << 10);
    let a = id24(1, 0);
    let g = group_of(&a);
    let b = ids_in_group(1, g, 2)[1];
    create(&mut w, &a);
    create(&mut w, &b);
    let (a0, a1) = (id24(2, 0), id24(2, 1));
    send(&mut w, &a, &a0, now(), 0, &[1u8; 1000]);
    send(&mut w, &a, &a1, now(), 0, &[1u8; 1000]);
    // A queue record too large for the rest of segment 1: it starts segment 2.
    let big = vec![9u8; BIG];
    let up = w.append(&Record::QueueUpdate {
        recipient_id: &a,
        data: &big,
    });
    assert_eq!(up.loc.segment, 2);
    let mut seg2 = 1;
    w.append(&Record::QueueUpdate {
        recipient_id: &b,
        data: b"queue record, updated",
    });
    seg2 += 1;
    for k in 2..4 {
        send(&mut w, &a, &id24(2, k), now(), 0, &[1u8; 100]);
        seg2 += 1;
    }
    send(&mut w, &b, &id24(2, 10), now(), 0, &[1u8; 100]);
    seg2 += 1;
    if dead {
        for m in [&a0, &a1] {
            w.append(&Record::MsgDelete {
                recipient_id: &a,
                msg_id: m,
            });
            seg2 += 1;
        }
    }
    w.sync_all();
    if dead {
        // As the relay does once every record in it is dead.
        let retired = w.journal(g).remove_segment(1).unwrap();
        drop(retired);
    }
    drop(w);
    (g, a, b, seg2)
}

#[test]
fn a_first_segment_removed_as_dead_verifies_clean_and_one_deleted_by_hand_is_repaired() {
    // Removed as dead by the journal: the group is trimmed, and its records say nothing wrong.
    let t = TempDir::new("retired");
    let (g, _, _, seg2) = build_two_segments(t.path(), true);
    let dir = group_dir(&t.journal(), g);
    assert!(!dir.join(segment_file_name(1)).exists());
    let o = run(t.path(), &["verify"]);
    assert_eq!(o.code, 0, "{}{}", o.stdout, o.stderr);
    assert_eq!(
        o.stdout,
        format!(
            "clean: 1 groups, {seg2} records checked under {}\n",
            t.journal().display()
        )
    );
    let v = json(&run(t.path(), &["stats", "--json"]));
    assert_eq!(v["total"]["queues"], 2, "{v:#}");
    assert_eq!(v["total"]["messages"], 3, "{v:#}");

    // The same shape, but segment 1 deleted by hand while its messages were live.
    let t = TempDir::new("first-deleted");
    let (g, a, b, seg2) = build_two_segments(t.path(), false);
    let dir = group_dir(&t.journal(), g);
    std::fs::remove_file(dir.join(segment_file_name(1))).unwrap();
    let seg2_path = dir.join(segment_file_name(2));
    let o = run(t.path(), &["verify"]);
    assert_eq!(o.code, 1, "{}{}", o.stdout, o.stderr);
    let damage = format!(
        "damage: {}: the segments before it are missing: its first record is number 5, and none \
         of the group's segments was removed as dead to make it the first",
        seg2_path.display()
    );
    assert_eq!(
        o.stdout.lines().next(),
        Some(damage.as_str()),
        "{}",
        o.stdout
    );
    assert!(o.stdout.contains("\nDAMAGE: 1 "), "{}", o.stdout);
    let e = Journal::open(&t.journal(), g, &Options::default(), |_, _, _| Ok(()))
        .err()
        .unwrap();
    assert!(e.to_string().contains("smp-journal repair"), "{e}");

    let o = run(t.path(), &["repair"]);
    assert_eq!(o.code, 0, "{}{}", o.stdout, o.stderr);
    let history = "its older records are missing: messages it held then, if any, are lost (how \
                   many is not known)";
    let mut queues = [a, b];
    queues.sort();
    let mut want = vec![
        damage.clone(),
        format!("group {g}: {seg2} records kept, none cut"),
        format!(
            "group {g}: {}: the segments before it are missing: its first record is number 5, \
             and none of the group's segments was removed as dead to make it the first; marked \
             as the group's first segment: the records before it are lost, and what they were \
             is not known",
            seg2_path.display()
        ),
    ];
    want.extend(
        queues
            .iter()
            .map(|q| format!("queue {}: {history}", b64(q))),
    );
    want.push("1 groups checked, 1 repaired, 0 still damaged".into());
    assert_eq!(o.stdout.lines().collect::<Vec<_>>(), want, "{}", o.stdout);

    let o = run(t.path(), &["verify"]);
    assert_eq!(o.code, 0, "{}{}", o.stdout, o.stderr);
    assert!(
        o.stdout
            .starts_with(&format!("clean: 1 groups, {seg2} records")),
        "{}",
        o.stdout
    );
    let got = replayed(t.path(), g);
    assert_eq!(got.len() as u64, seg2);
    assert_eq!(got[0].0, 5);
    assert_eq!((got[0].1, got[0].2.as_slice()), ("queue-update", &a[..]));
    assert_repair_is_idempotent(t.path(), g);
}

#[test]
fn a_first_segment_deleted_with_a_queue_record_leaves_its_later_messages_to_be_dropped() {
    // Queue C's create is in segment 1, one message of it in segment 2: with segment 1 gone,
    // the relay parks that message for a queue record that never comes, and drops it.
    let t = TempDir::new("first-deleted-orphan");
    let mut w = Writer::new(t.path(), 32 << 10);
    let c = id24(1, 0);
    let g = group_of(&c);
    create(&mut w, &c);
    send(&mut w, &c, &id24(2, 9), now(), 0, &[1u8; 1000]);
    let big = vec![9u8; BIG];
    let other = ids_in_group(1, g, 2)[1];
    let r = w.append(&Record::QueueCreate {
        recipient_id: &other,
        data: &big,
    });
    assert_eq!(r.loc.segment, 2);
    let m = send(&mut w, &c, &id24(2, 0), now(), 0, b"hello");
    w.sync_all();
    drop(w);
    let dir = group_dir(&t.journal(), g);
    std::fs::remove_file(dir.join(segment_file_name(1))).unwrap();

    let o = run(t.path(), &["repair"]);
    assert_eq!(o.code, 0, "{}{}", o.stdout, o.stderr);
    let line = format!(
        "queue {}: 1 message(s) lost with its queue's record (the relay drops messages of a \
         queue that has no record)",
        b64(&c)
    );
    assert!(o.stdout.lines().any(|l| l == line), "{}", o.stdout);
    assert!(
        o.stdout.ends_with(
            "1 groups checked, 1 repaired, 0 still damaged\nnote: 1 inconsistent record(s) left \
             (see `smp-journal verify`); repair changes damaged bytes and segment files only, \
             never records that contradict each other\n"
        ),
        "{}",
        o.stdout
    );
    // No damage is left; the message the relay drops stays an inconsistency until the relay
    // removes its segment.
    let o = run(t.path(), &["verify"]);
    assert_eq!(o.code, 1, "{}{}", o.stdout, o.stderr);
    let lines: Vec<&str> = o.stdout.lines().collect();
    assert_eq!(
        lines[0],
        format!(
            "inconsistent: {}: record at offset {}: 1 message(s) of queue {}, which has no \
             record: the relay drops them",
            dir.join(segment_file_name(2)).display(),
            m.loc.offset,
            b64(&c)
        )
    );
    assert_eq!(lines.len(), 2, "{}", o.stdout);
    assert!(lines[1].starts_with("DAMAGE: 1 "), "{}", o.stdout);
    assert_eq!(replayed(t.path(), g).len(), 2);
    assert_repair_is_idempotent(t.path(), g);
}

#[test]
fn a_deleted_last_segment_is_damage_and_repair_makes_the_one_before_it_the_last() {
    let t = TempDir::new("last-deleted");
    let mut w = Writer::new(t.path(), 32 << 10);
    let a = id24(1, 0);
    let g = group_of(&a);
    create(&mut w, &a);
    let mut kept = 1;
    let mut k = 0;
    loop {
        let s = send(&mut w, &a, &id24(2, k), now(), 0, &[3u8; 1000]);
        k += 1;
        if s.loc.segment == 2 {
            break;
        }
        kept += 1;
    }
    for j in 0..5 {
        send(&mut w, &a, &id24(3, j), now(), 0, &[3u8; 1000]);
    }
    w.sync_all();
    drop(w);
    let dir = group_dir(&t.journal(), g);
    let (seg1, seg2) = (
        dir.join(segment_file_name(1)),
        dir.join(segment_file_name(2)),
    );
    std::fs::remove_file(&seg2).unwrap();

    let o = run(t.path(), &["verify"]);
    assert_eq!(o.code, 1, "{}{}", o.stdout, o.stderr);
    let damage = format!(
        "damage: {}: the segment after it, seg-000000002.jnl, is missing (it was made, and its \
         records are lost)",
        seg1.display()
    );
    assert_eq!(
        o.stdout.lines().collect::<Vec<_>>()[..1],
        [damage.as_str()],
        "{}",
        o.stdout
    );
    assert!(o.stdout.contains("\nDAMAGE: 1 "), "{}", o.stdout);

    let o = run(t.path(), &["repair"]);
    assert_eq!(o.code, 0, "{}{}", o.stdout, o.stderr);
    assert_eq!(
        o.stdout.lines().collect::<Vec<_>>(),
        [
            damage,
            format!("group {g}: {kept} records kept, none cut"),
            format!(
                "group {g}: {} is missing (the segment before it says it was made): its records \
                 are lost, and what they were is not known; the segment before it is now the last",
                seg2.display()
            ),
            "1 groups checked, 1 repaired, 0 still damaged".into(),
        ],
        "{}",
        o.stdout
    );
    let o = run(t.path(), &["verify"]);
    assert_eq!(o.code, 0, "{}{}", o.stdout, o.stderr);
    assert!(
        o.stdout
            .starts_with(&format!("clean: 1 groups, {kept} records")),
        "{}",
        o.stdout
    );
    assert_eq!(replayed(t.path(), g).len(), kept);
    assert_repair_is_idempotent(t.path(), g);
}

#[test]
fn a_segment_cut_short_is_extended_and_the_journal_cut_where_its_records_end() {
    let t = TempDir::new("truncated");
    let mut w = Writer::new(t.path(), 256 << 10);
    let a = id24(1, 0);
    let g = group_of(&a);
    let others = ids_in_group(1, g, 3);
    let (b, c) = (others[1], others[2]);
    let n = id24(4, 0);
    let mut log: Vec<Appended> = Vec::new();
    log.push(create(&mut w, &a));
    log.push(create(&mut w, &b));
    for k in 0..2 {
        log.push(send(&mut w, &b, &id24(5, k), now(), 0, &[2u8; 100]));
    }
    for k in 0..2 {
        log.push(w.append_to(
            g,
            &Record::NtfAppend {
                notifier_id: &n,
                data: &[k],
            },
        ));
    }
    // Messages of A until segment 2 begins.
    let mut k = 0;
    loop {
        let s = send(&mut w, &a, &id24(2, k), now(), 0, &[1u8; 1000]);
        log.push(s);
        k += 1;
        if s.loc.segment == 2 {
            break;
        }
    }
    // In segment 2: 4 more messages of A, the first message of A acknowledged, A's record
    // changed, B deleted, C created with 3 messages, A's notifier cleared and given a new one.
    for j in 0..4 {
        send(&mut w, &a, &id24(3, j), now(), 0, &[1u8; 1000]);
    }
    w.append(&Record::MsgDelete {
        recipient_id: &a,
        msg_id: &id24(2, 0),
    });
    w.append(&Record::QueueUpdate {
        recipient_id: &a,
        data: b"queue record, updated",
    });
    w.append(&Record::QueueDelete { recipient_id: &b });
    create(&mut w, &c);
    for j in 0..3 {
        send(&mut w, &c, &id24(6, j), now(), 0, b"c");
    }
    w.append_to(g, &Record::NtfClear { notifier_id: &n });
    w.append_to(
        g,
        &Record::NtfAppend {
            notifier_id: &n,
            data: &[9],
        },
    );
    w.sync_all();
    drop(w);

    let dir = group_dir(&t.journal(), g);
    let seg1 = dir.join(segment_file_name(1));
    let seg2 = dir.join(segment_file_name(2));
    let synced = log
        .iter()
        .rev()
        .find(|a| a.loc.segment == 1)
        .unwrap()
        .end
        .offset;
    OpenOptions::new()
        .write(true)
        .open(&seg1)
        .unwrap()
        .set_len(100_000)
        .unwrap();
    // The records wholly before the cut-off end are kept; the one across it is where the cut is.
    let kept: Vec<&Appended> = log
        .iter()
        .take_while(|a| a.end.segment == 1 && a.end.offset <= 100_000)
        .collect();
    let cut_at = log[kept.len()].loc.offset;

    let o = run(t.path(), &["verify"]);
    assert_eq!(o.code, 1, "{}{}", o.stdout, o.stderr);
    let damage = format!(
        "damage: {}: damaged at offset {cut_at}: the file has 100000 bytes, its header says \
         262144: it was cut short, and the records from here on are lost (`smp-journal repair` \
         extends it with zeros and cuts the journal here)",
        seg1.display()
    );
    assert_eq!(
        o.stdout.lines().next(),
        Some(damage.as_str()),
        "{}",
        o.stdout
    );
    assert!(o.stdout.contains("\nDAMAGE: 1 "), "{}", o.stdout);
    let e = Journal::open(&t.journal(), g, &Options::default(), |_, _, _| Ok(()))
        .err()
        .unwrap();
    assert!(
        e.to_string()
            .contains("the header says 262144 bytes, the file has 100000"),
        "{e}"
    );

    let o = run(t.path(), &["repair"]);
    assert_eq!(o.code, 0, "{}{}", o.stdout, o.stderr);
    let lines: Vec<&str> = o.stdout.lines().collect();
    assert_eq!(lines[0], damage);
    assert!(
        lines[1].starts_with(&format!(
            "group {g}: cut {} at offset {cut_at} (the file was cut short at 100000; damage \
             before the synced offset {synced}: ",
            seg1.display()
        )),
        "{}",
        o.stdout
    );
    assert!(
        lines[1].ends_with(&format!(
            "{} records kept, everything from that offset on is gone; later segment set aside \
             as {}.cut (inspect or delete it)",
            kept.len(),
            seg2.display()
        )),
        "{}",
        o.stdout
    );
    assert_eq!(
        lines[2],
        format!(
            "group {g}: {} was cut short to 100000 bytes (its header says 262144): extended \
             back with zeros",
            seg1.display()
        )
    );
    assert_eq!(
        lines[3],
        format!(
            "group {g}: {}: the records from offset {cut_at} on were cut off with the file's \
             end (at 100000): what they were is not known",
            seg1.display()
        )
    );
    // Segment 2: the message of A that began it, 4 more, the delete, the update, the delete of
    // B, C's create and messages, the notifier's clear and append.
    assert_eq!(
        lines[4],
        format!("group {g}: 14 record(s) dropped past the cut; what they meant:")
    );
    let mut per_queue = vec![
        (
            a,
            format!(
                "queue {}: 5 message(s) lost, 1 acknowledged message(s) may be delivered \
                 again, its later record changes are lost",
                b64(&a)
            ),
        ),
        (
            b,
            format!(
                "queue {}: its deletion is lost: the queue is back with 2 message(s)",
                b64(&b)
            ),
        ),
        (
            c,
            format!(
                "queue {}: created after the cut, the queue is lost, 3 message(s) lost",
                b64(&c)
            ),
        ),
    ];
    per_queue.sort();
    let mut want: Vec<String> = per_queue.into_iter().map(|(_, l)| l).collect();
    want.push(format!(
        "notifier {}: 1 notification(s) lost, 2 deleted notification(s) come back",
        b64(&n)
    ));
    want.push("1 groups checked, 1 repaired, 0 still damaged".into());
    assert_eq!(lines[5..], want, "{}", o.stdout);
    assert_eq!(std::fs::metadata(&seg1).unwrap().len(), 262_144);

    let o = run(t.path(), &["verify"]);
    assert_eq!(o.code, 0, "{}{}", o.stdout, o.stderr);
    assert!(
        o.stdout
            .starts_with(&format!("clean: 1 groups, {} records", kept.len())),
        "{}",
        o.stdout
    );
    let got = replayed(t.path(), g);
    let want: Vec<u64> = kept.iter().map(|a| a.seq).collect();
    assert_eq!(got.iter().map(|r| r.0).collect::<Vec<_>>(), want);
    assert_repair_is_idempotent(t.path(), g);
}

#[test]
fn a_segment_longer_than_its_header_says_is_not_repaired() {
    let t = TempDir::new("longer");
    let mut w = Writer::new(t.path(), 32 << 10);
    let a = id24(1, 0);
    let g = group_of(&a);
    create(&mut w, &a);
    w.sync_all();
    drop(w);
    let seg1 = group_dir(&t.journal(), g).join(segment_file_name(1));
    OpenOptions::new()
        .write(true)
        .open(&seg1)
        .unwrap()
        .set_len(40 << 10)
        .unwrap();
    let o = run(t.path(), &["verify"]);
    assert_eq!(o.code, 1, "{}{}", o.stdout, o.stderr);
    assert!(
        o.stdout.contains(&format!(
            "damage: {}: segment does not match this journal: the header says 32768 bytes, the \
             file has 40960",
            seg1.display()
        )),
        "{}",
        o.stdout
    );
    let o = run(t.path(), &["repair"]);
    assert_eq!(o.code, 1, "{}{}", o.stdout, o.stderr);
    assert!(
        o.stdout.contains(&format!(
            "group {g:02}: not repaired: {}: segment does not match this journal: the header \
             says 32768 bytes, the file has 40960: files are never grown",
            seg1.display()
        )),
        "{}",
        o.stdout
    );
    assert_eq!(std::fs::metadata(&seg1).unwrap().len(), 40 << 10);
}

#[test]
fn repair_of_a_flipped_byte_says_per_queue_what_the_cut_dropped() {
    let t = TempDir::new("flip-report");
    let mut w = Writer::new(t.path(), 64 << 10);
    let a = id24(1, 0);
    let g = group_of(&a);
    let b = ids_in_group(1, g, 2)[1];
    create(&mut w, &a);
    let sent: Vec<Appended> = (0..10)
        .map(|k| send(&mut w, &a, &id24(2, k), now(), 0, &[7u8; 100]))
        .collect();
    // Past message 5, whose byte is flipped below: message 6, the acknowledgement of message
    // 1 (before the cut), message 7, queue B with one message; then messages of A until
    // segment 2 begins.
    send(&mut w, &a, &id24(3, 6), now(), 0, &[7u8; 100]);
    w.append(&Record::MsgDelete {
        recipient_id: &a,
        msg_id: &id24(2, 1),
    });
    send(&mut w, &a, &id24(3, 7), now(), 0, &[7u8; 100]);
    create(&mut w, &b);
    send(&mut w, &b, &id24(4, 0), now(), 0, b"b");
    let mut filler = 0;
    loop {
        let s = send(&mut w, &a, &id24(5, filler), now(), 0, &[7u8; 1000]);
        filler += 1;
        if s.loc.segment == 2 {
            break;
        }
    }
    // Segment 2: message 2 acknowledged (before the cut), message 6 too (after it), A's record
    // changed, one more message of B.
    for m in [id24(2, 2), id24(3, 6)] {
        w.append(&Record::MsgDelete {
            recipient_id: &a,
            msg_id: &m,
        });
    }
    w.append(&Record::QueueUpdate {
        recipient_id: &a,
        data: b"queue record, updated",
    });
    send(&mut w, &b, &id24(4, 1), now(), 0, b"b");
    w.sync_all();
    drop(w);

    let seg1 = seg_path(t.path(), &sent[5], g);
    let seg2 = group_dir(&t.journal(), g).join(segment_file_name(2));
    let off = sent[5].loc.offset;
    flip_byte(&seg1, off + 60);
    let o = run(t.path(), &["verify"]);
    assert_eq!(o.code, 1, "{}{}", o.stdout, o.stderr);
    assert!(
        o.stdout.starts_with(&format!(
            "damage: {}: damaged at offset {off}: ",
            seg1.display()
        )),
        "{}",
        o.stdout
    );

    let o = run(t.path(), &["repair"]);
    assert_eq!(o.code, 0, "{}{}", o.stdout, o.stderr);
    let lines: Vec<&str> = o.stdout.lines().collect();
    assert!(
        lines[1].starts_with(&format!(
            "group {g}: cut {} at offset {off} (damage before the synced offset",
            seg1.display()
        )),
        "{}",
        o.stdout
    );
    assert!(
        lines[1].contains(
            "; 6 records kept, everything from that offset on is gone; later segment set aside"
        ),
        "{}",
        o.stdout
    );
    assert_eq!(
        lines[2],
        format!(
            "group {g}: {}: the record at offset {off} cannot be read (CRC mismatch): what it \
             was is not known",
            seg1.display()
        )
    );
    // Found past the cut: messages 6 to 9 of the first ten, the 5 records after them, the
    // fillers and the 4 records of segment 2. Lost of A: messages 6 to 9, the other message 7
    // and the fillers (the other message 6 was acknowledged after the cut too); back: messages
    // 1 and 2.
    let dropped = 4 + 5 + filler + 4;
    assert_eq!(
        lines[3],
        format!("group {g}: {dropped} record(s) dropped past the cut; what they meant:")
    );
    let mut per_queue = vec![
        (
            a,
            format!(
                "queue {}: {} message(s) lost, 2 acknowledged message(s) may be delivered \
                 again, its later record changes are lost",
                b64(&a),
                5 + filler
            ),
        ),
        (
            b,
            format!(
                "queue {}: created after the cut, the queue is lost, 2 message(s) lost",
                b64(&b)
            ),
        ),
    ];
    per_queue.sort();
    let mut want: Vec<String> = per_queue.into_iter().map(|(_, l)| l).collect();
    want.push("1 groups checked, 1 repaired, 0 still damaged".into());
    assert_eq!(lines[4..], want, "{}", o.stdout);
    assert!(!seg2.exists());

    let o = run(t.path(), &["verify"]);
    assert_eq!(o.code, 0, "{}{}", o.stdout, o.stderr);
    assert!(
        o.stdout.starts_with("clean: 1 groups, 6 records"),
        "{}",
        o.stdout
    );
    let got = replayed(t.path(), g);
    assert_eq!(
        got.iter().map(|r| r.0).collect::<Vec<_>>(),
        (1..=6).collect::<Vec<u64>>()
    );
    assert_repair_is_idempotent(t.path(), g);
}

#[test]
fn a_gap_in_the_segment_numbers_is_cut_and_what_followed_it_reported() {
    let t = TempDir::new("gap");
    let mut w = Writer::new(t.path(), 32 << 10);
    let a = id24(1, 0);
    let g = group_of(&a);
    create(&mut w, &a);
    let mut log = Vec::new();
    let mut k = 0;
    // Segments 1 and 2 full of messages of A, then segment 3: the acknowledgement of A's first
    // message and two more messages.
    loop {
        let s = send(&mut w, &a, &id24(2, k), now(), 0, &[1u8; 1000]);
        k += 1;
        if s.loc.segment == 3 {
            break;
        }
        log.push(s);
    }
    w.append(&Record::MsgDelete {
        recipient_id: &a,
        msg_id: &id24(2, 0),
    });
    send(&mut w, &a, &id24(3, 0), now(), 0, b"x");
    w.sync_all();
    drop(w);
    let kept = 1 + log.iter().filter(|s| s.loc.segment == 1).count();
    let dir = group_dir(&t.journal(), g);
    let (seg2, seg3) = (
        dir.join(segment_file_name(2)),
        dir.join(segment_file_name(3)),
    );
    std::fs::remove_file(&seg2).unwrap();

    let o = run(t.path(), &["verify"]);
    assert_eq!(o.code, 1, "{}{}", o.stdout, o.stderr);
    let damage = format!(
        "damage: {}: segments before it are missing (seg-000000002.jnl)",
        seg3.display()
    );
    assert_eq!(
        o.stdout.lines().next(),
        Some(damage.as_str()),
        "{}",
        o.stdout
    );

    let o = run(t.path(), &["repair"]);
    assert_eq!(o.code, 0, "{}{}", o.stdout, o.stderr);
    assert_eq!(
        o.stdout.lines().collect::<Vec<_>>(),
        [
            damage,
            format!(
                "group {g}: cut {} at offset 4096 (segments before it are missing \
                 (seg-000000002.jnl)); {kept} records kept, everything from that offset on is \
                 gone; later segment set aside as {}.cut (inspect or delete it)",
                seg3.display(),
                seg3.display()
            ),
            format!(
                "group {g}: {}: missing, its records are lost, and what they were is not known",
                seg2.display()
            ),
            format!("group {g}: 3 record(s) dropped past the cut; what they meant:"),
            format!(
                "queue {}: 2 message(s) lost, 1 acknowledged message(s) may be delivered again",
                b64(&a)
            ),
            "1 groups checked, 1 repaired, 0 still damaged".into(),
        ],
        "{}",
        o.stdout
    );
    let o = run(t.path(), &["verify"]);
    assert_eq!(o.code, 0, "{}{}", o.stdout, o.stderr);
    assert_eq!(replayed(t.path(), g).len(), kept);
    assert_repair_is_idempotent(t.path(), g);
}

/// A reader that closes the tool's output (`smp-journal queues | head`) ends it quietly, as a Unix
/// tool that SIGPIPE ends: no `Broken pipe` message, the status 128 + 13.
#[test]
fn a_closed_output_ends_the_tool_quietly() {
    use std::os::fd::FromRawFd;
    let t = TempDir::new("pipe");
    build_sample(t.path());
    for cmd in [
        &["queues"][..],
        &["stats"],
        &["verify"],
        &["queues", "--json"],
    ] {
        let mut fds = [0i32; 2];
        // SAFETY: pipe(2) fills the two descriptors, each owned once below.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: fds[0] is the read end, open and owned by nothing else.
        drop(unsafe { File::from_raw_fd(fds[0]) });
        // SAFETY: fds[1] is the write end, open and owned by nothing else.
        let write_end = unsafe { File::from_raw_fd(fds[1]) };
        let o = tool()
            .arg("--data-dir")
            .arg(t.path())
            .args(cmd)
            .stdin(Stdio::null())
            .stdout(Stdio::from(write_end))
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(stderr, "", "{cmd:?}: nothing on stderr");
        assert_eq!(o.status.code(), Some(141), "{cmd:?}: {:?}", o.status);
    }
}
