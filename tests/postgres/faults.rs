//! The PostgreSQL store when the database misbehaves (`src/store/postgres.rs`,
//! `src/store/postgres/pool.rs`), with a real cluster and the real relay binary:
//!
//! 1. the relay's database sessions are killed (`pg_terminate_backend`) several times while
//!    senders SEND without pause, one SEND or several to different queues per block;
//! 2. the PostgreSQL server is stopped and started again while they do;
//! 3. the relay reaches its database over TLS only, checking the server's certificate;
//! 4. a second relay on the same database and schema is refused (the advisory lock);
//! 5. a statement blocked by a row lock ends at the statement timeout with `ERR STORE`.
//!
//! In 1 and 2 a SEND may be answered `ERR STORE` while the fault lasts, and the relay must come
//! back by itself; afterwards a receiver subscribing every queue gets every SEND answered OK
//! exactly once (by body and by message ID), each sender's messages in the order it sent them,
//! and nothing that was never sent. A SEND answered `ERR STORE` whose write did commit (the
//! relay could not learn its outcome) may be delivered too, once.

use crate::{common, support};

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{sleep, Relay, RelayOptions, TempDir};
use smp_relay::client::queue::Received;
use smp_relay::client::{new_corr_id, Client, ClientOptions, ClientTransmission};
use smp_relay::protocol::command::Command;
use smp_relay::protocol::response::BrokerMsg;
use smp_relay::store::postgres::cluster::{Cluster, ClusterOptions, SUPERUSER};
use support::*;

const QUEUES: usize = 12;
const SENDERS: usize = 4;
/// A sender's blocks hold 1 to this many SENDs.
const MAX_SENDS_PER_BLOCK: usize = 4;
/// OK-ed SENDs every sender must see after each fault before the next one (the relay is back).
const OK_AFTER_FAULT: usize = 25;
/// The longest the relay may take to serve again after a fault.
const RECOVERY: Duration = Duration::from_secs(20);
/// Client waits: longer than any database wait the relay is given here.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(60);

fn relay_on(conninfo: &str, extra: &[&str]) -> Relay {
    let mut args: Vec<String> = ["--store", "postgres", "--database", conninfo]
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.extend(extra.iter().map(|s| s.to_string()));
    Relay::start_with(RelayOptions {
        extra_args: args,
        ..Default::default()
    })
}

/// Runs `start` on postgres to its end in a fresh data directory, for starts that must fail;
/// its exit status and its stderr.
fn failed_start(conninfo: &str, extra: &[&str]) -> (std::process::ExitStatus, String) {
    let dir = TempDir::new("pg-faults").expect("a temp dir");
    common::init(dir.path());
    let port = common::free_port().to_string();
    let mut args = vec![
        "start",
        "--port",
        &port,
        "--store",
        "postgres",
        "--database",
        conninfo,
    ];
    args.extend_from_slice(extra);
    let out = common::run_cli(dir.path(), &args);
    (
        out.status,
        common::strip_ansi(&String::from_utf8_lossy(&out.stderr)),
    )
}

fn client_of(addr: SocketAddr, key_hash: [u8; 32]) -> Client {
    Client::connect(
        addr,
        key_hash,
        ClientOptions {
            timeout: CLIENT_TIMEOUT,
            ..ClientOptions::default()
        },
    )
    .unwrap_or_else(|e| panic!("connect: {e}"))
}

fn body(sender: usize, n: u64, q: usize) -> Vec<u8> {
    format!("s{sender} n{n:07} q{q:03}").into_bytes()
}

/// (sender, sequence number, queue) of a body made by [`body`].
fn parse_body(b: &[u8]) -> (usize, u64, usize) {
    let s = std::str::from_utf8(b).expect("utf-8 body");
    let f: Vec<&str> = s.split(' ').collect();
    assert_eq!(f.len(), 3, "a body of this test: {s:?}");
    (
        f[0][1..].parse().expect("sender"),
        f[1][1..].parse().expect("number"),
        f[2][1..].parse().expect("queue"),
    )
}

/// What one sender learnt of its SENDs.
#[derive(Default)]
struct SenderLog {
    /// Answered OK: (queue, number).
    ok: Vec<(usize, u64)>,
    /// Answered `ERR STORE`: (queue, number) and the error.
    failed: Vec<(usize, u64, String)>,
    /// A few of the `ERR STORE` texts, for the report.
    samples: Vec<String>,
}

