//! The cryptography the relay cannot avoid, per SUB and per delivered message (issue 5's "crypto
//! floor"). The same operations back the criterion benchmark (`benches/crypto_floor.rs`) and the
//! quick in-process measurement `smp-load` takes before each report, so that every scenario shows
//! relay CPU divided by the floor measured on the same machine, with the same build.
//!
//! What each operation is, with the relay's own code where the relay has it:
//! - `verify`: one Ed25519 verification of a signed SUB transmission (`crypto::auth`), the same
//!   check a SEND costs (senders send one SEND per block);
//! - `verify_batched`: the same check per signature when a block carries 135 of them, verified in
//!   one batch (`crypto::ed25519::verify_batch`) as the owner does for a block of ACKs, whose keys
//!   were decompressed (and cached) by the SUB before;
//! - `verify_batched_cold`: the same for keys not seen since the relay started, as in a SUB storm
//!   (each key decompressed once more);
//! - `sxbox`: SXbox sealing (libsodium's XSalsa20-Poly1305) of a MSG body padded to 16106 bytes (`crypto::sxbox::seal_padded`);
//! - `block_enc` / `block_dec`: a full 16 KB block through `transport::block::BlockCodec`;
//! - `tls_seal` / `tls_open`: one 16 KB TLS 1.3 record with ChaCha20-Poly1305 (the suite the relay
//!   prefers, and the only one reference clients offer), by ring's AEAD as rustls uses it.

use std::hint::black_box;
use std::time::Instant;

use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, CHACHA20_POLY1305};

use crate::crypto::auth;
use crate::crypto::ed25519::Item;
use crate::crypto::sxbox;
use crate::protocol::transmission::client_signed_bytes;
use crate::transport::block::{BlockCodec, BLOCK_SIZE, MAX_ENCRYPTED_CONTENT};

/// The padded plaintext length of a MSG body, as the relay seals it.
pub const MSG_BODY_PADDED_LEN: usize = 16106;
/// A TLS record carrying one block.
pub const TLS_RECORD_BYTES: usize = BLOCK_SIZE;
/// SUBs that fit in one block at v16+, over which a SUB block's and its response block's
/// encryption are shared.
pub const SUBS_PER_BLOCK: f64 = 135.0;

/// Fixed inputs for the floor operations.
pub struct Fixture {
    key: [u8; 32],
    signed: Vec<u8>,
    sig: [u8; 64],
    /// A block's worth of SUBs, each signed by its own key: (key, signed bytes, signature).
    batch: Vec<([u8; 32], Vec<u8>, [u8; 64])>,
    dh_secret: [u8; 32],
    msg_id: [u8; 24],
    msg_plain: Vec<u8>,
    block_content: Vec<u8>,
    session_id: [u8; 32],
    chain_secret: [u8; 32],
    send_codec: BlockCodec,
    tls_key: LessSafeKey,
    tls_seq: u64,
}

impl Default for Fixture {
    fn default() -> Self {
        Self::new()
    }
}

impl Fixture {
    pub fn new() -> Self {
        let sk = ed25519_dalek::SigningKey::from_bytes(&[7u8; 32]);
        let session_id = [3u8; 32];
        let signed = client_signed_bytes(18, &session_id, &[1u8; 24], &[2u8; 24], b"SUB");
        let sig = auth::sign_ed25519(&sk, &signed);
        let chain_secret = [5u8; 32];
        let tls_key = LessSafeKey::new(
            UnboundKey::new(&CHACHA20_POLY1305, &[9u8; 32]).expect("32-byte ChaCha20 key"),
        );
        let batch = (0..SUBS_PER_BLOCK as u32)
            .map(|i| {
                let mut seed = [8u8; 32];
                seed[..4].copy_from_slice(&i.to_le_bytes());
                let sk = ed25519_dalek::SigningKey::from_bytes(&seed);
                let mut rid = [2u8; 24];
                rid[..4].copy_from_slice(&i.to_le_bytes());
                let signed = client_signed_bytes(18, &session_id, &[1u8; 24], &rid, b"SUB");
                let sig = auth::sign_ed25519(&sk, &signed);
                (sk.verifying_key().to_bytes(), signed, sig)
            })
            .collect();
        Fixture {
            key: sk.verifying_key().to_bytes(),
            signed,
            sig,
            batch,
            dh_secret: [4u8; 32],
            msg_id: [6u8; 24],
            // Timestamp, flags and a full body, as a stored 16 KB message gives.
            msg_plain: vec![0x61; 16_064 + 11],
            block_content: vec![0x62; MAX_ENCRYPTED_CONTENT],
            session_id,
            chain_secret,
            send_codec: BlockCodec::client(&session_id, &chain_secret),
            tls_key,
            tls_seq: 0,
        }
    }

