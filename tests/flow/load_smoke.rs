//! `smp-load` end to end at tiny sizes: setup creates queues through a relay it starts, then a
//! storm and a displace run deliver every message (prefilled and sent) with no errors, a
//! reconnect run after each kind of restart resubscribes every queue and delivers every waiting
//! message, and the JSON records carry the figures the README's table is made of.

use std::path::Path;
use std::process::{Command, Output};

const LOAD: &str = env!("CARGO_BIN_EXE_smp-load");
const RELAY: &str = env!("CARGO_BIN_EXE_smp-relay");
const QUEUES: u64 = 200;

use smp_relay::load::proc::TempDir;

fn load(args: &[&str]) -> Output {
    let out = Command::new(LOAD)
        .args(args)
        .args(["--relay-bin", RELAY, "--relay-shards", "2"])
        .output()
        .expect("run smp-load");
    assert!(
        out.status.success(),
        "smp-load {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A figure of the first run record.
fn figure(json: &str, name: &str) -> f64 {
    let run = json
        .lines()
        .find(|l| l.contains("\"type\":\"run\""))
        .expect("a run record");
    figure_of(run, name)
}

/// A figure of one run record.
fn figure_of(run: &str, name: &str) -> f64 {
    let key = format!("\"{name}\":");
    let at = run.find(&key).unwrap_or_else(|| panic!("{name} in {run}")) + key.len();
    run[at..]
        .split([',', '}'])
        .next()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{name} is a number in {run}"))
}

fn run_scenario(scenario: &str, file: &Path) -> String {
    let q = QUEUES.to_string();
    let out = load(&[
        scenario,
        "--file",
        file.to_str().expect("utf-8 path"),
        "--queues",
        &q,
        "--conns",
        "2",
        "--senders",
        "1",
        "--threads",
        "2",
        "--runs",
        "1",
        "--timeout-secs",
        "60",
        "--json",
        "--quiet",
    ]);
    String::from_utf8(out.stdout).expect("utf-8 JSON")
}

#[test]
fn storm_and_displace_deliver_every_message() {
    let dir = TempDir::new("load-smoke").expect("a temp dir");
    let file = dir.path().join("queues");
    let q = QUEUES.to_string();
    load(&[
        "setup",
        "--queues",
        &q,
        "--file",
        file.to_str().expect("utf-8 path"),
    ]);

    let storm = run_scenario("storm", &file);
    let sent = figure(&storm, "sent");
    assert_eq!(figure(&storm, "subs"), QUEUES as f64);
    assert_eq!(
        figure(&storm, "delivered"),
        QUEUES as f64 + sent,
        "every prefilled and every sent message is ACKed"
    );
    for e in ["sub_errors", "ack_errors", "send_errors", "unexpected"] {
        assert_eq!(figure(&storm, e), 0.0, "{e}");
    }
    assert!(figure(&storm, "relay_cpu_s") > 0.0, "relay CPU is read");
    assert!(storm.contains("\"type\":\"summary\""));

    let displace = run_scenario("displace", &file);
    assert_eq!(figure(&displace, "subs"), 2.0 * QUEUES as f64);
    assert_eq!(
        figure(&displace, "ends"),
        QUEUES as f64,
        "set A is told END for every queue set B took"
    );
    assert_eq!(
        figure(&displace, "delivered"),
        QUEUES as f64 + figure(&displace, "sent")
    );
    assert_eq!(figure(&displace, "sub_errors"), 0.0);
}

/// `smp-journal stats --json` of a data directory: (messages, message bytes) in total.
fn journal_totals(data_dir: &Path) -> (u64, u64) {
    let tool = Path::new(RELAY).with_file_name("smp-journal");
    assert!(
        tool.is_file(),
        "{} is missing: build the workspace (cargo test --workspace)",
        tool.display()
    );
    let out = Command::new(tool)
        .arg("--data-dir")
        .arg(data_dir)
        .args(["--quiet", "stats", "--json"])
        .output()
        .expect("run smp-journal");
    assert!(out.status.success(), "smp-journal stats failed");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("stats JSON");
    let n = |k: &str| {
        v["total"][k]
            .as_u64()
            .unwrap_or_else(|| panic!("total.{k}"))
    };
    (n("messages"), n("message_bytes"))
}

/// `setup --messages-per-queue` leaves that many messages of that size in every queue of the
/// saved store, and `restart-time` starts and stops the relay on it, reporting the start, without
/// changing what it holds.
#[test]
fn setup_fills_queues_and_restart_time_times_a_start() {
    let dir = TempDir::new("load-restart").expect("a temp dir");
    let file = dir.path().join("queues");
    let file_s = file.to_str().expect("utf-8 path");
    let q = QUEUES.to_string();
    load(&[
        "setup",
        "--queues",
        &q,
        "--file",
        file_s,
        "--messages-per-queue",
        "2",
        "--message-size",
        "300",
    ]);
    let data_dir = dir.path().join("queues.relay");
    assert_eq!(journal_totals(&data_dir), (2 * QUEUES, 2 * QUEUES * 300));

    let out = load(&["restart-time", "--file", file_s, "--runs", "2", "--json"]);
    let json = String::from_utf8(out.stdout).expect("utf-8 JSON");
    assert_eq!(json.matches("\"type\":\"run\"").count(), 2, "{json}");
    assert!(figure(&json, "start_to_listening_s") > 0.0);
    assert!(figure(&json, "data_dir_mb") > 0.0);
    assert_eq!(journal_totals(&data_dir), (2 * QUEUES, 2 * QUEUES * 300));
}

/// `reconnect` at 40 connections × 5 queues, one queue in 10 holding a message: after a clean
/// stop and after a kill, every connection comes back from its own loopback address, every SUB
/// is answered SOK and every waiting message is delivered once and ACKed.
#[test]
fn reconnect_after_each_restart_resubscribes_and_delivers_everything() {
    let dir = TempDir::new("load-reconnect").expect("a temp dir");
    let file = dir.path().join("queues");
    let file_s = file.to_str().expect("utf-8 path");
    let q = QUEUES.to_string();
    load(&["setup", "--queues", &q, "--file", file_s]);
    let out = load(&[
        "reconnect",
        "--file",
        file_s,
        "--conns",
        "40",
        "--queues-per-conn",
        "5",
        "--restart",
        "both",
        "--msg-bytes",
        "1000",
        "--runs",
        "1",
        "--timeout-secs",
        "60",
        "--json",
        "--quiet",
    ]);
    let json = String::from_utf8(out.stdout).expect("utf-8 JSON");
    let runs: Vec<&str> = json
        .lines()
        .filter(|l| l.contains("\"type\":\"run\""))
        .collect();
    assert_eq!(runs.len(), 2, "{json}");
    assert!(runs[0].contains("restart=clean"), "{}", runs[0]);
    assert!(runs[1].contains("restart=kill"), "{}", runs[1]);
    for run in runs {
        assert_eq!(figure_of(run, "conns"), 40.0);
        assert_eq!(figure_of(run, "subs_answered"), QUEUES as f64, "{run}");
        assert_eq!(figure_of(run, "waiting"), (QUEUES / 10) as f64, "{run}");
        assert_eq!(figure_of(run, "delivered"), (QUEUES / 10) as f64, "{run}");
        assert_eq!(figure_of(run, "acked"), (QUEUES / 10) as f64, "{run}");
        for e in ["conns_gave_up", "sub_errors", "ack_errors", "unexpected"] {
            assert_eq!(figure_of(run, e), 0.0, "{e} in {run}");
        }
        assert!(figure_of(run, "connect_attempts") >= 40.0, "{run}");
        assert!(figure_of(run, "resubscribed_s") > 0.0, "{run}");
        assert!(figure_of(run, "relay_rss_anon_peak_mb") > 0.0, "{run}");
        assert!(figure_of(run, "floor_us_per_handshake") > 0.0, "{run}");
    }
}
