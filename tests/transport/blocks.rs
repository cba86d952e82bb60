//! Block framing and batching (simplexmq `Transport.hs`, `Protocol.hs`): encrypted blocks both
//! ways, batches of PINGs answered in as few blocks as possible, and the `ERR BLOCK` cases that
//! leave the connection usable.

use crate::common;

use std::collections::HashSet;

use common::Relay;
use smp_relay::client::{Authorization, Client, ClientOptions, ClientTransmission};
use smp_relay::transport::block::BLOCK_SIZE;

fn ping(corr_id: &[u8]) -> ClientTransmission {
    ClientTransmission::raw(corr_id, b"", b"PING")
}

/// Reads blocks until every corrId in `want` got `PONG`; returns how many blocks it took.
fn collect_pongs(c: &mut Client, want: &HashSet<Vec<u8>>) -> usize {
    let mut left = want.clone();
    let mut blocks = 0;
    while !left.is_empty() {
        let ts = c.recv_block().expect("response block");
        blocks += 1;
        for t in ts {
            assert_eq!(t.command, b"PONG", "response to {:?}", t.corr_id);
            assert!(t.entity_id.is_empty());
            assert!(
                left.remove(&t.corr_id),
                "unexpected or repeated corrId {:?}",
                t.corr_id
            );
        }
    }
    blocks
}

#[test]
fn ping_batches_are_answered_in_one_block() {
    let relay = Relay::start();
    let mut c = relay.client();
    assert_eq!(c.version(), 20);
    assert!(c.is_encrypted());
    for n in [1usize, 10, 255] {
        let corr_ids: Vec<Vec<u8>> = (0..n)
            .map(|_| smp_relay::client::new_corr_id().to_vec())
            .collect();
        let batch: Vec<_> = corr_ids.iter().map(|id| ping(id)).collect();
        c.send_batch(&batch).expect("send");
        let blocks = collect_pongs(&mut c, &corr_ids.into_iter().collect());
        // 255 PONGs are 255 × 33 bytes: one block holds them all.
        assert_eq!(blocks, 1, "{n} PONGs should come in one block");
    }
}

#[test]
fn plain_blocks_at_v10_carry_batches_too() {
    let relay = Relay::start();
    let mut c = relay
        .connect(ClientOptions {
            version: Some(10),
            ..ClientOptions::default()
        })
        .expect("connect");
    assert!(!c.is_encrypted());
    let corr_ids: Vec<Vec<u8>> = (0..100u8).map(|i| vec![i; 24]).collect();
    let batch: Vec<_> = corr_ids.iter().map(|id| ping(id)).collect();
    c.send_batch(&batch).expect("send");
    assert_eq!(collect_pongs(&mut c, &corr_ids.into_iter().collect()), 1);
}

#[test]
fn two_blocks_of_pings_in_a_row() {
    let relay = Relay::start();
    let mut c = relay.client();
    // 400 PINGs: the client packs them into two blocks (255 + 145).
    let corr_ids: Vec<Vec<u8>> = (0..400u32)
        .map(|i| {
            let mut id = vec![0u8; 24];
            id[..4].copy_from_slice(&i.to_be_bytes());
            id
        })
        .collect();
    let batch: Vec<_> = corr_ids.iter().map(|id| ping(id)).collect();
    c.send_batch(&batch).expect("send");
    let blocks = collect_pongs(&mut c, &corr_ids.into_iter().collect());
    assert!(blocks <= 2, "400 PONGs in {blocks} blocks");
}

/// One transmission in the next block: `ERR BLOCK` with empty corrId and entity.
fn expect_err_block(c: &mut Client) {
    let ts = c.recv_block().expect("ERR BLOCK");
    assert_eq!(ts.len(), 1, "{ts:?}");
    assert_eq!(ts[0].command, b"ERR BLOCK");
    assert!(ts[0].corr_id.is_empty() && ts[0].entity_id.is_empty());
}

