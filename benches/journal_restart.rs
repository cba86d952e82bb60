//! Start time of a relay on the journal store after a clean stop and after a SIGKILL
//! (`docs/ARCHITECTURE.md` §5, "Checkpoints"): a data directory gets `--queues` queues and a clean
//! stop, then `--records` more records (a SEND and its ACK, on queues picked at random, and now
//! and then a queue's record rewritten), written straight through the store (no network: the
//! store alone fills in seconds what clients would take an hour for). One copy of that history
//! ends with a clean stop, the other with the process exiting without one (what a SIGKILL leaves:
//! the files as written, in the page cache, and whatever checkpoints were taken while it ran).
//! Then `smp-relay start --cores 2` is timed to its `listening` line on each, alternately, and
//! killed (SIGKILL, so that nothing it would write at a stop changes the next start).
//!
//! Run: `cargo build --release && cargo bench --bench journal_restart -- [--queues N]
//! [--records N] [--runs N] [--dir DIR] [--checkpoint-records N]` (defaults 1,000,000 queues,
//! 10,000,000 records, 5 runs each, the system temp dir). Prints each start's seconds, then
//! median [min–max] per kind and the ratio of the medians.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::rc::Rc;
use std::time::{Duration, Instant};

use futures_lite::future::block_on;
use rand::{Rng, RngCore, SeedableRng};

use smp_relay::crypto::keys::PublicAuthKey;
use smp_relay::store::journal::{Durability, JournalStore};
use smp_relay::store::{
    Message, MessageStore, QueueRec, QueueStatus, QueueStore, ShardStore, StoreSettings,
};

const RELAY: &str = env!("CARGO_BIN_EXE_smp-relay");

struct Args {
    queues: usize,
    records: usize,
    runs: usize,
    dir: PathBuf,
    checkpoint_records: u64,
}

fn args() -> Args {
    let mut a = Args {
        queues: 1_000_000,
        records: 10_000_000,
        runs: 5,
        dir: std::env::temp_dir(),
        checkpoint_records: smp_relay::store::journal::DEFAULT_CHECKPOINT_RECORDS,
    };
    let v: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < v.len() {
        let next = |i: usize| v.get(i + 1).cloned().unwrap_or_default();
        match v[i].as_str() {
            "--queues" => a.queues = next(i).parse().expect("--queues N"),
            "--records" => a.records = next(i).parse().expect("--records N"),
            "--runs" => a.runs = next(i).parse().expect("--runs N"),
            "--dir" => a.dir = PathBuf::from(next(i)),
            "--checkpoint-records" => {
                a.checkpoint_records = next(i).parse().expect("--checkpoint-records N")
            }
            // cargo bench passes `--bench`.
            _ => {
                i += 1;
                continue;
            }
        }
        i += 2;
    }
    a
}

fn settings(dir: &Path, checkpoint_records: u64) -> StoreSettings {
    StoreSettings {
        data_dir: dir.to_path_buf(),
        keep: smp_relay::store::Keep::ALL,
        message_ttl_secs: i64::MAX,
        ntf_ttl_secs: i64::MAX,
        test_delay: None,
        durability: Durability::Interval(Duration::from_millis(50)),
        journal_budget: None,
        journal_checkpoint_records: checkpoint_records,
        postgres: None,
    }
}

fn rec(rid: &[u8], n: u64) -> QueueRec {
    QueueRec {
        recipient_id: rid.to_vec(),
        recipient_keys: vec![PublicAuthKey::Ed25519([1; 32])],
        rcv_dh_secret: [2; 32],
        sender_id: [rid, b"s"].concat(),
        sender_key: None,
        queue_mode: None,
        link: None,
        notifier: None,
        status: QueueStatus::Active,
        updated_at: Some(n as i64 * 86_400),
        rcv_service_id: None,
    }
}

fn rid_of(i: usize) -> Vec<u8> {
    let mut id = vec![0u8; 24];
    id[..8].copy_from_slice(&(i as u64).to_le_bytes());
    id[8..16].copy_from_slice(&(i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15).to_le_bytes());
    id
}

fn open(dir: &Path, checkpoint_records: u64) -> JournalStore {
    let groups: Vec<u32> = (0..smp_journal::JOURNAL_GROUPS).collect();
    JournalStore::open_groups(
        &settings(dir, checkpoint_records),
        &groups,
        0,
        Durability::Interval(Duration::from_millis(50)),
    )
    .expect("open the journal store")
}

/// The queues, and a clean stop.
fn fill(dir: &Path, a: &Args) {
    let st = open(dir, a.checkpoint_records);
    for i in 0..a.queues {
        block_on(st.create(rec(&rid_of(i), 0))).expect("create");
    }
    let all: Vec<u32> = (0..smp_journal::JOURNAL_GROUPS).collect();
    st.close(&settings(dir, a.checkpoint_records), &all)
        .expect("clean stop");
}

