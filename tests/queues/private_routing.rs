//! Private routing, destination role (simplexmq `Server.hs`,
//! `processForwardedCommand`): SEND, SKEY, LKEY and LGET forwarded in `RFWD` as a reference client
//! and proxy build them, on a proxy session (`proxyServer = T`, no block encryption) and on an
//! ordinary one, and the errors the reference gives: plain `ERR` for what the proxy got wrong,
//! `ERR` inside `RRES` for what the client got wrong.

use crate::common;
use crate::support;

use common::{Relay, RelayOptions};
use smp_relay::client::proxy::{
    batch_of, forward, forward_batch, send_rfwd, Destination, ForwardedCommand, InnerResponse,
    RfwdAnswer,
};
use smp_relay::client::queue::{self, auth_key, KeyAlg, RecipientKeys};
use smp_relay::client::{new_corr_id, Authorization, Client, ClientOptions, CommandBody, Signer};
use smp_relay::protocol::command::{Command, QueueReq};
use smp_relay::protocol::error::{
    BrokerError, CommandError, ErrorType, NameError, ProxyError, TransportError,
};
use smp_relay::protocol::response::BrokerMsg;
use smp_relay::protocol::version::max_message_length;
use smp_relay::server::router::owner_shard;
use support::{create, create_with_corr, expect_body, expect_nothing, signed, Queue};

/// The forwarded version a current client gets from PKEY (the relay's range capped to 8..20).
const FWD_V: u16 = 18;

fn proxy_session(relay: &Relay) -> Client {
    let c = relay
        .connect(ClientOptions {
            proxy_server: true,
            ..ClientOptions::default()
        })
        .expect("proxy session");
    assert!(!c.is_encrypted(), "a proxy session has no block encryption");
    assert!(c.session_secret().is_some());
    c
}

fn ordinary_session(relay: &Relay) -> Client {
    let c = relay.client();
    assert!(c.session_secret().is_some());
    c
}

