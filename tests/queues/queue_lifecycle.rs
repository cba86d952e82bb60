//! Queue lifecycle scenarios of the reference's `serverTests` ("SMP queues",
//! simplexmq `tests/ServerTests.hs`), at v18 over real TLS against the relay binary:
//! NEW, securing by KEY and SKEY, RKEY, OFF, DEL, many queues over reconnects, and NEW refused.

use crate::common;
use crate::support;

use common::{Relay, RelayOptions};
use smp_relay::client::queue::{self, auth_key, KeyAlg, RecipientKeys};
use smp_relay::protocol::command::{Command, QueueReq};
use smp_relay::protocol::response::BrokerMsg;
use smp_relay::protocol::version::max_message_length;
use support::*;

/// The reference's `testCreateSecure`: unsigned SEND before securing, ACK twice, KEY rules, signed
/// SEND after, size limits.
#[test]
fn create_and_secure_queue_with_key() {
    let relay = Relay::start();
    let (mut r, mut s) = (relay.client(), relay.client());
    let q = create(&mut r);

    assert_eq!(
        send(&mut s, &q, None, b"hello"),
        BrokerMsg::Ok,
        "accepts unsigned SEND"
    );
    let m1 = expect_body(&mut r, &q, b"hello");
    assert_eq!(
        ack(&mut r, &q, &m1.msg_id),
        BrokerMsg::Ok,
        "ACK with no more messages"
    );
    assert_eq!(
        ack(&mut r, &q, &m1.msg_id),
        ERR_NO_MSG,
        "second ACK of the same message"
    );

    let sender = auth_key(KeyAlg::Ed448);
    assert_eq!(
        send(&mut s, &q, Some(&sender), b"hello"),
        ERR_AUTH,
        "rejects signed SEND before KEY"
    );
    let key = Command::Key(sender.public_key());
    let r1 = request(&mut r, q.rid(), key.clone(), bad_sig());
    assert_eq!(r1.msg, Ok(ERR_AUTH), "rejects KEY with a wrong signature");
    assert_eq!(
        signed(&mut r, q.key(), q.sid(), key.clone()),
        ERR_AUTH,
        "rejects KEY with the sender ID"
    );
    assert_eq!(
        signed(&mut r, q.key(), q.rid(), key.clone()),
        BrokerMsg::Ok,
        "secures the queue"
    );
    assert_eq!(
        signed(&mut r, q.key(), q.rid(), key),
        BrokerMsg::Ok,
        "the same key again"
    );
    let other = auth_key(KeyAlg::Ed448).public_key();
    assert_eq!(
        signed(&mut r, q.key(), q.rid(), Command::Key(other)),
        ERR_AUTH,
        "another key"
    );

    assert_eq!(
        send(&mut s, &q, Some(&sender), b"hello again"),
        BrokerMsg::Ok,
        "accepts signed SEND"
    );
    let m2 = expect_body(&mut r, &q, b"hello again");
    assert_eq!(ack(&mut r, &q, &m2.msg_id), BrokerMsg::Ok);
    assert_eq!(
        send(&mut s, &q, None, b"hello"),
        ERR_AUTH,
        "rejects unsigned SEND once secured"
    );

    let max = vec![b'-'; max_message_length(18)];
    assert_eq!(max.len(), 16048);
    assert_eq!(send(&mut s, &q, Some(&sender), &max), BrokerMsg::Ok);
    let m3 = expect_msg(&mut r, &q);
    assert_eq!(
        m3.msg.body(),
        Some(&max[..]),
        "delivers a message of the maximum size"
    );
    assert_eq!(
        m3.enc_len, 16122,
        "MSG bodies are padded to 16106 and sealed"
    );
    let bigger = vec![b'-'; 16049];
    assert_eq!(send(&mut s, &q, Some(&sender), &bigger), ERR_LARGE_MSG);
    expect_nothing(&mut r, "the refused message is not delivered");
}

