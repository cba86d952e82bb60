//! `smp-relay block` / `unblock` on a stopped relay (the reference's control-port commands,
//! simplexmq `Server/Control.hs`, `Server/QueueStore.hs`): a blocked queue answers `ERR BLOCKED`
//! with the notice at v18, without it at v12–17 and `AUTH` at v11, for every command but OFF and
//! DEL; `unblock` restores it; neither runs while the relay does.

use crate::common;
use crate::support;

use common::{run_cli, Relay};
use smp_relay::client::queue::{auth_key, KeyAlg};
use smp_relay::client::{Authorization, ClientOptions};
use smp_relay::crypto::hash::b64url;
use smp_relay::protocol::command::Command;
use smp_relay::protocol::response::BrokerMsg;
use support::*;

const BLOCKED_V18: &str = "ERR BLOCKED reason=spam,notice={\"ttl\":3600}";

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn stop_cleanly(relay: &mut Relay) {
    let status = relay.stop();
    assert!(
        status.success(),
        "clean stop: {status:?}\n{}",
        relay.log_text()
    );
}

/// Runs a `block`/`unblock` command line that must succeed; returns its stdout.
fn cli_ok(relay: &Relay, args: &[&str]) -> String {
    let out = run_cli(relay.dir.path(), args);
    assert!(
        out.status.success(),
        "{args:?}: {}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// The response to `cmd` as sent on the wire (tag and parameters).
fn raw(relay: &Relay, version: u16, entity: &[u8], cmd: Command, auth: Authorization) -> String {
    let mut c = relay
        .connect(ClientOptions {
            version: Some(version),
            ..ClientOptions::default()
        })
        .unwrap_or_else(|e| panic!("connect at v{version}: {e}"));
    let r = request(&mut c, entity, cmd, auth);
    assert_eq!(r.entity_id, entity, "response entity at v{version}");
    text(&r.command)
}

#[test]
fn blocked_queue_answers_blocked_by_version_until_unblocked() {
    let mut relay = Relay::start();
    let (q, other) = {
        let mut c = relay.client();
        (create(&mut c), create(&mut c))
    };

    // While the relay runs, its store is in memory: block refuses rather than edit a stale file.
    let out = run_cli(
        relay.dir.path(),
        &["block", &b64url(q.sid()), "--reason", "spam"],
    );
    assert!(!out.status.success(), "block while running must fail");
    let err = text(&out.stderr);
    assert!(
        err.contains("running") && err.contains("stop it first"),
        "{err}"
    );
    relay.assert_serves();

    stop_cleanly(&mut relay);
    let out = cli_ok(
        &relay,
        &[
            "block",
            &b64url(q.sid()),
            "--reason",
            "spam",
            "--notice",
            "{ \"ttl\": 3600 }",
        ],
    );
    assert!(
        out.contains(&b64url(q.rid())),
        "prints the recipient ID: {out}"
    );
    // Without base64 padding, as IDs are often written.
    let other_sid = b64url(other.sid()).trim_end_matches('=').to_string();
    let out = cli_ok(&relay, &["block", &other_sid, "--reason", "spam"]);
    assert!(out.contains(&b64url(other.rid())), "{out}");
    relay.restart();

    let sender = auth_key(KeyAlg::Ed25519);
    let skey = || Command::SKey(sender.public_key());
    let sign_sender = || Authorization::Sign(sender.clone());
    let sign_rcv = || Authorization::Sign(q.key().clone());
    assert_eq!(raw(&relay, 18, q.sid(), skey(), sign_sender()), BLOCKED_V18);
    assert_eq!(
        raw(&relay, 18, q.sid(), send_cmd(b"hi"), Authorization::None),
        BLOCKED_V18
    );
    assert_eq!(
        raw(&relay, 18, q.rid(), Command::Sub, sign_rcv()),
        BLOCKED_V18
    );
    // v12-17: BLOCKED without the notice; below v12: AUTH.
    for v in [12, 14, 15, 16, 17] {
        assert_eq!(
            raw(&relay, v, q.sid(), send_cmd(b"hi"), Authorization::None),
            "ERR BLOCKED reason=spam",
            "v{v}"
        );
        assert_eq!(
            raw(&relay, v, q.rid(), Command::Sub, sign_rcv()),
            "ERR BLOCKED reason=spam",
            "v{v}"
        );
    }
    for v in [6, 8, 9, 11] {
        assert_eq!(
            raw(&relay, v, q.sid(), send_cmd(b"hi"), Authorization::None),
            "ERR AUTH",
            "v{v}"
        );
        assert_eq!(
            raw(&relay, v, q.rid(), Command::Sub, sign_rcv()),
            "ERR AUTH",
            "v{v}"
        );
    }

    // OFF and DEL do not check blocking.
    {
        let mut c = relay.client();
        assert_eq!(
            signed(&mut c, other.key(), other.rid(), Command::Off),
            BrokerMsg::Ok
        );
        assert_eq!(
            signed(&mut c, other.key(), other.rid(), Command::Del),
            BrokerMsg::Ok
        );
    }

    stop_cleanly(&mut relay);
    let out = cli_ok(&relay, &["unblock", &b64url(q.sid())]);
    assert!(out.contains(&b64url(q.rid())), "{out}");
    assert!(
        out.contains("reason=spam"),
        "says why it was blocked: {out}"
    );
    // The deleted queue is gone from the store.
    let out = run_cli(relay.dir.path(), &["unblock", &b64url(other.sid())]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("no queue"),
        "{}",
        text(&out.stderr)
    );
    relay.restart();

    let (mut rc, mut sc) = (relay.client(), relay.client());
    assert_eq!(
        signed(&mut sc, &sender, q.sid(), skey()),
        BrokerMsg::Ok,
        "SKEY after unblock"
    );
    send_ok(&mut sc, &q, Some(&sender), b"after unblock");
    let m = sub_with_msg(&mut rc, &q);
    assert_eq!(m.msg.body(), Some(&b"after unblock"[..]));
}

#[test]
fn block_checks_its_arguments() {
    let mut relay = Relay::start();
    let q = {
        let mut c = relay.client();
        create(&mut c)
    };
    stop_cleanly(&mut relay);
    for (args, expected) in [
        (
            vec!["block", "not base64!", "--reason", "spam"],
            "not a base64url",
        ),
        (
            vec!["block", "AAAA", "--reason", "spam"],
            "no queue has the sender ID or link ID",
        ),
        // base64url IDs may start with '-': an ID, not an option.
        (
            vec!["block", "-AAA", "--reason", "spam"],
            "no queue has the sender ID or link ID",
        ),
        (vec!["unblock", "-AAA"], "no queue"),
        (
            vec!["block", "x", "--reason", "spam", "--notice", "{ttl:1}"],
            "not valid JSON",
        ),
        (
            vec!["block", "x", "--reason", "spam", "--notice", "3600"],
            "must be a JSON object",
        ),
        (vec!["unblock", "AAAA"], "no queue"),
    ] {
        let out = run_cli(relay.dir.path(), &args);
        assert!(!out.status.success(), "{args:?} must fail");
        let err = text(&out.stderr);
        assert!(err.contains(expected), "{args:?}: {err}");
    }
    // The reason is one of the two the protocol has.
    let sid = b64url(q.sid());
    let out = run_cli(relay.dir.path(), &["block", &sid, "--reason", "other"]);
    assert!(!out.status.success());
    // Unblocking a queue that is not blocked changes nothing and says so.
    let out = cli_ok(&relay, &["unblock", &sid]);
    assert!(out.contains("not blocked"), "{out}");
    // By recipient ID: not a sender or link ID.
    let out = run_cli(
        relay.dir.path(),
        &["block", &b64url(q.rid()), "--reason", "content"],
    );
    assert!(!out.status.success(), "a recipient ID is not accepted");
    relay.restart();
    let mut c = relay.client();
    send_ok(&mut c, &q, None, b"still active");
}
