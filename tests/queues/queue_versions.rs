//! The queue round at every protocol version a client may still use (6, 8, 9, 14, 15, 16, 17, 18,
//! 19 and 20), and the apps' server test at every version the relay advertises: NEW and the
//! per-version form of IDS, SEND and MSG, SUB answered `SOK` (`OK` below v16) with the pending MSG in the same block, END to the previous subscriber, DEL giving
//! `DELD` (`END` below v10), and the per-version maximum message size
//! (simplexmq `Protocol.hs`, `Transport.hs`).

use crate::common;
use crate::support;

use common::Relay;
use smp_relay::client::queue::{self, auth_key, KeyAlg, NotifierKeys, RecipientKeys};
use smp_relay::client::{Client, ClientOptions};
use smp_relay::protocol::command::{Command, QueueMode};
use smp_relay::protocol::response::BrokerMsg;
use smp_relay::protocol::version::{max_message_length, Version};
use support::*;

fn connect(relay: &Relay, v: Version) -> Client {
    let c = relay
        .connect(ClientOptions {
            version: Some(v),
            ..Default::default()
        })
        .unwrap_or_else(|e| panic!("connect at v{v}: {e}"));
    assert_eq!(c.version(), v);
    c
}

fn round_at(relay: &Relay, v: Version) {
    let (mut rc, mut rc2, mut sc) = (connect(relay, v), connect(relay, v), connect(relay, v));
    let keys = RecipientKeys::generate(KeyAlg::Ed25519);
    let nkeys = NotifierKeys::generate(KeyAlg::Ed25519);
    let mut new = queue::new_queue(&keys);
    new.ntf_creds = Some(nkeys.creds());
    let q = create_with(&mut rc, keys, new);

    // IDS carries what the version can carry.
    let mode = match v {
        ..=8 => None,
        _ => Some(QueueMode::Messaging),
    };
    assert_eq!(q.ids.queue_mode, mode, "v{v} queue mode");
    assert_eq!(q.ids.link_id, None, "v{v} link ID");
    assert_eq!(q.ids.service_id, None, "v{v} service ID");
    assert_eq!(
        q.ids.srv_ntf_creds.is_some(),
        v >= 17,
        "v{v}: notifier credentials travel in NEW/IDS from v17"
    );

    send_ok(&mut sc, &q, None, format!("hello v{v}").as_bytes());
    let m1 = expect_body(&mut rc, &q, format!("hello v{v}").as_bytes());

    // Another connection takes the subscription: SOK/OK and the unACKed MSG in one block, END to
    // the first connection.
    let again = sub_with_msg(&mut rc2, &q);
    assert_eq!(again.msg_id, m1.msg_id, "v{v}");
    expect_event(&mut rc, q.rid(), BrokerMsg::End);
    assert_eq!(ack(&mut rc, &q, &m1.msg_id), ERR_NO_MSG, "v{v}");
    assert_eq!(ack(&mut rc2, &q, &m1.msg_id), BrokerMsg::Ok, "v{v}");

    // Securing: KEY at every version, signed SEND after it.
    let sender = auth_key(KeyAlg::Ed448);
    assert_eq!(
        signed(&mut rc, q.key(), q.rid(), Command::Key(sender.public_key())),
        BrokerMsg::Ok
    );
    let max = vec![b'x'; max_message_length(v)];
    send_ok(&mut sc, &q, Some(&sender), &max);
    let m2 = expect_msg(&mut rc2, &q);
    assert_eq!(m2.msg.body(), Some(&max[..]), "v{v}: the largest message");
    let over = vec![b'x'; max_message_length(v) + 1];
    assert_eq!(
        send(&mut sc, &q, Some(&sender), &over),
        ERR_LARGE_MSG,
        "v{v}"
    );
    assert_eq!(ack(&mut rc2, &q, &m2.msg_id), BrokerMsg::Ok);

    // DEL from the first connection: the subscriber is told.
    assert_eq!(
        signed(&mut rc, q.key(), q.rid(), Command::Del),
        BrokerMsg::Ok
    );
    let deld = if v >= 10 {
        BrokerMsg::Deld
    } else {
        BrokerMsg::End
    };
    expect_event(&mut rc2, q.rid(), deld);
    expect_nothing(&mut rc, "the deleting connection");
}

