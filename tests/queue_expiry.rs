//! Message expiration scenarios (`reference/smp-server-behaviour.md` §4.2, §9.2 items 25–27) with a
//! 1-second TTL: expiry on SEND, expiry by the periodic run, and no expiry before the run.
//! These tests wait on purpose: their subject is time.

mod common;
mod support;

use std::time::Duration;

use common::{Relay, RelayOptions};
use smp_relay::client::queue::{auth_key, KeyAlg};
use smp_relay::client::Signer;
use support::*;

fn relay_with(args: &[&str]) -> Relay {
    Relay::start_with(RelayOptions {
        extra_args: args.iter().map(|a| a.to_string()).collect(),
        ..Default::default()
    })
}

/// A secured queue whose creating connection has closed, so nothing is pushed.
fn orphan_queue(relay: &Relay, sender: &Signer) -> Queue {
    let mut rh = relay.client();
    create_secured(&mut rh, sender)
}

/// §9.2 item 25: with expiry on SEND, the first message has expired when the second is sent.
#[test]
fn expired_message_is_dropped_on_send() {
    let relay = relay_with(&[
        "--message-ttl-secs",
        "1",
        "--expire-interval-secs",
        "10000",
        "--expire-on-send",
        "on",
    ]);
    let sender = auth_key(KeyAlg::Ed25519);
    let q = orphan_queue(&relay, &sender);
    let mut sh = relay.client();
    send_ok(&mut sh, &q, Some(&sender), b"hello (should expire)");
    std::thread::sleep(Duration::from_millis(2500));
    send_ok(&mut sh, &q, Some(&sender), b"hello (should NOT expire)");
    let mut rh = relay.client();
    let m = sub_with_msg(&mut rh, &q);
    assert_eq!(m.msg.body(), Some(&b"hello (should NOT expire)"[..]));
    expect_nothing(&mut rh, "nothing else is delivered");
}

/// §9.2 item 26: the periodic run (every second) drops the expired message.
#[test]
fn expired_message_is_dropped_by_periodic_run() {
    let relay = relay_with(&[
        "--message-ttl-secs",
        "1",
        "--expire-interval-secs",
        "1",
        "--expire-on-send",
        "off",
    ]);
    let sender = auth_key(KeyAlg::Ed25519);
    let q = orphan_queue(&relay, &sender);
    let mut sh = relay.client();
    send_ok(&mut sh, &q, Some(&sender), b"hello (should expire)");
    std::thread::sleep(Duration::from_millis(3000));
    let mut rh = relay.client();
    sub_empty(&mut rh, &q);
    expect_nothing(&mut rh, "nothing is delivered");
}

/// §9.2 item 27: past its TTL but before any expiration run, the message is still delivered.
#[test]
fn message_is_kept_until_expiration_runs() {
    let relay = relay_with(&[
        "--message-ttl-secs",
        "1",
        "--expire-interval-secs",
        "10000",
        "--expire-on-send",
        "off",
    ]);
    let sender = auth_key(KeyAlg::Ed25519);
    let q = orphan_queue(&relay, &sender);
    let mut sh = relay.client();
    send_ok(&mut sh, &q, Some(&sender), b"hello (should NOT expire)");
    std::thread::sleep(Duration::from_millis(2500));
    let mut rh = relay.client();
    let m = sub_with_msg(&mut rh, &q);
    assert_eq!(m.msg.body(), Some(&b"hello (should NOT expire)"[..]));
    expect_nothing(&mut rh, "nothing else is delivered");
}

/// With expiry on SEND off, a second SEND does not drop the expired first message.
#[test]
fn send_does_not_expire_when_expire_on_send_is_off() {
    let relay = relay_with(&[
        "--message-ttl-secs",
        "1",
        "--expire-interval-secs",
        "10000",
        "--expire-on-send",
        "off",
    ]);
    let sender = auth_key(KeyAlg::Ed25519);
    let q = orphan_queue(&relay, &sender);
    let mut sh = relay.client();
    send_ok(&mut sh, &q, Some(&sender), b"old");
    std::thread::sleep(Duration::from_millis(2500));
    send_ok(&mut sh, &q, Some(&sender), b"new");
    let mut rh = relay.client();
    let m = sub_with_msg(&mut rh, &q);
    assert_eq!(m.msg.body(), Some(&b"old"[..]));
    let m2 = msg_of(&q, ack(&mut rh, &q, &m.msg_id));
    assert_eq!(m2.msg.body(), Some(&b"new"[..]));
}
