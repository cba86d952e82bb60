//! Append throughput of the journal store on one shard (`docs/ARCHITECTURE.md` §5): messages
//! written with `MessageStore::write` to the partition groups one shard of two owns, on a glommio
//! executor as the shard runs them, with the store's own sync thread beside it, under each
//! `--fsync` setting (`every-batch`, `interval-ms 50`, `never`), for 100-byte and 16,000-byte
//! bodies, with 1 write in flight and with 64 (the owner keeps many jobs in flight, and
//! `every-batch` syncs every change waiting at once). No TLS, no signatures: the store alone.
//!
//! Run: `cargo bench --bench journal_append [-- FILTER]` (FILTER: a substring of the
//! configuration, e.g. `every-batch`). `JOURNAL_BENCH_DIR` sets where the journals go (default:
//! the system temp dir; each run's is removed after it). Prints, per configuration, median
//! [min–max] over `RUNS` runs of appends per second, MB/s of bodies, the latency of one `write`
//! (its wait for the sync included) and the time of the close that follows (the sync of what is
//! left). Configurations alternate within each round, so machine noise spreads over all.

use std::rc::Rc;
use std::time::{Duration, Instant};

use glommio::{LocalExecutorBuilder, Placement};
use rand::RngCore;

use smp_relay::crypto::keys::PublicAuthKey;
use smp_relay::server::router::groups_of_shard;
use smp_relay::store::journal::{Durability, JournalStore};
use smp_relay::store::{
    group_of, Message, MessageStore, QueueRec, QueueStatus, QueueStore, ShardStore, StoreSettings,
};

const RUNS: usize = 5;
/// Shards of the relay this shard is one of: the groups it owns are 1 in `SHARDS`.
const SHARDS: usize = 2;
/// Queues the messages go to, spread over the shard's groups.
const QUEUES: usize = 1024;
/// Bytes of bodies written per run (bounds the disk a run takes) …
const BYTES_PER_RUN: usize = 160 << 20;
/// … and at most this many messages.
const MAX_MESSAGES: usize = 200_000;
/// `every-batch` with one write in flight waits for one msync per message: fewer of them.
const MAX_MESSAGES_SERIAL_SYNC: usize = 2_000;

#[derive(Clone, Copy)]
struct Config {
    durability: Durability,
    body_bytes: usize,
    in_flight: usize,
}

impl Config {
    fn name(&self) -> String {
        let d = match self.durability {
            Durability::EveryBatch => "every-batch".to_string(),
            Durability::Interval(t) => format!("interval-ms {}", t.as_millis()),
            Durability::Never => "never".to_string(),
        };
        format!(
            "{d}, {} B bodies, {} in flight",
            self.body_bytes, self.in_flight
        )
    }

    fn messages(&self) -> usize {
        let n = (BYTES_PER_RUN / self.body_bytes).min(MAX_MESSAGES);
        if self.durability == Durability::EveryBatch && self.in_flight == 1 {
            n.min(MAX_MESSAGES_SERIAL_SYNC)
        } else {
            n
        }
    }
}

struct RunResult {
    appends_per_s: f64,
    mb_per_s: f64,
    write_p50_us: f64,
    write_p99_us: f64,
    close_ms: f64,
}

fn rec(rid: &[u8]) -> QueueRec {
    QueueRec {
        recipient_id: rid.to_vec(),
        recipient_keys: vec![PublicAuthKey::Ed25519([1; 32])],
        rcv_dh_secret: [2; 32],
        sender_id: [rid, b"-snd"].concat(),
        sender_key: None,
        queue_mode: None,
        link: None,
        notifier: None,
        status: QueueStatus::Active,
        updated_at: None,
        rcv_service_id: None,
    }
}

/// `QUEUES` random recipient IDs in `groups`.
fn queue_ids(groups: &[u32]) -> Vec<Vec<u8>> {
    let mut rng = rand::thread_rng();
    let mut out = Vec::with_capacity(QUEUES);
    while out.len() < QUEUES {
        let mut id = vec![0u8; 24];
        rng.fill_bytes(&mut id);
        if groups.contains(&group_of(&id)) {
            out.push(id);
        }
    }
    out
}

fn quantile_us(sorted: &[Duration], p: f64) -> f64 {
    let i = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i].as_secs_f64() * 1e6
}

