//! Persistence scenarios (`reference/smp-server-behaviour.md` §9.2 items 17–19): a clean stop
//! (SIGTERM) saves the memory store and a start on the same data directory restores queues,
//! notifiers, messages, the quota marker and pending notifications; deleted queues stay deleted;
//! messages older than the TTL are dropped at start. Checked at the message level (the reference
//! also counts store-log lines, which this relay does not have).

mod common;
mod support;

use common::{Relay, RelayOptions};
use smp_relay::client::queue::{auth_key, KeyAlg};
use smp_relay::client::{new_corr_id, ClientTransmission};
use smp_relay::protocol::command::Command;
use smp_relay::protocol::response::BrokerMsg;
use support::*;

fn stop_cleanly(relay: &mut Relay) {
    let status = relay.stop();
    assert!(
        status.success(),
        "clean stop: {status:?}\n{}",
        relay.log_text()
    );
}

/// §9.2 item 17: a queue with a notifier and a deleted queue, across a clean restart; and a
/// notification that waits for its subscriber across it.
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

/// §9.2 item 18 with quota 4: one message delivered, four queued and a QUOTA; each clean restart
/// keeps what was not ACKed, including the marker, which is delivered last.
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

/// §9.2 item 19: two old and two newer messages; a restart with a long TTL keeps all four, a restart
/// with a TTL shorter than the old ones' age drops exactly those two.
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
        std::thread::sleep(std::time::Duration::from_millis(4200));
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
    relay.restart_with(&["--message-ttl-secs", "3"]);
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
