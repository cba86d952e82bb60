//! Short-link scenarios (simplexmq `Server.hs`, `tests/ServerTests.hs`) at v18:
//! link data on a 1-time invitation (LKEY secures and reads it) and on a contact address (LGET reads
//! it), the sender ID derived from the NEW's corrId, LSET rules, LDEL, and link IDs of other queues.

use crate::common;
use crate::support;

use common::Relay;
use smp_relay::client::queue::{self, auth_key, new_link, KeyAlg, RecipientKeys};
use smp_relay::client::{new_corr_id, Authorization, Client, ClientTransmission};
use smp_relay::protocol::command::{Command, NewLink, QueueMode, QueueReq};
use smp_relay::protocol::response::BrokerMsg;
use support::*;

fn lnk(sender_id: &[u8], fixed: &[u8], user: &[u8]) -> BrokerMsg {
    BrokerMsg::Lnk {
        sender_id: sender_id.to_vec(),
        fixed: fixed.to_vec(),
        user: user.to_vec(),
    }
}

fn lset(link_id: &[u8], fixed: &[u8], user: &[u8]) -> Command {
    Command::LSet {
        link_id: link_id.to_vec(),
        fixed: fixed.to_vec(),
        user: user.to_vec(),
    }
}

/// NEW whose link data names a sender ID not derived from its corrId: `CMD PROHIBITED`.
fn new_with_wrong_sender_id(r: &mut Client, keys: &RecipientKeys, req: QueueReq) {
    let mut new = queue::new_queue(keys);
    new.queue_req = Some(req);
    let corr = new_corr_id();
    let t = ClientTransmission::new(&corr, b"", Command::New(new)).signed(keys.auth.clone());
    r.send_batch(&[t]).unwrap();
    let resp = r.recv_for(&corr).unwrap();
    assert_eq!(resp.entity_id, b"");
    assert_eq!(resp.msg, Ok(cmd_err(CommandError::Prohibited)));
}

/// The reference's `testInvQueueLinkData` (simplexmq `tests/ServerTests.hs`).
#[test]
fn invitation_link_data_is_read_by_lkey() {
    let relay = Relay::start();
    let (mut r, mut s) = (relay.client(), relay.client());
    let keys = RecipientKeys::generate(KeyAlg::Ed25519);
    let corr = new_corr_id();
    let link = new_link(&corr, b"fixed data", b"user data");
    let wrong = NewLink {
        sender_id: queue::link_sender_id(&new_corr_id()),
        ..link.clone()
    };
    new_with_wrong_sender_id(&mut r, &keys, QueueReq::Messaging(Some(wrong)));

    let mut new = queue::new_queue(&keys);
    new.queue_req = Some(QueueReq::Messaging(Some(link.clone())));
    let q = create_with_corr(&mut r, keys, new, &corr);
    assert_eq!(q.ids.snd_id, link.sender_id, "the derived sender ID");
    assert_eq!(q.ids.queue_mode, Some(QueueMode::Messaging));
    let lnk_id = q.ids.link_id.clone().expect("the server's link ID");
    assert_eq!(lnk_id.len(), 24);

    assert_eq!(
        unsigned(&mut s, &lnk_id, Command::LGet),
        ERR_AUTH,
        "LGET is for contact addresses"
    );
    assert_eq!(
        signed(
            &mut r,
            q.key(),
            q.rid(),
            lset(&lnk_id, b"fixed data", b"updated user data")
        ),
        BrokerMsg::Ok,
        "link data can change before the queue is secured"
    );
    let sender = auth_key(KeyAlg::Ed25519);
    let lkey = Command::LKey(sender.public_key());
    assert_eq!(
        unsigned(&mut s, &lnk_id, lkey.clone()),
        cmd_err(CommandError::NoAuth)
    );
    let bad = request(&mut s, &lnk_id, lkey.clone(), bad_sig());
    assert_eq!(bad.msg, Ok(ERR_AUTH), "LKEY with a wrong signature");
    assert_eq!(
        signed(&mut s, &sender, q.rid(), lkey.clone()),
        ERR_AUTH,
        "LKEY with the recipient ID"
    );
    let data = lnk(q.sid(), b"fixed data", b"updated user data");
    assert_eq!(
        signed(&mut s, &sender, &lnk_id, lkey.clone()),
        data,
        "secures and returns the data"
    );
    let other = auth_key(KeyAlg::Ed25519);
    assert_eq!(
        signed(&mut s, &other, &lnk_id, Command::LKey(other.public_key())),
        ERR_AUTH,
        "another key"
    );
    assert_eq!(
        signed(&mut s, &sender, &lnk_id, lkey),
        data,
        "the same key again"
    );
    assert_eq!(
        send(&mut s, &q, None, b"hi"),
        ERR_AUTH,
        "LKEY secured the queue"
    );
    assert_eq!(
        signed(
            &mut r,
            q.key(),
            q.rid(),
            lset(&lnk_id, b"fixed data", b"more")
        ),
        ERR_AUTH,
        "no LSET once secured"
    );
    assert_eq!(
        signed(&mut r, q.key(), q.rid(), Command::LDel),
        BrokerMsg::Ok
    );
    let sender2 = auth_key(KeyAlg::Ed25519);
    assert_eq!(
        signed(&mut s, &sender, &lnk_id, Command::LKey(sender.public_key())),
        ERR_AUTH,
        "the link is gone"
    );
    drop(sender2);
    send_ok(&mut s, &q, Some(&sender), b"hello");
    expect_body(&mut r, &q, b"hello");
}

