//! Notification scenarios (simplexmq `Server.hs`, `Server/NtfStore.hs`,
//! `tests/ServerTests.hs`) at v18 over real TLS: NKEY, NSUB, NMSG content, END to the previous
//! notifier subscriber, NDEL with DELD, and notifier credentials in NEW (v17+).

use crate::common;
use crate::support;

use common::Relay;
use smp_relay::client::queue::{self, auth_key, receive_nmsg, KeyAlg, NotifierKeys, RecipientKeys};
use smp_relay::client::{new_corr_id, ClientTransmission};
use smp_relay::protocol::command::Command;
use smp_relay::protocol::error::ErrorType;
use smp_relay::protocol::response::BrokerMsg;
use support::*;

/// SEND with the notification flag, MSG to the recipient and its ACK; returns the message.
fn deliver(
    rh: &mut smp_relay::client::Client,
    sh: &mut smp_relay::client::Client,
    q: &Queue,
    sender: &smp_relay::client::Signer,
    body: &[u8],
) -> smp_relay::client::queue::Received {
    assert_eq!(
        send_as(sh, q.sid(), Some(sender), send_ntf_cmd(body)),
        BrokerMsg::Ok
    );
    let m = expect_body(rh, q, body);
    assert_eq!(ack(rh, q, &m.msg_id), BrokerMsg::Ok);
    m
}

/// The reference's `testMessageNotifications` (simplexmq `tests/ServerTests.hs`).
#[test]
fn notifier_subscribes_and_receives_notifications() {
    let relay = Relay::start();
    let sender = auth_key(KeyAlg::Ed25519);
    let (mut rh, mut sh, mut nh1, mut nh2) = (
        relay.client(),
        relay.client(),
        relay.client(),
        relay.client(),
    );
    let q = create_secured(&mut rh, &sender);
    let first = nkey(&mut rh, &q);
    let n = nkey(&mut rh, &q);
    assert_ne!(first.nid, n.nid, "NKEY again gives a new notifier ID");
    assert_eq!(
        nsub(&mut nh1, &first),
        ERR_AUTH,
        "the replaced notifier is gone"
    );

    // A service signature outside a service session.
    let corr = new_corr_id();
    let mut t = ClientTransmission::new(&corr, &n.nid, Command::NSub).signed(n.keys.auth.clone());
    t.service_sig = Some(vec![7u8; 64]);
    nh1.send_batch(&[t]).unwrap();
    let r = nh1.recv_for(&corr).unwrap();
    assert_eq!(r.msg, Ok(BrokerMsg::Err(ErrorType::Service)));

    assert_eq!(nsub(&mut nh1, &n), BrokerMsg::Sok(None));
    let m1 = deliver(&mut rh, &mut sh, &q, &sender, b"hello");
    let meta = expect_nmsg(&mut nh1, &n);
    assert_eq!(meta.msg_id, m1.msg_id, "NMSG names the message");
    assert_eq!(meta.ts, m1.msg.ts(), "and its time");

    assert_eq!(nsub(&mut nh2, &n), BrokerMsg::Sok(None));
    expect_event(&mut nh1, &n.nid, BrokerMsg::End);
    let m2 = deliver(&mut rh, &mut sh, &q, &sender, b"hello again");
    assert_eq!(expect_nmsg(&mut nh2, &n).msg_id, m2.msg_id);
    expect_nothing(&mut nh1, "nothing else to the first notifier connection");

    assert_eq!(
        signed(&mut rh, q.key(), q.rid(), Command::NDel),
        BrokerMsg::Ok
    );
    expect_event(&mut nh2, &n.nid, BrokerMsg::Deld);
    deliver(&mut rh, &mut sh, &q, &sender, b"hello there");
    expect_nothing(&mut nh2, "no NMSG after NDEL");
    assert_eq!(nsub(&mut nh2, &n), ERR_AUTH, "NSUB of a deleted notifier");

    let n3 = nkey(&mut rh, &q);
    assert_eq!(nsub(&mut nh1, &n3), BrokerMsg::Sok(None));
    let m4 = deliver(&mut rh, &mut sh, &q, &sender, b"one more");
    assert_eq!(expect_nmsg(&mut nh1, &n3).msg_id, m4.msg_id);
}

