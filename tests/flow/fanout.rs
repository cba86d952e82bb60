//! Events between shards over real connections (`docs/ARCHITECTURE.md` §4): while a subscriber's
//! shard is held (its thread blocked, as by work of its own), the owner of its queues serves a
//! flood of DELs and SENDs; the held shard's inbox takes at most `limits::MAX_INBOX_EVENTS` of
//! the DELDs and NMSGs they cause, the rest waits at the owner, and once the shard goes on the
//! subscriber gets every DELD and every NMSG once, the NMSGs of each notifier in message order.

use crate::common;
use crate::support;

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::{free_port, init, Relay, RelayOptions, TempDir};
use smp_relay::client::queue::{self, RcvMsg};
use smp_relay::client::{new_corr_id, Client, ClientTransmission};
use smp_relay::limits::MAX_INBOX_EVENTS;
use smp_relay::protocol::command::Command;
use smp_relay::protocol::response::BrokerMsg;
use support::*;

const ADMIN: &str = "fanout-admin";

/// A 2-shard relay with the control port on; returns it and the port.
fn relay_with_control() -> (Relay, u16) {
    let dir = TempDir::new("fanout").expect("a temp dir");
    init(dir.path());
    let ini = dir.path().join("smp-server.ini");
    let text = std::fs::read_to_string(&ini).expect("read the ini");
    let port = free_port();
    let text = text
        .replacen(
            "[AUTH]\n",
            &format!("[AUTH]\ncontrol_port_admin_password = {ADMIN}\n"),
            1,
        )
        .replacen(
            "[TRANSPORT]\n",
            &format!("[TRANSPORT]\ncontrol_port = {port}\n"),
            1,
        );
    std::fs::write(&ini, text).expect("write the ini");
    let opts = RelayOptions {
        cores: 2,
        ..RelayOptions::default()
    };
    (Relay::start_in(dir, opts), port)
}

/// The shard of each connection, by session ID, from the control port's `clients`: a client's
/// number is its shard plus the shard count times its number on the shard.
fn shards_of_sessions(port: u16) -> HashMap<Vec<u8>, usize> {
    use base64::Engine;
    let w = TcpStream::connect(("127.0.0.1", port)).expect("connect to the control port");
    w.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("read timeout");
    let mut r = BufReader::new(w.try_clone().expect("clone"));
    let mut w = w;
    write!(w, "auth {ADMIN}\nclients\nquit\n").expect("write");
    let mut out = HashMap::new();
    let mut line = String::new();
    while r.read_line(&mut line).unwrap_or(0) > 0 {
        let f: Vec<&str> = line.trim_end().split(',').collect();
        if f.len() == 8 {
            if let (Ok(id), Ok(sid)) = (
                f[0].parse::<usize>(),
                base64::engine::general_purpose::STANDARD.decode(f[1]),
            ) {
                out.insert(sid, id % 2);
            }
        }
        line.clear();
    }
    out
}

/// A connection on shard `shard`: connects until the kernel places one there (others are kept
/// open until then, so that each new one is a new placement).
fn client_on(relay: &Relay, port: u16, shard: usize) -> Client {
    let mut others = Vec::new();
    for _ in 0..64 {
        let c = relay.client();
        if shards_of_sessions(port).get(c.session_id()) == Some(&shard) {
            return c;
        }
        others.push(c);
    }
    panic!("64 connections, none on shard {shard}");
}

/// Sends `ts` in blocks of `per_block` and returns their answers, by corrId.
fn pipelined(c: &mut Client, ts: Vec<(Vec<u8>, ClientTransmission)>) -> Vec<BrokerMsg> {
    let mut answers = Vec::with_capacity(ts.len());
    for chunk in ts.chunks(50) {
        let batch: Vec<ClientTransmission> = chunk.iter().map(|(_, t)| t.clone()).collect();
        c.send_batch(&batch).expect("send a block");
        for (corr, _) in chunk {
            let r = c.recv_for(corr).expect("an answer");
            answers.push(r.msg.expect("a parsed answer"));
        }
    }
    answers
}

fn owned_by(q: &Queue, shard: usize) -> bool {
    smp_relay::store::group_of(q.rid()) as usize % 2 == shard
}

