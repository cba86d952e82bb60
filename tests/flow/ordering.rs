//! What a connection's socket shows, block by block (`docs/ARCHITECTURE.md` §3, O1–O4), on two
//! shards:
//! - O3: an owner's part of a block goes out when it is ready, not after a slower owner's part
//!   (`--test-store-delay` slows one shard's store down);
//! - O2: a SEND to one's own subscribed queue gives `[MSG]`, then `[OK]`;
//! - O4: a SUB part with ≤ 4 responses carries its first MSG in the responses' block (the rest one
//!   block each); a larger part sends its responses first, then one block per MSG. With a queue on
//!   each shard the 135 SUBs of one block are two owner parts, each laid out by that rule.

use crate::common;
use crate::support;

use common::{Relay, RelayOptions};
use smp_relay::client::queue::{self, KeyAlg};
use smp_relay::client::{new_corr_id, Client, ClientTransmission, ServerTransmission};
use smp_relay::protocol::batch::BatchWriter;
use smp_relay::protocol::command::Command;
use smp_relay::protocol::response::BrokerMsg;
use smp_relay::server::router::owner_shard;
use support::*;

const SHARDS: usize = 2;
/// The shard whose owner waits before each block of work in the O3 test.
const DELAYED_SHARD: usize = 1;
/// Long enough that the undelayed owner's SOK and the pushed MSG (a few ms of work) are certainly
/// produced while the delayed owner still waits.
const OWNER_DELAY_MS: u64 = 800;
/// The most SUBs one block carries at v16+ (the reference's batch of subscriptions).
const SUBS_PER_BLOCK: usize = 135;
/// NEWs and SENDs written before their responses are read: a few blocks, well under the relay's
/// blocks in flight, so neither side waits on a full socket.
const PIPELINE: usize = 150;

fn relay(cores: usize, extra_args: Vec<String>) -> Relay {
    Relay::start_with(RelayOptions { cores, extra_args })
}

fn owner(q: &Queue) -> usize {
    owner_shard(q.rid(), SHARDS)
}

/// One unsigned SEND to each queue (none is secured), batched; every one must be OK.
fn send_each(c: &mut Client, qs: &[Queue], body: impl Fn(usize) -> Vec<u8>) {
    for (chunk_no, chunk) in qs.chunks(PIPELINE).enumerate() {
        let corrs: Vec<[u8; 24]> = chunk.iter().map(|_| new_corr_id()).collect();
        let ts: Vec<ClientTransmission> = chunk
            .iter()
            .zip(&corrs)
            .enumerate()
            .map(|(i, (q, corr))| {
                ClientTransmission::new(corr, q.sid(), send_cmd(&body(chunk_no * PIPELINE + i)))
            })
            .collect();
        c.send_batch(&ts).expect("send SENDs");
        for corr in &corrs {
            let r = c.recv_for(corr).expect("SEND response");
            assert_eq!(r.msg, Ok(BrokerMsg::Ok), "SEND: {}", describe(&r));
        }
    }
}

fn sub_t(q: &Queue, corr: &[u8]) -> ClientTransmission {
    ClientTransmission::new(corr, q.rid(), Command::Sub).signed(q.key().clone())
}

/// Sends the transmissions as exactly one block (asserting they fit one).
fn send_one_block(c: &mut Client, ts: &[ClientTransmission]) {
    let mut w = BatchWriter::new();
    for t in ts {
        let bytes = c.encode_transmission(t).expect("encode");
        assert!(
            w.try_push(&bytes),
            "{} transmissions fit one block",
            ts.len()
        );
    }
    c.send_content(&w.content()).expect("send block");
}

/// A transmission as the layout assertions name it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Seen {
    Sok(Vec<u8>),
    Msg(Vec<u8>),
    Ok(Vec<u8>),
    Other(String),
}

fn seen(t: &ServerTransmission) -> Seen {
    match &t.msg {
        Ok(BrokerMsg::Sok(None)) => Seen::Sok(t.entity_id.clone()),
        Ok(BrokerMsg::Msg { .. }) if t.corr_id.is_empty() => Seen::Msg(t.entity_id.clone()),
        Ok(BrokerMsg::Ok) => Seen::Ok(t.entity_id.clone()),
        _ => Seen::Other(describe(t)),
    }
}