/// Only SENDs with the notification flag notify.
#[test]
fn send_without_notification_flag_does_not_notify() {
    let relay = Relay::start();
    let sender = auth_key(KeyAlg::Ed25519);
    let (mut rh, mut sh, mut nh) = (relay.client(), relay.client(), relay.client());
    let q = create_secured(&mut rh, &sender);
    let n = nkey(&mut rh, &q);
    assert_eq!(nsub(&mut nh, &n), BrokerMsg::Sok(None));
    send_ok(&mut sh, &q, Some(&sender), b"quiet");
    let m = expect_body(&mut rh, &q, b"quiet");
    assert!(matches!(
        m.msg,
        queue::RcvMsg::Message {
            notification: false,
            ..
        }
    ));
    assert_eq!(ack(&mut rh, &q, &m.msg_id), BrokerMsg::Ok);
    expect_nothing(&mut nh, "no NMSG without the flag");
    let m2 = deliver(&mut rh, &mut sh, &q, &sender, b"loud");
    assert!(matches!(
        m2.msg,
        queue::RcvMsg::Message {
            notification: true,
            ..
        }
    ));
    assert_eq!(expect_nmsg(&mut nh, &n).msg_id, m2.msg_id);
}

/// Notifications of SENDs made while nobody was subscribed follow a later NSUB, oldest first.
#[test]
fn notifications_wait_for_nsub() {
    let relay = Relay::start();
    let sender = auth_key(KeyAlg::Ed25519);
    let (mut rh, mut sh, mut nh) = (relay.client(), relay.client(), relay.client());
    let q = create_secured(&mut rh, &sender);
    let n = nkey(&mut rh, &q);
    let a = deliver(&mut rh, &mut sh, &q, &sender, b"a");
    let b = deliver(&mut rh, &mut sh, &q, &sender, b"b");
    assert_eq!(nsub(&mut nh, &n), BrokerMsg::Sok(None));
    assert_eq!(expect_nmsg(&mut nh, &n).msg_id, a.msg_id);
    assert_eq!(expect_nmsg(&mut nh, &n).msg_id, b.msg_id);
    expect_nothing(&mut nh, "each notification once");
}

/// DEL of a queue with a notifier: its notifier subscriber gets DELD.
#[test]
fn delete_queue_ends_notifier_subscription() {
    let relay = Relay::start();
    let (mut rh, mut nh) = (relay.client(), relay.client());
    let q = create(&mut rh);
    let n = nkey(&mut rh, &q);
    assert_eq!(nsub(&mut nh, &n), BrokerMsg::Sok(None));
    assert_eq!(
        signed(&mut rh, q.key(), q.rid(), Command::Del),
        BrokerMsg::Ok
    );
    expect_event(&mut nh, &n.nid, BrokerMsg::Deld);
    assert_eq!(nsub(&mut nh, &n), ERR_AUTH);
}

/// NEW with notifier credentials (v17+) creates the notifier in one step: IDS carries its ID and
/// the server's DH key, and NSUB/NMSG work with them.
#[test]
fn new_with_notifier_credentials() {
    let relay = Relay::start();
    let (mut rh, mut sh, mut nh) = (relay.client(), relay.client(), relay.client());
    let keys = RecipientKeys::generate(KeyAlg::Ed25519);
    let nkeys = NotifierKeys::generate(KeyAlg::Ed25519);
    let mut new = queue::new_queue(&keys);
    new.ntf_creds = Some(nkeys.creds());
    let q = create_with(&mut rh, keys, new);
    let creds = q
        .ids
        .srv_ntf_creds
        .clone()
        .expect("IDS has notifier credentials");
    assert_eq!(creds.notifier_id.len(), 24);
    let n = Notifier {
        secret: nkeys.dh.shared(&creds.srv_ntf_dh_key),
        keys: nkeys,
        nid: creds.notifier_id,
    };
    assert_eq!(nsub(&mut nh, &n), BrokerMsg::Sok(None));
    assert_eq!(
        send_as(&mut sh, q.sid(), None, send_ntf_cmd(b"hi")),
        BrokerMsg::Ok
    );
    let m = expect_body(&mut rh, &q, b"hi");
    let t = next(&mut nh);
    assert_eq!(t.entity_id, n.nid);
    let meta = receive_nmsg(&n.secret, &t).unwrap();
    assert_eq!(meta.msg_id, m.msg_id);
}