#[test]
fn events_for_a_held_shard_wait_at_their_owner_and_each_arrives_once() {
    const DELETED: usize = 1400;
    const NOTIFIERS: usize = 10;
    const SENDS_EACH: usize = 90;
    const { assert!(DELETED + NOTIFIERS * SENDS_EACH > MAX_INBOX_EVENTS + 200) };
    let (relay, port) = relay_with_control();
    // The subscriber on shard 1, the sender on shard 0; every queue used is owned by shard 0.
    let mut sub = client_on(&relay, port, 1);
    let mut snd = client_on(&relay, port, 0);
    let mut queues = Vec::new();
    while queues.len() < DELETED + NOTIFIERS {
        let batch = create_many(&mut sub, 200, 50);
        queues.extend(batch.into_iter().filter(|q| owned_by(q, 0)));
    }
    queues.truncate(DELETED + NOTIFIERS);
    let ntf_queues = queues.split_off(DELETED);
    let subs: Vec<_> = queues
        .iter()
        .chain(&ntf_queues)
        .map(|q| {
            let corr = new_corr_id().to_vec();
            let t = ClientTransmission::new(&corr, q.rid(), Command::Sub).signed(q.key().clone());
            (corr, t)
        })
        .collect();
    for a in pipelined(&mut sub, subs) {
        assert_eq!(a, sok(&sub));
    }
    let notifiers: Vec<Notifier> = ntf_queues.iter().map(|q| nkey(&mut sub, q)).collect();
    for n in &notifiers {
        assert_eq!(nsub(&mut sub, n), sok(&sub));
    }

    relay.hold_shard(1);
    // Every DEL and SEND is answered while shard 1 takes nothing from its inbox.
    let dels = queues
        .iter()
        .map(|q| {
            let corr = new_corr_id().to_vec();
            let t = ClientTransmission::new(&corr, q.rid(), Command::Del).signed(q.key().clone());
            (corr, t)
        })
        .collect();
    for a in pipelined(&mut snd, dels) {
        assert_eq!(a, BrokerMsg::Ok);
    }
    let sends = (0..SENDS_EACH)
        .flat_map(|i| {
            ntf_queues.iter().map(move |q| {
                let corr = new_corr_id().to_vec();
                let body = format!("message {i}");
                let t = ClientTransmission::new(&corr, q.sid(), send_ntf_cmd(body.as_bytes()));
                (corr, t)
            })
        })
        .collect();
    for a in pipelined(&mut snd, sends) {
        assert_eq!(a, BrokerMsg::Ok);
    }
    assert!(
        relay.log_shows("holds what it sends there"),
        "shard 0 held events back for shard 1; log:\n{}",
        relay.log_text()
    );
    relay.release_shard();

    // The subscriber gets every DELD once, one MSG per notifier queue (its first message, not
    // acknowledged yet), and every NMSG once.
    let mut deld = HashSet::new();
    let mut firsts: HashMap<Vec<u8>, Vec<u8>> = HashMap::new();
    let mut nmsgs: HashMap<Vec<u8>, Vec<Vec<u8>>> = HashMap::new();
    let by_nid: HashMap<&[u8], &Notifier> = notifiers.iter().map(|n| (&n.nid[..], n)).collect();
    let expected = DELETED + NOTIFIERS + NOTIFIERS * SENDS_EACH;
    let mut got = 0;
    while got < expected {
        let t = next(&mut sub);
        assert_eq!(t.corr_id, b"", "an event: {:?}", t.msg);
        got += 1;
        match t.msg {
            Ok(BrokerMsg::Deld) => assert!(deld.insert(t.entity_id.clone()), "a second DELD"),
            Ok(BrokerMsg::Msg { .. }) => {
                let q = ntf_queues
                    .iter()
                    .find(|q| q.rid() == t.entity_id)
                    .expect("a MSG of a notifier queue");
                let m = queue::receive(&q.secret, &t).expect("a MSG");
                assert!(firsts.insert(t.entity_id.clone(), m.msg_id).is_none());
            }
            Ok(BrokerMsg::Nmsg { .. }) => {
                let n = by_nid[&t.entity_id[..]];
                let meta = queue::receive_nmsg(&n.secret, &t).expect("an NMSG");
                nmsgs.entry(n.nid.clone()).or_default().push(meta.msg_id);
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    expect_nothing(&mut sub, "an event more");
    let want: HashSet<Vec<u8>> = queues.iter().map(|q| q.rid().to_vec()).collect();
    assert_eq!(deld, want, "one DELD per deleted queue");
    // Each notifier's NMSGs name its queue's messages, in the queue's order.
    for (q, n) in ntf_queues.iter().zip(&notifiers) {
        let mut order = vec![firsts[q.rid()].clone()];
        while order.len() < SENDS_EACH {
            let last = order.last().expect("a message").clone();
            let r = ack(&mut sub, q, &last);
            let m = msg_of(q, r);
            assert!(
                matches!(m.msg, RcvMsg::Message { .. }),
                "a message, not a quota marker"
            );
            order.push(m.msg_id);
        }
        assert_eq!(
            nmsgs[&n.nid], order,
            "NMSGs of a notifier, once each, in order"
        );
    }
}
