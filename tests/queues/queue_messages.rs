//! Message scenarios of the reference's `serverTests` ("SMP messages",
//! simplexmq `tests/ServerTests.hs`, `Server.hs`) at v18 over real TLS: duplex
//! exchange on one and two cores, switching the subscription to another connection, GET, GET with
//! SUB, the quota marker, concurrent senders, and the block layout of pushes and SUB responses.

use crate::common;
use crate::support;

use base64::Engine;
use common::{Relay, RelayOptions};
use smp_relay::client::queue::{auth_key, KeyAlg, RcvMsg};
use smp_relay::client::{new_corr_id, Client, ClientTransmission};
use smp_relay::protocol::command::Command;
use smp_relay::protocol::response::BrokerMsg;
use support::*;

fn b64(b: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(b)
}

/// The reference's `testDuplex` (simplexmq `tests/ServerTests.hs`): Alice and Bob set up two queues
/// by passing keys and IDs in messages, then talk.
fn duplex(relay: &Relay) {
    let (mut alice, mut bob) = (relay.client(), relay.client());
    let aq = create(&mut alice);
    // Alice's sender ID reaches Bob out of band.
    let bs_key = auth_key(KeyAlg::Ed448);
    let bs_pub = b64(&bs_key.public_key().to_spki());
    send_ok(&mut bob, &aq, None, format!("key {bs_pub}").as_bytes());
    let m1 = expect_msg(&mut alice, &aq);
    assert_eq!(ack(&mut alice, &aq, &m1.msg_id), BrokerMsg::Ok);
    let text = String::from_utf8(m1.msg.body().unwrap().to_vec()).unwrap();
    assert_eq!(text, format!("key {bs_pub}"), "key received from Bob");
    assert_eq!(
        signed(
            &mut alice,
            aq.key(),
            aq.rid(),
            Command::Key(bs_key.public_key())
        ),
        BrokerMsg::Ok
    );

    let bq = create(&mut bob);
    let reply = format!("reply_id {}", b64(bq.sid()));
    send_ok(&mut bob, &aq, Some(&bs_key), reply.as_bytes());
    let m2 = expect_body(&mut alice, &aq, reply.as_bytes());
    assert_eq!(ack(&mut alice, &aq, &m2.msg_id), BrokerMsg::Ok);

    let as_key = auth_key(KeyAlg::Ed448);
    let as_pub = format!("key {}", b64(&as_key.public_key().to_spki()));
    send_ok(&mut alice, &bq, None, as_pub.as_bytes());
    let m3 = expect_body(&mut bob, &bq, as_pub.as_bytes());
    assert_eq!(ack(&mut bob, &bq, &m3.msg_id), BrokerMsg::Ok);
    assert_eq!(
        signed(
            &mut bob,
            bq.key(),
            bq.rid(),
            Command::Key(as_key.public_key())
        ),
        BrokerMsg::Ok
    );

    send_ok(&mut bob, &aq, Some(&bs_key), b"hi alice");
    let m4 = expect_body(&mut alice, &aq, b"hi alice");
    assert_eq!(ack(&mut alice, &aq, &m4.msg_id), BrokerMsg::Ok);
    send_ok(&mut alice, &bq, Some(&as_key), b"how are you bob");
    let m5 = expect_body(&mut bob, &bq, b"how are you bob");
    assert_eq!(ack(&mut bob, &bq, &m5.msg_id), BrokerMsg::Ok);
    expect_nothing(&mut alice, "alice after the exchange");
    expect_nothing(&mut bob, "bob after the exchange");
}

#[test]
fn duplex_exchange_one_core() {
    duplex(&Relay::start());
}

/// The same exchange with two shards: connections and queue owners fall on either shard, so
/// several rounds cross shards in every direction.
#[test]
fn duplex_exchange_two_cores() {
    let relay = Relay::start_with(RelayOptions {
        cores: 2,
        ..Default::default()
    });
    for _ in 0..4 {
        duplex(&relay);
    }
}