/// The first SEND to a secured invitation queue deletes its link data (simplexmq `Server.hs`).
#[test]
fn invitation_link_data_disappears_with_first_message() {
    let relay = Relay::start();
    let (mut r, mut s) = (relay.client(), relay.client());
    let keys = RecipientKeys::generate(KeyAlg::Ed25519);
    let corr = new_corr_id();
    let mut new = queue::new_queue(&keys);
    new.queue_req = Some(QueueReq::Messaging(Some(new_link(&corr, b"f", b"u"))));
    let q = create_with_corr(&mut r, keys, new, &corr);
    let lnk_id = q.ids.link_id.clone().unwrap();
    let sender = auth_key(KeyAlg::Ed25519);
    let lkey = Command::LKey(sender.public_key());
    assert_eq!(
        signed(&mut s, &sender, &lnk_id, lkey.clone()),
        lnk(q.sid(), b"f", b"u")
    );
    send_ok(&mut s, &q, Some(&sender), b"confirmation");
    expect_body(&mut r, &q, b"confirmation");
    assert_eq!(
        signed(&mut s, &sender, &lnk_id, lkey),
        ERR_AUTH,
        "no link data after the first message"
    );
}

/// The reference's `testContactQueueLinkData`.
#[test]
fn contact_link_data_is_read_by_lget() {
    let relay = Relay::start();
    let (mut r, mut s) = (relay.client(), relay.client());
    let keys = RecipientKeys::generate(KeyAlg::Ed25519);
    let lnk_id: Vec<u8> = new_corr_id().to_vec();
    let corr = new_corr_id();
    let link = new_link(&corr, b"fixed data", b"user data");
    let wrong = NewLink {
        sender_id: queue::link_sender_id(b"another corrId"),
        ..link.clone()
    };
    new_with_wrong_sender_id(
        &mut r,
        &keys,
        QueueReq::Contact(Some((lnk_id.clone(), wrong))),
    );

    let mut new = queue::new_queue(&keys);
    new.queue_req = Some(QueueReq::Contact(Some((lnk_id.clone(), link.clone()))));
    let q = create_with_corr(&mut r, keys, new, &corr);
    assert_eq!(
        q.ids.link_id.as_deref(),
        Some(&lnk_id[..]),
        "the client's link ID"
    );
    assert_eq!(q.ids.snd_id, link.sender_id);
    assert_eq!(q.ids.queue_mode, Some(QueueMode::Contact));

    let sender = auth_key(KeyAlg::Ed25519);
    assert_eq!(
        signed(&mut s, &sender, &lnk_id, Command::LKey(sender.public_key())),
        ERR_AUTH,
        "a contact address cannot be secured"
    );
    let has_auth = request(&mut s, &lnk_id, Command::LGet, bad_sig());
    assert_eq!(
        has_auth.msg,
        Ok(cmd_err(CommandError::HasAuth)),
        "LGET must be unsigned"
    );
    assert_eq!(
        unsigned(&mut s, q.rid(), Command::LGet),
        ERR_AUTH,
        "LGET with the recipient ID"
    );
    let data = lnk(q.sid(), b"fixed data", b"user data");
    assert_eq!(unsigned(&mut s, &lnk_id, Command::LGet), data);
    assert_eq!(unsigned(&mut s, &lnk_id, Command::LGet), data, "repeatable");

    let updated = lset(&lnk_id, b"fixed data", b"updated user data");
    assert_eq!(signed(&mut r, q.key(), q.rid(), updated), BrokerMsg::Ok);
    assert_eq!(
        unsigned(&mut s, &lnk_id, Command::LGet),
        lnk(q.sid(), b"fixed data", b"updated user data")
    );
    let bad_id = new_corr_id();
    assert_eq!(
        signed(&mut r, q.key(), q.rid(), lset(&bad_id, b"fixed data", b"x")),
        ERR_AUTH,
        "another link ID"
    );
    assert_eq!(
        signed(
            &mut r,
            q.key(),
            q.rid(),
            lset(&lnk_id, b"changed fixed data", b"x")
        ),
        ERR_AUTH,
        "changed fixed data"
    );
    assert_eq!(
        unsigned(&mut s, &lnk_id, Command::LGet),
        lnk(q.sid(), b"fixed data", b"updated user data"),
        "refused LSETs changed nothing"
    );
    assert_eq!(
        signed(&mut r, q.key(), q.rid(), Command::LDel),
        BrokerMsg::Ok
    );
    assert_eq!(
        signed(&mut r, q.key(), q.rid(), Command::LDel),
        BrokerMsg::Ok,
        "LDEL again"
    );
    assert_eq!(
        unsigned(&mut s, &lnk_id, Command::LGet),
        ERR_AUTH,
        "the link is gone"
    );
    send_ok(&mut s, &q, None, b"still a contact address");
    expect_body(&mut r, &q, b"still a contact address");
}

