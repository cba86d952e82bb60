//! Bad input against live queues (simplexmq `Protocol.hs`, `Server.hs`): malformed parameters, keys
//! of the wrong type, oversize bodies, IDs of other parties, commands for deleted queues, and a
//! block of 255 transmissions from mixed parties. Each answers a protocol error per transmission
//! (never a panic or a dropped connection), and afterwards a control queue still completes SEND →
//! MSG → ACK.

use crate::common;
use crate::support;

use common::Relay;
use smp_relay::client::queue::{self, auth_key, KeyAlg, RecipientKeys, ALL_KEY_ALGS};
use smp_relay::client::{Authorization, Client, ClientTransmission, Signer};
use smp_relay::crypto::keys::{X25519_SPKI_PREFIX, X448_SPKI_PREFIX};
use smp_relay::protocol::batch::BatchWriter;
use smp_relay::protocol::command::{Command, QueueReq};
use smp_relay::protocol::response::BrokerMsg;
use support::*;

/// A relay with a control queue: its recipient connection, a sender connection and the sender key.
struct Setup {
    relay: Relay,
    rc: Client,
    sc: Client,
    control: Queue,
    sender: Signer,
}

impl Setup {
    fn new() -> Setup {
        let relay = Relay::start();
        let (mut rc, sc) = (relay.client(), relay.client());
        let sender = auth_key(KeyAlg::Ed25519);
        let control = create_secured(&mut rc, &sender);
        Setup {
            relay,
            rc,
            sc,
            control,
            sender,
        }
    }

    /// The relay still runs and the control queue still works.
    fn check(&mut self, after: &str) {
        assert!(self.relay.is_running(), "relay exited after {after}");
        control_round(
            &mut self.rc,
            &mut self.sc,
            &self.control,
            &self.sender,
            after,
        );
    }
}

fn short(b: &[u8]) -> Vec<u8> {
    let mut v = vec![b.len() as u8];
    v.extend_from_slice(b);
    v
}

fn raw(c: &mut Client, entity: &[u8], cmd: &[u8], auth: Authorization) -> BrokerMsg {
    let corr = smp_relay::client::new_corr_id();
    let t = ClientTransmission::raw(&corr, entity, cmd).with_auth(auth);
    c.send_batch(&[t]).expect("send");
    let r = c.recv_for(&corr).expect("response");
    assert_eq!(
        r.entity_id,
        entity,
        "errors keep the entity of {:?}",
        lossy(cmd)
    );
    r.msg.expect("a response that parses")
}

