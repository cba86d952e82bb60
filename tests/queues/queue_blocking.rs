//! Blocked queues (simplexmq `Server.hs`, `Protocol.hs` `BLOCKED`,
//! `tests/ServerTests.hs`): a queue blocked offline (`smp-relay block` on a stopped relay's
//! saved store) answers `ERR BLOCKED info` to every command that goes through the queue-status
//! check, `AUTH` below v12 and no notice below v18; OFF, DEL and NSUB are not blocked; `unblock`
//! restores it.

use crate::common;
use crate::support;

use base64::Engine;
use common::{run_cli, Relay};
use smp_relay::client::queue::{self, auth_key, KeyAlg, NotifierKeys, RecipientKeys};
use smp_relay::client::{new_corr_id, Client, ClientOptions};
use smp_relay::protocol::command::{Command, QueueReq};
use smp_relay::protocol::error::{BlockingInfo, BlockingReason};
use smp_relay::protocol::response::BrokerMsg;
use support::*;

fn b64url(id: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(id)
}

fn cli_ok(relay: &Relay, args: &[&str]) {
    let out = run_cli(relay.dir.path(), args);
    assert!(
        out.status.success(),
        "{args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn connect(relay: &Relay, v: u16) -> Client {
    relay
        .connect(ClientOptions {
            version: Some(v),
            ..Default::default()
        })
        .expect("connect")
}

fn blocked(msg: &BrokerMsg) -> Option<&BlockingInfo> {
    match msg {
        BrokerMsg::Err(ErrorType::Blocked(info)) => Some(info),
        _ => None,
    }
}

#[test]
fn blocked_queue_answers_blocked_until_unblocked() {
    let mut relay = Relay::start();
    let sender = auth_key(KeyAlg::Ed25519);
    let (q, n, contact, link, pending);
    {
        let (mut rc, mut sc) = (relay.client(), relay.client());
        q = create(&mut rc);
        n = nkey(&mut rc, &q);
        send_ok(&mut sc, &q, None, b"before the block");
        pending = expect_body(&mut rc, &q, b"before the block");
        let keys = RecipientKeys::generate(KeyAlg::Ed25519);
        let corr = new_corr_id();
        let mut new = queue::new_queue(&keys);
        new.queue_req = Some(QueueReq::Contact(Some((
            b"blocked contact link id.".to_vec(),
            queue::new_link(&corr, b"f", b"u"),
        ))));
        contact = create_with_corr(&mut rc, keys, new, &corr);
        link = contact.ids.link_id.clone().unwrap();
    }
    assert!(relay.stop().success());
    let sid = b64url(q.sid());
    cli_ok(
        &relay,
        &[
            "block",
            &sid,
            "--reason",
            "content",
            "--notice",
            r#"{"ttl":3600}"#,
        ],
    );
    cli_ok(&relay, &["block", &b64url(&link), "--reason", "spam"]);
    relay.restart();

    let (mut rc, mut sc) = (relay.client(), relay.client());
    let info = blocked(&signed(&mut rc, q.key(), q.rid(), Command::Sub))
        .expect("SUB answers BLOCKED")
        .clone();
    assert_eq!(info.reason, BlockingReason::Content);
    let notice = info.notice.clone().expect("the notice at v18");
    assert!(notice.contains("3600"), "notice {notice}");
    let want = BrokerMsg::Err(ErrorType::Blocked(info.clone()));

    let recipient_cmds = [
        Command::Get,
        Command::Ack(pending.msg_id.clone()),
        Command::Key(sender.public_key()),
        Command::Que,
        NotifierKeys::generate(KeyAlg::Ed25519).nkey(),
        Command::NDel,
        Command::LDel,
    ];
    for cmd in recipient_cmds {
        let tag = cmd.tag();
        assert_eq!(signed(&mut rc, q.key(), q.rid(), cmd), want, "{tag}");
    }
    assert_eq!(send(&mut sc, &q, None, b"x"), want, "SEND");
    let skey = Command::SKey(sender.public_key());
    assert_eq!(signed(&mut sc, &sender, q.sid(), skey), want, "SKEY");
    assert_eq!(
        nsub(&mut sc, &n),
        BrokerMsg::Sok(None),
        "NSUB is not blocked"
    );
    let spam = BrokerMsg::Err(ErrorType::Blocked(BlockingInfo {
        reason: BlockingReason::Spam,
        notice: None,
    }));
    assert_eq!(
        unsigned(&mut sc, &link, Command::LGet),
        spam,
        "LGET of a blocked link"
    );

    // Older sessions: no notice below v18, AUTH below v12.
    let mut v16 = connect(&relay, 16);
    let no_notice = BrokerMsg::Err(ErrorType::Blocked(BlockingInfo {
        reason: BlockingReason::Content,
        notice: None,
    }));
    assert_eq!(
        signed(&mut v16, q.key(), q.rid(), Command::Sub),
        no_notice,
        "v16"
    );
    let mut v11 = connect(&relay, 11);
    assert_eq!(
        signed(&mut v11, q.key(), q.rid(), Command::Sub),
        ERR_AUTH,
        "v11"
    );

    drop((rc, sc, v16, v11));
    assert!(relay.stop().success());
    cli_ok(&relay, &["unblock", &sid]);
    relay.restart();

    let mut rc = relay.client();
    let m = sub_with_msg(&mut rc, &q);
    assert_eq!(
        m.msg_id, pending.msg_id,
        "unblocked: the message is still there"
    );
    let mut sc = relay.client();
    send_ok(&mut sc, &q, None, b"after the block");
    assert_eq!(
        unsigned(&mut sc, &link, Command::LGet),
        spam,
        "the other block stays"
    );

    // OFF and DEL are not blocked. As in the reference (`suspendQueue` sets the status), OFF replaces
    // the block: the queue is then off, refusing senders with AUTH.
    assert_eq!(
        signed(&mut rc, contact.key(), contact.rid(), Command::Off),
        BrokerMsg::Ok,
        "OFF"
    );
    assert_eq!(send(&mut sc, &contact, None, b"x"), ERR_AUTH);
    assert_eq!(
        signed(&mut rc, contact.key(), contact.rid(), Command::Del),
        BrokerMsg::Ok,
        "DEL"
    );
    assert_eq!(unsigned(&mut sc, &link, Command::LGet), ERR_AUTH, "deleted");
}

#[test]
fn sends_refused_as_blocked_are_counted_in_the_metrics() {
    let mut relay = Relay::start();
    let q = {
        let mut rc = relay.client();
        create(&mut rc)
    };
    assert!(relay.stop().success());
    cli_ok(&relay, &["block", &b64url(q.sid()), "--reason", "spam"]);
    relay.restart_with(&["--metrics-interval", "1"]);
    let mut sc = relay.client();
    for i in 0..2 {
        let r = send(&mut sc, &q, None, b"x");
        assert!(blocked(&r).is_some(), "SEND {i}: {r:?}");
    }
    let sample = "simplex_smp_messages_sent_errors{type=\"block\"}";
    let m = relay.metrics_until("two blocked SENDs", |m| m.get(sample) == Some(&2));
    assert_eq!(
        m.get("simplex_smp_messages_sent"),
        Some(&0),
        "none accepted"
    );
}