/// The reference's `testCreateSndSecure`: the sender secures a messaging queue with SKEY.
#[test]
fn create_and_secure_queue_with_skey() {
    let relay = Relay::start();
    let (mut r, mut s) = (relay.client(), relay.client());
    let q = create(&mut r);
    let sender = auth_key(KeyAlg::Ed448);
    let skey = Command::SKey(sender.public_key());

    let r1 = request(&mut s, q.sid(), skey.clone(), bad_sig());
    assert_eq!(r1.msg, Ok(ERR_AUTH), "rejects SKEY with a wrong signature");
    assert_eq!(
        signed(&mut s, &sender, q.rid(), skey.clone()),
        ERR_AUTH,
        "rejects SKEY with the recipient ID"
    );
    // `signed` checks that the response names the sender ID.
    assert_eq!(
        signed(&mut s, &sender, q.sid(), skey.clone()),
        BrokerMsg::Ok,
        "secures the queue"
    );
    let other = auth_key(KeyAlg::Ed448);
    assert_eq!(
        signed(&mut s, &other, q.sid(), Command::SKey(other.public_key())),
        ERR_AUTH,
        "rejects another key"
    );
    assert_eq!(
        signed(&mut s, &sender, q.sid(), skey),
        BrokerMsg::Ok,
        "the same key again"
    );

    send_ok(&mut s, &q, Some(&sender), b"hello");
    let m = expect_body(&mut r, &q, b"hello");
    assert_eq!(ack(&mut r, &q, &m.msg_id), BrokerMsg::Ok);
    assert_eq!(
        send(&mut s, &q, None, b"hello"),
        ERR_AUTH,
        "rejects unsigned SEND"
    );

    let max = vec![b'-'; 16048];
    send_ok(&mut s, &q, Some(&sender), &max);
    assert_eq!(expect_msg(&mut r, &q).msg.body(), Some(&max[..]));
    assert_eq!(
        send(&mut s, &q, Some(&sender), &[b'-'; 16049]),
        ERR_LARGE_MSG
    );
}

/// The reference's `testSndSecureProhibited`: a contact queue cannot be secured by its sender.
#[test]
fn skey_is_refused_on_contact_queue() {
    let relay = Relay::start();
    let (mut r, mut s) = (relay.client(), relay.client());
    let keys = RecipientKeys::generate(KeyAlg::Ed448);
    let mut new = queue::new_queue(&keys);
    new.queue_req = Some(QueueReq::Contact(None));
    let q = create_with(&mut r, keys, new);
    assert_eq!(
        q.ids.queue_mode,
        Some(smp_relay::protocol::command::QueueMode::Contact)
    );
    let sender = auth_key(KeyAlg::Ed448);
    assert_eq!(
        signed(&mut s, &sender, q.sid(), Command::SKey(sender.public_key())),
        ERR_AUTH
    );
    // Still an open contact address: unsigned SEND works.
    send_ok(&mut s, &q, None, b"request");
    expect_body(&mut r, &q, b"request");
}

/// The reference's `testCreateUpdateKeys`: RKEY replaces the recipient keys of a contact queue; a
/// key can remove itself.
#[test]
fn rkey_updates_recipient_keys() {
    let relay = Relay::start();
    let mut h = relay.client();
    let keys = RecipientKeys::generate(KeyAlg::Ed25519);
    let mut new = queue::new_queue(&keys);
    new.queue_req = Some(QueueReq::Contact(None));
    let q = create_with(&mut h, keys, new);
    let k1 = q.key().clone();
    let k2 = auth_key(KeyAlg::Ed25519);
    let (p1, p2) = (k1.public_key(), k2.public_key());
    let rid = q.rid().to_vec();
    let info = |m: BrokerMsg| matches!(m, BrokerMsg::Info(_));

    assert_eq!(
        signed(
            &mut h,
            &k1,
            &rid,
            Command::RKey(vec![p1.clone(), p2.clone()])
        ),
        BrokerMsg::Ok
    );
    assert!(
        info(signed(&mut h, &k1, &rid, Command::Que)),
        "old key still works"
    );
    assert!(
        info(signed(&mut h, &k2, &rid, Command::Que)),
        "new key works too"
    );
    assert_eq!(
        signed(&mut h, &k2, &rid, Command::RKey(vec![p2.clone()])),
        BrokerMsg::Ok,
        "remove the old key"
    );
    assert_eq!(
        signed(&mut h, &k1, &rid, Command::Que),
        ERR_AUTH,
        "old key no longer works"
    );
    assert_eq!(
        signed(
            &mut h,
            &k2,
            &rid,
            Command::RKey(vec![p1.clone(), p2.clone()])
        ),
        BrokerMsg::Ok
    );
    assert!(
        info(signed(&mut h, &k1, &rid, Command::Que)),
        "old key works again"
    );
    assert_eq!(
        signed(&mut h, &k1, &rid, Command::RKey(vec![p2])),
        BrokerMsg::Ok,
        "a key removes itself"
    );
    assert_eq!(signed(&mut h, &k1, &rid, Command::Que), ERR_AUTH);
    assert!(info(signed(&mut h, &k2, &rid, Command::Que)));
}