/// One run on a fresh directory under `root`: the queues, then the timed writes from
/// `in_flight` tasks (each its own queues, as the owner's jobs hold theirs), then the close.
fn run(root: &std::path::Path, cfg: Config, tag: usize) -> RunResult {
    let dir = root.join(format!("smp-journal-append-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("bench directory");
    let settings = StoreSettings {
        data_dir: dir.clone(),
        keep: smp_relay::store::Keep::ALL,
        message_ttl_secs: i64::MAX,
        ntf_ttl_secs: i64::MAX,
        test_delay: None,
        durability: cfg.durability,
        journal_budget: None,
        journal_checkpoint_records: smp_relay::store::journal::DEFAULT_CHECKPOINT_RECORDS,
        postgres: None,
    };
    let groups = groups_of_shard(0, SHARDS);
    let ids = queue_ids(&groups);
    let n = cfg.messages();
    let result = LocalExecutorBuilder::new(Placement::Unbound)
        .io_memory(smp_relay::limits::IO_MEMORY_BYTES)
        .spawn(move || async move {
            let store = Rc::new(
                JournalStore::open_groups(&settings, &groups, 0, cfg.durability)
                    .expect("open the journal store"),
            );
            // The queues, as many at once as there are writers.
            let ids = Rc::new(ids);
            let tasks: Vec<_> = (0..cfg.in_flight)
                .map(|w| {
                    let (store, ids) = (store.clone(), ids.clone());
                    glommio::spawn_local(async move {
                        for id in ids.iter().skip(w).step_by(cfg.in_flight) {
                            store.create(rec(id)).await.expect("create");
                        }
                    })
                })
                .collect();
            for t in tasks {
                t.await;
            }
            let body: Rc<[u8]> = vec![0x5a; cfg.body_bytes].into();
            let t0 = Instant::now();
            let tasks: Vec<_> = (0..cfg.in_flight)
                .map(|w| {
                    let (store, ids, body) = (store.clone(), ids.clone(), body.clone());
                    glommio::spawn_local(async move {
                        let mut lat = Vec::with_capacity(n / cfg.in_flight + 1);
                        // Writer w takes messages w, w + in_flight, …, to queues of its own.
                        for i in (w..n).step_by(cfg.in_flight) {
                            let k = (i / cfg.in_flight) % (ids.len() / cfg.in_flight);
                            let q = &ids[k * cfg.in_flight + w];
                            let mut msg_id = [0u8; 24];
                            msg_id[..8].copy_from_slice(&(i as u64).to_be_bytes());
                            let m = Message::Message {
                                msg_id,
                                ts: 1,
                                notification: false,
                                body: body.clone(),
                            };
                            let t = Instant::now();
                            store.write(q, m, usize::MAX).await.expect("write");
                            lat.push(t.elapsed());
                        }
                        lat
                    })
                })
                .collect();
            let mut lat = Vec::with_capacity(n);
            for t in tasks {
                lat.extend(t.await);
            }
            let secs = t0.elapsed().as_secs_f64();
            lat.sort_unstable();
            let store = Rc::try_unwrap(store).ok().expect("every writer ended");
            let t1 = Instant::now();
            ShardStore::close(store, &settings, &groups_of_shard(0, SHARDS)).expect("close");
            RunResult {
                appends_per_s: n as f64 / secs,
                mb_per_s: (n * cfg.body_bytes) as f64 / secs / 1e6,
                write_p50_us: quantile_us(&lat, 0.5),
                write_p99_us: quantile_us(&lat, 0.99),
                close_ms: t1.elapsed().as_secs_f64() * 1e3,
            }
        })
        .expect("executor")
        .join()
        .expect("bench run");
    std::fs::remove_dir_all(&dir).expect("remove the bench directory");
    result
}

fn summary(mut v: Vec<f64>) -> String {
    v.sort_by(|a, b| a.total_cmp(b));
    let med = v[v.len() / 2];
    let fmt = |x: f64| {
        if x >= 100.0 {
            format!("{x:.0}")
        } else {
            format!("{x:.1}")
        }
    };
    format!("{} [{}–{}]", fmt(med), fmt(v[0]), fmt(v[v.len() - 1]))
}

fn main() {
    // `cargo bench` passes `--bench`; any other argument filters the configurations.
    let filter: Option<String> = std::env::args().skip(1).find(|a| !a.starts_with("--"));
    let root = std::env::var_os("JOURNAL_BENCH_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let mut configs = Vec::new();
    for durability in [
        Durability::EveryBatch,
        Durability::Interval(Duration::from_millis(50)),
        Durability::Never,
    ] {
        for body_bytes in [100, 16_000] {
            for in_flight in [1, 64] {
                configs.push(Config {
                    durability,
                    body_bytes,
                    in_flight,
                });
            }
        }
    }
    configs.retain(|c| {
        filter
            .as_ref()
            .is_none_or(|f| c.name().contains(f.as_str()))
    });
    let mut results: Vec<Vec<RunResult>> = configs.iter().map(|_| Vec::new()).collect();
    for r in 0..RUNS {
        for (i, cfg) in configs.iter().enumerate() {
            let res = run(&root, *cfg, i);
            eprintln!(
                "run {}/{RUNS} {}: {:.0} appends/s, {:.1} MB/s",
                r + 1,
                cfg.name(),
                res.appends_per_s,
                res.mb_per_s
            );
            results[i].push(res);
        }
    }
    println!(
        "journal append, one shard of {SHARDS} ({} groups), {QUEUES} queues, median [min–max] of {RUNS} runs",
        groups_of_shard(0, SHARDS).len()
    );
    println!(
        "| configuration | messages per run | appends/s | MB/s of bodies | write p50 µs | write p99 µs | close ms |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (cfg, rs) in configs.iter().zip(&results) {
        let col = |f: fn(&RunResult) -> f64| summary(rs.iter().map(f).collect());
        println!(
            "| {} | {} | {} | {} | {} | {} | {} |",
            cfg.name(),
            cfg.messages(),
            col(|r| r.appends_per_s),
            col(|r| r.mb_per_s),
            col(|r| r.write_p50_us),
            col(|r| r.write_p99_us),
            col(|r| r.close_ms),
        );
    }
}
