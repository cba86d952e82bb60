//! The journal store across a change of shard count (`docs/ARCHITECTURE.md` §1 and §5): journals
//! belong to the 64 partition groups, not to shards, so a store written by one shard is served by
//! two after a restart, and by one again. Each scenario fills every group on 1 shard (queues empty
//! and not, messages small and large, some acknowledged, some queues deleted), stops the relay
//! (SIGTERM, or SIGKILL), restarts it on 2 shards and reads every queue to its end: each message
//! not acknowledged comes exactly once and in order, none that was acknowledged comes back,
//! deleted queues stay deleted, and the relay's counts of queues and messages match. Then more of
//! the same on 2 shards, a restart on 1 shard, and the same checks.

use crate::common;
use crate::support;

use common::{Relay, RelayOptions};
use smp_relay::client::{new_corr_id, Client, ClientTransmission};
use smp_relay::protocol::command::Command;
use smp_relay::protocol::response::BrokerMsg;
use smp_relay::store::group_of;
use support::*;

const GROUPS: usize = smp_relay::store::PARTITION_GROUPS as usize;
/// Queues of each group before the first stop: enough for every pattern of `PATTERNS`.
const PER_GROUP: usize = 5;
/// The j-th queue of a group gets `PATTERNS[j % 5]` = (messages sent, of them acknowledged), so
/// that every group holds empty queues, queues emptied by ACKs, and queues with 1 or 2 left.
const PATTERNS: [(usize, usize); PER_GROUP] = [(0, 0), (3, 1), (1, 0), (4, 2), (2, 2)];
/// One message in `LARGE_EVERY` has a 15,000-byte body (segments fill and rotate), the rest 100.
const LARGE_EVERY: u64 = 5;
/// Transmissions written before their answers are read.
const PIPELINE: usize = 128;

/// The relay's arguments in every run: the journal whatever `SMP_RELAY_TEST_STORE` says, and a
/// metrics file for the counts.
const ARGS: [&str; 4] = ["--store", "journal", "--metrics-interval", "3600"];

fn body(qi: usize, seq: u64) -> Vec<u8> {
    let mut b = format!("q{qi:05} m{seq:07} ").into_bytes();
    let len = if seq % LARGE_EVERY == 0 { 15_000 } else { 100 };
    b.resize(len, b'a' + (seq % 26) as u8);
    b
}

/// What the test knows of every queue it made.
#[derive(Default)]
struct Model {
    queues: Vec<Queue>,
    deleted: Vec<bool>,
    /// Per queue, the messages sent and not acknowledged, oldest first.
    pending: Vec<std::collections::VecDeque<u64>>,
    next_seq: u64,
}

