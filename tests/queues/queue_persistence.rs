//! Persistence scenarios (simplexmq `tests/ServerTests.hs`): a clean stop
//! (SIGTERM) saves the memory store and a start on the same data directory restores queues,
//! notifiers, messages, the quota marker and pending notifications; deleted queues stay deleted;
//! messages older than the TTL are dropped at start. Checked at the message level (the reference
//! also counts store-log lines, which this relay does not have). Also what the README says a crash,
//! a failed save and a failed start cost (`store/memory/persist.rs`, module comment).

use crate::common;
use crate::support;

use common::{Relay, RelayOptions};
use smp_relay::client::queue::{auth_key, KeyAlg};
use smp_relay::client::{new_corr_id, ClientTransmission};
use smp_relay::protocol::command::Command;
use smp_relay::protocol::response::BrokerMsg;
use support::*;

/// The memory store, for the tests of its saved files (the default is the journal).
fn memory_store() -> RelayOptions {
    RelayOptions {
        extra_args: vec!["--store".into(), "memory".into()],
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

/// The reference's `testWithStoreLog` (simplexmq `tests/ServerTests.hs`): a queue with a notifier
/// and a deleted queue, across a clean restart; and a notification that waits for its subscriber
/// across it.
#[test]
fn queues_and_notifiers_survive_clean_restart() {
    let mut relay = Relay::start();
    let (s1, s2, s3) = (
        auth_key(KeyAlg::Ed25519),
        auth_key(KeyAlg::Ed25519),
        auth_key(KeyAlg::Ed25519),
    );
    let (q1, n, m1, q2, q3, n3, m3);
    {
        let (mut h, mut h1) = (relay.client(), relay.client());
        q1 = create_secured(&mut h, &s1);
        n = nkey(&mut h, &q1);
        assert_eq!(nsub(&mut h1, &n), BrokerMsg::Sok(None));

        // The MSG reaches the subscribed sender connection before its SEND's OK.
        let corr = new_corr_id();
        let t = ClientTransmission::new(&corr, q1.sid(), send_ntf_cmd(b"hello")).signed(s1.clone());
        h.send_batch(&[t]).unwrap();
        let first = h.recv_block().unwrap();
        assert_eq!(first.len(), 1);
        assert_eq!(first[0].entity_id, q1.rid());
        m1 = smp_relay::client::queue::receive(&q1.secret, &first[0]).unwrap();
        assert_eq!(m1.msg.body(), Some(&b"hello"[..]));
        let ok = h.recv_block().unwrap();
        assert_eq!(ok.len(), 1);
        assert_eq!(ok[0].corr_id, corr);
        assert_eq!(ok[0].msg, Ok(BrokerMsg::Ok));
        assert_eq!(expect_nmsg(&mut h1, &n).msg_id, m1.msg_id);

        q2 = create_secured(&mut h, &s2);
        send_ok(&mut h, &q2, Some(&s2), b"hello too");
        expect_body(&mut h, &q2, b"hello too");
        assert_eq!(
            signed(&mut h, q2.key(), q2.rid(), Command::Del),
            BrokerMsg::Ok
        );

        // A notification for a notifier nobody subscribed to when the relay stops.
        q3 = create_secured(&mut h, &s3);
        n3 = nkey(&mut h, &q3);
        let r = send_as(&mut h, q3.sid(), Some(&s3), send_ntf_cmd(b"while away"));
        assert_eq!(r, BrokerMsg::Ok);
        m3 = expect_body(&mut h, &q3, b"while away");
    }
    stop_cleanly(&mut relay);
    relay.restart();

    let (mut h, mut h1) = (relay.client(), relay.client());
    assert_eq!(
        nsub(&mut h1, &n),
        BrokerMsg::Sok(None),
        "the notifier is restored"
    );
    let r = send_as(&mut h, q1.sid(), Some(&s1), send_ntf_cmd(b"hello again"));
    assert_eq!(r, BrokerMsg::Ok);
    let again = sub_with_msg(&mut h, &q1);
    assert_eq!(
        again.msg_id, m1.msg_id,
        "the unACKed message is restored with its ID"
    );
    assert_eq!(again.msg, m1.msg, "and its time, flags and body");
    let m2 = msg_of(&q1, ack(&mut h, &q1, &m1.msg_id));
    assert_eq!(m2.msg.body(), Some(&b"hello again"[..]));
    assert_eq!(
        expect_nmsg(&mut h1, &n).msg_id,
        m2.msg_id,
        "new notifications flow"
    );
    assert_eq!(ack(&mut h, &q1, &m2.msg_id), BrokerMsg::Ok);

    assert_eq!(nsub(&mut h1, &n3), BrokerMsg::Sok(None));
    let waiting = expect_nmsg(&mut h1, &n3);
    assert_eq!(
        waiting.msg_id, m3.msg_id,
        "the saved notification follows NSUB"
    );
    assert_eq!(waiting.ts, m3.msg.ts());

    let r = send(&mut h, &q2, Some(&s2), b"hello too");
    assert_eq!(r, ERR_AUTH, "the deleted queue stays deleted");
    assert_eq!(signed(&mut h, q2.key(), q2.rid(), Command::Sub), ERR_AUTH);
}

/// The reference's `testRestoreMessages` with quota 4: one message delivered, four queued and a
/// QUOTA; each clean restart keeps what was not ACKed, including the marker, which is delivered
/// last.
#[test]
fn messages_and_quota_marker_survive_clean_restarts() {
    let mut relay = Relay::start_with(RelayOptions {
        extra_args: vec!["--quota".into(), "4".into()],
        ..Default::default()
    });
    let sender = auth_key(KeyAlg::Ed25519);
    let q;
    {
        let (mut h, mut h1) = (relay.client(), relay.client());
        q = create_secured(&mut h1, &sender);
        send_ok(&mut h, &q, Some(&sender), b"hello");
        let m = expect_body(&mut h1, &q, b"hello");
        assert_eq!(ack(&mut h1, &q, &m.msg_id), BrokerMsg::Ok);
        for i in 2..=5 {
            send_ok(&mut h, &q, Some(&sender), format!("hello {i}").as_bytes());
        }
        assert_eq!(send(&mut h, &q, Some(&sender), b"hello 6"), ERR_QUOTA);
    }
    stop_cleanly(&mut relay);
    relay.restart();
    {
        let mut h = relay.client();
        let m2 = sub_with_msg(&mut h, &q);
        assert_eq!(m2.msg.body(), Some(&b"hello 2"[..]));
        let m3 = msg_of(&q, ack(&mut h, &q, &m2.msg_id));
        assert_eq!(m3.msg.body(), Some(&b"hello 3"[..]));
        let m4 = msg_of(&q, ack(&mut h, &q, &m3.msg_id));
        assert_eq!(m4.msg.body(), Some(&b"hello 4"[..]), "delivered, not ACKed");
        assert_eq!(
            send(&mut h, &q, Some(&sender), b"hello 7"),
            ERR_QUOTA,
            "the marker is kept"
        );
    }
    stop_cleanly(&mut relay);
    relay.restart();
    let mut h = relay.client();
    let m4 = sub_with_msg(&mut h, &q);
    assert_eq!(m4.msg.body(), Some(&b"hello 4"[..]));
    let m5 = msg_of(&q, ack(&mut h, &q, &m4.msg_id));
    assert_eq!(m5.msg.body(), Some(&b"hello 5"[..]));
    let marker = msg_of(&q, ack(&mut h, &q, &m5.msg_id));
    assert!(
        is_quota(&marker),
        "the quota marker is restored: {:?}",
        marker.msg
    );
    assert_eq!(ack(&mut h, &q, &marker.msg_id), BrokerMsg::Ok);
    send_ok(&mut h, &q, Some(&sender), b"hello 8");
    expect_body(&mut h, &q, b"hello 8");
}

/// The reference's `testRestoreExpireMessages`: two old and two newer messages; a restart with a
/// long TTL keeps all four, a restart with a TTL shorter than the old ones' age drops exactly those
/// two.
#[test]
fn restart_drops_messages_older_than_ttl() {
    let mut relay = Relay::start();
    let sender = auth_key(KeyAlg::Ed25519);
    let q;
    {
        let (mut h, mut rh) = (relay.client(), relay.client());
        q = create_secured(&mut rh, &sender);
        drop(rh);
        send_ok(&mut h, &q, Some(&sender), b"hello 1");
        send_ok(&mut h, &q, Some(&sender), b"hello 2");
        // The scenario is about message age: the old ones must be older than the short TTL below.
        // The relay's clock moves 10 s on instead of the test sleeping (`Relay::advance_clock`).
        relay.advance_clock(10);
        send_ok(&mut h, &q, Some(&sender), b"hello 3");
        send_ok(&mut h, &q, Some(&sender), b"hello 4");
    }
    stop_cleanly(&mut relay);
    relay.restart_with(&["--message-ttl-secs", "86400"]);
    {
        let mut h = relay.client();
        let info = signed(&mut h, q.key(), q.rid(), Command::Que);
        let BrokerMsg::Info(json) = info else {
            panic!("QUE: {info:?}")
        };
        assert!(json.contains("\"qiSize\":4"), "all four kept: {json}");
    }
    stop_cleanly(&mut relay);
    // The restarted relay's clock starts where the first one's was (10 s ahead): with a 5 s TTL,
    // the two old messages (10 s old) are past it and the two newer ones (stamped at +10) are not.
    relay.restart_with(&["--message-ttl-secs", "5", "--test-clock-offset-secs", "10"]);
    let mut h = relay.client();
    let m3 = sub_with_msg(&mut h, &q);
    assert_eq!(
        m3.msg.body(),
        Some(&b"hello 3"[..]),
        "the two old messages expired at start"
    );
    let m4 = msg_of(&q, ack(&mut h, &q, &m3.msg_id));
    assert_eq!(m4.msg.body(), Some(&b"hello 4"[..]));
    assert_eq!(ack(&mut h, &q, &m4.msg_id), BrokerMsg::Ok);
}

/// The notification TTL (`--notification-ttl-secs`, ini `[STORE_LOG] expire_ntfs_hours`) also
/// applies when the saved store is loaded, as the reference expires notifications with its
/// configured `expire_ntfs_hours` (simplex-chat/simplexmq `src/Simplex/Messaging/Server/Main.hs`):
/// two pending notifications 3 s old on the restarted relay's clock; a restart with a long TTL keeps them (one is
/// delivered), a restart with a 1 s TTL drops the other before anything could expire it while
/// running (the periodic expiry is hours away).
#[test]
fn restart_drops_notifications_older_than_ntf_ttl() {
    let mut relay = Relay::start();
    let (s1, s2) = (auth_key(KeyAlg::Ed25519), auth_key(KeyAlg::Ed25519));
    let (n1, n2, m1);
    {
        let mut h = relay.client();
        let q1 = create_secured(&mut h, &s1);
        n1 = nkey(&mut h, &q1);
        let q2 = create_secured(&mut h, &s2);
        n2 = nkey(&mut h, &q2);
        let r = send_as(&mut h, q1.sid(), Some(&s1), send_ntf_cmd(b"one"));
        assert_eq!(r, BrokerMsg::Ok);
        m1 = expect_body(&mut h, &q1, b"one");
        let r = send_as(&mut h, q2.sid(), Some(&s2), send_ntf_cmd(b"two"));
        assert_eq!(r, BrokerMsg::Ok);
        expect_body(&mut h, &q2, b"two");
    }
    // Notification times are whole seconds: the restarted relay's clock starts 3 s ahead
    // (`--test-clock-offset-secs`, which applies to the store's load), so both are over 2 s older
    // than a 1 s TTL there, and no test sleeps for it.
    stop_cleanly(&mut relay);
    relay.restart_with(&[
        "--notification-ttl-secs",
        "86400",
        "--test-clock-offset-secs",
        "3",
    ]);
    {
        let mut h = relay.client();
        assert_eq!(nsub(&mut h, &n1), BrokerMsg::Sok(None));
        assert_eq!(
            expect_nmsg(&mut h, &n1).msg_id,
            m1.msg_id,
            "kept with a long TTL"
        );
    }
    stop_cleanly(&mut relay);
    relay.restart_with(&[
        "--notification-ttl-secs",
        "1",
        "--test-clock-offset-secs",
        "3",
    ]);
    let mut h = relay.client();
    assert_eq!(nsub(&mut h, &n2), BrokerMsg::Sok(None));
    expect_nothing(&mut h, "the old notification expired at start");
}

/// The saved store is split by partition group, not by shard: queues and messages saved by two
/// shards are all restored by one, and back.
#[test]
fn restart_with_another_number_of_cores_keeps_every_queue() {
    let mut relay = Relay::start_with(RelayOptions {
        cores: 2,
        ..Default::default()
    });
    let qs: Vec<Queue> = {
        let mut h = relay.client();
        let mut s = relay.client();
        let qs: Vec<Queue> = (0..12).map(|_| create(&mut h)).collect();
        for (i, q) in qs.iter().enumerate() {
            send_ok(&mut s, q, None, format!("saved {i}").as_bytes());
            expect_body(&mut h, q, format!("saved {i}").as_bytes());
        }
        qs
    };
    for cores in [1, 2] {
        stop_cleanly(&mut relay);
        relay.set_cores(cores);
        relay.restart();
        let mut h = relay.client();
        for (i, q) in qs.iter().enumerate() {
            let m = sub_with_msg(&mut h, q);
            assert_eq!(
                m.msg.body(),
                Some(format!("saved {i}").as_bytes()),
                "cores {cores}"
            );
        }
    }
}

/// The relay's log once it contains `needle` (its stderr is read by another thread, which may lag
/// behind the process's exit); the whole log if `needle` never comes within 10 s.
fn log_with(relay: &Relay, needle: &str) -> String {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let text = relay.log_text();
        if text.contains(needle) || std::time::Instant::now() > deadline {
            return text;
        }
        common::sleep(std::time::Duration::from_millis(20));
    }
}

fn group_file_name(q: &Queue) -> String {
    format!("group-{:02}.bin", smp_relay::store::group_of(q.rid()))
}

/// Every file of the saved store, by name, with its bytes.
fn saved_files(relay: &Relay) -> std::collections::BTreeMap<String, Vec<u8>> {
    let dir = relay.dir.path().join("memory-store");
    std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("dir entry"))
        .filter(|e| e.path().is_file())
        .map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            (name, std::fs::read(e.path()).expect("read a saved file"))
        })
        .collect()
}

