//! Crashes under load (`docs/ARCHITECTURE.md` §5, the journal store): a relay under steady SEND,
//! SUB and ACK traffic is killed with SIGKILL at a seeded point while at least 100 SENDs and 100
//! ACKs are unanswered, 20 rounds, half of them with `--fsync never`. After each restart every
//! message whose SEND was answered OK and whose ACK was not answered is delivered exactly once, in
//! order; a SEND or an ACK without an answer is ambiguous (its message may or may not be there);
//! nothing whose ACK was answered comes back.

use crate::common;
use crate::support;

use std::collections::{BTreeSet, HashMap, HashSet};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use common::{sleep, Relay};
use smp_relay::client::{new_corr_id, Client, ClientTransmission};
use smp_relay::protocol::command::Command;
use smp_relay::protocol::response::BrokerMsg;
use support::*;

const QUEUES: usize = 128;
const ROUNDS: u64 = 20;
/// SENDs per queue answered before the crash.
const ANSWERED_SENDS: u64 = 2;
/// SENDs written, and not answered, when the relay is killed.
const INFLIGHT_SENDS: usize = 150;

/// What the test knows of each queue's messages, by sequence number.
#[derive(Default)]
struct Ledger {
    /// Answered OK, not (yet) acknowledged with an answer.
    must: Vec<BTreeSet<u64>>,
    /// Sent or acknowledged without an answer: may or may not be there.
    may: Vec<HashSet<u64>>,
    /// Acknowledged with an answer: never again.
    gone: Vec<HashSet<u64>>,
    next_seq: u64,
}

fn body(q: usize, seq: u64) -> Vec<u8> {
    format!("q{q:03} s{seq:08}").into_bytes()
}

fn seq_of(b: &[u8]) -> (usize, u64) {
    let s = std::str::from_utf8(b).expect("utf-8 body");
    let q = s[1..4].parse().expect("queue");
    let n = s[6..].parse().expect("seq");
    (q, n)
}

fn send_t(q: &Queue, b: &[u8]) -> (Vec<u8>, ClientTransmission) {
    let corr = new_corr_id();
    (
        corr.to_vec(),
        ClientTransmission::new(&corr, q.sid(), send_cmd(b)),
    )
}

/// Takes every message of every queue (GET, then ACK, all queues at once each round) until every
/// queue is empty; checks what arrives against the ledger (exactly once, in order, nothing
/// acknowledged) and forgets it.
fn drain_and_check(c: &mut Client, qs: &[Queue], l: &mut Ledger, round: u64) {
    let mut got: Vec<Vec<u64>> = vec![Vec::new(); qs.len()];
    let mut open: Vec<usize> = (0..qs.len()).collect();
    while !open.is_empty() {
        let gets: Vec<(Vec<u8>, ClientTransmission)> = open
            .iter()
            .map(|&qi| {
                let corr = new_corr_id();
                let q = &qs[qi];
                (
                    corr.to_vec(),
                    ClientTransmission::new(&corr, q.rid(), Command::Get).signed(q.key().clone()),
                )
            })
            .collect();
        c.send_batch(&gets.iter().map(|(_, t)| t.clone()).collect::<Vec<_>>())
            .expect("GETs");
        let mut acks = Vec::new();
        let mut still = Vec::new();
        for (&qi, (corr, _)) in open.iter().zip(&gets) {
            let q = &qs[qi];
            let t = c.recv_for(corr).expect("GET answer");
            match t.msg.clone().expect("a response that parses") {
                BrokerMsg::Ok => {}
                m @ BrokerMsg::Msg { .. } => {
                    let rm = msg_of(q, m);
                    let (bq, seq) = seq_of(rm.msg.body().expect("a message"));
                    assert_eq!(bq, qi, "round {round}: a message in its own queue");
                    got[qi].push(seq);
                    let corr = new_corr_id();
                    acks.push((
                        corr.to_vec(),
                        ClientTransmission::new(&corr, q.rid(), Command::Ack(rm.msg_id.clone()))
                            .signed(q.key().clone()),
                    ));
                    still.push(qi);
                }
                other => panic!("round {round}: GET answered {other:?}"),
            }
        }
        c.send_batch(&acks.iter().map(|(_, t)| t.clone()).collect::<Vec<_>>())
            .expect("ACKs");
        for (corr, _) in &acks {
            let t = c.recv_for(corr).expect("ACK answer");
            assert_eq!(
                t.msg,
                Ok(BrokerMsg::Ok),
                "round {round}: GET-mode ACK answered OK"
            );
        }
        open = still;
    }
    for (qi, seqs) in got.iter().enumerate() {
        let mut seen = HashSet::new();
        for w in seqs.windows(2) {
            assert!(
                w[0] < w[1],
                "round {round}: queue {qi} out of order or twice: {seqs:?}"
            );
        }
        for s in seqs {
            assert!(
                seen.insert(*s),
                "round {round}: queue {qi} message {s} twice"
            );
            assert!(
                !l.gone[qi].contains(s),
                "round {round}: queue {qi} message {s} came back after its ACK was answered"
            );
            assert!(
                l.must[qi].contains(s) || l.may[qi].contains(s),
                "round {round}: queue {qi} message {s} was never sent"
            );
        }
        for s in &l.must[qi] {
            assert!(
                seen.contains(s),
                "round {round}: queue {qi} lost message {s} (its SEND was answered OK)"
            );
        }
        l.must[qi].clear();
        l.may[qi].clear();
    }
}