/// SENDs to the queues in turn until `stop`, in blocks of 1 to [`MAX_SENDS_PER_BLOCK`] SENDs to
/// different queues (the relay makes one statement of a block's SENDs); counts its OKs in `oks`.
fn sender(
    addr: SocketAddr,
    key_hash: [u8; 32],
    id: usize,
    sids: Arc<Vec<Vec<u8>>>,
    stop: Arc<AtomicBool>,
    oks: Arc<Vec<AtomicUsize>>,
    failures: Arc<AtomicUsize>,
) -> SenderLog {
    let mut c = client_of(addr, key_hash);
    let mut log = SenderLog::default();
    let mut n = 0u64;
    let mut blocks = 0usize;
    while !stop.load(Ordering::Relaxed) {
        blocks += 1;
        let per_block = 1 + blocks % MAX_SENDS_PER_BLOCK;
        let sends: Vec<(u64, usize, [u8; 24], ClientTransmission)> = (0..per_block)
            .map(|_| {
                n += 1;
                let q = (n as usize + id) % sids.len();
                let corr = new_corr_id();
                let t = ClientTransmission::new(&corr, &sids[q], send_cmd(&body(id, n, q)));
                (n, q, corr, t)
            })
            .collect();
        let ts: Vec<ClientTransmission> = sends.iter().map(|s| s.3.clone()).collect();
        c.send_batch(&ts)
            .unwrap_or_else(|e| panic!("sender {id}: SENDs up to {n}: {e}"));
        for (n, q, corr, _) in sends {
            let r = c
                .recv_for(&corr)
                .unwrap_or_else(|e| panic!("sender {id}: the answer to SEND {n}: {e}"));
            match r.msg {
                Ok(BrokerMsg::Ok) => {
                    log.ok.push((q, n));
                    oks[id].fetch_add(1, Ordering::Relaxed);
                }
                Ok(BrokerMsg::Err(ErrorType::Store(s))) => {
                    if log.samples.len() < 3 {
                        log.samples.push(s.clone());
                    }
                    log.failed.push((q, n, s));
                    failures.fetch_add(1, Ordering::Relaxed);
                }
                other => panic!("sender {id}: SEND {n} answered {other:?}"),
            }
        }
    }
    log
}

/// Waits until every sender has `more` OKs beyond `base` (the relay serves them all).
fn wait_oks(relay: &Relay, oks: &[AtomicUsize], base: &[usize], more: usize, what: &str) {
    let deadline = Instant::now() + RECOVERY;
    loop {
        let now: Vec<usize> = oks.iter().map(|a| a.load(Ordering::Relaxed)).collect();
        if now.iter().zip(base).all(|(n, b)| *n >= b + more) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: the senders' OKs went from {base:?} to only {now:?} in {RECOVERY:?}; relay \
             log:\n{}",
            relay.log_text()
        );
        sleep(Duration::from_millis(20));
    }
}

/// Runs [`SENDERS`] senders on `qs`; calls `fault(round)` `faults` times, each once every sender
/// has had [`OK_AFTER_FAULT`] SENDs answered OK since the previous one (the first after a warm-up),
/// and stops them once that holds after the last fault too.
fn under_load(
    relay: &Relay,
    qs: &[Queue],
    faults: usize,
    mut fault: impl FnMut(usize, &AtomicUsize),
) -> Vec<SenderLog> {
    let sids: Arc<Vec<Vec<u8>>> = Arc::new(qs.iter().map(|q| q.sid().to_vec()).collect());
    let stop = Arc::new(AtomicBool::new(false));
    let oks: Arc<Vec<AtomicUsize>> = Arc::new((0..SENDERS).map(|_| AtomicUsize::new(0)).collect());
    // SENDs answered ERR STORE so far, over every sender (a fault may wait for the first).
    let failures = Arc::new(AtomicUsize::new(0));
    let handles: Vec<_> = (0..SENDERS)
        .map(|id| {
            let (sids, stop, oks) = (sids.clone(), stop.clone(), oks.clone());
            let failures = failures.clone();
            let (addr, key_hash) = (relay.addr, relay.key_hash);
            std::thread::spawn(move || sender(addr, key_hash, id, sids, stop, oks, failures))
        })
        .collect();
    let snapshot = |oks: &[AtomicUsize]| -> Vec<usize> {
        oks.iter().map(|a| a.load(Ordering::Relaxed)).collect()
    };
    wait_oks(relay, &oks, &[0; SENDERS], OK_AFTER_FAULT, "warm-up");
    for round in 0..faults {
        fault(round, &failures);
        let base = snapshot(&oks);
        wait_oks(
            relay,
            &oks,
            &base,
            OK_AFTER_FAULT,
            &format!("after fault {round}"),
        );
    }
    stop.store(true, Ordering::Relaxed);
    handles
        .into_iter()
        .map(|h| h.join().expect("a sender thread"))
        .collect()
}

