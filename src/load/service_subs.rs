//! The service-subscription scenario (`smp-load service-subs`): one messaging service whose N
//! queues are associated with it (each moved there by a SUB from the service's connection), M of
//! them holding a message. Each run, a new connection of the service sends one `SUBS` with the
//! count and ID hash the generator computed; the figures are the time to `SOKS` (count and hash
//! checked) and to `ALLS` (every held message delivered exactly once before it), the relay's CPU
//! over that interval, and its memory. The messages are not acknowledged, so every run delivers
//! them again.

use std::collections::HashSet;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::creds::{self, QueueCreds};
use super::scenario::Target;
use crate::client::{new_corr_id, Client, ClientCert, ClientTransmission};
use crate::protocol::command::Command;
use crate::protocol::ids_hash::{id_hash, xor_into};
use crate::protocol::response::BrokerMsg;

/// SUBs per batch while the queues are associated (the client packs them into blocks).
const ASSOCIATE_BATCH: usize = 100;
/// Batches in flight while associating.
const ASSOCIATE_WINDOW: usize = 8;

/// What the runs share: the service's certificate and what its SUBS must find.
pub struct PreparedService {
    cert: ClientCert,
    queues: usize,
    hash: [u8; 16],
    /// Recipient IDs of the queues holding a message.
    held: HashSet<Vec<u8>>,
}

/// One connection of the service (the same certificate each time).
fn connect(target: &Target, cert: &ClientCert, timeout: Duration) -> Result<Client, String> {
    target.connect_service_as(cert, timeout)
}

/// Associates every queue of `creds` with a new service (SUBs from its connection, `window`
/// batches in flight), then, with the service away, puts one message of `message_bytes` into
/// `messages` of them, spread evenly.
pub fn prepare(
    target: &Target,
    creds: &Arc<Vec<QueueCreds>>,
    messages: usize,
    message_bytes: usize,
    timeout: Duration,
) -> Result<PreparedService, String> {
    let cert = ClientCert::self_signed().map_err(|e| e.to_string())?;
    {
        let mut c = connect(target, &cert, timeout)?;
        let mut in_flight: std::collections::VecDeque<Vec<[u8; 24]>> = Default::default();
        let mut chunks = creds.chunks(ASSOCIATE_BATCH);
        loop {
            while in_flight.len() < ASSOCIATE_WINDOW {
                let Some(chunk) = chunks.next() else { break };
                let corrs: Vec<[u8; 24]> = chunk.iter().map(|_| new_corr_id()).collect();
                let ts: Vec<ClientTransmission> = chunk
                    .iter()
                    .zip(&corrs)
                    .map(|(q, cid)| {
                        ClientTransmission::new(cid, &q.rid, Command::Sub).signed(q.rcv_signer())
                    })
                    .collect();
                c.send_batch(&ts).map_err(|e| format!("send SUB: {e}"))?;
                in_flight.push_back(corrs);
            }
            let Some(corrs) = in_flight.pop_front() else {
                break;
            };
            for cid in &corrs {
                let t = c.recv_for(cid).map_err(|e| format!("SUB answer: {e}"))?;
                match t.msg {
                    Ok(BrokerMsg::Sok(Some(_))) => {}
                    other => return Err(format!("SUB from the service answered {other:?}")),
                }
            }
        }
    }
    let n = creds.len();
    let step = n.checked_div(messages).unwrap_or(0).max(1);
    let holders: Vec<QueueCreds> = creds.iter().step_by(step).take(messages).cloned().collect();
    if !holders.is_empty() {
        let done = AtomicUsize::new(0);
        creds::fill(
            target.addr,
            target.key_hash,
            &holders,
            1,
            message_bytes,
            &done,
        )
        .map_err(|e| e.0)?;
    }
    let mut hash = [0u8; 16];
    for q in creds.iter() {
        xor_into(&mut hash, &id_hash(&q.rid));
    }
    Ok(PreparedService {
        cert,
        queues: n,
        hash,
        held: holders.into_iter().map(|q| q.rid).collect(),
    })
}

/// One run: a new connection of the service, one SUBS, everything until ALLS.
pub fn run(
    target: &Target,
    s: &PreparedService,
    timeout: Duration,
) -> Result<Vec<(&'static str, f64)>, String> {
    let mut c = connect(target, &s.cert, timeout)?;
    let corr = new_corr_id();
    let subs = Command::Subs(Some((s.queues as i64, s.hash)));
    let t = c
        .service_transmission(&corr, subs)
        .map_err(|e| e.to_string())?;
    let before = target.sample();
    let start = Instant::now();
    c.send_batch(&[t]).map_err(|e| format!("send SUBS: {e}"))?;
    let (mut soks_at, mut alls_at) = (None, None);
    let mut delivered: HashSet<Vec<u8>> = HashSet::with_capacity(s.held.len());
    while alls_at.is_none() {
        for t in c.recv_block().map_err(|e| format!("receive: {e}"))? {
            match t.msg {
                Ok(BrokerMsg::Soks { count, ids_hash }) if t.corr_id == corr => {
                    if (count, ids_hash) != (s.queues as i64, s.hash) {
                        return Err(format!(
                            "SOKS {count} does not match the {} queues associated",
                            s.queues
                        ));
                    }
                    soks_at = Some(start.elapsed());
                }
                Ok(BrokerMsg::Msg { .. }) => {
                    if !s.held.contains(&t.entity_id) || !delivered.insert(t.entity_id) {
                        return Err("a MSG for a queue without one, or twice".into());
                    }
                }
                Ok(BrokerMsg::Alls) => alls_at = Some(start.elapsed()),
                other => return Err(format!("unexpected during SUBS: {other:?}")),
            }
        }
    }
    let after = target.sample();
    let (Some(soks), Some(alls)) = (soks_at, alls_at) else {
        return Err("ALLS before SOKS".into());
    };
    if delivered.len() != s.held.len() {
        return Err(format!(
            "{} of {} held messages delivered before ALLS",
            delivered.len(),
            s.held.len()
        ));
    }
    let cpu = after.cpu_s - before.cpu_s;
    Ok(vec![
        ("queues", s.queues as f64),
        ("soks_ms", soks.as_secs_f64() * 1000.0),
        ("alls_s", alls.as_secs_f64()),
        ("delivered", delivered.len() as f64),
        ("relay_cpu_s", cpu),
        ("relay_cpu_us_per_queue", cpu * 1e6 / s.queues as f64),
        ("relay_rss_anon_mb", after.rss_anon_kb as f64 / 1024.0),
    ])
}