/// One round of load that ends with a SIGKILL: returns (SENDs, ACKs) unanswered at the kill.
fn load_and_kill(r: &mut Relay, qs: &[Queue], l: &mut Ledger, rng: &mut StdRng) -> (usize, usize) {
    let mut sc = r.client();
    let mut rc = r.client();
    // Answered SENDs.
    let mut ts = Vec::new();
    let mut pending: HashMap<Vec<u8>, (usize, u64)> = HashMap::new();
    for (qi, q) in qs.iter().enumerate() {
        for _ in 0..ANSWERED_SENDS {
            l.next_seq += 1;
            let (corr, t) = send_t(q, &body(qi, l.next_seq));
            pending.insert(corr, (qi, l.next_seq));
            ts.push(t);
        }
    }
    sc.send_batch(&ts).expect("SENDs");
    for (corr, (qi, seq)) in pending {
        let t = sc.recv_for(&corr).expect("SEND answer");
        assert_eq!(t.msg, Ok(BrokerMsg::Ok), "SEND answered OK");
        l.must[qi].insert(seq);
    }
    // Each queue's first message, then half of them acknowledged with the answer read.
    let subs: Vec<ClientTransmission> = qs
        .iter()
        .map(|q| {
            ClientTransmission::new(&new_corr_id(), q.rid(), Command::Sub).signed(q.key().clone())
        })
        .collect();
    rc.send_batch(&subs).expect("SUBs");
    let mut outstanding: Vec<Option<(Vec<u8>, u64)>> = vec![None; qs.len()];
    let mut have = 0;
    while have < qs.len() {
        let t = rc.recv().expect("SUB answers and MSGs");
        if let Ok(m @ BrokerMsg::Msg { .. }) = t.msg.clone() {
            let qi = qs
                .iter()
                .position(|q| q.rid() == t.entity_id)
                .expect("queue");
            let rm = msg_of(&qs[qi], m);
            let (_, seq) = seq_of(rm.msg.body().expect("message"));
            outstanding[qi] = Some((rm.msg_id.clone(), seq));
            have += 1;
        }
    }
    let _ = rc.take_pending();
    for (qi, q) in qs.iter().enumerate().filter(|(i, _)| i % 2 == 0) {
        let (id, seq) = outstanding[qi].take().expect("delivered");
        let m = ack(&mut rc, q, &id);
        l.must[qi].remove(&seq);
        l.gone[qi].insert(seq);
        if let m @ BrokerMsg::Msg { .. } = m {
            let rm = msg_of(q, m);
            let (_, s) = seq_of(rm.msg.body().expect("message"));
            outstanding[qi] = Some((rm.msg_id.clone(), s));
        }
    }
    // In flight at the kill: SENDs and ACKs written, their answers never read.
    let mut ts = Vec::new();
    for _ in 0..INFLIGHT_SENDS {
        let qi = rng.gen_range(0..qs.len());
        l.next_seq += 1;
        l.may[qi].insert(l.next_seq);
        ts.push(send_t(&qs[qi], &body(qi, l.next_seq)).1);
    }
    let mut acks = Vec::new();
    for (qi, q) in qs.iter().enumerate() {
        if let Some((id, seq)) = outstanding[qi].take() {
            l.must[qi].remove(&seq);
            l.may[qi].insert(seq);
            acks.push(
                ClientTransmission::new(&new_corr_id(), q.rid(), Command::Ack(id))
                    .signed(q.key().clone()),
            );
        }
    }
    // Interleaved writes from two connections, then the kill at a seeded moment.
    sc.send_batch(&ts).expect("in-flight SENDs");
    rc.send_batch(&acks).expect("in-flight ACKs");
    sleep(std::time::Duration::from_millis(rng.gen_range(0..20)));
    r.kill();
    (ts.len(), acks.len())
}

#[test]
fn sigkill_under_load_loses_no_answered_send_and_resurrects_no_answered_ack() {
    let mut r = Relay::start();
    let mut c = r.client();
    let qs = create_many(&mut c, QUEUES, 64);
    drop(c);
    let mut l = Ledger {
        must: vec![BTreeSet::new(); QUEUES],
        may: vec![HashSet::new(); QUEUES],
        gone: vec![HashSet::new(); QUEUES],
        next_seq: 0,
    };
    for round in 0..ROUNDS {
        let mut rng = StdRng::seed_from_u64(round);
        let (sends, acks) = load_and_kill(&mut r, &qs, &mut l, &mut rng);
        assert!(
            sends >= 100 && acks >= 100,
            "round {round}: {sends} SENDs and {acks} ACKs unanswered at the kill"
        );
        if round % 2 == 0 {
            r.restart_with(&["--fsync", "never"]);
        } else {
            r.restart_with(&[]);
        }
        let mut c = r.client();
        drain_and_check(&mut c, &qs, &mut l, round);
    }
}