/// RKEY on a messaging queue is refused (contact queues only, simplexmq `Server.hs`).
#[test]
fn rkey_is_refused_on_messaging_queue() {
    let relay = Relay::start();
    let mut h = relay.client();
    let q = create(&mut h);
    let k2 = auth_key(KeyAlg::Ed25519);
    let keys = vec![q.key().public_key(), k2.public_key()];
    assert_eq!(
        signed(&mut h, q.key(), q.rid(), Command::RKey(keys)),
        ERR_AUTH
    );
    assert_eq!(
        signed(&mut h, &k2, q.rid(), Command::Que),
        ERR_AUTH,
        "the second key was not added"
    );
}

/// The reference's `testCreateDelete`: OFF and DEL, with their refusals, and SUB after OFF
/// re-delivering the unACKed message.
#[test]
fn suspend_and_delete_queue() {
    let relay = Relay::start();
    let (mut rh, mut sh) = (relay.client(), relay.client());
    let keys = RecipientKeys::generate(KeyAlg::Ed25519);
    let new = queue::new_queue(&keys);
    let q = create_with(&mut rh, keys, new);
    let sender = auth_key(KeyAlg::Ed25519);
    assert_eq!(
        signed(&mut rh, q.key(), q.rid(), Command::Key(sender.public_key())),
        BrokerMsg::Ok
    );

    send_ok(&mut sh, &q, Some(&sender), b"hello");
    send_ok(&mut sh, &q, Some(&sender), b"hello 2");
    let m1 = expect_body(&mut rh, &q, b"hello");
    expect_nothing(&mut rh, "the second message waits for the ACK of the first");

    let r1 = request(&mut rh, q.rid(), Command::Off, bad_sig());
    assert_eq!(r1.msg, Ok(ERR_AUTH), "rejects OFF with a wrong signature");
    assert_eq!(
        signed(&mut rh, q.key(), q.sid(), Command::Off),
        ERR_AUTH,
        "rejects OFF with the sender ID"
    );
    assert_eq!(
        signed(&mut rh, q.key(), q.rid(), Command::Off),
        BrokerMsg::Ok,
        "suspends the queue"
    );
    assert_eq!(
        send(&mut sh, &q, Some(&sender), b"hello"),
        ERR_AUTH,
        "rejects signed SEND when off"
    );
    assert_eq!(
        send(&mut sh, &q, None, b"hello"),
        ERR_AUTH,
        "rejects unsigned SEND when off"
    );
    assert_eq!(
        signed(&mut rh, q.key(), q.rid(), Command::Off),
        BrokerMsg::Ok,
        "OFF again"
    );

    let again = sub_with_msg(&mut rh, &q);
    assert_eq!(
        again.msg_id, m1.msg_id,
        "SUB when suspended re-delivers the unACKed message"
    );
    assert_eq!(again.msg.body(), Some(&b"hello"[..]));

    let r2 = request(&mut rh, q.rid(), Command::Del, bad_sig());
    assert_eq!(r2.msg, Ok(ERR_AUTH), "rejects DEL with a wrong signature");
    assert_eq!(
        signed(&mut rh, q.key(), q.sid(), Command::Del),
        ERR_AUTH,
        "rejects DEL with the sender ID"
    );
    assert_eq!(
        signed(&mut rh, q.key(), q.rid(), Command::Del),
        BrokerMsg::Ok,
        "deletes the queue"
    );
    assert_eq!(
        send(&mut sh, &q, Some(&sender), b"hello"),
        ERR_AUTH,
        "signed SEND when deleted"
    );
    assert_eq!(
        send(&mut sh, &q, None, b"hello"),
        ERR_AUTH,
        "unsigned SEND when deleted"
    );
    assert_eq!(ack(&mut rh, &q, b""), ERR_AUTH, "ACK when deleted");
    assert_eq!(
        signed(&mut rh, q.key(), q.rid(), Command::Off),
        ERR_AUTH,
        "OFF when deleted"
    );
    assert_eq!(
        signed(&mut rh, q.key(), q.rid(), Command::Sub),
        ERR_AUTH,
        "SUB when deleted"
    );
    assert_eq!(
        signed(&mut rh, q.key(), q.rid(), Command::Del),
        ERR_AUTH,
        "DEL when deleted"
    );
    expect_nothing(&mut rh, "the deleting connection gets no DELD");
}