impl Model {
    fn live(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.queues.len()).filter(|&i| !self.deleted[i])
    }

    /// Creates `n` queues; returns their indexes.
    fn create(&mut self, c: &mut Client, n: usize) -> std::ops::Range<usize> {
        let from = self.queues.len();
        for q in create_many(c, n, PIPELINE) {
            self.queues.push(q);
            self.deleted.push(false);
            self.pending.push(Default::default());
        }
        from..self.queues.len()
    }

    /// Creates queues until every partition group has `per_group` of them; returns, per group,
    /// its queues in the order they were made.
    fn create_in_every_group(&mut self, c: &mut Client, per_group: usize) -> Vec<Vec<usize>> {
        let mut by_group = vec![Vec::new(); GROUPS];
        while by_group.iter().any(|g: &Vec<usize>| g.len() < per_group) {
            for qi in self.create(c, GROUPS) {
                by_group[group_of(self.queues[qi].rid()) as usize].push(qi);
            }
        }
        by_group
    }

    /// Sends `counts[k].1` messages to queue `counts[k].0`, pipelined, each answered OK.
    fn send(&mut self, c: &mut Client, counts: &[(usize, usize)]) {
        let mut all = Vec::new();
        for &(qi, n) in counts {
            for _ in 0..n {
                self.next_seq += 1;
                all.push((qi, self.next_seq));
            }
        }
        for chunk in all.chunks(PIPELINE) {
            let ts: Vec<(Vec<u8>, ClientTransmission)> = chunk
                .iter()
                .map(|&(qi, seq)| {
                    let corr = new_corr_id();
                    let t = ClientTransmission::new(
                        &corr,
                        self.queues[qi].sid(),
                        send_cmd(&body(qi, seq)),
                    );
                    (corr.to_vec(), t)
                })
                .collect();
            c.send_batch(&ts.iter().map(|(_, t)| t.clone()).collect::<Vec<_>>())
                .expect("SENDs");
            for ((corr, _), &(qi, seq)) in ts.iter().zip(chunk) {
                let t = c.recv_for(corr).expect("SEND answer");
                assert_eq!(t.msg, Ok(BrokerMsg::Ok), "SEND {seq} to queue {qi}");
                self.pending[qi].push_back(seq);
            }
        }
    }

    /// Takes up to `want(qi)` messages from every live queue (GET, then ACK, all queues at once
    /// each round). Each must be the queue's oldest message not acknowledged: nothing lost,
    /// nothing twice, nothing acknowledged before, in order. A queue that answers GET with OK
    /// (empty) must have no message left.
    fn take(&mut self, c: &mut Client, what: &str, want: impl Fn(usize) -> usize) {
        let mut left: Vec<(usize, usize)> = self
            .live()
            .map(|qi| (qi, want(qi)))
            .filter(|&(_, n)| n > 0)
            .collect();
        while !left.is_empty() {
            let mut still = Vec::new();
            for chunk in left.chunks(PIPELINE) {
                let gets: Vec<(Vec<u8>, ClientTransmission)> = chunk
                    .iter()
                    .map(|&(qi, _)| {
                        let q = &self.queues[qi];
                        let corr = new_corr_id();
                        let t = ClientTransmission::new(&corr, q.rid(), Command::Get)
                            .signed(q.key().clone());
                        (corr.to_vec(), t)
                    })
                    .collect();
                c.send_batch(&gets.iter().map(|(_, t)| t.clone()).collect::<Vec<_>>())
                    .expect("GETs");
                let mut acks = Vec::new();
                for ((corr, _), &(qi, n)) in gets.iter().zip(chunk) {
                    let q = &self.queues[qi];
                    let t = c.recv_for(corr).expect("GET answer");
                    match t.msg.clone().expect("a response that parses") {
                        BrokerMsg::Ok => assert_eq!(
                            self.pending[qi],
                            std::collections::VecDeque::<u64>::new(),
                            "{what}: queue {qi} (group {}) is empty, these were lost",
                            group_of(q.rid())
                        ),
                        m @ BrokerMsg::Msg { .. } => {
                            let rm = msg_of(q, m);
                            let got = rm.msg.body().expect("a message, not a quota marker");
                            let Some(&seq) = self.pending[qi].front() else {
                                panic!("{what}: queue {qi} should be empty, got {:?}", lossy(got))
                            };
                            assert!(
                                got == body(qi, seq),
                                "{what}: queue {qi} (group {}): expected message {seq}, got {:?}",
                                group_of(q.rid()),
                                lossy(got)
                            );
                            self.pending[qi].pop_front();
                            let corr = new_corr_id();
                            acks.push((
                                corr.to_vec(),
                                ClientTransmission::new(
                                    &corr,
                                    q.rid(),
                                    Command::Ack(rm.msg_id.clone()),
                                )
                                .signed(q.key().clone()),
                            ));
                            if n > 1 {
                                still.push((qi, n - 1));
                            }
                        }
                        other => panic!(
                            "{what}: GET of queue {qi} (group {}) answered {other:?}",
                            group_of(q.rid())
                        ),
                    }
                }
                c.send_batch(&acks.iter().map(|(_, t)| t.clone()).collect::<Vec<_>>())
                    .expect("ACKs");
                for (corr, _) in &acks {
                    let t = c.recv_for(corr).expect("ACK answer");
                    assert_eq!(t.msg, Ok(BrokerMsg::Ok), "{what}: ACK answered OK");
                }
            }
            left = still;
        }
    }

    /// Every live queue read to its end, checked as `take` checks.
    fn drain(&mut self, c: &mut Client, what: &str) {
        self.take(c, what, |_| usize::MAX);
    }

    fn delete(&mut self, c: &mut Client, qs: impl IntoIterator<Item = usize>) {
        for qi in qs {
            let q = &self.queues[qi];
            assert_eq!(signed(c, q.key(), q.rid(), Command::Del), BrokerMsg::Ok);
            self.deleted[qi] = true;
            self.pending[qi].clear();
        }
    }

    /// Deleted queues are unknown: GET answers AUTH.
    fn assert_deleted(&self, c: &mut Client, what: &str) {
        for (qi, q) in self
            .queues
            .iter()
            .enumerate()
            .filter(|(i, _)| self.deleted[*i])
        {
            assert_eq!(
                signed(c, q.key(), q.rid(), Command::Get),
                ERR_AUTH,
                "{what}: deleted queue {qi} (group {})",
                group_of(q.rid())
            );
        }
    }

    /// The relay's own counts: every live queue once, every message not acknowledged once.
    fn assert_counts(&self, r: &Relay, what: &str) {
        r.publish_metrics();
        let m = r.metrics();
        let queues = self.live().count() as u64;
        let messages = self.pending.iter().map(|p| p.len() as u64).sum::<u64>();
        assert_eq!(
            m.get("simplex_smp_queues_total1"),
            Some(&queues),
            "{what}: queues in the store"
        );
        assert_eq!(
            m.get("simplex_smp_messages_total"),
            Some(&messages),
            "{what}: messages in the store"
        );
    }
}