/// A crash (SIGKILL) keeps every queue change, as the reference's store log does (simplexmq
/// `src/Simplex/Messaging/Server/StoreLog.hs`: the reference's own configuration, `store_messages
/// = memory` with `[STORE_LOG] enable = on`, loses no queue in a crash): queues created, secured
/// and deleted since the last start are as they were served (`store/memory/queue_log.rs`).
/// Messages are saved at a clean stop only, so those of the last clean stop are loaded again, with
/// a warning that names the files and says that messages acknowledged since may be delivered
/// again, as the README says.
#[test]
fn a_crash_keeps_every_queue_change_and_the_messages_of_the_last_clean_stop() {
    let mut relay = Relay::start_with(memory_store());
    let (s1, s2) = (auth_key(KeyAlg::Ed25519), auth_key(KeyAlg::Ed25519));
    let (q1, q3) = {
        let (mut h, mut rh) = (relay.client(), relay.client());
        let q1 = create_secured(&mut rh, &s1);
        let q3 = create(&mut rh);
        drop(rh);
        send_ok(&mut h, &q1, Some(&s1), b"one");
        send_ok(&mut h, &q1, Some(&s1), b"two");
        (q1, q3)
    };
    stop_cleanly(&mut relay);
    relay.restart();
    let q2 = {
        let mut h = relay.client();
        let m1 = sub_with_msg(&mut h, &q1);
        assert_eq!(m1.msg.body(), Some(&b"one"[..]));
        let m2 = msg_of(&q1, ack(&mut h, &q1, &m1.msg_id));
        assert_eq!(m2.msg.body(), Some(&b"two"[..]));
        assert_eq!(
            signed(&mut h, q3.key(), q3.rid(), Command::Del),
            BrokerMsg::Ok
        );
        create_secured(&mut h, &s2)
    };
    relay.kill();
    relay.restart();
    let bak = format!("{}.bak", group_file_name(&q1));
    let log = log_with(&relay, &bak);
    assert!(
        log.contains(&bak) && log.contains("delivered again"),
        "a warning names {bak} and what loading it means:\n{log}"
    );
    {
        let mut h = relay.client();
        let m = sub_with_msg(&mut h, &q1);
        assert_eq!(
            m.msg.body(),
            Some(&b"one"[..]),
            "the messages saved at the last clean stop are back, with the one ACKed since"
        );
        let mut s = relay.client();
        assert_eq!(
            signed(&mut h, q2.key(), q2.rid(), Command::Sub),
            BrokerMsg::Sok(None),
            "the queue created since the last start is kept"
        );
        assert_eq!(
            send(&mut s, &q2, None, b"unsigned"),
            ERR_AUTH,
            "with the sender key it was secured with since"
        );
        send_ok(&mut s, &q2, Some(&s2), b"after the crash");
        expect_body(&mut h, &q2, b"after the crash");
        assert_eq!(
            signed(&mut h, q3.key(), q3.rid(), Command::Sub),
            ERR_AUTH,
            "the queue deleted since the last start stays deleted"
        );
    }
    // A clean stop saves what is served now; the next start loads it without the warning, and the
    // queue log is empty again.
    stop_cleanly(&mut relay);
    relay.restart();
    let mut h = relay.client();
    assert_eq!(sub_with_msg(&mut h, &q1).msg.body(), Some(&b"one"[..]));
    assert_eq!(
        signed(&mut h, q2.key(), q2.rid(), Command::Sub),
        BrokerMsg::Sok(None)
    );
    assert!(
        !relay.log_text().contains(".bak"),
        "no warning after a clean stop:\n{}",
        relay.log_text()
    );
}