fn layout(blocks: &[Vec<ServerTransmission>]) -> Vec<Vec<Seen>> {
    blocks
        .iter()
        .map(|b| b.iter().map(seen).collect())
        .collect()
}

/// The next `n` blocks.
fn recv_blocks(c: &mut Client, n: usize) -> Vec<Vec<ServerTransmission>> {
    (0..n)
        .map(|i| {
            c.recv_block()
                .unwrap_or_else(|e| panic!("block {i} of {n}: {e}"))
        })
        .collect()
}

/// O3 with O1: `[SUB q1, SUB q2]` where q2's owner waits before each block, and meanwhile a SEND to
/// q1 from another connection. The socket shows q1's SOK, then q1's MSG (pushed, or in the SOK's
/// block if the SEND won the race to the owner), and only then q2's SOK, in a block of its own.
/// Which shard accepts the subscribing connection is the kernel's choice, so several rounds with
/// fresh connections run; the order must hold whichever shard holds the connection.
#[test]
fn o3_an_owners_part_does_not_wait_for_a_delayed_owner() {
    const ROUNDS: usize = 4;
    let r = relay(
        SHARDS,
        vec![
            "--test-store-delay".into(),
            format!("{DELAYED_SHARD}:{OWNER_DELAY_MS}"),
        ],
    );
    let mut setup = r.client();
    let qs = create_many(&mut setup, 8 * ROUNDS, PIPELINE);
    let fast: Vec<&Queue> = qs.iter().filter(|q| owner(q) != DELAYED_SHARD).collect();
    let slow: Vec<&Queue> = qs.iter().filter(|q| owner(q) == DELAYED_SHARD).collect();
    assert!(
        fast.len() >= ROUNDS && slow.len() >= ROUNDS,
        "queues on both shards: {} and {}",
        fast.len(),
        slow.len()
    );
    let mut sender = r.client();
    for round in 0..ROUNDS {
        let (q1, q2) = (fast[round], slow[round]);
        let mut c = r.client();
        let (c1, c2) = (new_corr_id(), new_corr_id());
        send_one_block(&mut c, &[sub_t(q1, &c1), sub_t(q2, &c2)]);
        let body = format!("meanwhile {round}");
        send_ok(&mut sender, q1, None, body.as_bytes());
        let mut blocks = Vec::new();
        while !blocks
            .iter()
            .flatten()
            .any(|t: &ServerTransmission| t.corr_id == c2)
        {
            blocks.push(c.recv_block().expect("a block of the SUB answers"));
        }
        let got = layout(&blocks);
        let flat: Vec<&ServerTransmission> = blocks.iter().flatten().collect();
        assert_eq!(flat.len(), 3, "round {round}: SOK, MSG, SOK; got {got:?}");
        assert_eq!(
            flat[0].corr_id, c1,
            "round {round}: q1's SOK first: {got:?}"
        );
        assert_eq!(seen(flat[0]), Seen::Sok(q1.rid().to_vec()), "round {round}");
        assert_eq!(
            seen(flat[1]),
            Seen::Msg(q1.rid().to_vec()),
            "round {round}: q1's MSG before the delayed part: {got:?}"
        );
        let m = queue::receive(&q1.secret, flat[1]).expect("MSG decrypts");
        assert_eq!(m.msg.body(), Some(body.as_bytes()), "round {round}");
        assert_eq!(flat[2].corr_id, c2, "round {round}: q2's SOK last: {got:?}");
        assert_eq!(seen(flat[2]), Seen::Sok(q2.rid().to_vec()), "round {round}");
        assert_eq!(
            blocks.last().map(Vec::len),
            Some(1),
            "round {round}: the delayed owner's part is a block of its own: {got:?}"
        );
        expect_nothing(&mut c, "after both SUB answers");
    }
}

