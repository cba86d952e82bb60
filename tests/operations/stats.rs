//! Statistics as the reference keeps them (simplexmq `src/Simplex/Messaging/Server/Stats.hs`,
//! `Prometheus.hs`, `Server.hs`): the daily CSV line of `log_stats` after a day of traffic, the
//! statistics backup written at a clean stop and restored at start, the metrics file's families
//! against the reference's (`tests/fixtures/reference-prometheus-families.txt`), and the metrics
//! over HTTP (`metrics_listen`). The clock moves with the clock-control hook, never by sleeping.

use crate::common;
use crate::support;

use std::collections::HashMap;
use std::io::{Read, Write};

use common::*;
use smp_relay::client::{new_corr_id, ClientTransmission};
use smp_relay::protocol::command::Command;
use smp_relay::protocol::error::NameError;
use smp_relay::protocol::response::BrokerMsg;
use support::*;

const DAILY_FILE: &str = "smp-server-stats.daily.log";
const BACKUP_FILE: &str = "smp-server-stats.log";

fn fixture(name: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn fixture_lines(name: &str) -> Vec<String> {
    fixture(name)
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(str::to_string)
        .collect()
}

/// `YYYY-MM-DD` and the day of the week (1 Monday … 7 Sunday) and of the month of Unix seconds.
fn date_of(secs: i64) -> (String, i64, i64) {
    let (y, m, d, wd) = smp_relay::clock::utc_date(secs);
    (format!("{y:04}-{m:02}-{d:02}"), wd, d)
}

/// A block of DELs of `qs`, one transmission each, as a client sends a batch.
fn del_block(c: &mut smp_relay::client::Client, qs: &[&Queue]) {
    let corrs: Vec<_> = qs.iter().map(|_| new_corr_id()).collect();
    let ts: Vec<ClientTransmission> = qs
        .iter()
        .zip(&corrs)
        .map(|(q, corr)| {
            ClientTransmission::new(corr, q.rid(), Command::Del).signed(q.key().clone())
        })
        .collect();
    c.send_batch(&ts).expect("send the DELs");
    for corr in &corrs {
        let r = c.recv_for(corr).expect("DEL answered");
        assert_eq!(r.msg, Ok(BrokerMsg::Ok), "DEL");
    }
}

/// One day of known traffic, then the line written after midnight on the relay's clock: every
/// column, by the reference's column names (`tests/fixtures/reference-stats-daily-columns.txt`).
#[test]
fn a_day_of_traffic_is_one_daily_line_field_by_field() {
    let started = support::now_secs();
    let relay = Relay::start_with(RelayOptions {
        extra_args: vec!["--log-stats".into(), "on".into()],
        ..RelayOptions::default()
    });
    let (mut rc, mut rc2, mut sc) = (relay.client(), relay.client(), relay.client());
    // q1: a message sent and received, then one with the notification flag, sent and received.
    let q1 = create(&mut rc);
    send_ok(&mut sc, &q1, None, b"one");
    let m = expect_body(&mut rc, &q1, b"one");
    assert_eq!(ack(&mut rc, &q1, &m.msg_id), BrokerMsg::Ok);
    assert_eq!(
        unsigned(&mut sc, q1.sid(), send_ntf_cmd(b"two")),
        BrokerMsg::Ok
    );
    let m = expect_body(&mut rc, &q1, b"two");
    assert_eq!(ack(&mut rc, &q1, &m.msg_id), BrokerMsg::Ok);
    // A SEND with a key to a queue without one: AUTH.
    let stray = smp_relay::client::queue::auth_key(smp_relay::client::queue::KeyAlg::Ed25519);
    assert_eq!(send(&mut sc, &q1, Some(&stray), b"x"), ERR_AUTH);
    // q2: a message waits; another connection subscribes (END to the first, a new subscription
    // with a message), then subscribes again (a duplicate).
    let q2 = create(&mut rc);
    send_ok(&mut sc, &q2, None, b"waits");
    expect_body(&mut rc, &q2, b"waits");
    sub_with_msg(&mut rc2, &q2);
    expect_event(&mut rc, q2.rid(), BrokerMsg::End);
    sub_with_msg(&mut rc2, &q2);
    // q3, q4: a GET of an empty queue, a GET of a message and its ACK, then both queues deleted
    // in one block, never secured.
    let (q3, q4) = (create_only(&mut rc), create_only(&mut rc));
    assert_eq!(
        signed(&mut rc, q3.key(), q3.rid(), Command::Get),
        BrokerMsg::Ok
    );
    send_ok(&mut sc, &q3, None, b"pulled");
    let got = msg_of(&q3, signed(&mut rc, q3.key(), q3.rid(), Command::Get));
    assert_eq!(got.msg.body(), Some(&b"pulled"[..]));
    assert_eq!(ack(&mut rc, &q3, &got.msg_id), BrokerMsg::Ok);
    del_block(&mut rc, &[&q3, &q4]);

    relay.write_daily_stats();
    assert!(
        !relay.dir.path().join(DAILY_FILE).exists(),
        "no line before midnight"
    );
    let now = support::now_secs();
    let to_midnight = 86_400 - now.rem_euclid(86_400) + 1;
    relay.advance_clock(to_midnight as u32);
    relay.write_daily_stats();
    let text = std::fs::read_to_string(relay.dir.path().join(DAILY_FILE)).expect("the daily file");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 1, "one line: {text}");
    let columns = fixture_lines("reference-stats-daily-columns.txt");
    let values: Vec<&str> = lines[0].split(',').collect();
    assert_eq!(
        values.len(),
        columns.len(),
        "the reference's columns: {}",
        lines[0]
    );
    let col: HashMap<&str, &str> = columns
        .iter()
        .map(String::as_str)
        .zip(values.iter().copied())
        .collect();
    let day_of_line = now + to_midnight;
    let (_, weekday, monthday) = date_of(day_of_line);
    let dates = [date_of(started).0, date_of(now).0];
    assert!(
        dates.contains(&col["date"].to_string()),
        "dated by its period's start: {}",
        col["date"]
    );
    let weekly = |n: &str| {
        if weekday == 1 {
            n.to_string()
        } else {
            String::new()
        }
    };
    let monthly = |n: &str| {
        if monthday == 1 {
            n.to_string()
        } else {
            String::new()
        }
    };
    let mut expected: Vec<(&str, String)> = vec![
        ("qCreated", "4".into()),
        ("qSecured", "0".into()),
        ("qDeletedAll", "2".into()),
        ("msgSent", "4".into()),
        ("msgRecv", "3".into()),
        ("dayMsgQueues", "3".into()),
        ("weekMsgQueues", weekly("3")),
        ("monthMsgQueues", monthly("3")),
        ("msgSentNtf", "1".into()),
        ("msgRecvNtf", "1".into()),
        ("dayCountNtf", "1".into()),
        ("weekCountNtf", weekly("1")),
        ("monthCountNtf", monthly("1")),
        ("qCount", "2".into()),
        ("msgCount", "1".into()),
        ("qDeletedNew", "2".into()),
        ("qDeletedSecured", "0".into()),
        ("qSub", "1".into()),
        ("qSubAuth", "0".into()),
        ("qSubDuplicate", "1".into()),
        ("qSubProhibited", "0".into()),
        ("msgSentAuth", "1".into()),
        ("msgGetNoMsg", "1".into()),
        ("msgGet", "1".into()),
        ("msgRecvGet", "1".into()),
        ("msgGetDuplicate", "0".into()),
        ("queueCount", "2".into()),
        ("qDeletedAllB", "1".into()),
        ("qSubAllB", "0".into()),
        ("qSubEnd", "1".into()),
        ("qSubEndB", "1".into()),
        ("rcvServiceCount", "0".into()),
        ("rslvDisabled", "0".into()),
    ];
    for removed in columns.iter().filter(|c| c.starts_with("0 (")) {
        expected.push((removed, "0".into()));
    }
    for (name, want) in expected {
        assert_eq!(col[name], want, "column {name} of {}", lines[0]);
    }
    // The counters start again; the gauges stay.
    relay.write_daily_stats();
    let again = std::fs::read_to_string(relay.dir.path().join(DAILY_FILE)).expect("daily file");
    assert_eq!(again.lines().count(), 1, "the next line is due tomorrow");
    relay.publish_metrics();
    let m = relay.metrics();
    assert_eq!(m["simplex_smp_queues_created"], 0, "reset by the line");
    assert_eq!(m["simplex_smp_messages_sent"], 0);
    assert_eq!(m["simplex_smp_queues_daily"], 0, "a new day");
    assert_eq!(m["simplex_smp_queues_total1"], 2);
    assert_eq!(m["simplex_smp_messages_total"], 1);
}