    /// One Ed25519 verification of a SUB transmission, as the owner does it alone.
    pub fn verify(&self) -> bool {
        auth::ed25519_verify(&self.key, black_box(&self.signed), &self.sig)
    }

    /// `verify_batch` with keys not in the shard's key cache (a SUB storm after a start).
    pub fn verify_batch_cold(&self) -> bool {
        crate::crypto::ed25519::clear_key_cache();
        self.verify_batch()
    }

    /// A block of 135 SUB signatures verified in one batch, as the owner does it.
    pub fn verify_batch(&self) -> bool {
        let items: Vec<Item> = self
            .batch
            .iter()
            .map(|(key, msg, sig)| Item { key, msg, sig })
            .collect();
        auth::ed25519_verify_batch(black_box(&items))
    }

    /// The MSG body of a delivery: SXbox over the padded message.
    pub fn sxbox(&self) -> Vec<u8> {
        sxbox::seal_padded(
            &self.dh_secret,
            &self.msg_id,
            black_box(&self.msg_plain),
            MSG_BODY_PADDED_LEN,
        )
        .expect("message fits its padding")
    }

    /// One full block encrypted with the next key of the send chain.
    pub fn block_encode(&mut self, out: &mut [u8; BLOCK_SIZE]) {
        self.send_codec
            .encode(black_box(&self.block_content), out)
            .expect("content fits a block");
    }

    /// A fresh (receiver, encrypted block) pair for `block_decode`; not part of the floor.
    pub fn block_for_decode(&self) -> (BlockCodec, Box<[u8; BLOCK_SIZE]>) {
        let mut sender = BlockCodec::client(&self.session_id, &self.chain_secret);
        let receiver = BlockCodec::server(&self.session_id, &self.chain_secret);
        let mut block = Box::new([0u8; BLOCK_SIZE]);
        sender
            .encode(&self.block_content, &mut block)
            .expect("content fits a block");
        (receiver, block)
    }

    /// One full block decrypted (the receive side of `block_encode`).
    pub fn block_decode(receiver: &mut BlockCodec, block: &mut [u8; BLOCK_SIZE]) -> usize {
        receiver
            .decode(block)
            .map(|c| c.len())
            .expect("block decrypts")
    }

    fn tls_nonce(&mut self) -> Nonce {
        self.tls_seq += 1;
        let mut n = [0u8; 12];
        n[4..].copy_from_slice(&self.tls_seq.to_be_bytes());
        Nonce::assume_unique_for_key(n)
    }

    /// One 16 KB TLS record sealed in place (ChaCha20-Poly1305; record header as AAD).
    pub fn tls_seal(&mut self, record: &mut Vec<u8>) {
        record.clear();
        record.resize(TLS_RECORD_BYTES + 1, 0x63);
        let nonce = self.tls_nonce();
        self.tls_key
            .seal_in_place_append_tag(nonce, Aad::from([23u8, 3, 3, 0x40, 0x11]), record)
            .expect("record fits");
    }

    /// A sealed record and its sequence number, for `tls_open`; not part of the floor.
    pub fn record_for_open(&mut self) -> (u64, Vec<u8>) {
        let mut rec = Vec::with_capacity(TLS_RECORD_BYTES + 17);
        self.tls_seal(&mut rec);
        (self.tls_seq, rec)
    }

    /// Opens one 16 KB TLS record in place.
    pub fn tls_open(&self, seq: u64, record: &mut [u8]) -> usize {
        let mut n = [0u8; 12];
        n[4..].copy_from_slice(&seq.to_be_bytes());
        self.tls_key
            .open_in_place(
                Nonce::assume_unique_for_key(n),
                Aad::from([23u8, 3, 3, 0x40, 0x11]),
                record,
            )
            .map(|p| p.len())
            .expect("record opens")
    }
}

/// Per-operation costs in µs, and the per-SUB and per-message floors built from them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Floor {
    pub verify_us: f64,
    /// Per signature, in a batch of 135: keys seen before, and keys first seen.
    pub verify_batched_us: f64,
    pub verify_batched_cold_us: f64,
    pub sxbox_us: f64,
    pub block_enc_us: f64,
    pub block_dec_us: f64,
    pub tls_seal_us: f64,
    pub tls_open_us: f64,
}

impl Floor {
    /// One batched signature check of a key first seen, plus a 1/135 share of the SUB block in and
    /// the response block out.
    pub fn per_sub_us(&self) -> f64 {
        self.verify_batched_cold_us
            + (self.block_dec_us + self.tls_open_us + self.block_enc_us + self.tls_seal_us)
                / SUBS_PER_BLOCK
    }