/// A subscribed queue on each shard, created by `c` (NEW in subscribe mode).
fn subscribed_on_each_shard(c: &mut Client) -> Vec<Queue> {
    let mut by_shard: Vec<Option<Queue>> = vec![None; SHARDS];
    for _ in 0..64 {
        let q = create_alg(c, KeyAlg::Ed25519);
        let s = owner(&q);
        if by_shard[s].is_none() {
            by_shard[s] = Some(q);
        }
        if by_shard.iter().all(Option::is_some) {
            return by_shard.into_iter().flatten().collect();
        }
    }
    panic!("64 queues and no queue on every shard");
}

/// O2 on two shards: a SEND to the sender's own subscribed queue gives a block with the MSG alone,
/// then a block with the SEND's OK, whichever shard owns the queue.
#[test]
fn o2_send_to_own_subscribed_queue_is_msg_block_then_ok_block() {
    let r = relay(SHARDS, Vec::new());
    let mut c = r.client();
    for q in subscribed_on_each_shard(&mut c) {
        let corr = new_corr_id();
        let body = format!("to myself on shard {}", owner(&q));
        c.send_batch(&[ClientTransmission::new(
            &corr,
            q.sid(),
            send_cmd(body.as_bytes()),
        )])
        .expect("send SEND");
        let blocks = recv_blocks(&mut c, 2);
        assert_eq!(
            layout(&blocks),
            vec![
                vec![Seen::Msg(q.rid().to_vec())],
                vec![Seen::Ok(q.sid().to_vec())]
            ],
            "shard {}",
            owner(&q)
        );
        assert_eq!(blocks[1][0].corr_id, corr);
        let m = queue::receive(&q.secret, &blocks[0][0]).expect("MSG decrypts");
        assert_eq!(m.msg.body(), Some(body.as_bytes()));
        assert_eq!(ack(&mut c, &q, &m.msg_id), BrokerMsg::Ok);
        expect_nothing(&mut c, "after MSG and OK");
    }
}

/// O4 on two shards: a SUB of a queue with a message pending answers `[SOK, MSG]` in one block, on
/// a fresh connection, whichever shard owns the queue.
#[test]
fn o4_sub_with_a_pending_message_is_sok_and_msg_in_one_block() {
    let r = relay(SHARDS, Vec::new());
    let mut setup = r.client();
    let qs = create_many(&mut setup, 16, PIPELINE);
    let picked: Vec<&Queue> = (0..SHARDS)
        .map(|s| {
            qs.iter()
                .find(|q| owner(q) == s)
                .unwrap_or_else(|| panic!("no queue on shard {s}"))
        })
        .collect();
    let mut sender = r.client();
    let mut c = r.client();
    for q in picked {
        send_ok(&mut sender, q, None, b"pending");
        let m = sub_with_msg(&mut c, q);
        assert_eq!(m.msg.body(), Some(&b"pending"[..]));
        assert_eq!(ack(&mut c, q, &m.msg_id), BrokerMsg::Ok);
    }
    expect_nothing(&mut c, "one MSG per SUB");
}

/// `n` queues owned by shard 0 of a one-shard relay, each with one message.
fn queues_with_a_message(r: &Relay, n: usize) -> Vec<Queue> {
    let mut setup = r.client();
    let qs = create_many(&mut setup, n, PIPELINE);
    send_each(&mut setup, &qs, |i| format!("pending {i}").into_bytes());
    qs
}

/// The SUB block for `qs` (one block) and its corrIds.
fn sub_block(c: &mut Client, qs: &[Queue]) -> Vec<[u8; 24]> {
    let corrs: Vec<[u8; 24]> = qs.iter().map(|_| new_corr_id()).collect();
    let ts: Vec<ClientTransmission> = qs.iter().zip(&corrs).map(|(q, c)| sub_t(q, c)).collect();
    send_one_block(c, &ts);
    corrs
}