/// The records after the clean stop; then a clean stop or an exit without one.
fn churn(dir: &Path, a: &Args, clean: bool) {
    let st = open(dir, a.checkpoint_records);
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let body: Rc<[u8]> = Rc::from(&[0x5au8; 100][..]);
    let mut n = 0;
    while n < a.records {
        let rid = rid_of(rng.gen_range(0..a.queues));
        if rng.gen_range(0..16) == 0 {
            block_on(st.update(rec(&rid, n as u64))).expect("update");
            n += 1;
            continue;
        }
        let mut msg_id = [0u8; 24];
        rng.fill_bytes(&mut msg_id);
        let m = Message::Message {
            msg_id,
            ts: 1_700_000_000,
            notification: false,
            body: body.clone(),
        };
        block_on(st.write(&rid, m, 128)).expect("write");
        block_on(st.try_del(&rid, &msg_id)).expect("ack");
        n += 2;
    }
    if clean {
        let all: Vec<u32> = (0..smp_journal::JOURNAL_GROUPS).collect();
        st.close(&settings(dir, a.checkpoint_records), &all)
            .expect("clean stop");
    } else {
        // What a SIGKILL leaves: no stop at all.
        std::process::exit(0);
    }
}

/// One start of the relay on `dir`, to its `listening` line: the seconds it took.
fn start(dir: &Path) -> f64 {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
        l.local_addr().expect("address").port()
    };
    let t = Instant::now();
    let mut child = Command::new(RELAY)
        .args(["--data-dir", dir.to_str().expect("utf-8")])
        .args(["start", "--cores", "2", "--port", &port.to_string()])
        .args(["--store", "journal"])
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("smp-relay");
    let err = child.stderr.take().expect("stderr");
    let mut took = None;
    for line in BufReader::new(err).lines() {
        let line = line.expect("log line");
        if line.contains("listening") {
            took = Some(t.elapsed().as_secs_f64());
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    took.expect("the relay reached listening")
}

fn median(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(|a, b| a.partial_cmp(b).expect("numbers"));
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

fn main() {
    let a = args();
    // The child processes of this bench: `fill`/`churn` run in a process of their own, so that
    // the one that ends without a stop ends like a killed relay.
    if let Ok(step) = std::env::var("JOURNAL_RESTART_STEP") {
        let dir = PathBuf::from(std::env::var("JOURNAL_RESTART_DIR").expect("dir"));
        match step.as_str() {
            "fill" => fill(&dir, &a),
            "churn-clean" => churn(&dir, &a, true),
            "churn-kill" => churn(&dir, &a, false),
            _ => panic!("unknown step"),
        }
        return;
    }
    let root = a
        .dir
        .join(format!("smp-journal-restart-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let me = std::env::current_exe().expect("this bench");
    let step = |dir: &Path, what: &str| {
        let t = Instant::now();
        let ok = Command::new(&me)
            .args(std::env::args().skip(1))
            .env("JOURNAL_RESTART_STEP", what)
            .env("JOURNAL_RESTART_DIR", dir)
            .status()
            .expect("a step")
            .success();
        assert!(ok, "step {what} failed");
        eprintln!("{what}: {:.1} s", t.elapsed().as_secs_f64());
    };
    let dirs = [root.join("clean"), root.join("kill")];
    for d in &dirs {
        std::fs::create_dir_all(d).expect("dir");
        let ok = Command::new(RELAY)
            .args(["--data-dir", d.to_str().expect("utf-8"), "init"])
            .stdout(Stdio::null())
            .status()
            .expect("init")
            .success();
        assert!(ok, "init");
        step(d, "fill");
    }
    step(&dirs[0], "churn-clean");
    step(&dirs[1], "churn-kill");
    let (mut clean, mut kill) = (Vec::new(), Vec::new());
    for r in 0..a.runs {
        // Alternate which goes first.
        let order = if r % 2 == 0 { [0, 1] } else { [1, 0] };
        for i in order {
            let s = start(&dirs[i]);
            eprintln!("run {r}: {} {s:.2} s", ["clean", "kill"][i]);
            [&mut clean, &mut kill][i].push(s);
        }
    }
    let (c, cmin, cmax) = median(clean);
    let (k, kmin, kmax) = median(kill);
    println!(
        "{} queues, {} records since the last clean stop, checkpoints every {} records of a group",
        a.queues, a.records, a.checkpoint_records
    );
    println!("start after a clean stop: {c:.2} s [{cmin:.2}–{cmax:.2}]");
    println!("start after SIGKILL:      {k:.2} s [{kmin:.2}–{kmax:.2}]");
    println!("ratio of the medians:     {:.2}", k / c);
    let _ = std::fs::remove_dir_all(&root);
}
