//! Queue-level test steps over a real connection: the reference tests' `signSendRecv`,
//! `createAndSecureQueue` and `tGet1`, written over the crate's client and `client::queue`.
//! Every step asserts what the reference expects, so a scenario reads as its list of steps.

#![allow(dead_code)]

pub mod services;

use std::time::Duration;

pub use smp_relay::client::queue::describe;
use smp_relay::client::queue::{
    self, parse_ids, receive, receive_nmsg, KeyAlg, NmsgMeta, NotifierKeys, RcvMsg, Received,
    RecipientKeys,
};
use smp_relay::client::{
    new_corr_id, Authorization, Client, ClientError, ClientTransmission, ServerTransmission, Signer,
};
use smp_relay::protocol::command::{Command, MsgFlags, NewQueue, SubMode};
pub use smp_relay::protocol::error::{CommandError, ErrorType};
use smp_relay::protocol::response::{BrokerMsg, QueueIds};

/// How long "nothing else is delivered" waits (the reference waits 1 s).
pub const QUIET: Duration = Duration::from_millis(500);
pub const ERR_AUTH: BrokerMsg = BrokerMsg::Err(ErrorType::Auth);
pub const ERR_NO_MSG: BrokerMsg = BrokerMsg::Err(ErrorType::NoMsg);
pub const ERR_QUOTA: BrokerMsg = BrokerMsg::Err(ErrorType::Quota);
pub const ERR_LARGE_MSG: BrokerMsg = BrokerMsg::Err(ErrorType::LargeMsg);

pub fn cmd_err(e: CommandError) -> BrokerMsg {
    BrokerMsg::Err(ErrorType::Cmd(e))
}

/// A 64-byte authorization that is no valid signature (the reference's `sampleSig`).
pub fn bad_sig() -> Authorization {
    Authorization::Raw(vec![0x5a; 64])
}

pub fn sign(s: &Signer) -> Authorization {
    Authorization::Sign(s.clone())
}

/// Sends one transmission and returns the response with its corrId; events received meanwhile stay
/// pending on the client.
pub fn request(
    c: &mut Client,
    entity: &[u8],
    cmd: Command,
    auth: Authorization,
) -> ServerTransmission {
    c.request(entity, cmd, auth)
        .unwrap_or_else(|e| panic!("request: {e}"))
}

/// As `request`, signed with `key`, and returns only the response (after checking it names `entity`,
/// as every response but IDS and PONG does).
pub fn signed(c: &mut Client, key: &Signer, entity: &[u8], cmd: Command) -> BrokerMsg {
    let r = request(c, entity, cmd, sign(key));
    assert_eq!(r.entity_id, entity, "response entity of {}", describe(&r));
    r.msg
        .unwrap_or_else(|raw| panic!("unparsed response {raw:?}"))
}

/// As `signed`, unsigned.
pub fn unsigned(c: &mut Client, entity: &[u8], cmd: Command) -> BrokerMsg {
    let r = request(c, entity, cmd, Authorization::None);
    assert_eq!(r.entity_id, entity, "response entity of {}", describe(&r));
    r.msg
        .unwrap_or_else(|raw| panic!("unparsed response {raw:?}"))
}

pub fn send_cmd(body: &[u8]) -> Command {
    Command::Send {
        flags: MsgFlags::new(false),
        body: body.to_vec(),
    }
}

/// SEND with the notification flag.
pub fn send_ntf_cmd(body: &[u8]) -> Command {
    Command::Send {
        flags: MsgFlags::new(true),
        body: body.to_vec(),
    }
}

/// A queue as its recipient knows it.
#[derive(Clone)]
pub struct Queue {
    pub keys: RecipientKeys,
    pub ids: QueueIds,
    /// `rcvDhSecret`, for MSG bodies.
    pub secret: [u8; 32],
}

impl Queue {
    pub fn rid(&self) -> &[u8] {
        &self.ids.rcv_id
    }

    pub fn sid(&self) -> &[u8] {
        &self.ids.snd_id
    }

    pub fn key(&self) -> &Signer {
        &self.keys.auth
    }
}

/// NEW with `new` (built for `keys`), expecting IDS with an empty entity and the NEW's corrId.
pub fn create_with(c: &mut Client, keys: RecipientKeys, new: NewQueue) -> Queue {
    let corr = new_corr_id();
    create_with_corr(c, keys, new, &corr)
}

pub fn create_with_corr(c: &mut Client, keys: RecipientKeys, new: NewQueue, corr: &[u8]) -> Queue {
    let t = ClientTransmission::new(corr, b"", Command::New(new)).signed(keys.auth.clone());
    c.send_batch(&[t]).expect("send NEW");
    let r = c.recv_for(corr).expect("IDS");
    assert_eq!(r.entity_id, b"", "IDS carries the NEW's empty entity");
    let ids = parse_ids(&r).unwrap_or_else(|e| panic!("NEW: {e}"));
    assert_eq!(ids.rcv_id.len(), 24, "recipient ID length");
    assert_eq!(ids.snd_id.len(), 24, "sender ID length");
    assert_ne!(ids.rcv_id, ids.snd_id);
    Queue {
        secret: keys.dh.shared(&ids.srv_dh_key),
        keys,
        ids,
    }
}