/// O4, small part: two SUBs with messages pending give `[SOK, SOK, MSG]` (the responses and the
/// first MSG; two 16 KB MSGs never share a block), then `[MSG]`.
#[test]
fn o4_two_subs_give_both_soks_and_the_first_msg_then_the_second_msg() {
    let r = relay(1, Vec::new());
    let qs = queues_with_a_message(&r, 2);
    let mut c = r.client();
    let corrs = sub_block(&mut c, &qs);
    let blocks = recv_blocks(&mut c, 2);
    let (a, b) = (qs[0].rid().to_vec(), qs[1].rid().to_vec());
    assert_eq!(
        layout(&blocks),
        vec![
            vec![Seen::Sok(a.clone()), Seen::Sok(b.clone()), Seen::Msg(a)],
            vec![Seen::Msg(b)]
        ]
    );
    assert_eq!(blocks[0][0].corr_id, corrs[0]);
    assert_eq!(blocks[0][1].corr_id, corrs[1]);
    expect_nothing(&mut c, "one MSG per SUB");
}

/// O4, the largest part whose first MSG fits the responses' block: three SOKs (58 bytes each with
/// 24-byte corrIds) and a 16,180-byte MSG make 16,354 of the 16,365 bytes a block holds.
#[test]
fn o4_three_subs_carry_the_first_msg_with_the_responses() {
    let r = relay(1, Vec::new());
    let qs = queues_with_a_message(&r, 3);
    let mut c = r.client();
    sub_block(&mut c, &qs);
    let blocks = recv_blocks(&mut c, 3);
    let rid = |i: usize| qs[i].rid().to_vec();
    let mut first: Vec<Seen> = (0..3).map(|i| Seen::Sok(rid(i))).collect();
    first.push(Seen::Msg(rid(0)));
    let mut want = vec![first];
    want.extend((1..3).map(|i| vec![Seen::Msg(rid(i))]));
    assert_eq!(layout(&blocks), want);
    expect_nothing(&mut c, "one MSG per SUB");
}

/// O4 at four responses: the rule would put the first MSG in the responses' block, but it no
/// longer fits after four SOKs, so the greedy packing (the reference's `batchTransmissions` too)
/// gives a block of four SOKs, then one block per MSG.
#[test]
fn o4_four_subs_give_the_responses_then_one_block_per_msg() {
    let r = relay(1, Vec::new());
    let qs = queues_with_a_message(&r, 4);
    let mut c = r.client();
    sub_block(&mut c, &qs);
    let blocks = recv_blocks(&mut c, 5);
    let rid = |i: usize| qs[i].rid().to_vec();
    let mut want = vec![(0..4).map(|i| Seen::Sok(rid(i))).collect::<Vec<_>>()];
    want.extend((0..4).map(|i| vec![Seen::Msg(rid(i))]));
    assert_eq!(layout(&blocks), want);
    expect_nothing(&mut c, "one MSG per SUB");
}

/// O4, over the limit: five SUBs give a block of five SOKs, then one block per MSG.
#[test]
fn o4_five_subs_give_the_responses_then_one_block_per_msg() {
    let r = relay(1, Vec::new());
    let qs = queues_with_a_message(&r, 5);
    let mut c = r.client();
    sub_block(&mut c, &qs);
    let blocks = recv_blocks(&mut c, 6);
    let rid = |i: usize| qs[i].rid().to_vec();
    let mut want = vec![(0..5).map(|i| Seen::Sok(rid(i))).collect::<Vec<_>>()];
    want.extend((0..5).map(|i| vec![Seen::Msg(rid(i))]));
    assert_eq!(layout(&blocks), want);
    expect_nothing(&mut c, "one MSG per SUB");
}