/// The reference's `testSwitchSub`: SUB from a second connection takes the queue over.
fn switch_subscription(relay: &Relay) {
    let (mut rh1, mut rh2, mut sh) = (relay.client(), relay.client(), relay.client());
    let q = create(&mut rh1);
    send_ok(&mut sh, &q, None, b"test1");
    send_ok(&mut sh, &q, None, b"test2, no ACK");
    let m1 = expect_body(&mut rh1, &q, b"test1");
    let m2 = msg_of(&q, ack(&mut rh1, &q, &m1.msg_id));
    assert_eq!(
        m2.msg.body(),
        Some(&b"test2, no ACK"[..]),
        "the ACK's response is the next MSG"
    );

    let m2b = sub_with_msg(&mut rh2, &q);
    assert_eq!(
        m2b.msg_id, m2.msg_id,
        "the unACKed message is delivered again to the new subscriber"
    );
    assert_eq!(ack(&mut rh2, &q, &m2b.msg_id), BrokerMsg::Ok);
    expect_event(&mut rh1, q.rid(), BrokerMsg::End);

    send_ok(&mut sh, &q, None, b"test3");
    let m3 = expect_body(&mut rh2, &q, b"test3");
    assert_eq!(
        ack(&mut rh1, &q, &m3.msg_id),
        ERR_NO_MSG,
        "the old connection cannot ACK"
    );
    assert_eq!(ack(&mut rh2, &q, &m3.msg_id), BrokerMsg::Ok);

    assert_eq!(
        signed(&mut rh1, q.key(), q.rid(), Command::Del),
        BrokerMsg::Ok
    );
    expect_event(&mut rh2, q.rid(), BrokerMsg::Deld);
    expect_nothing(&mut rh1, "nothing else to the first connection");
}

#[test]
fn switch_subscription_to_another_connection() {
    switch_subscription(&Relay::start());
}

#[test]
fn switch_subscription_to_another_connection_two_cores() {
    let relay = Relay::start_with(RelayOptions {
        cores: 2,
        ..Default::default()
    });
    for _ in 0..3 {
        switch_subscription(&relay);
    }
}

/// A queue created and secured on a connection that then closed, so nobody is subscribed.
fn orphan_queue(relay: &Relay, sender: &smp_relay::client::Signer) -> Queue {
    let mut c = relay.client();
    create_secured(&mut c, sender)
}

/// The reference's `testGetCommand`: GET returns the head, ACK removes it, GET of an empty queue is
/// OK.
#[test]
fn get_retrieves_messages() {
    let relay = Relay::start();
    let sender = auth_key(KeyAlg::Ed25519);
    let q = orphan_queue(&relay, &sender);
    let (mut rh, mut sh) = (relay.client(), relay.client());
    send_ok(&mut sh, &q, Some(&sender), b"hello");
    let m = msg_of(&q, signed(&mut rh, q.key(), q.rid(), Command::Get));
    assert_eq!(m.msg.body(), Some(&b"hello"[..]));
    let again = msg_of(&q, signed(&mut rh, q.key(), q.rid(), Command::Get));
    assert_eq!(
        again.msg_id, m.msg_id,
        "GET without ACK returns the same head"
    );
    assert_eq!(ack(&mut rh, &q, &m.msg_id), BrokerMsg::Ok);
    assert_eq!(
        signed(&mut rh, q.key(), q.rid(), Command::Get),
        BrokerMsg::Ok,
        "empty queue"
    );
    expect_nothing(&mut rh, "GET mode gets no pushes");
}