/// NEW of a messaging queue (subscribed) with a recipient key of `alg`.
/// A queue with an Ed25519 key whose creating connection does not subscribe to it.
pub fn create_only(c: &mut Client) -> Queue {
    let keys = RecipientKeys::generate(KeyAlg::Ed25519);
    let mut new = queue::new_queue(&keys);
    new.sub_mode = SubMode::OnlyCreate;
    create_with(c, keys, new)
}

/// `n` queues as `create_only` makes them, created with NEWs pipelined `per_batch` at a time.
pub fn create_many(c: &mut Client, n: usize, per_batch: usize) -> Vec<Queue> {
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let k = per_batch.min(n - out.len());
        let mut pending = Vec::with_capacity(k);
        let mut ts = Vec::with_capacity(k);
        for _ in 0..k {
            let keys = RecipientKeys::generate(KeyAlg::Ed25519);
            let mut new = queue::new_queue(&keys);
            new.sub_mode = SubMode::OnlyCreate;
            let corr = new_corr_id();
            ts.push(
                ClientTransmission::new(&corr, b"", Command::New(new)).signed(keys.auth.clone()),
            );
            pending.push((corr, keys));
        }
        c.send_batch(&ts).expect("send NEWs");
        for (corr, keys) in pending {
            let r = c.recv_for(&corr).expect("IDS");
            let ids = parse_ids(&r).unwrap_or_else(|e| panic!("NEW: {e}"));
            out.push(Queue {
                secret: keys.dh.shared(&ids.srv_dh_key),
                keys,
                ids,
            });
        }
    }
    out
}

pub fn create_alg(c: &mut Client, alg: KeyAlg) -> Queue {
    let keys = RecipientKeys::generate(alg);
    let new = queue::new_queue(&keys);
    create_with(c, keys, new)
}

/// NEW with an Ed448 recipient key, as the reference's tests use.
pub fn create(c: &mut Client) -> Queue {
    create_alg(c, KeyAlg::Ed448)
}

/// `createAndSecureQueue`: NEW, then KEY with the sender's key → OK.
pub fn create_secured(c: &mut Client, sender: &Signer) -> Queue {
    let q = create(c);
    assert_eq!(
        signed(c, q.key(), q.rid(), Command::Key(sender.public_key())),
        BrokerMsg::Ok,
        "KEY secures the queue"
    );
    q
}

/// A SEND by the sender (`None` = unsigned), returning the response.
pub fn send(c: &mut Client, q: &Queue, key: Option<&Signer>, body: &[u8]) -> BrokerMsg {
    send_as(c, q.sid(), key, send_cmd(body))
}

pub fn send_as(c: &mut Client, sid: &[u8], key: Option<&Signer>, cmd: Command) -> BrokerMsg {
    match key {
        Some(k) => signed(c, k, sid, cmd),
        None => unsigned(c, sid, cmd),
    }
}

/// SEND expecting OK.
pub fn send_ok(c: &mut Client, q: &Queue, key: Option<&Signer>, body: &[u8]) {
    assert_eq!(
        send(c, q, key, body),
        BrokerMsg::Ok,
        "SEND {:?}",
        lossy(body)
    );
}

pub fn lossy(b: &[u8]) -> String {
    String::from_utf8_lossy(&b[..b.len().min(40)]).into_owned()
}

/// The next transmission, pending or from the wire (an event, usually).
pub fn next(c: &mut Client) -> ServerTransmission {
    c.recv()
        .unwrap_or_else(|e| panic!("waiting for an event: {e}"))
}

/// The next transmission must be the event `MSG` for `q` (empty corrId); returns it decrypted.
pub fn expect_msg(c: &mut Client, q: &Queue) -> Received {
    let t = next(c);
    assert_eq!(
        t.corr_id,
        b"",
        "an event has an empty corrId: {}",
        describe(&t)
    );
    assert_eq!(t.entity_id, q.rid(), "MSG for this queue");
    receive(&q.secret, &t).unwrap_or_else(|e| panic!("{e}"))
}

/// As `expect_msg`, checking the body.
pub fn expect_body(c: &mut Client, q: &Queue, body: &[u8]) -> Received {
    let m = expect_msg(c, q);
    assert_eq!(m.msg.body(), Some(body), "delivered body");
    m
}

/// A response that must be a MSG of `q` (ACK, GET); returns it decrypted.
pub fn msg_of(q: &Queue, r: BrokerMsg) -> Received {
    let t = ServerTransmission {
        corr_id: vec![],
        entity_id: q.rid().to_vec(),
        command: vec![],
        msg: Ok(r),
    };
    receive(&q.secret, &t).unwrap_or_else(|e| panic!("{e}"))
}

pub fn body_of(q: &Queue, r: BrokerMsg) -> Vec<u8> {
    let m = msg_of(q, r);
    m.msg
        .body()
        .unwrap_or_else(|| panic!("a message, not {:?}", m.msg))
        .to_vec()
}