#[test]
fn garbage_encrypted_block_gets_err_block_and_the_chains_stay_in_step() {
    let relay = Relay::start();
    let mut c = relay.client();
    assert!(c.is_encrypted());
    for _ in 0..3 {
        let mut garbage = Box::new([0u8; BLOCK_SIZE]);
        for (i, b) in garbage.iter_mut().enumerate() {
            *b = (i * 7 + 3) as u8;
        }
        c.send_raw_block(&garbage).expect("send garbage");
        expect_err_block(&mut c);
        let r = c.ping().expect("PING after garbage");
        assert_eq!(r.command, b"PONG");
    }
}

#[test]
fn garbage_plain_block_gets_err_block() {
    let relay = Relay::start();
    let mut c = relay
        .connect(ClientOptions {
            send_key: false,
            ..ClientOptions::default()
        })
        .expect("connect");
    assert!(!c.is_encrypted());
    // Padding length larger than the block: unPad fails.
    let garbage = Box::new([0xffu8; BLOCK_SIZE]);
    c.send_raw_block(&garbage).expect("send garbage");
    expect_err_block(&mut c);
    assert_eq!(c.ping().expect("PING").command, b"PONG");
}

#[test]
fn batch_count_mismatch_gets_err_block() {
    let relay = Relay::start();
    let mut c = relay.client();
    let t = c.encode_transmission(&ping(b"c1")).expect("encode");
    // Count says 2, one item follows.
    let mut content = vec![2u8];
    content.extend_from_slice(&(t.len() as u16).to_be_bytes());
    content.extend_from_slice(&t);
    c.send_content(&content).expect("send");
    expect_err_block(&mut c);
    // Count 0.
    c.send_content(&[0u8]).expect("send");
    expect_err_block(&mut c);
    // Trailing bytes after the last item.
    let mut content = vec![1u8];
    content.extend_from_slice(&(t.len() as u16).to_be_bytes());
    content.extend_from_slice(&t);
    content.push(0);
    c.send_content(&content).expect("send");
    expect_err_block(&mut c);
    assert_eq!(c.ping().expect("PING").command, b"PONG");
}

#[test]
fn unparsable_transmission_in_a_batch_gets_err_block() {
    let relay = Relay::start();
    let mut c = relay.client();
    let good = c.encode_transmission(&ping(b"good")).expect("encode");
    // A corrId length that runs past the end of the transmission.
    let bad = b"\x00\x30abc".to_vec();
    c.send_encoded(&[good, bad]).expect("send");
    let mut got = Vec::new();
    while got.len() < 2 {
        got.extend(c.recv_block().expect("responses"));
    }
    got.sort_by(|a, b| a.corr_id.cmp(&b.corr_id));
    assert_eq!(got[0].corr_id, b"");
    assert_eq!(got[0].command, b"ERR BLOCK");
    assert_eq!(got[1].corr_id, b"good");
    assert_eq!(got[1].command, b"PONG");
}

#[test]
fn bad_authorization_length_gets_err_block_with_the_corr_id() {
    let relay = Relay::start();
    let mut c = relay.client();
    for len in [10usize, 63, 65, 100, 113, 115] {
        let t = ClientTransmission::raw(b"badauth", b"entity", b"PING")
            .with_auth(Authorization::Raw(vec![1u8; len]));
        c.send_batch(&[t]).expect("send");
        let r = c.recv_for(b"badauth").expect("response");
        assert_eq!(r.command, b"ERR BLOCK", "authorization of {len} bytes");
        assert!(r.entity_id.is_empty(), "ERR BLOCK carries no entity");
    }
    assert_eq!(c.ping().expect("PING").command, b"PONG");
}

#[test]
fn largest_batch_is_accepted() {
    let relay = Relay::start();
    let mut c = relay.client();
    // One transmission whose `Large` item is exactly at the batch byte limit (16365).
    let target = smp_relay::protocol::batch::MAX_BATCH_BYTES - 2;
    let overhead = c
        .encode_transmission(&ClientTransmission::raw(b"filler", b"", b""))
        .expect("encode")
        .len();
    let filler = ClientTransmission::raw(b"filler", b"", &vec![b'X'; target - overhead]);
    let t = c.encode_transmission(&filler).expect("encode");
    assert_eq!(t.len() + 2, smp_relay::protocol::batch::MAX_BATCH_BYTES);
    c.send_encoded(&[t]).expect("send");
    let r = c.recv_for(b"filler").expect("response");
    assert_eq!(r.command, b"ERR CMD UNKNOWN");
}