/// A clean stop writes the backup in the reference's `key=value` layout; the next start restores
/// it, sets it aside as `.bak` and says when its queue count is not the store's.
#[test]
fn the_backup_is_written_at_stop_and_restored_at_start() {
    let mut relay = Relay::start_with(RelayOptions {
        cores: 2,
        extra_args: vec!["--log-stats".into(), "on".into()],
    });
    let q = {
        let (mut rc, mut sc) = (relay.client(), relay.client());
        let q = create_only(&mut rc);
        send_ok(&mut sc, &q, None, b"a");
        send_ok(&mut sc, &q, None, b"b");
        q
    };
    assert!(relay.stop().success());
    let path = relay.dir.path().join(BACKUP_FILE);
    let text = std::fs::read_to_string(&path).expect("the backup at stop");
    assert!(text.starts_with("fromTime="), "{text}");
    for line in [
        "qCreated=1",
        "qCount=1",
        "msgSent=2",
        "activeQueues:",
        "pRelays:",
        "rcvServices:",
        "assocUpdatedt=0",
        "rslvStats:",
    ] {
        assert!(text.lines().any(|l| l == line), "{line:?} in:\n{text}");
    }
    let day_hashes: Vec<&str> = text
        .lines()
        .find_map(|l| l.strip_prefix("dayHashes="))
        .expect("dayHashes")
        .split(',')
        .collect();
    assert_eq!(day_hashes.len(), 1, "one active queue: {text}");
    // The saved queue count no longer matches the store: the start warns.
    std::fs::write(&path, text.replace("\nqCount=1\n", "\nqCount=5\n")).expect("edit the backup");
    relay.restart_with(&["--log-stats", "on"]);
    assert!(!path.exists(), "set aside once restored");
    assert!(relay.dir.path().join(format!("{BACKUP_FILE}.bak")).exists());
    assert!(
        relay.log_shows("Queue count differs: stats: 5, store: 1"),
        "{}",
        relay.log_text()
    );
    let mut sc = relay.client();
    send_ok(&mut sc, &q, None, b"c");
    relay.publish_metrics();
    let m = relay.metrics();
    assert_eq!(m["simplex_smp_queues_created"], 1, "restored");
    assert_eq!(m["simplex_smp_messages_sent"], 3, "restored and counted on");
    assert_eq!(
        m["simplex_smp_queues_daily"], 1,
        "the same queue, known by its restored hash"
    );
    // A backup that cannot be read stops the start, naming the file.
    assert!(relay.stop().success());
    std::fs::write(&path, "fromTime=yesterday\n").expect("a bad backup");
    let out = relay.failed_start(&["--log-stats", "on"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains(BACKUP_FILE) && err.contains("line 1"), "{err}");
}

/// The metrics file has every family of the reference, in its order, with its type and labels,
/// and the counters this traffic moves have the right values.
#[test]
fn the_metrics_file_has_the_reference_families() {
    let relay = Relay::start_with(RelayOptions {
        extra_args: vec!["--metrics-interval".into(), "3600".into()],
        ..RelayOptions::default()
    });
    let (mut rc, mut sc) = (relay.client(), relay.client());
    let q = create(&mut rc);
    send_ok(&mut sc, &q, None, b"hello");
    let m = expect_body(&mut rc, &q, b"hello");
    assert_eq!(ack(&mut rc, &q, &m.msg_id), BrokerMsg::Ok);
    let n = nkey(&mut rc, &q);
    assert_eq!(nsub(&mut sc, &n), sok(&sc));
    // A notification stored for a notifier nobody subscribes to.
    let q2 = create_only(&mut rc);
    nkey(&mut rc, &q2);
    assert_eq!(
        unsigned(&mut sc, q2.sid(), send_ntf_cmd(b"flagged")),
        BrokerMsg::Ok
    );
    // Without a resolver RSLV is refused, and counted as the reference counts it.
    for _ in 0..2 {
        let r = unsigned(&mut sc, b"", Command::Rslv("simplex.example".into()));
        assert_eq!(r, BrokerMsg::Err(ErrorType::Name(NameError::NoResolver)));
    }
    // A delivery left without its ACK for 100 s on the relay's clock.
    send_ok(&mut sc, &q, None, b"later");
    expect_body(&mut rc, &q, b"later");
    relay.advance_clock(100);
    relay.publish_metrics();
    let text = std::fs::read_to_string(relay.dir.path().join("smp-server-metrics.txt"))
        .expect("metrics file");
    // Families as the file declares them, in order, with their samples' labels.
    let mut families: Vec<(String, String)> = Vec::new();
    let mut labels: HashMap<String, Vec<String>> = HashMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut p = rest.split(' ');
            families.push((p.next().unwrap().into(), p.next().unwrap().into()));
        } else if !line.starts_with('#') && !line.is_empty() {
            let sample = line.split(' ').next().unwrap();
            let (name, l) = sample.split_once('{').unwrap_or((sample, ""));
            let family = families.last().expect("a TYPE before samples").0.clone();
            assert!(name.starts_with(&family), "{line} under {family}");
            let l = l.trim_end_matches('}').replace('"', "");
            if !l.is_empty() {
                labels.entry(family).or_default().push(l);
            }
        }
    }
    let reference = fixture_lines("reference-prometheus-families.txt");
    assert_eq!(
        families.len()
            - families
                .iter()
                .filter(|f| f.0.starts_with("smprelay_"))
                .count(),
        reference.len(),
        "as many families as the reference"
    );
    for (i, line) in reference.iter().enumerate() {
        let mut p = line.split(' ');
        let (name, kind) = (p.next().unwrap(), p.next().unwrap());
        assert_eq!(
            families[i],
            (name.to_string(), kind.to_string()),
            "family {i}"
        );
        let want: Vec<&str> = p.collect();
        let got = labels.get(name).cloned().unwrap_or_default();
        if want.iter().any(|w| w.contains('*')) {
            let keys = |s: &str| -> Vec<String> {
                s.split(',')
                    .map(|kv| kv.split('=').next().unwrap().to_string())
                    .collect()
            };
            assert!(!got.is_empty(), "{name} has samples");
            for g in &got {
                assert_eq!(keys(g), keys(want[0]), "{name} labels {g}");
            }
        } else {
            assert_eq!(got, want, "{name} labels");
        }
    }
    let m = relay.metrics();
    for (sample, value) in [
        ("simplex_smp_queues_created", 2),
        ("simplex_smp_messages_sent", 3),
        ("simplex_smp_messages_received", 1),
        ("simplex_smp_queues_daily", 2),
        ("simplex_smp_queues_notify_daily", 1),
        ("simplex_smp_messages_notify_sent", 1),
        ("simplex_smp_queues_notify_created", 2),
        ("simplex_smp_queues_notify_total1", 1),
        ("simplex_smp_queues_notify_total2", 2),
        ("simplex_smp_subscription_ntf_requests", 1),
        ("simplex_smp_subscription_ntf_total", 1),
        ("simplex_smp_subscribtion_total", 1),
        ("simplex_smp_delivery_ack_confirmed_time_count", 1),
        (
            "simplex_smp_delivery_ack_confirmed_time_bucket{le=\"+Inf\"}",
            1,
        ),
        (
            "simplex_smp_delivery_ack_confirmed_count{period=\"0-60\"}",
            1,
        ),
        (
            "simplex_smp_delivery_ack_pending_count{period=\"60-300\"}",
            1,
        ),
        ("simplex_smp_delivery_ack_pending_count{period=\"0-60\"}", 0),
        ("simplex_smp_delivered_total", 1),
        ("simplex_smp_delivered_clients_total", 1),
        ("simplex_smp_clients_total", 2),
        ("simplex_smp_names_reqs", 2),
        ("simplex_smp_names_disabled", 2),
        ("simplex_smp_names_success", 0),
    ] {
        assert_eq!(m.get(sample), Some(&value), "{sample}");
    }
    let max = m["simplex_smp_delivery_ack_time_max"];
    assert!(
        (100..=110).contains(&max),
        "the pending delivery's age: {max}"
    );
    let port = format!("simplex_smp_sockets_active{{port=\"{}\"}}", relay.port);
    assert_eq!(m.get(&port), Some(&2), "two connections on the port");
    assert!(text.contains("\n# qCreated\n") && text.contains("# Stats from: "));
}