/// A delivered message: its ID and body.
type Delivery = (Vec<u8>, Vec<u8>);

/// SUBs every queue from one new connection and takes every message (ACK answers the next one);
/// each queue's deliveries in order.
fn drain(relay: &Relay, qs: &[Queue]) -> Vec<Vec<Delivery>> {
    let mut c = client_of(relay.addr, relay.key_hash);
    let subs: Vec<(Vec<u8>, ClientTransmission)> = qs
        .iter()
        .map(|q| {
            let corr = new_corr_id();
            (
                corr.to_vec(),
                ClientTransmission::new(&corr, q.rid(), Command::Sub).signed(q.key().clone()),
            )
        })
        .collect();
    c.send_batch(&subs.iter().map(|(_, t)| t.clone()).collect::<Vec<_>>())
        .expect("SUBs");
    for (corr, _) in &subs {
        let t = c.recv_for(corr).expect("SUB answer");
        assert_eq!(t.msg, Ok(sok(&c)), "SUB answered");
    }
    // Every queue holds messages (see the callers), so each SUB delivers one.
    let mut current: Vec<Option<Received>> = vec![None; qs.len()];
    while current.iter().any(Option::is_none) {
        let t = c.recv().unwrap_or_else(|e| {
            let missing: Vec<usize> = (0..qs.len()).filter(|&i| current[i].is_none()).collect();
            panic!("no MSG after SUB for queues {missing:?}: {e}")
        });
        let qi = qs
            .iter()
            .position(|q| q.rid() == t.entity_id)
            .expect("an event of a queue of the test");
        assert!(t.corr_id.is_empty(), "an event: {}", describe(&t));
        assert!(current[qi].is_none(), "queue {qi}: a second MSG after SUB");
        current[qi] = Some(msg_of(&qs[qi], t.msg.expect("a MSG that parses")));
    }
    let mut got: Vec<Vec<Delivery>> = vec![Vec::new(); qs.len()];
    loop {
        let mut acks = Vec::new();
        for (qi, cur) in current.iter_mut().enumerate() {
            let Some(m) = cur.take() else { continue };
            let b = m
                .msg
                .body()
                .expect("a message, not a quota marker")
                .to_vec();
            got[qi].push((m.msg_id.clone(), b));
            let corr = new_corr_id();
            acks.push((
                qi,
                corr.to_vec(),
                ClientTransmission::new(&corr, qs[qi].rid(), Command::Ack(m.msg_id.clone()))
                    .signed(qs[qi].key().clone()),
            ));
        }
        if acks.is_empty() {
            return got;
        }
        c.send_batch(&acks.iter().map(|(_, _, t)| t.clone()).collect::<Vec<_>>())
            .expect("ACKs");
        for (qi, corr, _) in acks {
            let t = c.recv_for(&corr).expect("ACK answer");
            match t.msg.expect("an answer that parses") {
                BrokerMsg::Ok => {}
                m @ BrokerMsg::Msg { .. } => current[qi] = Some(msg_of(&qs[qi], m)),
                other => panic!("queue {qi}: ACK answered {other:?}"),
            }
        }
    }
}

/// What [`check_deliveries`] counted.
#[derive(Debug)]
struct Tally {
    ok: usize,
    failed: usize,
    /// SENDs answered `ERR STORE` that were delivered all the same, with the error.
    failed_but_delivered: Vec<String>,
}