/// A start that fails after the store is loaded (the second shard's listener cannot bind, or its
/// thread ends before it is ready, as when its executor cannot be built) exits with a message
/// naming the shard, leaves every saved file as it was, and the next start has every queue.
#[test]
fn a_failed_start_leaves_the_saved_store_as_it_was() {
    let mut relay = Relay::start_with(RelayOptions {
        cores: 2,
        ..memory_store()
    });
    let qs: Vec<Queue> = {
        let (mut h, mut s) = (relay.client(), relay.client());
        let qs: Vec<Queue> = (0..12).map(|_| create(&mut h)).collect();
        for (i, q) in qs.iter().enumerate() {
            send_ok(&mut s, q, None, format!("saved {i}").as_bytes());
            expect_body(&mut h, q, format!("saved {i}").as_bytes());
        }
        qs
    };
    stop_cleanly(&mut relay);
    let before = saved_files(&relay);
    assert!(!before.is_empty(), "the clean stop saved the queues");
    for fault in ["1:bind", "1:exit"] {
        let out = relay.failed_start(&["--store", "memory", "--test-fail-start", fault]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "{fault}: the start must fail:\n{err}"
        );
        assert_eq!(
            saved_files(&relay).keys().collect::<Vec<_>>(),
            before.keys().collect::<Vec<_>>(),
            "{fault}: the saved files are the same files"
        );
        assert!(
            saved_files(&relay) == before,
            "{fault}: the saved files are unchanged"
        );
        assert!(err.contains("shard 1"), "{fault}: names the shard:\n{err}");
    }
    relay.restart();
    let mut h = relay.client();
    for (i, q) in qs.iter().enumerate() {
        let m = sub_with_msg(&mut h, q);
        assert_eq!(m.msg.body(), Some(format!("saved {i}").as_bytes()));
    }
}