/// The reference's `testGetSubCommands`: one connection SUBs, another GETs; only one ACK of a
/// message works.
#[test]
fn get_and_sub_share_the_queue() {
    let relay = Relay::start();
    let sender = auth_key(KeyAlg::Ed25519);
    let (mut rh1, mut rh2, mut sh) = (relay.client(), relay.client(), relay.client());
    let q = create_secured(&mut rh1, &sender);
    for i in 1..=4 {
        send_ok(&mut sh, &q, Some(&sender), format!("hello {i}").as_bytes());
    }
    let m1 = expect_body(&mut rh1, &q, b"hello 1");
    let g1 = msg_of(&q, signed(&mut rh2, q.key(), q.rid(), Command::Get));
    assert_eq!(g1.msg_id, m1.msg_id, "both see the same first message");
    assert_eq!(g1.msg, m1.msg);

    let prohibited = cmd_err(CommandError::Prohibited);
    assert_eq!(
        signed(&mut rh1, q.key(), q.rid(), Command::Get),
        prohibited,
        "subscriber cannot GET"
    );
    assert_eq!(
        signed(&mut rh2, q.key(), q.rid(), Command::Sub),
        prohibited,
        "getter cannot SUB"
    );

    let m2 = msg_of(&q, ack(&mut rh1, &q, &m1.msg_id));
    assert_eq!(
        m2.msg.body(),
        Some(&b"hello 2"[..]),
        "ACK for SUB delivers the next message"
    );
    assert_eq!(ack(&mut rh2, &q, b"1234"), ERR_NO_MSG, "a wrong msgId");
    assert_eq!(
        ack(&mut rh2, &q, &m1.msg_id),
        BrokerMsg::Ok,
        "already ACKed by the subscriber, still OK"
    );
    let g2 = msg_of(&q, signed(&mut rh2, q.key(), q.rid(), Command::Get));
    assert_eq!(g2.msg_id, m2.msg_id, "message 2 is not lost");
    assert_eq!(
        ack(&mut rh2, &q, &g2.msg_id),
        BrokerMsg::Ok,
        "getter ACK is OK even with more messages"
    );
    let g3 = msg_of(&q, signed(&mut rh2, q.key(), q.rid(), Command::Get));
    assert_eq!(g3.msg.body(), Some(&b"hello 3"[..]));
    let m3 = msg_of(&q, ack(&mut rh1, &q, &g2.msg_id));
    assert_eq!(
        m3.msg_id, g3.msg_id,
        "subscriber ACK of a removed message returns the head"
    );
    let m4 = msg_of(&q, ack(&mut rh1, &q, &g3.msg_id));
    assert_eq!(m4.msg.body(), Some(&b"hello 4"[..]));
    assert_eq!(ack(&mut rh1, &q, &m4.msg_id), BrokerMsg::Ok);
    assert_eq!(
        signed(&mut rh2, q.key(), q.rid(), Command::Get),
        BrokerMsg::Ok,
        "no more messages"
    );
}

/// The reference's `testExceedQueueQuota` with quota 2: two messages, then QUOTA; the marker is
/// delivered after them; sending resumes only once the marker is ACKed.
#[test]
fn exceeding_quota_sends_quota_marker() {
    let relay = Relay::start_with(RelayOptions {
        extra_args: vec!["--quota".into(), "2".into()],
        ..Default::default()
    });
    let sender = auth_key(KeyAlg::Ed25519);
    let (mut sh, mut rh) = (relay.client(), relay.client());
    let q = create_secured(&mut rh, &sender);
    send_ok(&mut sh, &q, Some(&sender), b"hello 1");
    send_ok(&mut sh, &q, Some(&sender), b"hello 2");
    assert_eq!(send(&mut sh, &q, Some(&sender), b"hello 3"), ERR_QUOTA);
    let m1 = expect_body(&mut rh, &q, b"hello 1");
    let m2 = msg_of(&q, ack(&mut rh, &q, &m1.msg_id));
    assert_eq!(m2.msg.body(), Some(&b"hello 2"[..]));
    assert_eq!(
        send(&mut sh, &q, Some(&sender), b"hello 3"),
        ERR_QUOTA,
        "still full"
    );
    let m3 = msg_of(&q, ack(&mut rh, &q, &m2.msg_id));
    assert!(is_quota(&m3), "the quota marker follows: {:?}", m3.msg);
    assert!(
        m3.msg.ts() >= m2.msg.ts(),
        "the marker has the refused message's time"
    );
    assert_eq!(
        send(&mut sh, &q, Some(&sender), b"hello 3"),
        ERR_QUOTA,
        "until the marker is ACKed"
    );
    assert_eq!(ack(&mut rh, &q, &m3.msg_id), BrokerMsg::Ok);
    send_ok(&mut sh, &q, Some(&sender), b"hello 3");
    let m4 = expect_body(&mut rh, &q, b"hello 3");
    assert_eq!(ack(&mut rh, &q, &m4.msg_id), BrokerMsg::Ok);
}