/// The reference's `stressTest`: 50 queues created on one connection, subscribed from a second and
/// then a third.
#[test]
fn many_queues_survive_reconnects() {
    let relay = Relay::start_with(RelayOptions {
        cores: 2,
        ..Default::default()
    });
    let keys = RecipientKeys::generate(KeyAlg::Ed25519);
    let mut h1 = relay.client();
    let rids: Vec<Vec<u8>> = (0..50)
        .map(|_| {
            let new = queue::new_queue(&keys);
            create_with(&mut h1, keys.clone(), new).rid().to_vec()
        })
        .collect();
    drop(h1);
    for round in 0..2 {
        let mut h = relay.client();
        for rid in &rids {
            let r = signed(&mut h, &keys.auth, rid, Command::Sub);
            assert_eq!(r, BrokerMsg::Sok(None), "round {round}");
        }
    }
}

/// The reference's `testAllowNewQueues`: with `--new-queues off` NEW is refused with AUTH.
#[test]
fn new_queues_off_refuses_new() {
    let relay = Relay::start_with(RelayOptions {
        extra_args: vec!["--new-queues".into(), "off".into()],
        ..Default::default()
    });
    let mut h = relay.client();
    let keys = RecipientKeys::generate(KeyAlg::Ed448);
    let corr = smp_relay::client::new_corr_id();
    let t = smp_relay::client::ClientTransmission::new(
        &corr,
        b"",
        Command::New(queue::new_queue(&keys)),
    )
    .signed(keys.auth.clone());
    h.send_batch(&[t]).expect("send NEW");
    let r = h.recv_for(&corr).expect("response");
    assert_eq!(r.entity_id, b"");
    assert_eq!(r.msg, Ok(ERR_AUTH));
}

/// QUE (simplexmq `Server/QueueStore/QueueInfo.hs`): sender key and notifier presence, this
/// connection's subscription with its delivered message, the size, and the head message (`qiMsg`,
/// as the reference's `getQueueInfo` peeks it) with its type, message or quota.
#[test]
fn que_describes_the_queue() {
    use base64::Engine;
    let relay = common::Relay::start_with(RelayOptions {
        extra_args: vec!["--quota".into(), "1".into()],
        ..Default::default()
    });
    let (mut r, mut s) = (relay.client(), relay.client());
    let q = create(&mut r);
    let que = |c: &mut smp_relay::client::Client| match signed(c, q.key(), q.rid(), Command::Que) {
        BrokerMsg::Info(json) => json,
        other => panic!("QUE: {other:?}"),
    };
    let empty = que(&mut r);
    assert!(
        empty.starts_with("{\"qiSnd\":false,\"qiNtf\":false,"),
        "{empty}"
    );
    assert!(empty.contains("\"qiSize\":0"), "{empty}");
    assert!(!empty.contains("qiMsg"), "no head message: {empty}");

    send_ok(&mut s, &q, None, b"one");
    assert_eq!(send(&mut s, &q, None, b"two"), ERR_QUOTA);
    let m = expect_body(&mut r, &q, b"one");
    let id = base64::engine::general_purpose::STANDARD.encode(&m.msg_id);
    let full = que(&mut r);
    assert!(
        full.contains("\"qiSize\":2"),
        "the message and the marker: {full}"
    );
    assert!(full.contains(&format!("\"qDelivered\":\"{id}\"")), "{full}");
    assert!(
        full.contains(&format!("\"qiMsg\":{{\"msgId\":\"{id}\",\"msgTs\":\"")),
        "the head message: {full}"
    );
    assert!(full.contains("\"msgType\":\"message\""), "{full}");
    let ts = iso8601(m.msg.ts());
    assert!(
        full.contains(&format!("\"msgTs\":\"{ts}\"")),
        "{ts} in {full}"
    );

    let marker = msg_of(&q, ack(&mut r, &q, &m.msg_id));
    assert!(is_quota(&marker));
    let at_marker = que(&mut r);
    assert!(at_marker.contains("\"msgType\":\"quota\""), "{at_marker}");
    assert!(at_marker.contains("\"qiSize\":1"), "{at_marker}");
}

/// Unix seconds as aeson writes a whole-second `UTCTime`: `YYYY-MM-DDTHH:MM:SSZ`.
fn iso8601(secs: i64) -> String {
    let days = secs.div_euclid(86400);
    let rem = secs.rem_euclid(86400);
    // Days since 1970-01-01 to a civil date (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[test]
fn iso8601_matches_known_dates() {
    assert_eq!(iso8601(0), "1970-01-01T00:00:00Z");
    assert_eq!(iso8601(951_782_400), "2000-02-29T00:00:00Z");
    assert_eq!(iso8601(1_700_000_000), "2023-11-14T22:13:20Z");
}