fn http(addr: std::net::SocketAddr, request: &[u8]) -> String {
    let mut s = std::net::TcpStream::connect(addr).expect("connect to the metrics endpoint");
    s.set_read_timeout(Some(COMMAND_TIMEOUT)).expect("timeout");
    s.write_all(request).expect("send the request");
    let mut answer = Vec::new();
    s.read_to_end(&mut answer)
        .expect("the answer, then the close");
    String::from_utf8_lossy(&answer).into_owned()
}

/// `GET /metrics` answers the metrics file's text; anything else 404; a malformed or oversized
/// request 400, and the connection is closed either way.
#[test]
fn metrics_are_served_over_http() {
    let port = free_port();
    let relay = Relay::start_with(RelayOptions {
        extra_args: vec![
            "--metrics-interval".into(),
            "3600".into(),
            "--metrics-listen".into(),
            format!("127.0.0.1:{port}"),
        ],
        ..RelayOptions::default()
    });
    let mut rc = relay.client();
    create(&mut rc);
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let answer = http(addr, b"GET /metrics HTTP/1.1\r\nHost: relay\r\n\r\n");
    let (head, body) = answer.split_once("\r\n\r\n").expect("head and body");
    assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
    assert!(
        head.contains("Content-Type: text/plain; version=0.0.4"),
        "{head}"
    );
    assert!(body.contains("\nsimplex_smp_queues_created 1 "), "{body}");
    let file = std::fs::read_to_string(relay.dir.path().join("smp-server-metrics.txt"))
        .expect("metrics file");
    assert_eq!(body, file, "the metrics file's text");
    let answer = http(addr, b"GET /other HTTP/1.1\r\n\r\n");
    assert!(answer.starts_with("HTTP/1.1 404 Not Found\r\n"), "{answer}");
    let answer = http(addr, b"hello there\r\n\r\n");
    assert!(
        answer.starts_with("HTTP/1.1 400 Bad Request\r\n"),
        "{answer}"
    );
    let answer = http(addr, &[b'a'; 8192]);
    assert!(
        answer.starts_with("HTTP/1.1 400 Bad Request\r\n"),
        "{answer}"
    );
    relay.assert_serves();
}

