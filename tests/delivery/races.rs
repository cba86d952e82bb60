//! Delivery races (`docs/ARCHITECTURE.md` §3): the reference reads a SUB batch's first messages
//! before it registers the subscriber, so a SEND in between is neither returned nor pushed (T1).
//! Here registration and the read happen in one owner turn. Each scenario runs on one and on two
//! shards. `SMP_RELAY_TEST_LATE_REGISTRATION=1 cargo test --test delivery races::t1_` must fail:
//! its relays start with `--test-late-registration` and register late, as the reference does, and
//! CI checks that these tests catch it.

use crate::common;
use crate::support;

use std::time::Duration;

use common::{Relay, RelayOptions};
use smp_relay::client::queue::{self};
use smp_relay::protocol::command::Command;
use smp_relay::protocol::response::BrokerMsg;
use support::*;

fn relay(cores: usize) -> Relay {
    let late = std::env::var_os("SMP_RELAY_TEST_LATE_REGISTRATION").is_some_and(|v| v == "1");
    Relay::start_with(RelayOptions {
        cores,
        extra_args: match late {
            true => vec!["--test-late-registration".into()],
            false => Vec::new(),
        },
    })
}

/// T1: SUB on an empty queue, then a SEND as soon as the SOK is back: the subscriber must get the
/// message pushed. With late registration the SEND finds no subscriber and the message waits for
/// the next SUB (the stall `docs/ARCHITECTURE.md` §3 describes).
fn t1(cores: usize) {
    let r = relay(cores);
    let mut recipient = r.client();
    let mut sender = r.client();
    for round in 0..5 {
        let q = create_only(&mut recipient);
        sub_empty(&mut recipient, &q);
        let body = format!("right after SOK {round}");
        send_ok(&mut sender, &q, None, body.as_bytes());
        recipient
            .set_timeout(Duration::from_secs(3))
            .expect("timeout");
        let m = recipient.recv().unwrap_or_else(|e| {
            panic!("round {round}: the message sent after SOK was not pushed ({e})")
        });
        assert_eq!(m.entity_id, q.rid(), "MSG for the subscribed queue");
        let got = queue::receive(&q.secret, &m).expect("MSG decrypts");
        assert_eq!(got.msg.body(), Some(body.as_bytes()));
        assert_eq!(ack(&mut recipient, &q, &got.msg_id), BrokerMsg::Ok);
    }
}

#[test]
fn t1_send_right_after_sub_is_pushed_one_shard() {
    t1(1);
}

#[test]
fn t1_send_right_after_sub_is_pushed_two_shards() {
    t1(2);
}

/// A re-SUB while a MSG waits for its ACK re-delivers it, and later messages still follow.
fn resub_while_delivery_waits(cores: usize) {
    let r = relay(cores);
    let mut a = r.client();
    let mut s = r.client();
    let q = create(&mut a);
    send_ok(&mut s, &q, None, b"one");
    let first = expect_body(&mut a, &q, b"one");
    send_ok(&mut s, &q, None, b"two");
    // Re-SUB: SOK and the same unacknowledged message again.
    let again = sub_with_msg(&mut a, &q);
    assert_eq!(again.msg_id, first.msg_id, "re-SUB re-delivers the head");
    let next = ack(&mut a, &q, &first.msg_id);
    assert_eq!(
        body_of(&q, next.clone()),
        b"two",
        "ACK answers with the next message"
    );
    let second = msg_of(&q, next);
    assert_eq!(ack(&mut a, &q, &second.msg_id), BrokerMsg::Ok);
    send_ok(&mut s, &q, None, b"three");
    expect_body(&mut a, &q, b"three");
}

#[test]
fn resub_while_a_delivery_waits_one_shard() {
    resub_while_delivery_waits(1);
}

#[test]
fn resub_while_a_delivery_waits_two_shards() {
    resub_while_delivery_waits(2);
}

/// SUB from another connection while a MSG is unacknowledged: the new subscriber gets it, the old
/// one gets END and its ACK is refused.
fn takeover_with_unacked(cores: usize) {
    let r = relay(cores);
    let mut a = r.client();
    let mut b = r.client();
    let mut s = r.client();
    let q = create(&mut a);
    send_ok(&mut s, &q, None, b"pending");
    let m = expect_body(&mut a, &q, b"pending");
    let again = sub_with_msg(&mut b, &q);
    assert_eq!(again.msg_id, m.msg_id);
    let end = next(&mut a);
    assert_eq!(end.entity_id, q.rid());
    assert_eq!(
        end.msg,
        Ok(BrokerMsg::End),
        "the previous subscriber gets END"
    );
    assert_eq!(ack(&mut a, &q, &m.msg_id), ERR_NO_MSG);
    assert_eq!(ack(&mut b, &q, &m.msg_id), BrokerMsg::Ok);
    send_ok(&mut s, &q, None, b"after");
    expect_body(&mut b, &q, b"after");
}

#[test]
fn sub_from_another_connection_while_a_msg_is_unacknowledged_one_shard() {
    takeover_with_unacked(1);
}

#[test]
fn sub_from_another_connection_while_a_msg_is_unacknowledged_two_shards() {
    takeover_with_unacked(2);
}

/// DEL from another connection of the recipient while subscribed: the subscriber gets DELD, the
/// deleting connection only its OK, and the queue is gone for senders.
fn del_while_subscribed(cores: usize) {
    let r = relay(cores);
    let mut a = r.client();
    let mut b = r.client();
    let mut s = r.client();
    let q = create(&mut a);
    send_ok(&mut s, &q, None, b"unread");
    expect_body(&mut a, &q, b"unread");
    assert_eq!(
        signed(&mut b, q.key(), q.rid(), Command::Del),
        BrokerMsg::Ok
    );
    let deld = next(&mut a);
    assert_eq!(deld.entity_id, q.rid());
    assert_eq!(deld.msg, Ok(BrokerMsg::Deld), "the subscriber gets DELD");
    assert_eq!(send(&mut s, &q, None, b"late"), ERR_AUTH);
    b.set_timeout(QUIET).expect("timeout");
    assert!(
        b.recv().is_err(),
        "the deleting connection gets nothing more"
    );
}

#[test]
fn del_while_subscribed_one_shard() {
    del_while_subscribed(1);
}

#[test]
fn del_while_subscribed_two_shards() {
    del_while_subscribed(2);
}
