//! The configuration file `<data-dir>/smp-server.ini` (simplexmq `Server/Main.hs`):
//! its settings reach the relay, a command-line flag wins over the file, a key of a reference
//! feature the relay does not have is ignored with a warning, and an unknown key or a bad value
//! stops `start` with a message naming the file, line and key (every problem of the file at once).

use crate::common;
use crate::support;

use std::path::Path;

use common::{free_port, run_cli, Relay, TempDir};
use smp_relay::protocol::command::Command;
use smp_relay::protocol::response::BrokerMsg;
use support::*;

fn ini_path(dir: &Path) -> std::path::PathBuf {
    dir.join("smp-server.ini")
}

/// Replaces the line `from` of the file `init` wrote with `to`.
fn edit_ini(dir: &Path, from: &str, to: &str) {
    let text = std::fs::read_to_string(ini_path(dir)).expect("read ini");
    assert!(
        text.lines().any(|l| l == from),
        "{from:?} in the ini:\n{text}"
    );
    let edited: String = text
        .lines()
        .map(|l| if l == from { to } else { l })
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(ini_path(dir), edited).expect("write ini");
}

fn append_ini(dir: &Path, text: &str) {
    let mut all = std::fs::read_to_string(ini_path(dir)).expect("read ini");
    all.push_str(text);
    std::fs::write(ini_path(dir), all).expect("write ini");
}

/// A relay restarted after its configuration file was changed by `change`.
fn relay_with_ini(change: impl FnOnce(&Path), args: &[&str]) -> Relay {
    let mut relay = Relay::start();
    let status = relay.stop();
    assert!(status.success(), "clean stop: {status:?}");
    change(relay.dir.path());
    relay.restart_with(args);
    relay
}

/// `start` on an initialised directory whose file was changed by `change`: it must fail; returns
/// its stderr and the file's line count.
fn start_fails(change: impl FnOnce(&Path)) -> (String, usize) {
    let dir = TempDir::new("config").expect("a temp dir");
    common::init(dir.path());
    change(dir.path());
    let port = free_port().to_string();
    let out = run_cli(dir.path(), &["start", "--port", &port, "--cores", "1"]);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "start must fail; stderr:\n{stderr}");
    assert!(
        stderr.contains(&ini_path(dir.path()).display().to_string()),
        "the message names the file:\n{stderr}"
    );
    let lines = std::fs::read_to_string(ini_path(dir.path()))
        .expect("read ini")
        .lines()
        .count();
    (stderr, lines)
}

/// Sends until the first refusal; returns how many SENDs were accepted.
fn sends_accepted(relay: &Relay, max: usize) -> usize {
    let (mut rc, mut sc) = (relay.client(), relay.client());
    let q = create(&mut rc);
    for i in 0..max {
        match send(&mut sc, &q, None, format!("message {i}").as_bytes()) {
            BrokerMsg::Ok => {}
            r => {
                assert_eq!(r, ERR_QUOTA, "SEND {}", i + 1);
                return i;
            }
        }
    }
    max
}

#[test]
fn quota_from_the_file_limits_sends() {
    let relay = relay_with_ini(|d| append_ini(d, "\n[RELAY]\nquota = 2\n"), &[]);
    assert_eq!(sends_accepted(&relay, 10), 2, "the 3rd SEND gets ERR QUOTA");
}

#[test]
fn a_flag_wins_over_the_file() {
    let relay = relay_with_ini(
        |d| append_ini(d, "\n[RELAY]\nquota = 2\n"),
        &["--quota", "3"],
    );
    assert_eq!(sends_accepted(&relay, 10), 3);
}

#[test]
fn new_queues_off_in_the_file_refuses_new_and_the_flag_turns_it_back_on() {
    let off = |d: &Path| edit_ini(d, "new_queues = on", "new_queues = off");
    let relay = relay_with_ini(off, &[]);
    let mut c = relay.client();
    let keys = smp_relay::client::queue::RecipientKeys::generate(
        smp_relay::client::queue::KeyAlg::Ed25519,
    );
    let new = smp_relay::client::queue::new_queue(&keys);
    let r = request(&mut c, b"", Command::New(new), sign(&keys.auth));
    assert_eq!(r.msg, Ok(ERR_AUTH), "NEW with new_queues = off");
    drop(relay);

    let relay = relay_with_ini(off, &["--new-queues", "on"]);
    let mut c = relay.client();
    create(&mut c);
}