/// The deliveries against what the senders were told (see the module comment).
fn check_deliveries(logs: &[SenderLog], got: &[Vec<Delivery>]) -> Tally {
    let ok: HashSet<(usize, u64, usize)> = logs
        .iter()
        .enumerate()
        .flat_map(|(s, l)| l.ok.iter().map(move |&(q, n)| (s, n, q)))
        .collect();
    let failed: HashMap<(usize, u64, usize), &String> = logs
        .iter()
        .enumerate()
        .flat_map(|(s, l)| l.failed.iter().map(move |(q, n, e)| ((s, *n, *q), e)))
        .collect();
    let mut bodies = HashSet::new();
    let mut failed_but_delivered = Vec::new();
    for (qi, list) in got.iter().enumerate() {
        let mut ids = HashSet::new();
        let mut last: HashMap<usize, u64> = HashMap::new();
        for (id, b) in list {
            assert!(
                ids.insert(id.clone()),
                "queue {qi}: message ID {id:?} twice"
            );
            let (s, n, q) = parse_body(b);
            assert_eq!(q, qi, "a message in its own queue");
            assert!(bodies.insert((s, n, q)), "queue {qi}: {} twice", lossy(b));
            if let Some(prev) = last.insert(s, n) {
                assert!(
                    prev < n,
                    "queue {qi}: sender {s}'s message {n} delivered after its {prev}"
                );
            }
            if let Some(e) = failed.get(&(s, n, q)) {
                failed_but_delivered.push(e.to_string());
            } else {
                assert!(
                    ok.contains(&(s, n, q)),
                    "queue {qi}: {} never sent",
                    lossy(b)
                );
            }
        }
    }
    let mut lost: Vec<_> = ok.difference(&bodies).collect();
    lost.sort();
    assert!(
        lost.is_empty(),
        "{} SENDs answered OK were not delivered (sender, number, queue): {:?}",
        lost.len(),
        &lost[..lost.len().min(20)]
    );
    Tally {
        ok: ok.len(),
        failed: failed.len(),
        failed_but_delivered,
    }
}

/// Every queue must have OK-ed messages, so that [`drain`] knows each SUB delivers one.
fn assert_every_queue_written(logs: &[SenderLog]) {
    for qi in 0..QUEUES {
        assert!(
            logs.iter().any(|l| l.ok.iter().any(|&(q, _)| q == qi)),
            "queue {qi}: no SEND answered OK"
        );
    }
}

/// Whether a session of `db` holds the relay's advisory lock; waits (bounded) until one does.
fn wait_lock_held(c: &mut postgres::Client, db: &str, relay: &Relay) {
    let deadline = Instant::now() + RECOVERY;
    loop {
        let n: i64 = c
            .query_one(
                "SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database \
                 WHERE l.locktype = 'advisory' AND l.granted AND d.datname = $1",
                &[&db],
            )
            .expect("pg_locks")
            .get(0);
        if n == 1 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the relay's advisory lock on {db} was not taken again ({n} held); relay log:\n{}",
            relay.log_text()
        );
        sleep(Duration::from_millis(50));
    }
}

/// After faults: the relay holds its lock again, so a second relay is still refused.
fn assert_still_alone(c: &mut postgres::Client, db: &str, conninfo: &str, relay: &Relay) {
    wait_lock_held(c, db, relay);
    let (status, err) = failed_start(conninfo, &[]);
    assert!(!status.success(), "a second relay started: {err}");
    assert!(err.contains("advisory lock"), "{err}");
}

fn report(what: &str, logs: &[SenderLog], t: &Tally) {
    let samples: Vec<&String> = logs.iter().flat_map(|l| &l.samples).take(3).collect();
    eprintln!(
        "{what}: {} SENDs OK, {} ERR STORE, e.g. {samples:?}; delivered all the same: {:?}",
        t.ok, t.failed, t.failed_but_delivered
    );
}

/// Terminates every session of `db` but the caller's; how many.
/// The sessions on database `db` (the relay's), but the caller's.
fn sessions_of(c: &mut postgres::Client, db: &str) -> i64 {
    c.query_one(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()",
        &[&db],
    )
    .expect("pg_stat_activity")
    .get(0)
}

fn terminate_sessions(c: &mut postgres::Client, db: &str) -> i64 {
    c.query_one(
        "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity \
         WHERE datname = $1 AND pid <> pg_backend_pid()",
        &[&db],
    )
    .expect("pg_terminate_backend")
    .get(0)
}