/// Sockets held open on `metrics_listen` without a request do not keep a scraper out: at the
/// connection bound (8) the oldest of them is closed to serve the new one, so the scrape is
/// answered at once while twelve idle sockets are held. `HEAD /metrics` is answered as `GET`,
/// without the body.
#[test]
fn a_scrape_is_answered_while_idle_sockets_are_held_and_head_has_no_body() {
    let port = free_port();
    let relay = Relay::start_with(RelayOptions {
        extra_args: vec![
            "--metrics-interval".into(),
            "3600".into(),
            "--metrics-listen".into(),
            format!("127.0.0.1:{port}"),
        ],
        ..RelayOptions::default()
    });
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut idle: Vec<std::net::TcpStream> = (0..12)
        .map(|_| std::net::TcpStream::connect(addr).expect("an idle socket"))
        .collect();
    let answer = http(addr, b"GET /metrics HTTP/1.1\r\nHost: relay\r\n\r\n");
    let (head, body) = answer
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("an answer while idle sockets are held: {answer:?}"));
    assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
    assert!(body.contains("\nsimplex_smp_queues_created "), "{body}");
    // The oldest idle sockets made room: five of them (four for the idle ones beyond eight, one
    // for the scrape) were closed.
    // (They were closed before the scrape's connection was served, so their ends are in.)
    let closed = idle
        .iter_mut()
        .filter_map(|s| {
            s.set_nonblocking(true).unwrap();
            let ended = match s.read(&mut [0u8; 1]) {
                Ok(0) => true,
                Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
                Ok(_) => panic!("an idle socket was sent something"),
            };
            ended.then_some(())
        })
        .count();
    assert_eq!(closed, 5, "the five oldest idle sockets were closed");

    let answer = http(addr, b"HEAD /metrics HTTP/1.1\r\nHost: relay\r\n\r\n");
    let (head, body) = answer.split_once("\r\n\r\n").expect("a head");
    assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("Content-Length: "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("a Content-Length: {head}"));
    assert!(length > 1000, "the length of GET's body: {length}");
    assert_eq!(body, "", "no body after HEAD's head");
    relay.assert_serves();
}

