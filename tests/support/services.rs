//! Service sessions for the tests: a connection with a client certificate and a role, `SUBS`
//! and `NSUBS` with their expected count and hash, a queue made by a service, and the MSGs of a
//! fold by queue.

use std::collections::HashMap;

use md5::{Digest, Md5};
use smp_relay::client::queue::{self, describe, receive, KeyAlg, RecipientKeys};
use smp_relay::client::{
    new_corr_id, Client, ClientCert, ClientOptions, ClientTransmission, ServerTransmission,
};
use smp_relay::protocol::command::Command;
use smp_relay::protocol::response::BrokerMsg;

use super::{next, Queue};
use crate::common::Relay;

pub fn service(relay: &Relay, cert: &ClientCert, role: u8) -> Client {
    let c = relay
        .connect(ClientOptions {
            tls_cert: Some(cert.clone()),
            service_role: Some(role),
            ..Default::default()
        })
        .unwrap_or_else(|e| panic!("service connection: {e}"));
    assert!(c.service().is_some(), "a service session");
    c
}

/// XOR of MD5 of each ID (simplexmq `Protocol.hs`, `IdsHash`).
pub fn ids_hash<'a>(ids: impl IntoIterator<Item = &'a [u8]>) -> [u8; 16] {
    let mut h = [0u8; 16];
    for id in ids {
        let d: [u8; 16] = Md5::digest(id).into();
        for (x, y) in h.iter_mut().zip(d) {
            *x ^= y;
        }
    }
    h
}

/// `SUBS`/`NSUBS` with the count and hash the client expects; returns the `SOKS` answer and
/// everything else that arrived until `ALLS` (role M) or the answer (role N).
pub fn subs(
    c: &mut Client,
    notifier: bool,
    expect: (i64, [u8; 16]),
) -> (BrokerMsg, Vec<ServerTransmission>) {
    let corr = new_corr_id();
    let cmd = if notifier {
        Command::NSubs(Some(expect))
    } else {
        Command::Subs(Some(expect))
    };
    let t = c
        .service_transmission(&corr, cmd)
        .expect("service transmission");
    c.send_batch(&[t]).expect("send SUBS");
    let mut answer = None;
    let mut rest = Vec::new();
    let mut alls = false;
    while answer.is_none() || (!notifier && !alls) {
        let t = next(c);
        if t.corr_id == corr {
            assert_eq!(
                t.entity_id,
                c.service_id().expect("service ID"),
                "SOKS names the service"
            );
            answer = Some(t.msg.clone().expect("parsed answer"));
        } else if t.msg == Ok(BrokerMsg::Alls) {
            assert_eq!((t.corr_id.len(), t.entity_id.len()), (0, 0), "ALLS");
            alls = true;
        } else {
            rest.push(t);
        }
    }
    (answer.expect("answered"), rest)
}

pub fn soks(count: i64, ids_hash: [u8; 16]) -> BrokerMsg {
    BrokerMsg::Soks { count, ids_hash }
}

pub fn new_as_service(c: &mut Client, service_auth: bool) -> Result<Queue, Box<BrokerMsg>> {
    let keys = RecipientKeys::generate(KeyAlg::Ed25519);
    let new = queue::new_queue(&keys);
    let corr = new_corr_id();
    let mut t = ClientTransmission::new(&corr, b"", Command::New(new)).signed(keys.auth.clone());
    t.service_auth = service_auth;
    c.send_batch(&[t]).expect("send NEW");
    let r = c.recv_for(&corr).expect("answer");
    match queue::parse_ids(&r) {
        Ok(ids) => Ok(Queue {
            secret: keys.dh.shared(&ids.srv_dh_key),
            keys,
            ids,
        }),
        Err(_) => Err(Box::new(r.msg.expect("parsed"))),
    }
}

/// The MSGs among `ts`, by queue, decrypted with the queues' secrets.
pub fn bodies(queues: &[&Queue], ts: &[ServerTransmission]) -> HashMap<Vec<u8>, Vec<u8>> {
    let by_rid: HashMap<&[u8], &Queue> = queues.iter().map(|q| (q.rid(), *q)).collect();
    let mut out = HashMap::new();
    for t in ts {
        let q = by_rid
            .get(&t.entity_id[..])
            .unwrap_or_else(|| panic!("unexpected {}", describe(t)));
        let m = receive(&q.secret, t).unwrap_or_else(|e| panic!("{e}: {}", describe(t)));
        let body = m.msg.body().expect("a message").to_vec();
        assert!(
            out.insert(t.entity_id.clone(), body).is_none(),
            "one MSG per queue"
        );
    }
    out
}