#[test]
fn killed_sessions_lose_no_answered_send_and_the_relay_reconnects() {
    let cluster = common::pg_cluster();
    let db = cluster.create_database().expect("a database");
    let conninfo = cluster.conninfo(&db);
    let relay = relay_on(&conninfo, &["--quota", "4096", "--pool-size", "4"]);
    let qs = create_many(&mut relay.client(), QUEUES, QUEUES);
    let mut admin = cluster.client("postgres").expect("an admin session");
    let logs = under_load(&relay, &qs, 3, |round, _| {
        // The relay serves again before its lock session is back (that one is retaken within
        // the lock's check interval): wait for both kinds of session, then end them all.
        let deadline = Instant::now() + RECOVERY;
        while sessions_of(&mut admin, &db) < 2 {
            assert!(
                Instant::now() < deadline,
                "round {round}: the relay's sessions never came back"
            );
            sleep(Duration::from_millis(20));
        }
        let killed = terminate_sessions(&mut admin, &db);
        // The pool's sessions and the lock's: at least the lock's and one pooled.
        assert!(
            killed >= 2,
            "round {round}: only {killed} of the relay's sessions terminated"
        );
    });
    assert!(
        logs.iter().any(|l| !l.failed.is_empty()),
        "no SEND met a killed session"
    );
    assert_every_queue_written(&logs);
    let got = drain(&relay, &qs);
    let tally = check_deliveries(&logs, &got);
    report("sessions killed", &logs, &tally);
    assert_still_alone(&mut admin, &db, &conninfo, &relay);
}

#[test]
fn a_restarted_server_loses_no_answered_send_and_the_relay_reconnects() {
    // A cluster of this test's own: the restarts must not disturb the other tests' databases.
    let cluster = Cluster::start(&ClusterOptions::default()).expect("a cluster");
    let db = cluster.create_database().expect("a database");
    let conninfo = cluster.conninfo(&db);
    let relay = relay_on(
        &conninfo,
        &[
            "--quota",
            "4096",
            "--pool-size",
            "4",
            "--db-pool-wait-secs",
            "2",
        ],
    );
    let qs = create_many(&mut relay.client(), QUEUES, QUEUES);
    let started = Instant::now();
    let logs = under_load(&relay, &qs, 2, |round, failures| {
        let before = failures.load(Ordering::Relaxed);
        cluster
            .stop_server("fast")
            .unwrap_or_else(|e| panic!("round {round}: {e}"));
        // Down until SENDs found no server at all (at least 500 ms; on a busy machine the
        // senders may take longer to get there), and at most 10 s.
        sleep(Duration::from_millis(500));
        let deadline = Instant::now() + Duration::from_secs(10);
        while failures.load(Ordering::Relaxed) == before && Instant::now() < deadline {
            sleep(Duration::from_millis(50));
        }
        cluster
            .start_server()
            .unwrap_or_else(|e| panic!("round {round}: {e}"));
    });
    assert!(
        logs.iter().any(|l| !l.failed.is_empty()),
        "no SEND met the stopped server"
    );
    // The pool's failed connection attempts are logged, at most one line a second (`log_limit`),
    // and r2d2 logs none of its own.
    let secs = started.elapsed().as_secs() as usize;
    let (lines, _) = relay.warnings("database connection failed");
    assert!(
        (1..=secs + 2).contains(&lines),
        "{lines} lines about failed database connections in {secs} s:\n{}",
        relay.log_text()
    );
    assert!(
        !relay.log_lines().iter().any(|l| l.contains("r2d2")),
        "r2d2's own error lines:\n{}",
        relay.log_text()
    );
    assert_every_queue_written(&logs);
    let got = drain(&relay, &qs);
    let tally = check_deliveries(&logs, &got);
    report("server restarted", &logs, &tally);
    let mut admin = cluster.client("postgres").expect("an admin session");
    assert_still_alone(&mut admin, &db, &conninfo, &relay);
}

/// A CA and a server certificate it signed for `localhost` and 127.0.0.1: (CA PEM, certificate
/// PEM, key PEM).
fn certificates() -> (String, String, String) {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};
    let ca_key = KeyPair::generate().expect("CA key");
    let mut ca = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    ca.distinguished_name
        .push(DnType::CommonName, "smp-relay test CA");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca = ca.self_signed(&ca_key).expect("CA certificate");
    let key = KeyPair::generate().expect("server key");
    let mut p = CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])
        .expect("server params");
    p.distinguished_name.push(DnType::CommonName, "localhost");
    let cert = p.signed_by(&key, &ca, &ca_key).expect("server certificate");
    (ca.pem(), cert.pem(), key.serialize_pem())
}

/// Writes `text` into the cluster's data directory as `name`, owned by the cluster's user.
fn write_owned(data: &Path, name: &str, text: &str, mode: u32) {
    let path = data.join(name);
    std::fs::write(&path, text).expect("write into the data directory");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).expect("chmod");
    let owner = std::fs::metadata(data).expect("the data directory");
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        std::os::unix::fs::chown(&path, Some(owner.uid()), Some(owner.gid())).expect("chown");
    }
}