#[test]
fn queue_round_at_v6() {
    round_at(&Relay::start(), 6);
}

#[test]
fn queue_round_at_v8() {
    round_at(&Relay::start(), 8);
}

#[test]
fn queue_round_at_v9() {
    round_at(&Relay::start(), 9);
}

#[test]
fn queue_round_at_v14() {
    round_at(&Relay::start(), 14);
}

#[test]
fn queue_round_at_v15() {
    round_at(&Relay::start(), 15);
}

#[test]
fn queue_round_at_v16() {
    round_at(&Relay::start(), 16);
}

#[test]
fn queue_round_at_v17() {
    round_at(&Relay::start(), 17);
}

#[test]
fn queue_round_at_v18() {
    round_at(&Relay::start(), 18);
}

#[test]
fn queue_round_at_v19() {
    round_at(&Relay::start(), 19);
}

#[test]
fn queue_round_at_v20() {
    round_at(&Relay::start(), 20);
}

/// Every version the relay advertises is negotiated, and the SimpleX apps' server test passes at
/// it: create a queue, secure it (by the sender, SKEY, from v9; by the recipient, KEY, before),
/// send and receive over it, delete it.
#[test]
fn every_advertised_version_passes_the_apps_server_test() {
    let relay = Relay::start();
    let advertised = smp_relay::protocol::version::SERVER_VERSIONS;
    assert_eq!((advertised.min, advertised.max), (6, 20));
    for v in advertised.min..=advertised.max {
        let (mut rc, mut sc) = (connect(&relay, v), connect(&relay, v));
        let q = create(&mut rc);
        let sender = auth_key(KeyAlg::Ed25519);
        let (by, entity, key) = if v >= 9 {
            (&mut sc, q.sid(), Command::SKey(sender.public_key()))
        } else {
            (&mut rc, q.rid(), Command::Key(sender.public_key()))
        };
        let signer = if v >= 9 { &sender } else { q.key() };
        assert_eq!(
            signed(by, signer, entity, key),
            BrokerMsg::Ok,
            "v{v}: secure"
        );
        send_ok(&mut sc, &q, Some(&sender), format!("v{v}").as_bytes());
        let m = expect_body(&mut rc, &q, format!("v{v}").as_bytes());
        assert_eq!(ack(&mut rc, &q, &m.msg_id), BrokerMsg::Ok, "v{v}: ACK");
        assert_eq!(
            signed(&mut rc, q.key(), q.rid(), Command::Del),
            BrokerMsg::Ok,
            "v{v}: DEL"
        );
    }
}

/// SKEY exists from v9: a messaging queue made at v9 can be secured by its sender.
#[test]
fn sender_secures_queue_at_v9() {
    let relay = Relay::start();
    let (mut rc, mut sc) = (connect(&relay, 9), connect(&relay, 9));
    let q = create(&mut rc);
    let sender = auth_key(KeyAlg::Ed25519);
    assert_eq!(
        signed(
            &mut sc,
            &sender,
            q.sid(),
            Command::SKey(sender.public_key())
        ),
        BrokerMsg::Ok
    );
    send_ok(&mut sc, &q, Some(&sender), b"secured at v9");
    expect_body(&mut rc, &q, b"secured at v9");
}

/// A queue made at v8 has no mode (legacy): its sender cannot secure it with SKEY at a later
/// version, and without a sender key it counts as a contact address.
#[test]
fn legacy_queue_cannot_be_secured_by_sender() {
    let relay = Relay::start();
    let mut rc = connect(&relay, 8);
    let q = create(&mut rc);
    assert_eq!(q.ids.queue_mode, None);
    let mut sc = relay.client();
    let sender = auth_key(KeyAlg::Ed25519);
    assert_eq!(
        signed(
            &mut sc,
            &sender,
            q.sid(),
            Command::SKey(sender.public_key())
        ),
        ERR_AUTH
    );
    send_ok(&mut sc, &q, None, b"unsecured");
    expect_body(&mut rc, &q, b"unsecured");
}