/// `n` queues (no subscription) with one message each, `"{tag} {i}"`.
fn queues_with_a_message(h: &mut smp_relay::client::Client, n: usize, tag: &str) -> Vec<Queue> {
    (0..n)
        .map(|i| {
            let q = create_only(h);
            send_ok(h, &q, None, format!("{tag} {i}").as_bytes());
            q
        })
        .collect()
}

/// A new queue in partition group `group`, holding more than 2 MiB of messages.
fn big_queue_in(h: &mut smp_relay::client::Client, group: u32) -> Queue {
    let q = (0..2000)
        .map(|_| create_only(h))
        .find(|q| smp_relay::store::group_of(q.rid()) == group)
        .expect("a queue in the group within 2000 NEWs");
    let body = vec![b'x'; 15000];
    for _ in 0..150 {
        send_ok(h, &q, None, &body);
    }
    q
}

fn assert_message(h: &mut smp_relay::client::Client, q: &Queue, body: &str, what: &str) {
    let r = signed(h, q.key(), q.rid(), Command::Get);
    assert_eq!(body_of(q, r), body.as_bytes(), "{what}");
}

/// A clean stop on a full disk (a 2 MiB tmpfs): every shard keeps saving its other groups after a
/// group fails, removes the temporary file of the failed write, keeps the group's previous saved
/// state, and the relay exits non-zero naming every shard and group that failed. The next start,
/// with space, loads the previous state of the failed groups (with a warning) and the new state of
/// the others.
#[test]
fn a_failed_save_keeps_the_previous_state_and_names_every_shard() {
    let mut relay = Relay::start_with(RelayOptions {
        cores: 2,
        extra_args: vec![
            "--quota".into(),
            "400".into(),
            "--store".into(),
            "memory".into(),
        ],
    });
    stop_cleanly(&mut relay);
    let store = relay.dir.path().join("memory-store");
    let disk = common::Tmpfs::mount(&store, "2m");
    relay.restart();
    let saved = queues_with_a_message(&mut relay.client(), 16, "saved");
    stop_cleanly(&mut relay);
    relay.restart();

    // Both shards (groups are owned by `group % 2`) get a group that cannot fit the disk.
    let mut big = Vec::new();
    {
        let mut h = relay.client();
        for shard in 0..2 {
            let q = saved
                .iter()
                .find(|q| smp_relay::store::group_of(q.rid()) % 2 == shard)
                .expect("a saved queue on each shard");
            big.push((q, big_queue_in(&mut h, smp_relay::store::group_of(q.rid()))));
        }
    }
    let status = relay.stop();
    assert!(!status.success(), "a failed save exits non-zero");
    let log = log_with(&relay, "smp-relay:");
    let last = log
        .lines()
        .find(|l| l.starts_with("smp-relay:"))
        .unwrap_or_default()
        .to_string();
    for (shard, (q, _)) in big.iter().enumerate() {
        assert!(
            last.contains(&format!("shard {shard}")) && last.contains(&group_file_name(q)),
            "the error names shard {shard} and {}:\n{log}",
            group_file_name(q)
        );
    }
    let tmp: Vec<String> = saved_files(&relay)
        .into_keys()
        .filter(|n| n.ends_with(".tmp"))
        .collect();
    assert!(tmp.is_empty(), "temporary files left: {tmp:?}");

    disk.resize("64m");
    relay.set_cores(1);
    relay.restart();
    for (q, _) in &big {
        let bak = format!("{}.bak", group_file_name(q));
        assert!(
            log_with(&relay, &bak).contains(&bak),
            "a warning names {bak}:\n{}",
            relay.log_text()
        );
    }
    let mut h = relay.client();
    for (i, q) in saved.iter().enumerate() {
        assert_message(
            &mut h,
            q,
            &format!("saved {i}"),
            "every saved queue is back",
        );
    }

    // One shard, so that only this shard's writes compete for the disk: a group that fails is
    // followed by groups that fit, and they are saved.
    disk.resize("2m");
    let (first, _) = big[0];
    let group = smp_relay::store::group_of(first.rid());
    let later: Vec<Queue> = (0..2000)
        .map(|_| create_only(&mut h))
        .filter(|q| smp_relay::store::group_of(q.rid()) > group)
        .take(3)
        .collect();
    assert_eq!(later.len(), 3, "queues in later groups");
    for (i, q) in later.iter().enumerate() {
        send_ok(&mut h, q, None, format!("later {i}").as_bytes());
    }
    big_queue_in(&mut h, group);
    drop(h);
    let status = relay.stop();
    assert!(!status.success(), "a failed save exits non-zero");
    disk.resize("64m");
    relay.restart();
    let mut h = relay.client();
    for (i, q) in later.iter().enumerate() {
        assert_message(
            &mut h,
            q,
            &format!("later {i}"),
            "a group after the failed one is saved",
        );
    }
    assert_message(
        &mut h,
        first,
        &format!(
            "saved {}",
            saved.iter().position(|q| q.rid() == first.rid()).unwrap()
        ),
        "the failed group's previous state is loaded",
    );
}