#[test]
fn tls_to_the_database_checks_the_certificate_and_is_used() {
    let cluster = Cluster::start(&ClusterOptions {
        tcp: true,
        conf: vec![
            "ssl_cert_file = 'server.crt'".into(),
            "ssl_key_file = 'server.key'".into(),
        ],
    })
    .expect("a cluster");
    let (ca, cert, key) = certificates();
    let data = cluster.data_dir();
    write_owned(&data, "server.crt", &cert, 0o644);
    write_owned(&data, "server.key", &key, 0o600);
    // Local sessions (the test's) as before; over TCP only with TLS.
    write_owned(
        &data,
        "pg_hba.conf",
        "local all all trust\n\
         hostssl all all 127.0.0.1/32 trust\n\
         host all all 127.0.0.1/32 reject\n",
        0o600,
    );
    cluster
        .client("postgres")
        .expect("a session")
        .batch_execute("ALTER SYSTEM SET ssl = on")
        .expect("ssl = on");
    // TLS is set up at the server's start: a start that fails here names a bad certificate.
    cluster.restart("fast").expect("the server with TLS");
    let db = cluster.create_database().expect("a database");
    let dir = TempDir::new("pg-tls").expect("a temp dir");
    let ca_path = dir.path().join("ca.pem");
    std::fs::write(&ca_path, &ca).expect("write the CA");
    let tcp = |extra: &str| {
        format!(
            "host=127.0.0.1 port={} user={SUPERUSER} dbname={db} {extra}",
            cluster.port
        )
    };

    // Another CA: the server's certificate is not trusted.
    let (other_ca, _, _) = certificates();
    let other_path = dir.path().join("other-ca.pem");
    std::fs::write(&other_path, &other_ca).expect("write the other CA");
    let (status, err) = failed_start(
        &tcp(&format!(
            "sslmode=verify-full sslrootcert={}",
            other_path.display()
        )),
        &[],
    );
    assert!(!status.success(), "started with an untrusted certificate");
    assert!(err.contains("certificate verify failed"), "{err}");
    // Without TLS: refused by pg_hba.conf.
    let (status, err) = failed_start(&tcp("sslmode=disable"), &[]);
    assert!(!status.success(), "started without TLS");
    assert!(err.contains("pg_hba.conf rejects"), "{err}");

    let relay = relay_on(
        &tcp(&format!(
            "sslmode=verify-full sslrootcert={}",
            ca_path.display()
        )),
        &[],
    );
    let (mut rc, mut sc) = (relay.client(), relay.client());
    let q = create(&mut rc);
    send_ok(&mut sc, &q, None, b"over TLS");
    let m = expect_body(&mut rc, &q, b"over TLS");
    assert_eq!(ack(&mut rc, &q, &m.msg_id), BrokerMsg::Ok);
    let mut rc2 = relay.client();
    send_ok(&mut sc, &q, None, b"still over TLS");
    let m = sub_with_msg(&mut rc2, &q);
    assert_eq!(m.msg.body(), Some(&b"still over TLS"[..]));
    assert_eq!(ack(&mut rc2, &q, &m.msg_id), BrokerMsg::Ok);

    let sessions: Vec<bool> = cluster
        .client("postgres")
        .expect("a session")
        .query(
            "SELECT ssl FROM pg_stat_ssl JOIN pg_stat_activity USING (pid) WHERE datname = $1",
            &[&db],
        )
        .expect("pg_stat_ssl")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(!sessions.is_empty(), "the relay has no session");
    assert!(
        sessions.iter().all(|&s| s),
        "every session of the relay is TLS: {sessions:?}"
    );
}

#[test]
fn one_relay_per_database_and_schema() {
    let conninfo = common::pg_database();
    let relay = relay_on(&conninfo, &[]);
    relay.assert_serves();
    let (status, err) = failed_start(&conninfo, &[]);
    assert!(!status.success(), "a second relay started on the schema");
    assert!(
        err.contains("another smp-relay") && err.contains("advisory lock"),
        "{err}"
    );
    // Its own schema: the same database serves both.
    let other = relay_on(&conninfo, &["--schema", "smp_other"]);
    for r in [&relay, &other] {
        let (mut rc, mut sc) = (r.client(), r.client());
        let q = create(&mut rc);
        send_ok(&mut sc, &q, None, b"alone in its schema");
        let m = expect_body(&mut rc, &q, b"alone in its schema");
        assert_eq!(ack(&mut rc, &q, &m.msg_id), BrokerMsg::Ok);
    }
}