/// O4, a full block on one shard: 135 SUBs of queues with a message each give one block of 135
/// SOKs (in SUB order), then 135 blocks of one MSG each, in SUB order, each decrypting to its
/// queue's message.
#[test]
fn o4_a_block_of_135_subs_gives_one_block_of_135_soks_then_one_msg_per_block() {
    let r = relay(1, Vec::new());
    let qs = queues_with_a_message(&r, SUBS_PER_BLOCK);
    let mut c = r.client();
    let corrs = sub_block(&mut c, &qs);
    let blocks = recv_blocks(&mut c, 1 + SUBS_PER_BLOCK);
    let soks = &blocks[0];
    assert_eq!(soks.len(), SUBS_PER_BLOCK, "one block of all the SOKs");
    for (i, (t, q)) in soks.iter().zip(&qs).enumerate() {
        assert_eq!(t.corr_id, corrs[i], "SOK {i} in SUB order");
        assert_eq!(seen(t), Seen::Sok(q.rid().to_vec()), "SOK {i}");
    }
    for (i, (b, q)) in blocks[1..].iter().zip(&qs).enumerate() {
        assert_eq!(b.len(), 1, "MSG {i} alone in its block");
        assert_eq!(
            seen(&b[0]),
            Seen::Msg(q.rid().to_vec()),
            "MSG {i} in SUB order"
        );
        let m = queue::receive(&q.secret, &b[0]).expect("MSG decrypts");
        assert_eq!(m.msg.body(), Some(format!("pending {i}").as_bytes()));
    }
    expect_nothing(&mut c, "one MSG per SUB");
}

/// O4 with O3 on two shards: the 135 SUBs are two owner parts. Each part is one block of its SOKs
/// (in SUB order), then one block per MSG of that part (in SUB order); the two parts may
/// interleave, but nothing of a part comes before its SOK block.
#[test]
fn o4_a_block_of_135_subs_on_two_shards_gives_each_owners_part_its_own_layout() {
    let r = relay(SHARDS, Vec::new());
    let qs = queues_with_a_message(&r, SUBS_PER_BLOCK);
    let per_owner: Vec<Vec<usize>> = (0..SHARDS)
        .map(|s| (0..qs.len()).filter(|&i| owner(&qs[i]) == s).collect())
        .collect();
    assert!(
        per_owner.iter().all(|p| !p.is_empty()),
        "both shards own some of the queues"
    );
    let mut c = r.client();
    let corrs = sub_block(&mut c, &qs);
    let blocks = recv_blocks(&mut c, SHARDS + SUBS_PER_BLOCK);
    let index_of = |rid: &[u8]| {
        qs.iter()
            .position(|q| q.rid() == rid)
            .unwrap_or_else(|| panic!("a transmission for an unknown queue"))
    };
    // What each owner's part showed, in arrival order: its SOK blocks and its MSGs.
    let mut sok_blocks: Vec<Vec<Vec<usize>>> = vec![Vec::new(); SHARDS];
    let mut msgs: Vec<Vec<usize>> = vec![Vec::new(); SHARDS];
    for (n, b) in blocks.iter().enumerate() {
        match layout(std::slice::from_ref(b)).remove(0).as_slice() {
            [Seen::Msg(rid)] => {
                let i = index_of(rid);
                let s = owner(&qs[i]);
                assert!(
                    !sok_blocks[s].is_empty(),
                    "block {n}: MSG of queue {i} before its owner's SOK block"
                );
                let m = queue::receive(&qs[i].secret, &b[0]).expect("MSG decrypts");
                assert_eq!(m.msg.body(), Some(format!("pending {i}").as_bytes()));
                msgs[s].push(i);
            }
            all_soks if all_soks.iter().all(|t| matches!(t, Seen::Sok(_))) => {
                let idx: Vec<usize> = b
                    .iter()
                    .map(|t| {
                        let i = index_of(&t.entity_id);
                        assert_eq!(t.corr_id, corrs[i], "SOK {i} carries its SUB's corrId");
                        i
                    })
                    .collect();
                let s = owner(&qs[idx[0]]);
                assert!(
                    idx.iter().all(|&i| owner(&qs[i]) == s),
                    "block {n}: SOKs of one owner's part only"
                );
                sok_blocks[s].push(idx);
            }
            other => panic!("block {n}: neither SOKs nor one MSG: {other:?}"),
        }
    }
    for s in 0..SHARDS {
        assert_eq!(
            sok_blocks[s],
            vec![per_owner[s].clone()],
            "shard {s}: one SOK block, in SUB order"
        );
        assert_eq!(
            msgs[s], per_owner[s],
            "shard {s}: one MSG each, in SUB order"
        );
    }
    expect_nothing(&mut c, "one MSG per SUB");
}