/// The reference's short-link test "rejects attaching an existing short link to another queue":
/// LSET cannot attach another queue's link ID; the victim's data stays.
#[test]
fn lset_cannot_take_another_queues_link() {
    let relay = Relay::start();
    let (mut r, mut s) = (relay.client(), relay.client());
    let vkeys = RecipientKeys::generate(KeyAlg::Ed25519);
    let lnk_id: Vec<u8> = new_corr_id().to_vec();
    let corr = new_corr_id();
    let mut new = queue::new_queue(&vkeys);
    new.queue_req = Some(QueueReq::Contact(Some((
        lnk_id.clone(),
        new_link(&corr, b"victim fixed", b"victim user"),
    ))));
    let victim = create_with_corr(&mut r, vkeys, new, &corr);

    let akeys = RecipientKeys::generate(KeyAlg::Ed25519);
    let mut new = queue::new_queue(&akeys);
    new.queue_req = Some(QueueReq::Contact(None));
    let attacker = create_with(&mut r, akeys, new);
    let resp = signed(
        &mut r,
        attacker.key(),
        attacker.rid(),
        lset(&lnk_id, b"attacker fixed", b"attacker user"),
    );
    assert!(
        matches!(resp, BrokerMsg::Err(_)),
        "LSET of a taken link ID: {resp:?}"
    );
    assert_eq!(
        unsigned(&mut s, &lnk_id, Command::LGet),
        lnk(victim.sid(), b"victim fixed", b"victim user"),
        "the victim's link is unchanged"
    );
    // The attacker's queue can still get a link of its own.
    let own = new_corr_id();
    assert_eq!(
        signed(
            &mut r,
            attacker.key(),
            attacker.rid(),
            lset(&own, b"f", b"u")
        ),
        BrokerMsg::Ok
    );
    assert_eq!(
        unsigned(&mut s, &own, Command::LGet),
        lnk(attacker.sid(), b"f", b"u")
    );
    let _ = Authorization::None;
}
