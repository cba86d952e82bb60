//! Batched subscriptions (`docs/ARCHITECTURE.md` §2): a block of 135 SUBs costs each owner shard
//! one `peek_first_many` store call and no single peeks. The counts are the store's own, read from
//! the metrics file (`smprelay_store_peek_first_many_calls_total`,
//! `smprelay_store_peek_first_calls_total`).

use crate::common;
use crate::support;

use std::collections::HashMap;

use common::{Relay, RelayOptions};
use smp_relay::client::{new_corr_id, ClientTransmission};
use smp_relay::protocol::command::Command;
use smp_relay::protocol::response::BrokerMsg;
use smp_relay::server::router::owner_shard;
use support::*;

/// The most Ed25519-signed SUBs one block holds at v16+ (simplexmq
/// `tests/CoreTests/BatchingTests.hs`).
const SUBS_PER_BLOCK: usize = 135;

/// The metrics file once every shard has published its numbers (`Relay::publish_metrics`: shard 0
/// writes the sum last), which must show `blocks` blocks of SUBs (the reference's `qSubAllB`):
/// they were all answered before.
fn metrics_after(relay: &Relay, blocks: u64) -> HashMap<String, u64> {
    relay.publish_metrics();
    let m = relay.metrics();
    assert_eq!(
        m.get("simplex_smp_subscribtion_successes_batch").copied(),
        Some(blocks),
        "{blocks} blocks of SUBs: {m:?}"
    );
    m
}

#[test]
fn a_block_of_135_subs_over_two_shards_makes_at_most_two_store_calls() {
    let relay = Relay::start_with(RelayOptions {
        cores: 2,
        extra_args: vec!["--metrics-interval".into(), "1".into()],
    });
    let mut creator = relay.client();
    let mut sender = relay.client();
    let queues: Vec<Queue> = (0..SUBS_PER_BLOCK)
        .map(|_| create_only(&mut creator))
        .collect();
    let owners: Vec<usize> = queues.iter().map(|q| owner_shard(q.rid(), 2)).collect();
    assert!(
        owners.contains(&0) && owners.contains(&1),
        "135 random queues are spread over both shards"
    );
    // Some queues hold a message, so the batch read has something to return.
    for q in queues.iter().step_by(3) {
        send_ok(&mut sender, q, None, b"waiting");
    }

    let mut subscriber = relay.client();
    let subs: Vec<ClientTransmission> = queues
        .iter()
        .map(|q| {
            ClientTransmission::new(&new_corr_id(), q.rid(), Command::Sub).signed(q.key().clone())
        })
        .collect();
    // The client packs greedily: 135 Ed25519-signed SUBs are exactly one block (if they were two,
    // each owner would be asked twice and the assertion below would fail).
    subscriber.send_batch(&subs).expect("send the SUB block");
    let mut soks = 0;
    let mut msgs = 0;
    while soks < SUBS_PER_BLOCK || msgs < SUBS_PER_BLOCK.div_ceil(3) {
        let t = next(&mut subscriber);
        match t.msg {
            Ok(BrokerMsg::Sok(None)) => soks += 1,
            Ok(BrokerMsg::Msg { .. }) => msgs += 1,
            other => panic!("unexpected answer to a SUB: {other:?}"),
        }
    }

    let m = metrics_after(&relay, 1);
    // New subscriptions count when they deliver a waiting message (the reference's `qSub`).
    assert_eq!(
        m["simplex_smp_subscribtion_successes"],
        SUBS_PER_BLOCK.div_ceil(3) as u64
    );
    let many = m["smprelay_store_peek_first_many_calls_total"];
    let single = m["smprelay_store_peek_first_calls_total"];
    assert!(
        many <= 2,
        "peek_first_many calls for one block over 2 shards: {many}"
    );
    assert!(many >= 1, "the batch read is counted");
    assert_eq!(single, 0, "no SUB of the block read its queue alone");
}

/// Ed25519 batch verification over real TLS (`crypto::ed25519`, `Owner::batch_verify`): a block of
/// 135 signed SUBs over 2 shards is verified in one batch per owner part, with no fallback; a block
/// holding a wrong key and a missing queue among 133 good SUBs gets exactly those two AUTH answers
/// while the 133 subscribe, and its failed batches are counted.
#[test]
fn a_block_of_subs_is_batch_verified_and_bad_signatures_cost_only_their_own_auth() {
    let relay = Relay::start_with(RelayOptions {
        cores: 2,
        extra_args: vec!["--metrics-interval".into(), "1".into()],
    });
    let mut creator = relay.client();
    let queues: Vec<Queue> = (0..SUBS_PER_BLOCK)
        .map(|_| create_only(&mut creator))
        .collect();
    let sub = |rid: &[u8], key: &smp_relay::client::Signer| {
        ClientTransmission::new(&new_corr_id(), rid, Command::Sub).signed(key.clone())
    };

    let mut first = relay.client();
    let subs: Vec<ClientTransmission> = queues.iter().map(|q| sub(q.rid(), q.key())).collect();
    first.send_batch(&subs).expect("send the SUB block");
    for _ in 0..SUBS_PER_BLOCK {
        let t = next(&mut first);
        assert!(matches!(t.msg, Ok(BrokerMsg::Sok(None))), "{:?}", t.msg);
    }
    let m = metrics_after(&relay, 1);
    let batches = m["smprelay_verify_batches_total"];
    assert!(
        (1..=2).contains(&batches),
        "one batch per owner part: {batches}"
    );
    assert_eq!(m["smprelay_verify_batch_fallbacks_total"], 0);

    // A second connection: 133 good SUBs, one signed with another key, one for no queue.
    let wrong = smp_relay::client::Signer::Ed25519(ed25519_dalek::SigningKey::from_bytes(&[7; 32]));
    let missing = [9u8; 24];
    let mut second = relay.client();
    let mut subs: Vec<ClientTransmission> = queues[..SUBS_PER_BLOCK - 2]
        .iter()
        .map(|q| sub(q.rid(), q.key()))
        .collect();
    subs.insert(40, sub(queues[SUBS_PER_BLOCK - 2].rid(), &wrong));
    subs.insert(90, sub(&missing, queues[0].key()));
    let bad: Vec<Vec<u8>> = vec![subs[40].corr_id.clone(), subs[90].corr_id.clone()];
    second.send_batch(&subs).expect("send the second SUB block");
    let mut auth = Vec::new();
    let mut soks = 0;
    while soks + auth.len() < SUBS_PER_BLOCK {
        let t = next(&mut second);
        match t.msg {
            Ok(BrokerMsg::Sok(None)) => soks += 1,
            Ok(BrokerMsg::Err(smp_relay::protocol::error::ErrorType::Auth)) => {
                auth.push(t.corr_id.clone())
            }
            other => panic!("unexpected answer to a SUB: {other:?}"),
        }
    }
    auth.sort();
    let mut expected = bad;
    expected.sort();
    assert_eq!(auth, expected, "AUTH for exactly the two bad SUBs");
    assert_eq!(soks, SUBS_PER_BLOCK - 2);
    let m = metrics_after(&relay, 2);
    assert_eq!(m["simplex_smp_subscribtion_errors{type=\"auth\"}"], 2);
    let fallbacks = m["smprelay_verify_batch_fallbacks_total"];
    assert!(
        (1..=2).contains(&fallbacks),
        "the failed batches: {fallbacks}"
    );
}