/// A backup as the reference writes it (`tests/fixtures/reference-stats-backup.txt`) is restored:
/// its counters go on, its active queues count, and its queue count is compared with the store's.
#[test]
fn a_backup_written_by_the_reference_is_restored() {
    let mut relay = Relay::start();
    assert!(relay.stop().success());
    std::fs::write(
        relay.dir.path().join(BACKUP_FILE),
        fixture("reference-stats-backup.txt"),
    )
    .expect("put the backup in place");
    relay.restart_with(&["--log-stats", "on", "--metrics-interval", "3600"]);
    assert!(relay.log_shows("Queue count differs: stats: 9, store: 0"));
    relay.publish_metrics();
    let m = relay.metrics();
    for (sample, value) in [
        ("simplex_smp_queues_created", 12),
        ("simplex_smp_messages_sent", 40),
        ("simplex_smp_messages_notify_get_received", 4),
        (
            "simplex_smp_relay_messages_errors{source=\"all\",type=\"other\"}",
            1,
        ),
        ("simplex_smp_relay_messages_received", 11),
        ("simplex_smp_rcv_services_sub_queues", 2),
        ("simplex_smp_names_disabled", 3),
        ("simplex_smp_queues_daily", 3),
        ("simplex_smp_queues_monthly", 4),
        ("simplex_smp_queues_notify_weekly", 1),
    ] {
        assert_eq!(m.get(sample), Some(&value), "{sample}");
    }
    let text = std::fs::read_to_string(relay.dir.path().join("smp-server-metrics.txt"))
        .expect("metrics file");
    assert!(
        text.contains("\n# Stats from: 2026-11-30T00:00:00.25Z\n"),
        "{text}"
    );
}

/// A connection subscribed to queues of both shards is one subscribed client, as on the reference.
#[test]
fn a_client_subscribed_on_two_shards_counts_once() {
    let relay = Relay::start_with(RelayOptions {
        cores: 2,
        extra_args: vec!["--metrics-interval".into(), "3600".into()],
    });
    let (mut rc, mut sc) = (relay.client(), relay.client());
    let mut shards = std::collections::HashSet::new();
    let mut queues = Vec::new();
    while shards.len() < 2 {
        let q = create(&mut rc);
        shards.insert(smp_relay::server::router::owner_shard(q.rid(), 2));
        queues.push(q);
    }
    for q in &queues {
        send_ok(&mut sc, q, None, b"held");
        expect_body(&mut rc, q, b"held");
    }
    relay.publish_metrics();
    let m = relay.metrics();
    assert_eq!(m["simplex_smp_subscribtion_total"], queues.len() as u64);
    assert_eq!(m["simplex_smp_subscribtion_clients_total"], 1);
    assert_eq!(m["simplex_smp_delivered_total"], queues.len() as u64);
    assert_eq!(m["simplex_smp_delivered_clients_total"], 1);
}