/// NKEY on a queue whose notifier has a subscriber: the old notifier ID's subscriber gets DELD.
#[test]
fn nkey_again_ends_old_notifier_subscription() {
    let relay = Relay::start();
    let (mut rh, mut nh) = (relay.client(), relay.client());
    let q = create(&mut rh);
    let old = nkey(&mut rh, &q);
    assert_eq!(nsub(&mut nh, &old), BrokerMsg::Sok(None));
    let new = nkey(&mut rh, &q);
    expect_event(&mut nh, &old.nid, BrokerMsg::Deld);
    assert_eq!(nsub(&mut nh, &new), BrokerMsg::Sok(None));
    assert_eq!(
        nsub(&mut nh, &new),
        BrokerMsg::Sok(None),
        "NSUB again on the same connection"
    );
    expect_nothing(&mut nh, "no END to oneself");
}

/// The quota marker is not notified (simplexmq `Server.hs`): with quota 1, the SEND that gets QUOTA
/// makes no NMSG.
#[test]
fn quota_marker_is_not_notified() {
    let relay = common::Relay::start_with(common::RelayOptions {
        extra_args: vec!["--quota".into(), "1".into()],
        ..Default::default()
    });
    let (mut rh, mut sh, mut nh) = (relay.client(), relay.client(), relay.client());
    let q = create(&mut rh);
    let n = nkey(&mut rh, &q);
    assert_eq!(nsub(&mut nh, &n), BrokerMsg::Sok(None));
    assert_eq!(
        send_as(&mut sh, q.sid(), None, send_ntf_cmd(b"1")),
        BrokerMsg::Ok
    );
    assert_eq!(
        send_as(&mut sh, q.sid(), None, send_ntf_cmd(b"2")),
        ERR_QUOTA
    );
    let m = expect_body(&mut rh, &q, b"1");
    assert_eq!(expect_nmsg(&mut nh, &n).msg_id, m.msg_id);
    expect_nothing(&mut nh, "no NMSG for the refused message or the marker");
    let marker = msg_of(&q, ack(&mut rh, &q, &m.msg_id));
    assert!(is_quota(&marker));
}

/// The notification scenario with two shards: notifier, recipient and sender connections and the
/// queue's owner fall on either shard.
#[test]
fn notifications_across_two_cores() {
    let relay = common::Relay::start_with(common::RelayOptions {
        cores: 2,
        ..Default::default()
    });
    for _ in 0..3 {
        let sender = auth_key(KeyAlg::Ed25519);
        let (mut rh, mut sh, mut nh1, mut nh2) = (
            relay.client(),
            relay.client(),
            relay.client(),
            relay.client(),
        );
        let q = create_secured(&mut rh, &sender);
        let n = nkey(&mut rh, &q);
        assert_eq!(nsub(&mut nh1, &n), BrokerMsg::Sok(None));
        let m1 = deliver(&mut rh, &mut sh, &q, &sender, b"one");
        assert_eq!(expect_nmsg(&mut nh1, &n).msg_id, m1.msg_id);
        assert_eq!(nsub(&mut nh2, &n), BrokerMsg::Sok(None));
        expect_event(&mut nh1, &n.nid, BrokerMsg::End);
        let m2 = deliver(&mut rh, &mut sh, &q, &sender, b"two");
        assert_eq!(expect_nmsg(&mut nh2, &n).msg_id, m2.msg_id);
        assert_eq!(
            signed(&mut rh, q.key(), q.rid(), Command::NDel),
            BrokerMsg::Ok
        );
        expect_event(&mut nh2, &n.nid, BrokerMsg::Deld);
        expect_nothing(&mut nh1, "first notifier connection");
    }
}