/// The reference's `[STORE_LOG] enable = off` and `restore_messages = off` on the memory store:
/// without the store log nothing is kept over a restart (and no file is written); without
/// restored messages the queue stays and its messages go.
#[test]
fn the_memory_store_keeps_what_the_configuration_says() {
    for (flag, queue_kept) in [("--restore-messages", true), ("--store-log", false)] {
        let mut opts = memory_store();
        opts.extra_args
            .extend([flag.to_string(), "off".to_string()]);
        let mut relay = Relay::start_with(opts.clone());
        let mut c = relay.client();
        let q = create(&mut c);
        send_ok(&mut c, &q, None, b"not kept");
        drop(c);
        stop_cleanly(&mut relay);
        let args: Vec<&str> = opts.extra_args.iter().map(String::as_str).collect();
        relay.restart_with(&args);
        let mut c = relay.client();
        let r = signed(&mut c, q.key(), q.rid(), Command::Sub);
        if queue_kept {
            assert_eq!(r, sok(&c), "{flag} off: the queue stays");
            expect_nothing(&mut c, "the message was not kept");
        } else {
            assert_eq!(
                r,
                BrokerMsg::Err(ErrorType::Auth),
                "{flag} off: nothing kept"
            );
            stop_cleanly(&mut relay);
            assert!(saved_files(&relay).is_empty(), "{flag} off wrote files");
        }
    }
}