    /// Delivering one 16 KB message: its MSG body sealed, its block and TLS record out, and the
    /// recipient's ACK verified. ACKs can share blocks (the load generator packs those it has), so
    /// their blocks and answers are not counted, and their signatures are batched.
    pub fn per_delivery_us(&self) -> f64 {
        self.verify_batched_us + self.sxbox_us + self.block_enc_us + self.tls_seal_us
    }

    /// Accepting one 16 KB SEND: its TLS record and block in, its signature verified.
    pub fn per_send_us(&self) -> f64 {
        self.verify_us + self.block_dec_us + self.tls_open_us
    }

    /// A message sent and delivered in the same run: SEND in, MSG out, ACK in.
    pub fn per_message_us(&self) -> f64 {
        self.per_delivery_us() + self.per_send_us()
    }

    /// The floor of a whole run from its counts.
    pub fn run_us(&self, subs: u64, delivered: u64, sent: u64) -> f64 {
        subs as f64 * self.per_sub_us()
            + delivered as f64 * self.per_delivery_us()
            + sent as f64 * self.per_send_us()
    }

    /// A quick measurement (about 0.2 s): the minimum over a few rounds of the mean of each
    /// operation, so that a busy moment does not raise the floor.
    pub fn measure() -> Floor {
        let mut fx = Fixture::new();
        let mut out = Box::new([0u8; BLOCK_SIZE]);
        let mut rec = Vec::with_capacity(TLS_RECORD_BYTES + 17);
        let mut floor = Floor {
            verify_us: f64::MAX,
            verify_batched_us: f64::MAX,
            verify_batched_cold_us: f64::MAX,
            sxbox_us: f64::MAX,
            block_enc_us: f64::MAX,
            block_dec_us: f64::MAX,
            tls_seal_us: f64::MAX,
            tls_open_us: f64::MAX,
        };
        const ROUNDS: usize = 5;
        const N: usize = 100;
        for _ in 0..ROUNDS {
            floor.verify_us = floor.verify_us.min(time_us(N, || {
                black_box(fx.verify());
            }));
            floor.verify_batched_us = floor.verify_batched_us.min(
                time_us(N / 20, || {
                    black_box(fx.verify_batch());
                }) / SUBS_PER_BLOCK,
            );
            floor.verify_batched_cold_us = floor.verify_batched_cold_us.min(
                time_us(N / 20, || {
                    black_box(fx.verify_batch_cold());
                }) / SUBS_PER_BLOCK,
            );
            floor.sxbox_us = floor.sxbox_us.min(time_us(N, || {
                black_box(fx.sxbox());
            }));
            floor.block_enc_us = floor
                .block_enc_us
                .min(time_us(N, || fx.block_encode(&mut out)));
            let mut blocks: Vec<_> = (0..N).map(|_| fx.block_for_decode()).collect();
            let t = Instant::now();
            for (rx, b) in blocks.iter_mut() {
                black_box(Fixture::block_decode(rx, b));
            }
            floor.block_dec_us = floor.block_dec_us.min(per_us(t, N));
            floor.tls_seal_us = floor.tls_seal_us.min(time_us(N, || fx.tls_seal(&mut rec)));
            let mut recs: Vec<_> = (0..N).map(|_| fx.record_for_open()).collect();
            let t = Instant::now();
            for (seq, r) in recs.iter_mut() {
                black_box(fx.tls_open(*seq, r));
            }
            floor.tls_open_us = floor.tls_open_us.min(per_us(t, N));
        }
        floor
    }
}

fn time_us(n: usize, mut f: impl FnMut()) -> f64 {
    let t = Instant::now();
    for _ in 0..n {
        f();
    }
    per_us(t, n)
}

fn per_us(t: Instant, n: usize) -> f64 {
    t.elapsed().as_secs_f64() * 1e6 / n as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floor_operations_succeed() {
        let mut fx = Fixture::new();
        assert!(fx.verify());
        assert!(fx.verify_batch());
        assert!(fx.verify_batch_cold());
        assert_eq!(fx.sxbox().len(), MSG_BODY_PADDED_LEN + sxbox::TAG_LEN);
        let (mut rx, mut b) = fx.block_for_decode();
        assert_eq!(
            Fixture::block_decode(&mut rx, &mut b),
            MAX_ENCRYPTED_CONTENT
        );
        let (seq, mut r) = fx.record_for_open();
        assert_eq!(fx.tls_open(seq, &mut r), TLS_RECORD_BYTES + 1);
    }
}