#[test]
fn an_unknown_key_stops_start() {
    let (stderr, lines) = start_fails(|d| append_ini(d, "\n[RELAY]\nqouta = 2\n"));
    assert!(stderr.contains("qouta"), "names the key:\n{stderr}");
    assert!(stderr.contains("unknown key"), "{stderr}");
    // The appended key is the file's last line.
    assert!(
        stderr.contains(&format!("line {lines}:")),
        "names the line:\n{stderr}"
    );
}

#[test]
fn a_bad_boolean_stops_start() {
    let (stderr, _) = start_fails(|d| {
        edit_ini(
            d,
            "expire_messages_on_send = on",
            "expire_messages_on_send = yes",
        )
    });
    assert!(
        stderr.contains("expire_messages_on_send"),
        "names the key:\n{stderr}"
    );
    assert!(stderr.contains("expected on or off"), "{stderr}");
}

/// Keys of the reference's features this relay does not have (here the name resolver and the
/// deleted queues' retention) are accepted with one warning at start naming each; a value this relay cannot honour stops it, and every problem of
/// the file is in one message.
#[test]
fn reference_keys_this_relay_lacks_are_ignored_with_one_warning() {
    let relay = relay_with_ini(
        |d| {
            append_ini(
                d,
                "\n[NAMES]\nresolver_endpoint = https://names.example.com\n",
            );
            edit_ini(
                d,
                "store_messages = journal",
                "store_messages = journal\ndb_deleted_ttl = 30",
            )
        },
        &[],
    );
    relay.client().ping().expect("the relay serves");
    assert!(
        relay.log_shows("ignores these keys of features this relay does not have"),
        "{}",
        relay.log_text()
    );
    for key in ["[NAMES] resolver_endpoint", "[STORE_LOG] db_deleted_ttl"] {
        assert!(relay.log_shows(key), "{key}:\n{}", relay.log_text());
    }

    let (stderr, _) = start_fails(|d| {
        edit_ini(d, "store_messages = journal", "store_messages = sqlite");
        append_ini(d, "\n[RELAY]\nquota = many\n");
    });
    assert!(stderr.contains("2 problems"), "{stderr}");
    assert!(
        stderr.contains("expected journal, memory or database"),
        "{stderr}"
    );
    assert!(stderr.contains("`quota` in [RELAY]"), "{stderr}");
}

/// `[INACTIVE_CLIENTS]` as the reference does it (here with 1-second `ttl` and
/// `check_interval`): a connection without subscriptions that sends and gets nothing is closed;
/// one holding a subscription, and one that keeps sending, stay.
#[test]
fn inactive_connections_without_subscriptions_are_closed() {
    let relay = relay_with_ini(
        |d| {
            // `init` writes the reference's template values (on, 6 hours, every hour).
            edit_ini(d, "ttl = 21600", "ttl = 1");
            edit_ini(d, "check_interval = 3600", "check_interval = 1");
        },
        &[],
    );
    let mut idle = relay.client();
    let mut subscribed = relay.client();
    let _q = create(&mut subscribed);
    let active = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let pinger = {
        let mut c = relay.client();
        let active = active.clone();
        std::thread::spawn(move || {
            while active.load(std::sync::atomic::Ordering::Relaxed) {
                c.ping().expect("a connection that keeps sending stays");
                std::thread::sleep(std::time::Duration::from_millis(200));
            }
            c
        })
    };
    idle.set_timeout(std::time::Duration::from_secs(20))
        .unwrap();
    idle.wait_closed(1 << 20)
        .expect("the idle connection is closed by the relay");
    // Two more looks for inactive connections pass over the others.
    std::thread::sleep(std::time::Duration::from_millis(2500));
    active.store(false, std::sync::atomic::Ordering::Relaxed);
    let mut pinger = pinger.join().expect("pinger");
    pinger.ping().expect("still open");
    subscribed.ping().expect("a subscribed connection stays");
}

#[test]
fn cores_over_the_shard_limit_in_the_file_stops_start() {
    let (stderr, _) = start_fails(|d| append_ini(d, "\n[RELAY]\ncores = 1000\n"));
    assert!(stderr.contains("cores"), "names the key:\n{stderr}");
    let max = smp_relay::limits::MAX_SHARDS;
    assert!(stderr.contains(&format!("1 to {max}")), "{stderr}");
}