fn restart_on(r: &mut Relay, shards: usize, stop: fn(&mut Relay)) {
    stop(r);
    r.set_cores(shards);
    r.restart_with(&ARGS);
}

fn clean_stop(r: &mut Relay) {
    let status = r.stop();
    assert!(status.success(), "clean stop: {status:?}\n{}", r.log_text());
}

fn sigkill(r: &mut Relay) {
    r.kill();
}

/// 1 shard → 2 shards → 1 shard, every restart after `stop`.
fn every_queue_and_message_survives_shard_changes(stop: fn(&mut Relay)) {
    let mut r = Relay::start_with(RelayOptions {
        cores: 1,
        extra_args: ARGS.iter().map(|a| a.to_string()).collect(),
    });
    let mut m = Model::default();
    {
        let mut c = r.client();
        let by_group = m.create_in_every_group(&mut c, PER_GROUP);
        let pattern = |qi: usize| {
            let g = group_of(m.queues[qi].rid()) as usize;
            let j = by_group[g]
                .iter()
                .position(|&x| x == qi)
                .expect("in its group");
            PATTERNS[j % PER_GROUP]
        };
        let counts: Vec<(usize, usize)> = m.live().map(|qi| (qi, pattern(qi).0)).collect();
        let acks: Vec<usize> = (0..m.queues.len()).map(|qi| pattern(qi).1).collect();
        m.send(&mut c, &counts);
        m.take(&mut c, "1 shard, acknowledging", |qi| acks[qi]);
        // One queue of every group deleted with the 2 messages it holds (its second).
        let doomed: Vec<usize> = by_group.iter().map(|g| g[1]).collect();
        m.delete(&mut c, doomed);
        for (g, qs) in by_group.iter().enumerate() {
            let left: usize = qs.iter().map(|&qi| m.pending[qi].len()).sum();
            assert!(left > 0, "group {g} holds messages before the stop");
        }
        m.assert_counts(&r, "1 shard, before the stop");
    }

    restart_on(&mut r, 2, stop);
    m.assert_counts(&r, "2 shards, after the restart");
    {
        let mut c = r.client();
        m.assert_deleted(&mut c, "2 shards");
        m.drain(&mut c, "2 shards, after the restart");
        // More on 2 shards: new queues, new messages everywhere, some acknowledged, some deleted.
        let new = m.create(&mut c, 2 * GROUPS);
        let counts: Vec<(usize, usize)> = m.live().map(|qi| (qi, 1 + qi % 3)).collect();
        m.send(&mut c, &counts);
        m.take(&mut c, "2 shards, acknowledging", |qi| qi % 2);
        m.delete(&mut c, new.step_by(7));
        m.assert_counts(&r, "2 shards, before the stop");
    }

    restart_on(&mut r, 1, stop);
    m.assert_counts(&r, "1 shard, after the restart");
    let mut c = r.client();
    m.assert_deleted(&mut c, "1 shard");
    m.drain(&mut c, "1 shard, after the restart");
}

#[test]
fn a_cleanly_stopped_journal_store_is_served_whole_by_two_shards_then_one() {
    every_queue_and_message_survives_shard_changes(clean_stop);
}

#[test]
fn a_killed_journal_store_is_served_whole_by_two_shards_then_one() {
    every_queue_and_message_survives_shard_changes(sigkill);
}
