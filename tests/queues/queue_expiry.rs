//! Message expiration scenarios (simplexmq `Server.hs`, `tests/ServerTests.hs`) with a
//! 1-second TTL: expiry on SEND, expiry by the periodic run, and no expiry before the run.
//! Their subject is time, which they move on the relay's clock (`Relay::advance_clock`, 3 s past
//! the TTL's whole seconds) instead of sleeping; `Relay::run_expiration` makes the periodic run
//! happen at once, where the 1-second ticker would otherwise be waited for.

use crate::common;
use crate::support;

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

/// The reference's `testMsgExpireOnSend` (simplexmq `tests/ServerTests.hs`): with expiry on SEND,
/// the first message has expired when the second is sent.
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
    relay.advance_clock(3);
    send_ok(&mut sh, &q, Some(&sender), b"hello (should NOT expire)");
    let mut rh = relay.client();
    let m = sub_with_msg(&mut rh, &q);
    assert_eq!(m.msg.body(), Some(&b"hello (should NOT expire)"[..]));
    expect_nothing(&mut rh, "nothing else is delivered");
}

/// The reference's `testMsgExpireOnInterval`: the periodic run (every second, and once at once by the test) drops the expired
/// message.
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
    relay.advance_clock(3);
    relay.run_expiration();
    let mut rh = relay.client();
    sub_empty(&mut rh, &q);
    expect_nothing(&mut rh, "nothing is delivered");
}

/// The reference's `testMsgNOTExpireOnInterval`: past its TTL but before any expiration run, the
/// message is still delivered.
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
    relay.advance_clock(3);
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
    relay.advance_clock(3);
    send_ok(&mut sh, &q, Some(&sender), b"new");
    let mut rh = relay.client();
    let m = sub_with_msg(&mut rh, &q);
    assert_eq!(m.msg.body(), Some(&b"old"[..]));
    let m2 = msg_of(&q, ack(&mut rh, &q, &m.msg_id));
    assert_eq!(m2.msg.body(), Some(&b"new"[..]));
}

/// A delivered message that expires before its ACK: the subscriber keeps waiting for the ACK (no
/// push of the next message), and the ACK of the expired ID returns the new head, as the
/// reference's `tryDelPeekMsg` does.
#[test]
fn ack_of_expired_delivered_message_returns_new_head() {
    let relay = relay_with(&[
        "--message-ttl-secs",
        "1",
        "--expire-interval-secs",
        "1",
        "--expire-on-send",
        "off",
    ]);
    let (mut rh, mut sh) = (relay.client(), relay.client());
    let q = create(&mut rh);
    send_ok(&mut sh, &q, None, b"expires while delivered");
    let m1 = expect_body(&mut rh, &q, b"expires while delivered");
    relay.advance_clock(3);
    relay.run_expiration();
    send_ok(&mut sh, &q, None, b"fresh");
    expect_nothing(&mut rh, "one outstanding message per subscription");
    let m2 = msg_of(&q, ack(&mut rh, &q, &m1.msg_id));
    assert_eq!(m2.msg.body(), Some(&b"fresh"[..]));
    assert_eq!(
        ack(&mut rh, &q, &m2.msg_id),
        smp_relay::protocol::response::BrokerMsg::Ok
    );
}

/// Pending notifications expire after the notification TTL (simplexmq `Server/NtfStore.hs`): a
/// later NSUB receives nothing.
#[test]
fn pending_notifications_expire() {
    let relay = relay_with(&[
        "--notification-ttl-secs",
        "1",
        "--expire-interval-secs",
        "1",
    ]);
    let (mut rh, mut sh, mut nh) = (relay.client(), relay.client(), relay.client());
    let q = create(&mut rh);
    let n = nkey(&mut rh, &q);
    let r = send_as(&mut sh, q.sid(), None, send_ntf_cmd(b"notify me"));
    assert_eq!(r, smp_relay::protocol::response::BrokerMsg::Ok);
    expect_body(&mut rh, &q, b"notify me");
    relay.advance_clock(3);
    relay.run_expiration();
    assert_eq!(
        nsub(&mut nh, &n),
        smp_relay::protocol::response::BrokerMsg::Sok(None)
    );
    expect_nothing(&mut nh, "the notification expired");
}