pub fn ack(c: &mut Client, q: &Queue, msg_id: &[u8]) -> BrokerMsg {
    signed(c, q.key(), q.rid(), Command::Ack(msg_id.to_vec()))
}

/// SUB as one block in, expecting exactly `[SOK, MSG]` in one block back; returns the MSG.
pub fn sub_with_msg(c: &mut Client, q: &Queue) -> Received {
    let corr = new_corr_id();
    let t = ClientTransmission::new(&corr, q.rid(), Command::Sub).signed(q.key().clone());
    c.send_batch(&[t]).expect("send SUB");
    let block = c.recv_block().expect("SUB response block");
    let got: Vec<String> = block.iter().map(describe).collect();
    assert_eq!(block.len(), 2, "SOK and MSG in one block, got {got:?}");
    assert_eq!(block[0].corr_id, corr);
    assert_eq!(block[0].entity_id, q.rid());
    assert_eq!(block[0].msg, Ok(sok(c)), "SUB answered first");
    assert_eq!(block[1].corr_id, b"", "the MSG is an event");
    assert_eq!(block[1].entity_id, q.rid());
    receive(&q.secret, &block[1]).unwrap_or_else(|e| panic!("{e}"))
}

/// SUB expecting only `SOK` (nothing pending).
pub fn sub_empty(c: &mut Client, q: &Queue) {
    let r = signed(c, q.key(), q.rid(), Command::Sub);
    assert_eq!(r, sok(c), "SUB of an empty queue");
}

/// What SUB and NSUB answer at the session's version: `SOK` without a service from v16, `OK` before.
pub fn sok(c: &Client) -> BrokerMsg {
    if c.version() >= 16 {
        BrokerMsg::Sok(None)
    } else {
        BrokerMsg::Ok
    }
}

/// Nothing arrives within `QUIET`.
pub fn expect_nothing(c: &mut Client, what: &str) {
    let pending = c.take_pending();
    assert!(
        pending.is_empty(),
        "{what}: unexpected {:?}",
        pending.iter().map(describe).collect::<Vec<_>>()
    );
    c.set_timeout(QUIET).expect("set timeout");
    match c.recv_block() {
        Err(ClientError::Timeout) => {}
        Ok(ts) => panic!(
            "{what}: unexpected {:?}",
            ts.iter().map(describe).collect::<Vec<_>>()
        ),
        Err(e) => panic!("{what}: {e}"),
    }
    c.set_timeout(smp_relay::client::DEFAULT_TIMEOUT)
        .expect("set timeout");
}

/// The next transmission must be the event `END` (or `DELD`) for `entity`.
pub fn expect_event(c: &mut Client, entity: &[u8], event: BrokerMsg) {
    let t = next(c);
    assert_eq!(t.corr_id, b"", "an event: {}", describe(&t));
    assert_eq!(t.entity_id, entity, "event entity of {}", describe(&t));
    assert_eq!(t.msg, Ok(event));
}

/// A notifier as the notification server knows it.
pub struct Notifier {
    pub keys: NotifierKeys,
    pub nid: Vec<u8>,
    /// `rcvNtfDhSecret`, for NMSG metadata.
    pub secret: [u8; 32],
}

/// NKEY on `q` with fresh keys, expecting NID.
pub fn nkey(c: &mut Client, q: &Queue) -> Notifier {
    let keys = NotifierKeys::generate(KeyAlg::Ed25519);
    let r = request(c, q.rid(), keys.nkey(), sign(q.key()));
    assert_eq!(r.entity_id, q.rid());
    let (nid, srv) = queue::parse_nid(&r).unwrap_or_else(|e| panic!("NKEY: {e}"));
    assert_eq!(nid.len(), 24, "notifier ID length");
    Notifier {
        secret: keys.dh.shared(&srv),
        keys,
        nid,
    }
}

pub fn nsub(c: &mut Client, n: &Notifier) -> BrokerMsg {
    signed(c, &n.keys.auth, &n.nid, Command::NSub)
}

/// The next transmission must be an NMSG for `n`; returns its decrypted metadata.
pub fn expect_nmsg(c: &mut Client, n: &Notifier) -> NmsgMeta {
    let t = next(c);
    assert_eq!(t.corr_id, b"", "an event: {}", describe(&t));
    assert_eq!(t.entity_id, n.nid, "NMSG for this notifier");
    receive_nmsg(&n.secret, &t).unwrap_or_else(|e| panic!("{e}"))
}

/// A full SEND → MSG → ACK round on a control queue: the relay still serves queues correctly.
pub fn control_round(rc: &mut Client, sc: &mut Client, q: &Queue, sender: &Signer, tag: &str) {
    let body = format!("control {tag}");
    assert_eq!(
        send(sc, q, Some(sender), body.as_bytes()),
        BrokerMsg::Ok,
        "control SEND after {tag}"
    );
    let m = expect_body(rc, q, body.as_bytes());
    assert_eq!(
        ack(rc, q, &m.msg_id),
        BrokerMsg::Ok,
        "control ACK after {tag}"
    );
}

pub fn is_quota(m: &Received) -> bool {
    matches!(m.msg, RcvMsg::Quota { .. })
}

pub fn now_secs() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}