/// The reference's `testConcurrentSendDelivery`: 50 rounds of two SENDs racing from two
/// connections; the recipient gets one as an event, the other in the ACK's response, and the second
/// ACK is OK.
#[test]
fn concurrent_sends_keep_delivering() {
    let relay = Relay::start_with(RelayOptions {
        cores: 2,
        ..Default::default()
    });
    let sender = auth_key(KeyAlg::Ed25519);
    let (mut rh, mut sh1, mut sh2) = (relay.client(), relay.client(), relay.client());
    let q = create_secured(&mut rh, &sender);
    let is_1_or_2 = |m: &RcvMsg| matches!(m.body(), Some(b"msg 1") | Some(b"msg 2"));
    for round in 0..50 {
        std::thread::scope(|s| {
            let (q1, q2, k1, k2) = (&q, &q, &sender, &sender);
            let (c1, c2) = (&mut sh1, &mut sh2);
            let a = s.spawn(move || send(c1, q1, Some(k1), b"msg 1"));
            let b = s.spawn(move || send(c2, q2, Some(k2), b"msg 2"));
            assert_eq!(a.join().unwrap(), BrokerMsg::Ok, "round {round}");
            assert_eq!(b.join().unwrap(), BrokerMsg::Ok, "round {round}");
        });
        let m1 = expect_msg(&mut rh, &q);
        assert!(is_1_or_2(&m1.msg), "round {round}: {:?}", m1.msg);
        let m2 = msg_of(&q, ack(&mut rh, &q, &m1.msg_id));
        assert!(is_1_or_2(&m2.msg), "round {round}: {:?}", m2.msg);
        assert_ne!(m1.msg.body(), m2.msg.body(), "round {round}: both messages");
        assert_eq!(ack(&mut rh, &q, &m2.msg_id), BrokerMsg::Ok, "round {round}");
    }
}

/// O2: a SEND to a queue the sending connection itself subscribes gives a block with the MSG, then
/// a block with the SEND's OK (cause before effect; the reference's store-log test relies on it).
#[test]
fn send_to_own_subscribed_queue_pushes_msg_block_then_ok_block() {
    let relay = Relay::start();
    let mut c = relay.client();
    let q = create(&mut c);
    let corr = new_corr_id();
    let t = ClientTransmission::new(&corr, q.sid(), send_cmd(b"to myself"));
    c.send_batch(&[t]).unwrap();
    let first = c.recv_block().unwrap();
    assert_eq!(
        first.len(),
        1,
        "the MSG alone: {:?}",
        first.iter().map(describe).collect::<Vec<_>>()
    );
    assert_eq!(first[0].corr_id, b"");
    assert_eq!(first[0].entity_id, q.rid());
    let m = smp_relay::client::queue::receive(&q.secret, &first[0]).unwrap();
    assert_eq!(m.msg.body(), Some(&b"to myself"[..]));
    let second = c.recv_block().unwrap();
    assert_eq!(second.len(), 1);
    assert_eq!(second[0].corr_id, corr);
    assert_eq!(second[0].entity_id, q.sid());
    assert_eq!(second[0].msg, Ok(BrokerMsg::Ok));
}

/// O4: SUB of a queue with a message pending answers `[SOK, MSG]` in one block, on the connection
/// that created the queue (re-SUB) and on a fresh one.
#[test]
fn sub_with_pending_message_answers_sok_and_msg_in_one_block() {
    let relay = Relay::start();
    let (mut r, mut s) = (relay.client(), relay.client());
    let q = create(&mut r);
    send_ok(&mut s, &q, None, b"pending");
    let pushed = expect_body(&mut r, &q, b"pending");
    let resub = sub_with_msg(&mut r, &q);
    assert_eq!(resub.msg_id, pushed.msg_id, "re-SUB re-delivers the head");
    let mut fresh = relay.client();
    let m = sub_with_msg(&mut fresh, &q);
    assert_eq!(m.msg_id, pushed.msg_id);
    expect_event(&mut r, q.rid(), BrokerMsg::End);
}