fn cat(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

fn x448_spki() -> Vec<u8> {
    cat(&[&X448_SPKI_PREFIX, &[9u8; 56]])
}

fn x25519_spki(k: &[u8; 32]) -> Vec<u8> {
    cat(&[&X25519_SPKI_PREFIX, k])
}

#[test]
fn malformed_parameters_answer_syntax_errors() {
    let mut t = Setup::new();
    let syntax = cmd_err(CommandError::Syntax);
    let unknown = cmd_err(CommandError::Unknown);
    let q = create(&mut t.rc);
    let k = sign(q.key());
    let rid = q.rid().to_vec();
    let cases: Vec<(&[u8], Vec<u8>, Authorization, BrokerMsg)> = vec![
        (&rid, b"KEY".to_vec(), k.clone(), syntax.clone()),
        (&rid, b"KEY \x05abcde".to_vec(), k.clone(), syntax.clone()),
        (&rid, b"KEY \xff".to_vec(), k.clone(), syntax.clone()),
        (&rid, b"SUB ".to_vec(), k.clone(), syntax.clone()),
        (&rid, b"SUB=".to_vec(), k.clone(), unknown.clone()),
        (&rid, b"ACK".to_vec(), k.clone(), syntax.clone()),
        (&rid, b"ACK \x30short".to_vec(), k.clone(), syntax.clone()),
        (&rid, b"RKEY \x00".to_vec(), k.clone(), syntax.clone()),
        (&rid, b"NKEY \x02ab".to_vec(), k.clone(), syntax.clone()),
        (
            &rid,
            b"LSET \x03abc\x00".to_vec(),
            k.clone(),
            syntax.clone(),
        ),
        (&rid, b"OFF extra".to_vec(), k.clone(), syntax.clone()),
        (
            q.sid(),
            b"SEND".to_vec(),
            Authorization::None,
            syntax.clone(),
        ),
        (
            q.sid(),
            b"SEND T".to_vec(),
            Authorization::None,
            syntax.clone(),
        ),
        (
            q.sid(),
            b"SEND X hello".to_vec(),
            Authorization::None,
            syntax.clone(),
        ),
        (b"", b"NEW".to_vec(), k.clone(), syntax.clone()),
        (b"", b"NEW \x01\x02".to_vec(), k.clone(), syntax.clone()),
        (&rid, b"MSG \x00".to_vec(), k.clone(), unknown.clone()),
        (&rid, b"OK".to_vec(), k.clone(), unknown.clone()),
    ];
    for (entity, cmd, auth, want) in cases {
        let got = raw(&mut t.rc, entity, &cmd, auth);
        assert_eq!(got, want, "{:?}", lossy(&cmd));
    }
    // The queue the malformed commands named is intact.
    send_ok(&mut t.sc, &q, None, b"still here");
    expect_body(&mut t.rc, &q, b"still here");
    t.check("malformed parameters");
}

#[test]
fn keys_of_the_wrong_type_are_refused() {
    let mut t = Setup::new();
    let syntax = cmd_err(CommandError::Syntax);
    let rk = RecipientKeys::generate(KeyAlg::Ed25519);
    let auth_spki = rk.auth.public_key().to_spki();
    let dh_spki = x25519_spki(&rk.dh.public);
    let ed_spki = auth_spki.clone();
    // NEW at v18: auth key, DH key, no password, subscribe, messaging, no notifier.
    let new_with = |a: &[u8], d: &[u8]| cat(&[b"NEW ", &short(a), &short(d), b"0S1M00"]);
    let ok_new = new_with(&auth_spki, &dh_spki);
    assert!(
        matches!(
            raw(&mut t.rc, b"", &ok_new, sign(&rk.auth)),
            BrokerMsg::Ids(_)
        ),
        "the hand-built NEW is right"
    );
    let bad_dh = new_with(&auth_spki, &ed_spki);
    assert_eq!(
        raw(&mut t.rc, b"", &bad_dh, sign(&rk.auth)),
        syntax,
        "Ed25519 as DH key"
    );
    let bad_auth = new_with(&x448_spki(), &dh_spki);
    assert_eq!(
        raw(&mut t.rc, b"", &bad_auth, sign(&rk.auth)),
        syntax,
        "X448 as auth key"
    );

    let q = create(&mut t.rc);
    let key_x448 = cat(&[b"KEY ", &short(&x448_spki())]);
    assert_eq!(
        raw(&mut t.rc, q.rid(), &key_x448, sign(q.key())),
        syntax,
        "X448 sender key"
    );
    let nkey_ed = cat(&[b"NKEY ", &short(&ed_spki), &short(&ed_spki)]);
    assert_eq!(
        raw(&mut t.rc, q.rid(), &nkey_ed, sign(q.key())),
        syntax,
        "Ed25519 as notifier DH key"
    );

    // A signature of another algorithm than the queue key's.
    for alg in ALL_KEY_ALGS {
        let q = create_alg(&mut t.rc, alg);
        for other in ALL_KEY_ALGS.into_iter().filter(|a| *a != alg) {
            let wrong = auth_key(other);
            assert_eq!(
                signed(&mut t.rc, &wrong, q.rid(), Command::Sub),
                ERR_AUTH,
                "{alg:?} queue, {other:?} authorization"
            );
        }
        assert_eq!(
            signed(&mut t.rc, q.key(), q.rid(), Command::Sub),
            BrokerMsg::Sok(None),
            "{alg:?}"
        );
    }
    // An authorization of no algorithm's length.
    let corr = smp_relay::client::new_corr_id();
    let tr = ClientTransmission::new(&corr, q.rid(), Command::Sub)
        .with_auth(Authorization::Raw(vec![1; 10]));
    t.rc.send_batch(&[tr]).unwrap();
    let r = t.rc.recv_for(&corr).unwrap();
    assert_eq!(r.entity_id, b"", "ERR BLOCK drops the entity");
    assert_eq!(r.msg, Ok(BrokerMsg::Err(ErrorType::Block)));
    t.check("keys of the wrong type");
}

/// Every key algorithm works for the recipient and for the sender.
#[test]
fn every_key_algorithm_authorizes() {
    let mut t = Setup::new();
    for ra in ALL_KEY_ALGS {
        for sa in ALL_KEY_ALGS {
            let q = create_alg(&mut t.rc, ra);
            let sender = auth_key(sa);
            let key = Command::Key(sender.public_key());
            assert_eq!(
                signed(&mut t.rc, q.key(), q.rid(), key),
                BrokerMsg::Ok,
                "{ra:?}/{sa:?}"
            );
            let body = format!("{ra:?} {sa:?}");
            send_ok(&mut t.sc, &q, Some(&sender), body.as_bytes());
            let m = expect_body(&mut t.rc, &q, body.as_bytes());
            assert_eq!(ack(&mut t.rc, &q, &m.msg_id), BrokerMsg::Ok);
        }
    }
    t.check("all key algorithms");
}

#[test]
fn oversize_bodies_are_refused() {
    let mut t = Setup::new();
    let q = t.control.clone();
    let sender = t.sender.clone();
    assert_eq!(
        send(&mut t.sc, &q, Some(&sender), &[b'a'; 16049]),
        ERR_LARGE_MSG
    );
    assert_eq!(
        send(&mut t.sc, &q, Some(&sender), &[b'a'; 16100]),
        ERR_LARGE_MSG
    );
    let unsecured = create(&mut t.rc);
    assert_eq!(
        send(&mut t.sc, &unsecured, None, &[0u8; 16049]),
        ERR_LARGE_MSG
    );
    expect_nothing(&mut t.rc, "refused messages are not delivered");
    t.check("oversize bodies");
}

#[test]
fn ids_of_other_parties_are_refused() {
    let mut t = Setup::new();
    let sender = auth_key(KeyAlg::Ed25519);
    let q = create_secured(&mut t.rc, &sender);
    let n = nkey(&mut t.rc, &q);
    let keys = RecipientKeys::generate(KeyAlg::Ed25519);
    let corr = smp_relay::client::new_corr_id();
    let mut new = queue::new_queue(&keys);
    new.queue_req = Some(QueueReq::Contact(Some((
        b"a link id of 24 bytes...".to_vec(),
        queue::new_link(&corr, b"f", b"u"),
    ))));
    let c = create_with_corr(&mut t.rc, keys, new, &corr);
    let link = c.ids.link_id.clone().unwrap();

    let recipient_cmds = [
        Command::Sub,
        Command::Get,
        Command::Ack(vec![]),
        Command::Key(sender.public_key()),
        Command::Off,
        Command::Del,
        Command::Que,
        Command::NDel,
        Command::LDel,
        queue::NotifierKeys::generate(KeyAlg::Ed25519).nkey(),
    ];
    for other in [q.sid(), n.nid.as_slice(), link.as_slice()] {
        for cmd in &recipient_cmds {
            let got = signed(&mut t.rc, q.key(), other, cmd.clone());
            assert_eq!(got, ERR_AUTH, "{} with another party's ID", cmd.tag());
        }
    }
    for other in [q.rid(), n.nid.as_slice(), link.as_slice()] {
        assert_eq!(
            send_as(&mut t.sc, other, Some(&sender), send_cmd(b"x")),
            ERR_AUTH,
            "SEND"
        );
        let skey = Command::SKey(sender.public_key());
        assert_eq!(signed(&mut t.sc, &sender, other, skey), ERR_AUTH, "SKEY");
    }
    for other in [q.rid(), q.sid(), link.as_slice()] {
        assert_eq!(
            signed(&mut t.sc, &n.keys.auth, other, Command::NSub),
            ERR_AUTH,
            "NSUB"
        );
    }
    for other in [c.rid(), c.sid()] {
        assert_eq!(unsigned(&mut t.sc, other, Command::LGet), ERR_AUTH, "LGET");
    }
    // The queues whose IDs were misused are intact.
    send_ok(&mut t.sc, &q, Some(&sender), b"intact");
    expect_body(&mut t.rc, &q, b"intact");
    assert!(matches!(
        unsigned(&mut t.sc, &link, Command::LGet),
        BrokerMsg::Lnk { .. }
    ));
    assert_eq!(nsub(&mut t.sc, &n), BrokerMsg::Sok(None));
    t.check("IDs of other parties");
}

#[test]
fn commands_for_deleted_queues_are_refused() {
    let mut t = Setup::new();
    let sender = auth_key(KeyAlg::Ed25519);
    let keys = RecipientKeys::generate(KeyAlg::Ed25519);
    let corr = smp_relay::client::new_corr_id();
    let mut new = queue::new_queue(&keys);
    new.queue_req = Some(QueueReq::Messaging(Some(queue::new_link(
        &corr, b"f", b"u",
    ))));
    let q = create_with_corr(&mut t.rc, keys, new, &corr);
    let link = q.ids.link_id.clone().unwrap();
    let n = nkey(&mut t.rc, &q);
    send_ok(&mut t.sc, &q, None, b"pending");
    let m = expect_body(&mut t.rc, &q, b"pending");
    assert_eq!(
        signed(&mut t.rc, q.key(), q.rid(), Command::Del),
        BrokerMsg::Ok
    );

    let recipient_cmds = [
        Command::Sub,
        Command::Get,
        Command::Ack(m.msg_id.clone()),
        Command::Ack(vec![]),
        Command::Key(sender.public_key()),
        Command::RKey(vec![sender.public_key()]),
        Command::LSet {
            link_id: link.clone(),
            fixed: b"f".to_vec(),
            user: b"u2".to_vec(),
        },
        Command::LDel,
        queue::NotifierKeys::generate(KeyAlg::Ed25519).nkey(),
        Command::NDel,
        Command::Off,
        Command::Del,
        Command::Que,
    ];
    for cmd in recipient_cmds {
        let tag = cmd.tag();
        assert_eq!(
            signed(&mut t.rc, q.key(), q.rid(), cmd),
            ERR_AUTH,
            "{tag} on a deleted queue"
        );
    }
    assert_eq!(send(&mut t.sc, &q, None, b"late"), ERR_AUTH);
    let skey = Command::SKey(sender.public_key());
    assert_eq!(signed(&mut t.sc, &sender, q.sid(), skey), ERR_AUTH);
    let lkey = Command::LKey(sender.public_key());
    assert_eq!(signed(&mut t.sc, &sender, &link, lkey), ERR_AUTH);
    assert_eq!(unsigned(&mut t.sc, &link, Command::LGet), ERR_AUTH);
    assert_eq!(nsub(&mut t.sc, &n), ERR_AUTH);
    t.check("commands for a deleted queue");
}

/// One block of 255 transmissions from every party, valid and not: each gets its own response, in
/// a block or another, and exactly the accepted SENDs are stored.
#[test]
fn block_of_255_mixed_transmissions() {
    let mut t = Setup::new();
    // A target queue nobody is subscribed to (its creator closed), unsecured so SEND is unsigned.
    let target = {
        let mut c = t.relay.client();
        create(&mut c)
    };
    let contact = {
        let keys = RecipientKeys::generate(KeyAlg::Ed25519);
        let corr = smp_relay::client::new_corr_id();
        let mut new = queue::new_queue(&keys);
        new.queue_req = Some(QueueReq::Contact(Some((
            b"contact link of 24 bytes".to_vec(),
            queue::new_link(&corr, b"f", b"u"),
        ))));
        create_with_corr(&mut t.rc, keys, new, &corr)
    };
    let link = contact.ids.link_id.clone().unwrap();
    let stranger = auth_key(KeyAlg::Ed25519);

    let mut c = t.relay.client();
    let mut writer = BatchWriter::new();
    let mut expected: Vec<(Vec<u8>, Vec<u8>, BrokerMsg)> = Vec::new();
    let mut sends = 0;
    for i in 0..255u16 {
        let corr = i.to_be_bytes().to_vec();
        let (tr, entity, want) = match i % 12 {
            0 => (
                ClientTransmission::new(&corr, b"", Command::Ping),
                vec![],
                BrokerMsg::Pong,
            ),
            1 => {
                sends += 1;
                let tr = ClientTransmission::new(&corr, target.sid(), send_cmd(b"x"));
                (tr, target.sid().to_vec(), BrokerMsg::Ok)
            }
            2 => {
                let tr = ClientTransmission::new(&corr, target.rid(), Command::Sub);
                (tr, target.rid().to_vec(), cmd_err(CommandError::NoAuth))
            }
            3 => {
                let tr = ClientTransmission::new(&corr, target.rid(), send_cmd(b"x"));
                (tr, target.rid().to_vec(), ERR_AUTH)
            }
            4 => {
                let tr = ClientTransmission::new(&corr, &link, Command::LGet);
                let lnk = BrokerMsg::Lnk {
                    sender_id: contact.sid().to_vec(),
                    fixed: b"f".to_vec(),
                    user: b"u".to_vec(),
                };
                (tr, link.clone(), lnk)
            }
            5 => {
                let tr = ClientTransmission::new(&corr, b"no such link", Command::LGet);
                (tr, b"no such link".to_vec(), ERR_AUTH)
            }
            6 => {
                let tr = ClientTransmission::raw(&corr, target.rid(), b"HELLO");
                (tr, target.rid().to_vec(), cmd_err(CommandError::Unknown))
            }
            7 => {
                let tr = ClientTransmission::new(&corr, target.rid(), Command::NSub);
                (tr, target.rid().to_vec(), cmd_err(CommandError::NoAuth))
            }
            8 => {
                let tr = ClientTransmission::new(&corr, b"", send_cmd(b"x"));
                (tr, vec![], cmd_err(CommandError::NoEntity))
            }
            9 => {
                let tr = ClientTransmission::new(&corr, target.rid(), Command::Sub)
                    .signed(stranger.clone());
                (tr, target.rid().to_vec(), ERR_AUTH)
            }
            10 => {
                let tr = ClientTransmission::raw(&corr, target.rid(), b"ACK");
                (tr, target.rid().to_vec(), cmd_err(CommandError::Syntax))
            }
            _ => {
                let tr = ClientTransmission::new(&corr, b"an unknown sender id...", send_cmd(b"x"));
                (tr, b"an unknown sender id...".to_vec(), ERR_AUTH)
            }
        };
        let bytes = c.encode_transmission(&tr).unwrap();
        assert!(writer.try_push(&bytes), "transmission {i} fits the block");
        expected.push((corr, entity, want));
    }
    assert_eq!(writer.len(), 255);
    c.send_content(&writer.content()).unwrap();
    for (corr, entity, want) in &expected {
        let r = c
            .recv_for(corr)
            .unwrap_or_else(|e| panic!("response {corr:?}: {e}"));
        assert_eq!(&r.entity_id, entity, "entity of response {corr:?}");
        assert_eq!(r.msg.as_ref(), Ok(want), "response {corr:?}");
    }
    expect_nothing(&mut c, "one response per transmission");
    let info = signed(&mut t.rc, target.key(), target.rid(), Command::Que);
    let BrokerMsg::Info(json) = info else {
        panic!("QUE: {info:?}")
    };
    assert!(
        json.contains(&format!("\"qiSize\":{sends}")),
        "{sends} SENDs stored: {json}"
    );
    t.check("a block of 255 mixed transmissions");
}