#[test]
fn a_blocked_statement_ends_at_the_statement_timeout() {
    let cluster = common::pg_cluster();
    let db = cluster.create_database().expect("a database");
    let relay = relay_on(
        &cluster.conninfo(&db),
        &[
            "--pool-size",
            "1",
            "--db-statement-timeout-secs",
            "1",
            "--db-pool-wait-secs",
            "5",
        ],
    );
    let (mut rc, mut sc) = (relay.client(), relay.client());
    let (q, other) = (create(&mut rc), create(&mut rc));
    let mut pg = cluster.client(&db).expect("a session");
    let mut tx = pg.transaction().expect("a transaction");
    let locked = tx
        .query(
            "SELECT recipient_id FROM smp_server.msg_queues WHERE recipient_id = $1 FOR UPDATE",
            &[&q.rid().to_vec()],
        )
        .expect("the queue's row locked");
    assert_eq!(locked.len(), 1, "the queue's row");

    let started = Instant::now();
    let r = send(&mut sc, &q, None, b"blocked");
    let waited = started.elapsed();
    match &r {
        BrokerMsg::Err(ErrorType::Store(s)) => {
            assert!(s.contains("statement timeout"), "{s}")
        }
        other => panic!("SEND on a locked queue answered {other:?}"),
    }
    assert!(
        waited < Duration::from_secs(10),
        "the SEND waited {waited:?}"
    );
    // The one connection is free again: another queue is served while the lock is held.
    send_ok(&mut sc, &other, None, b"not blocked");
    expect_body(&mut rc, &other, b"not blocked");

    tx.rollback().expect("release the lock");
    send_ok(&mut sc, &q, None, b"after the lock");
    // The SEND that timed out wrote nothing: the next message is the first.
    let m = expect_body(&mut rc, &q, b"after the lock");
    assert_eq!(ack(&mut rc, &q, &m.msg_id), BrokerMsg::Ok);
    expect_nothing(&mut rc, "after the ACK");
}

/// A Unix-socket proxy in front of the cluster's socket. [`Proxy::cut`] closes the relay's side of
/// every connection open at that moment and keeps the server's side open, as a network that drops
/// a connection does: the server process goes on with the statement it was given, unaware.
struct Proxy {
    dir: TempDir,
    port: String,
    open: Arc<std::sync::Mutex<Vec<(UnixStream, UnixStream)>>>,
}

use std::os::unix::net::{UnixListener, UnixStream};

impl Proxy {
    /// Listens beside nothing else in a directory of its own, forwarding to the server whose
    /// conninfo is `real` (`host=<socket dir> port=<port> …`).
    fn start(real: &str) -> Proxy {
        let field = |k: &str| {
            real.split_whitespace()
                .find_map(|f| f.strip_prefix(k))
                .unwrap_or_else(|| panic!("no {k} in {real}"))
                .to_string()
        };
        let (host, port) = (field("host="), field("port="));
        let target = format!("{host}/.s.PGSQL.{port}");
        let dir = TempDir::new("pg-proxy").expect("a temp dir");
        let listener =
            UnixListener::bind(dir.path().join(format!(".s.PGSQL.{port}"))).expect("bind");
        let open: Arc<std::sync::Mutex<Vec<(UnixStream, UnixStream)>>> = Arc::default();
        let kept = open.clone();
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let Ok(server) = UnixStream::connect(&target) else {
                    continue;
                };
                let pipe = |mut from: UnixStream, mut to: UnixStream| {
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut from, &mut to);
                    });
                };
                pipe(client.try_clone().unwrap(), server.try_clone().unwrap());
                pipe(server.try_clone().unwrap(), client.try_clone().unwrap());
                kept.lock().unwrap().push((client, server));
            }
        });
        Proxy { dir, port, open }
    }

    /// `real` with its host replaced by the proxy's directory.
    fn conninfo(&self, real: &str) -> String {
        real.split_whitespace()
            .map(|f| {
                if f.starts_with("host=") {
                    format!("host={}", self.dir.path().display())
                } else if f.starts_with("port=") {
                    format!("port={}", self.port)
                } else {
                    f.to_string()
                }
            })
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// Closes the client side of every connection open now; their server sides stay open.
    fn cut(&self) -> usize {
        let open = self.open.lock().unwrap();
        for (client, _) in open.iter() {
            let _ = client.shutdown(std::net::Shutdown::Both);
        }
        open.len()
    }
}