/// Every response of a block of SUBs comes back (more than 4 responses: the MSGs follow in their
/// own blocks), and each pending message is delivered once.
#[test]
fn block_of_subs_with_pending_messages() {
    let relay = Relay::start_with(RelayOptions {
        cores: 2,
        ..Default::default()
    });
    let mut owner = relay.client();
    let mut s = relay.client();
    let qs: Vec<Queue> = (0..6).map(|_| create(&mut owner)).collect();
    for (i, q) in qs.iter().enumerate() {
        send_ok(&mut s, q, None, format!("m{i}").as_bytes());
    }
    drop(owner);
    let mut c: Client = relay.client();
    let corrs: Vec<[u8; 24]> = qs.iter().map(|_| new_corr_id()).collect();
    let ts: Vec<ClientTransmission> = qs
        .iter()
        .zip(&corrs)
        .map(|(q, corr)| {
            ClientTransmission::new(corr, q.rid(), Command::Sub).signed(q.key().clone())
        })
        .collect();
    c.send_batch(&ts).unwrap();
    for (q, corr) in qs.iter().zip(&corrs) {
        let r = c.recv_for(corr).unwrap();
        assert_eq!(r.entity_id, q.rid());
        assert_eq!(r.msg, Ok(BrokerMsg::Sok(None)));
    }
    let mut seen = Vec::new();
    for _ in &qs {
        let t = next(&mut c);
        let q = qs
            .iter()
            .find(|q| q.rid() == t.entity_id)
            .expect("MSG for one of the queues");
        let m = smp_relay::client::queue::receive(&q.secret, &t).unwrap();
        seen.push(m.msg.body().unwrap().to_vec());
    }
    seen.sort();
    let want: Vec<Vec<u8>> = (0..6).map(|i| format!("m{i}").into_bytes()).collect();
    assert_eq!(seen, want);
    expect_nothing(&mut c, "one MSG per queue");
}

/// As simplexmq `Server.hs` acknowledges: an ACK of another ID leaves the delivered message
/// outstanding; an empty ID acknowledges whatever was delivered; with nothing delivered, or on a
/// connection without SUB or GET, ACK is `NO_MSG`.
#[test]
fn ack_rules() {
    let relay = Relay::start();
    let (mut r, mut s, mut other) = (relay.client(), relay.client(), relay.client());
    let q = create(&mut r);
    assert_eq!(ack(&mut r, &q, b""), ERR_NO_MSG, "nothing delivered");
    send_ok(&mut s, &q, None, b"one");
    send_ok(&mut s, &q, None, b"two");
    let m1 = expect_body(&mut r, &q, b"one");
    assert_eq!(ack(&mut r, &q, &[7u8; 24]), ERR_NO_MSG, "another ID");
    assert_eq!(
        ack(&mut other, &q, &m1.msg_id),
        ERR_NO_MSG,
        "a connection without SUB or GET"
    );
    let m2 = msg_of(&q, ack(&mut r, &q, b""));
    assert_eq!(
        m2.msg.body(),
        Some(&b"two"[..]),
        "the empty ID acknowledged message one"
    );
    assert_eq!(ack(&mut r, &q, b""), BrokerMsg::Ok);
    assert_eq!(ack(&mut r, &q, b""), ERR_NO_MSG, "nothing outstanding");
}

/// NEW with subscribe mode 'C' (create only) does not subscribe: nothing is pushed until SUB.
#[test]
fn create_only_queue_is_not_subscribed() {
    let relay = Relay::start();
    let (mut r, mut s) = (relay.client(), relay.client());
    let q = create_only(&mut r);
    send_ok(&mut s, &q, None, b"waiting");
    expect_nothing(&mut r, "no subscription yet");
    let m = sub_with_msg(&mut r, &q);
    assert_eq!(m.msg.body(), Some(&b"waiting"[..]));
}