/// Both kinds of session a proxy may forward over.
fn sessions(relay: &Relay) -> [(&'static str, Client); 2] {
    [
        ("proxy session", proxy_session(relay)),
        ("ordinary session", ordinary_session(relay)),
    ]
}

fn send_cmd(body: &[u8]) -> Command {
    support::send_cmd(body)
}

fn sign(s: &Signer) -> Authorization {
    Authorization::Sign(s.clone())
}

/// Forwards and expects `RRES` whose inner answer names `entity` and carries the client's corrId.
fn fwd(p: &mut Client, v: u16, entity: &[u8], cmd: Command, a: Authorization) -> InnerResponse {
    match forward(p, v, entity, cmd, a).unwrap_or_else(|e| panic!("forward: {e}")) {
        RfwdAnswer::Rres(r) => {
            assert_eq!(r.entity_id, entity, "inner answer entity");
            assert_eq!(
                r.corr_id.len(),
                24,
                "inner answer carries the client's corrId"
            );
            r
        }
        RfwdAnswer::Err(e) => panic!("plain ERR {e:?} instead of RRES"),
    }
}

fn fwd_msg(p: &mut Client, v: u16, entity: &[u8], cmd: Command, a: Authorization) -> BrokerMsg {
    fwd(p, v, entity, cmd, a).msg
}

/// A messaging queue with short-link data (the server makes its link ID), for LKEY.
fn create_messaging_link(c: &mut Client, fixed: &[u8], user: &[u8]) -> Queue {
    let corr = new_corr_id();
    let keys = RecipientKeys::generate(KeyAlg::Ed25519);
    let mut new = queue::new_queue(&keys);
    new.queue_req = Some(QueueReq::Messaging(Some(queue::new_link(
        &corr, fixed, user,
    ))));
    let q = create_with_corr(c, keys, new, &corr);
    assert!(q.ids.link_id.is_some(), "IDS names the link");
    q
}

/// A contact queue with short-link data and a client-chosen link ID, for LGET.
fn create_contact_link(c: &mut Client, fixed: &[u8], user: &[u8]) -> (Queue, Vec<u8>) {
    let corr = new_corr_id();
    let link_id = new_corr_id().to_vec();
    let keys = RecipientKeys::generate(KeyAlg::Ed25519);
    let mut new = queue::new_queue(&keys);
    new.queue_req = Some(QueueReq::Contact(Some((
        link_id.clone(),
        queue::new_link(&corr, fixed, user),
    ))));
    (create_with_corr(c, keys, new, &corr), link_id)
}

#[test]
fn forwarded_skey_then_send_reaches_the_recipient() {
    let relay = Relay::start();
    let mut r = relay.client();
    for (kind, mut p) in sessions(&relay) {
        for alg in [KeyAlg::Ed25519, KeyAlg::Ed448, KeyAlg::X25519] {
            let q = create(&mut r);
            let s = auth_key(alg);
            assert_eq!(
                fwd_msg(
                    &mut p,
                    FWD_V,
                    q.sid(),
                    Command::SKey(s.public_key()),
                    sign(&s)
                ),
                BrokerMsg::Ok,
                "{kind} {alg:?}: SKEY"
            );
            let body = format!("forwarded over a {kind} with {alg:?}");
            assert_eq!(
                fwd_msg(&mut p, FWD_V, q.sid(), send_cmd(body.as_bytes()), sign(&s)),
                BrokerMsg::Ok,
                "{kind} {alg:?}: SEND"
            );
            expect_body(&mut r, &q, body.as_bytes());
            support::ack(&mut r, &q, b"");
            // Secured: an unsigned forwarded SEND is refused inside RRES.
            assert_eq!(
                fwd_msg(&mut p, FWD_V, q.sid(), send_cmd(b"x"), Authorization::None),
                BrokerMsg::Err(ErrorType::Auth),
                "{kind} {alg:?}"
            );
        }
        // Nothing reached the proxy connection but the answers.
        expect_nothing(&mut p, kind);
    }
}

#[test]
fn forwarded_unsigned_send_to_an_unsecured_queue() {
    let relay = Relay::start();
    let mut r = relay.client();
    for (kind, mut p) in sessions(&relay) {
        let q = create(&mut r);
        assert_eq!(
            fwd_msg(&mut p, FWD_V, q.sid(), send_cmd(b"hi"), Authorization::None),
            BrokerMsg::Ok,
            "{kind}"
        );
        expect_body(&mut r, &q, b"hi");
    }
}

#[test]
fn forwarded_lkey_secures_and_returns_the_link_data() {
    let relay = Relay::start();
    let mut r = relay.client();
    for (kind, mut p) in sessions(&relay) {
        let q = create_messaging_link(&mut r, b"fixed data", b"user data");
        let link_id = q.ids.link_id.clone().expect("link id");
        let s = auth_key(KeyAlg::Ed25519);
        let lnk = BrokerMsg::Lnk {
            sender_id: q.sid().to_vec(),
            fixed: b"fixed data".to_vec(),
            user: b"user data".to_vec(),
        };
        assert_eq!(
            fwd_msg(
                &mut p,
                FWD_V,
                &link_id,
                Command::LKey(s.public_key()),
                sign(&s)
            ),
            lnk,
            "{kind}: LKEY"
        );
        // Idempotent with the same key; another key is refused.
        assert_eq!(
            fwd_msg(
                &mut p,
                FWD_V,
                &link_id,
                Command::LKey(s.public_key()),
                sign(&s)
            ),
            lnk,
            "{kind}: LKEY again"
        );
        let other = auth_key(KeyAlg::Ed25519);
        assert_eq!(
            fwd_msg(
                &mut p,
                FWD_V,
                &link_id,
                Command::LKey(other.public_key()),
                sign(&other)
            ),
            BrokerMsg::Err(ErrorType::Auth),
            "{kind}: LKEY with another key"
        );
        assert_eq!(
            fwd_msg(&mut p, FWD_V, q.sid(), send_cmd(b"after LKEY"), sign(&s)),
            BrokerMsg::Ok
        );
        expect_body(&mut r, &q, b"after LKEY");
    }
}

#[test]
fn forwarded_lget_reads_a_contact_address() {
    let relay = Relay::start();
    let mut r = relay.client();
    for (kind, mut p) in sessions(&relay) {
        let (q, link_id) = create_contact_link(&mut r, b"contact fixed", b"contact user");
        assert_eq!(
            fwd_msg(&mut p, FWD_V, &link_id, Command::LGet, Authorization::None),
            BrokerMsg::Lnk {
                sender_id: q.sid().to_vec(),
                fixed: b"contact fixed".to_vec(),
                user: b"contact user".to_vec(),
            },
            "{kind}: LGET"
        );
        assert_eq!(
            fwd_msg(
                &mut p,
                FWD_V,
                &new_corr_id(),
                Command::LGet,
                Authorization::None
            ),
            BrokerMsg::Err(ErrorType::Auth),
            "{kind}: unknown link"
        );
        // A contact queue takes unsigned SENDs.
        assert_eq!(
            fwd_msg(
                &mut p,
                FWD_V,
                q.sid(),
                send_cmd(b"contact request"),
                Authorization::None
            ),
            BrokerMsg::Ok
        );
        expect_body(&mut r, &q, b"contact request");
    }
}

/// The inner command runs at the forwarded version, whatever the session's: v8–10 allow 16064
/// bytes, v11+ 16048. The reference does not refuse forwarded versions below 8 at the destination
/// (`processForwardedCommand` only sets the version; the proxy is what requires v8 of the
/// destination), so neither does the relay.
#[test]
fn forwarded_version_decides_the_command_forms() {
    let relay = Relay::start();
    let mut r = relay.client();
    let mut p = proxy_session(&relay);
    let q = create(&mut r);
    let s = auth_key(KeyAlg::Ed25519);
    assert_eq!(
        fwd_msg(&mut p, 9, q.sid(), Command::SKey(s.public_key()), sign(&s)),
        BrokerMsg::Ok
    );
    let big = vec![b'b'; max_message_length(8)];
    assert_eq!(big.len(), 16064);
    assert_eq!(
        fwd_msg(&mut p, 11, q.sid(), send_cmd(&big), sign(&s)),
        BrokerMsg::Err(ErrorType::LargeMsg),
        "v11 allows 16048 bytes"
    );
    assert_eq!(
        fwd_msg(&mut p, 8, q.sid(), send_cmd(&big), sign(&s)),
        BrokerMsg::Ok,
        "v8 allows 16064 bytes"
    );
    expect_body(&mut r, &q, &big);
    support::ack(&mut r, &q, b"");
    for v in [6, 7] {
        assert_eq!(
            fwd_msg(&mut p, v, q.sid(), send_cmd(b"old"), sign(&s)),
            BrokerMsg::Ok,
            "forwarded v{v}"
        );
        expect_body(&mut r, &q, b"old");
        support::ack(&mut r, &q, b"");
    }
    // The largest SEND, Ed448-signed at the highest version this relay serves (20; a forwarded
    // version outside its range is refused), fills the padded length exactly and is accepted.
    let q = create(&mut r);
    let s = auth_key(KeyAlg::Ed448);
    assert_eq!(
        fwd_msg(&mut p, 20, q.sid(), Command::SKey(s.public_key()), sign(&s)),
        BrokerMsg::Ok
    );
    let max = vec![b'm'; max_message_length(20)];
    assert_eq!(
        fwd_msg(&mut p, 20, q.sid(), send_cmd(&max), sign(&s)),
        BrokerMsg::Ok
    );
    expect_body(&mut r, &q, &max);
}

#[test]
fn without_a_session_secret_rfwd_is_refused() {
    let relay = Relay::start();
    let mut p = relay
        .connect(ClientOptions {
            send_key: false,
            ..ClientOptions::default()
        })
        .expect("session without a hello key");
    assert!(p.session_secret().is_none());
    let (n2, t) = send_rfwd(&mut p, vec![0u8; 200]).expect("RFWD");
    assert_eq!(t.corr_id, n2);
    assert_eq!(t.entity_id, b"");
    assert_eq!(
        t.msg,
        Ok(BrokerMsg::Err(ErrorType::Proxy(ProxyError::Broker(
            BrokerError::Transport(TransportError::NoAuth)
        ))))
    );
}

#[test]
fn plain_errors_for_what_the_proxy_got_wrong() {
    let relay = Relay::start();
    let mut r = relay.client();
    for (kind, mut p) in sessions(&relay) {
        // A body that does not open with the session secret.
        let (n2, t) = send_rfwd(&mut p, vec![0x33; 300]).expect("RFWD");
        assert_eq!(
            (t.corr_id.as_slice(), t.entity_id.as_slice()),
            (&n2[..], &b""[..])
        );
        assert_eq!(
            t.msg,
            Ok(BrokerMsg::Err(ErrorType::Crypto)),
            "{kind}: garbage"
        );
        // RFWD with no body at all does not parse.
        let corr = new_corr_id();
        let raw = smp_relay::client::ClientTransmission::raw(&corr, b"", b"RFWD");
        p.send_batch(&[raw]).expect("send");
        let t = p.recv_for(&corr).expect("answer");
        assert_eq!(
            t.msg,
            Ok(BrokerMsg::Err(ErrorType::Cmd(CommandError::Syntax))),
            "{kind}: bare RFWD"
        );
        // Two inner transmissions.
        let q = create(&mut r);
        let dest = Destination::of(&p).expect("destination");
        let fc = ForwardedCommand::new(FWD_V, &dest);
        let t1 = fc.transmission(
            &dest,
            q.sid(),
            &CommandBody::Cmd(send_cmd(b"one")),
            &Authorization::None,
        );
        let t2 = fc.transmission(
            &dest,
            q.sid(),
            &CommandBody::Cmd(send_cmd(b"two")),
            &Authorization::None,
        );
        let two = batch_of(&[t1, t2]).expect("batch");
        assert_eq!(
            forward_batch(&mut p, &dest, &fc, &two).expect("forward"),
            RfwdAnswer::Err(ErrorType::Block),
            "{kind}: batch of two"
        );
        expect_nothing(&mut r, "nothing of the batch of two was sent");
    }
}

#[test]
fn errors_inside_rres_for_what_the_client_got_wrong() {
    let relay = Relay::start();
    let mut r = relay.client();
    for (kind, mut p) in sessions(&relay) {
        let q = create(&mut r);
        let s = auth_key(KeyAlg::Ed25519);
        assert_eq!(
            signed(&mut r, q.key(), q.rid(), Command::Key(s.public_key())),
            BrokerMsg::Ok
        );
        // Only SEND, SKEY, LKEY, LGET and RSLV may be forwarded.
        assert_eq!(
            fwd_msg(&mut p, FWD_V, q.rid(), Command::Sub, sign(q.key())),
            BrokerMsg::Err(ErrorType::Cmd(CommandError::Prohibited)),
            "{kind}: SUB"
        );
        assert_eq!(
            fwd_msg(&mut p, FWD_V, b"", Command::Ping, Authorization::None),
            BrokerMsg::Err(ErrorType::Cmd(CommandError::Prohibited)),
            "{kind}: PING"
        );
        // The names role is off.
        assert_eq!(
            fwd_msg(
                &mut p,
                FWD_V,
                b"",
                Command::Rslv("simplex.example".into()),
                Authorization::None
            ),
            BrokerMsg::Err(ErrorType::Name(NameError::NoResolver)),
            "{kind}: RSLV"
        );
        // Verification: a bad signature, another key, an unknown sender ID.
        assert_eq!(
            fwd_msg(
                &mut p,
                FWD_V,
                q.sid(),
                send_cmd(b"x"),
                Authorization::Raw(vec![0x5a; 64])
            ),
            BrokerMsg::Err(ErrorType::Auth),
            "{kind}: bad signature"
        );
        let other = auth_key(KeyAlg::Ed25519);
        assert_eq!(
            fwd_msg(&mut p, FWD_V, q.sid(), send_cmd(b"x"), sign(&other)),
            BrokerMsg::Err(ErrorType::Auth),
            "{kind}: another key"
        );
        assert_eq!(
            fwd_msg(&mut p, FWD_V, &new_corr_id(), send_cmd(b"x"), sign(&s)),
            BrokerMsg::Err(ErrorType::Auth),
            "{kind}: unknown queue"
        );
        // Credential shape is checked before the filter: SEND without an entity.
        assert_eq!(
            fwd_msg(&mut p, FWD_V, b"", send_cmd(b"x"), Authorization::None),
            BrokerMsg::Err(ErrorType::Cmd(CommandError::NoEntity)),
            "{kind}: SEND without entity"
        );
        expect_nothing(&mut r, "no refused SEND was delivered");
    }
}

#[test]
fn forwarded_send_to_queues_owned_by_either_shard() {
    let relay = Relay::start_with(RelayOptions {
        cores: 2,
        ..RelayOptions::default()
    });
    let mut r = relay.client();
    let mut queues = Vec::new();
    // Create until both shards own some (each queue lands on either with even odds).
    while queues.len() < 6
        || !(0..2).all(|s| queues.iter().any(|q: &Queue| owner_shard(q.rid(), 2) == s))
    {
        assert!(queues.len() < 64, "64 queues all on one shard");
        queues.push(create(&mut r));
    }
    for (kind, mut p) in sessions(&relay) {
        for (i, q) in queues.iter().enumerate() {
            let body = format!("{kind} to queue {i} on shard {}", owner_shard(q.rid(), 2));
            assert_eq!(
                fwd_msg(
                    &mut p,
                    FWD_V,
                    q.sid(),
                    send_cmd(body.as_bytes()),
                    Authorization::None
                ),
                BrokerMsg::Ok,
                "{body}"
            );
            expect_body(&mut r, q, body.as_bytes());
            support::ack(&mut r, q, b"");
        }
    }
}