/// A SEND whose database connection is lost while its statement waits on a row lock: the relay
/// must not conclude "not written" while that statement may still commit (`pool::settle` ends
/// the session's server process first), and must not trust the queue's cached count of 0 after
/// such a loss. Before, the look found nothing, the client got `ERR STORE`, and when the lock went
/// the write committed: a message the client was told failed (and would send again) reached the
/// subscriber ahead of the next one.
#[test]
fn a_lost_connection_never_answers_a_send_that_later_commits() {
    let cluster = common::pg_cluster();
    let db = cluster.create_database().expect("a database");
    let real = cluster.conninfo(&db);
    let proxy = Proxy::start(&real);
    let relay = relay_on(
        &proxy.conninfo(&real),
        &["--pool-size", "1", "--db-statement-timeout-secs", "120"],
    );
    let mut rc = relay.client();
    let q = create(&mut rc);
    let mut pg = cluster.client(&db).expect("a session");
    let mut admin = cluster.client(&db).expect("a second session");
    let mut tx = pg.transaction().expect("a transaction");
    let locked = tx
        .query(
            "SELECT recipient_id FROM smp_server.msg_queues WHERE recipient_id = $1 FOR UPDATE",
            &[&q.rid().to_vec()],
        )
        .expect("the queue's row locked");
    assert_eq!(locked.len(), 1);

    let (sid, addr, key_hash) = (q.sid().to_vec(), relay.addr, relay.key_hash);
    let sender = std::thread::spawn(move || {
        let mut sc = client_of(addr, key_hash);
        let corr = new_corr_id();
        let t = ClientTransmission::new(&corr, &sid, send_cmd(b"blocked"));
        sc.send_batch(&[t]).expect("send");
        // The answer, or none when the relay closes the connection (an uncertain outcome).
        sc.recv_for(&corr).ok().map(|t| t.msg)
    });
    // The SEND's statement waits on the lock; then its connection is cut.
    let deadline = Instant::now() + CLIENT_TIMEOUT;
    let blocked_pid: i32 = loop {
        let row = admin
            .query_opt(
                "SELECT pid FROM pg_stat_activity WHERE datname = $1 AND wait_event_type = 'Lock'",
                &[&db],
            )
            .expect("pg_stat_activity");
        if let Some(r) = row {
            break r.get(0);
        }
        assert!(
            Instant::now() < deadline,
            "the SEND never waited on the lock"
        );
        sleep(Duration::from_millis(20));
    };
    assert!(proxy.cut() >= 2, "the pool's and the lock's connections");
    let answer = sender.join().expect("sender");
    // Whatever the relay answered, the blocked statement's server process has its outcome once
    // the lock goes: release it, and wait until that process is idle or gone.
    tx.rollback().expect("release the lock");
    let deadline = Instant::now() + CLIENT_TIMEOUT;
    while admin
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1 AND state = 'active')",
            &[&blocked_pid],
        )
        .expect("pg_stat_activity")
        .get::<_, bool>(0)
    {
        assert!(
            Instant::now() < deadline,
            "the blocked statement never ended"
        );
        sleep(Duration::from_millis(20));
    }
    let mut sc = relay.client();
    send_ok(&mut sc, &q, None, b"after");
    let first = expect_msg(&mut rc, &q);
    match answer {
        Some(Ok(BrokerMsg::Ok)) => {
            assert_eq!(
                first.msg.body(),
                Some(&b"blocked"[..]),
                "answered OK: delivered"
            );
            let m = msg_of(&q, ack(&mut rc, &q, &first.msg_id));
            assert_eq!(m.msg.body(), Some(&b"after"[..]));
        }
        Some(Ok(BrokerMsg::Err(ErrorType::Store(_)))) | None => {
            assert_eq!(
                first.msg.body(),
                Some(&b"after"[..]),
                "a SEND answered ERR STORE (or not answered: {}) was written after all",
                answer.is_none()
            );
            assert_eq!(ack(&mut rc, &q, &first.msg_id), BrokerMsg::Ok);
        }
        other => panic!("the SEND answered {other:?}"),
    }
    expect_nothing(&mut rc, "after the last ACK");
}