/// A block `[SEND, SUB]` for one queue from a connection that was not subscribed: the SUB sees the
/// message the SEND of the same block stored, and delivers it once.
#[test]
fn send_then_sub_in_one_block() {
    for cores in [1, 2] {
        let relay = Relay::start_with(RelayOptions {
            cores,
            ..Default::default()
        });
        let mut owner = relay.client();
        let q = create(&mut owner);
        drop(owner);
        let mut c = relay.client();
        let (c1, c2) = (new_corr_id(), new_corr_id());
        let ts = [
            ClientTransmission::new(&c1, q.sid(), send_cmd(b"same block")),
            ClientTransmission::new(&c2, q.rid(), Command::Sub).signed(q.key().clone()),
        ];
        c.send_batch(&ts).unwrap();
        let block = c.recv_block().unwrap();
        let got: Vec<String> = block.iter().map(describe).collect();
        assert_eq!(
            block.len(),
            3,
            "cores {cores}: OK, SOK and MSG in one block: {got:?}"
        );
        assert_eq!(
            (block[0].corr_id.as_slice(), &block[0].msg),
            (&c1[..], &Ok(BrokerMsg::Ok))
        );
        assert_eq!(
            (block[1].corr_id.as_slice(), &block[1].msg),
            (&c2[..], &Ok(BrokerMsg::Sok(None)))
        );
        let m = smp_relay::client::queue::receive(&q.secret, &block[2]).unwrap();
        assert_eq!(m.msg.body(), Some(&b"same block"[..]));
        expect_nothing(&mut c, "delivered once");
    }
}

/// A block `[SUB, SEND]`: the SEND lands in the queue the same block subscribed; the MSG, SOK and
/// OK each arrive once.
#[test]
fn sub_then_send_in_one_block() {
    let relay = Relay::start();
    let mut owner = relay.client();
    let q = create(&mut owner);
    drop(owner);
    let mut c = relay.client();
    let (c1, c2) = (new_corr_id(), new_corr_id());
    let ts = [
        ClientTransmission::new(&c1, q.rid(), Command::Sub).signed(q.key().clone()),
        ClientTransmission::new(&c2, q.sid(), send_cmd(b"after sub")),
    ];
    c.send_batch(&ts).unwrap();
    assert_eq!(c.recv_for(&c1).unwrap().msg, Ok(BrokerMsg::Sok(None)));
    assert_eq!(c.recv_for(&c2).unwrap().msg, Ok(BrokerMsg::Ok));
    let m = expect_msg(&mut c, &q);
    assert_eq!(m.msg.body(), Some(&b"after sub"[..]));
    expect_nothing(&mut c, "delivered once");
}

/// DEL tells the subscriber (DELD) but not a connection in GET mode, which has no subscription.
#[test]
fn delete_does_not_notify_get_mode_connection() {
    let relay = Relay::start();
    let (mut r, mut g, mut s) = (relay.client(), relay.client(), relay.client());
    let q = create(&mut r);
    send_ok(&mut s, &q, None, b"m");
    expect_body(&mut r, &q, b"m");
    let got = msg_of(&q, signed(&mut g, q.key(), q.rid(), Command::Get));
    assert_eq!(got.msg.body(), Some(&b"m"[..]));
    let mut d = relay.client();
    assert_eq!(
        signed(&mut d, q.key(), q.rid(), Command::Del),
        BrokerMsg::Ok
    );
    expect_event(&mut r, q.rid(), BrokerMsg::Deld);
    expect_nothing(&mut g, "GET mode gets no DELD");
    assert_eq!(ack(&mut g, &q, &got.msg_id), ERR_AUTH, "the queue is gone");
}

/// Flag bytes after the notification Bool are accepted and not stored: the MSG carries the Bool only,
/// as the reference's `MsgFlags` keeps only `notification`.
#[test]
fn reserved_flag_bytes_are_dropped() {
    let relay = Relay::start();
    let (mut r, mut s) = (relay.client(), relay.client());
    let q = create(&mut r);
    let cmd = Command::Send {
        flags: smp_relay::protocol::command::MsgFlags {
            notification: true,
            reserved: b"xyz".to_vec(),
        },
        body: b"flagged".to_vec(),
    };
    assert_eq!(send_as(&mut s, q.sid(), None, cmd), BrokerMsg::Ok);
    let m = expect_body(&mut r, &q, b"flagged");
    match m.msg {
        RcvMsg::Message {
            notification,
            reserved_flags,
            ..
        } => {
            assert!(notification);
            assert_eq!(reserved_flags, b"", "only the Bool is delivered");
        }
        other => panic!("{other:?}"),
    }
}
