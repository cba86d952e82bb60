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
//!   prefers, and the only one reference clients offer), by the relay's record protection
//!   (`transport::tls_chacha`, OpenSSL);
//! - `handshake`: the relay's side of one connection's setup (`HandshakeFixture`): the TLS 1.3
//!   handshake on `transport::tls::server_config` with a certificate `init` would make, and the
//!   SMP handshake as `server/conn` does it (server hello with a signed session key, the client
//!   hello read and checked, the block keys derived), both hellos as 16 KB blocks through TLS. The
//!   client side runs in the same thread over memory buffers and is not counted.

use std::hint::black_box;
use std::io::{Read, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::client::handshake::{self as client_handshake, HandshakeParams};
use crate::crypto::auth;
use crate::crypto::ed25519::Item;
use crate::crypto::{pad, sxbox};
use crate::protocol::handshake::{CertChainPubKey, ClientHello, ServerHello};
use crate::protocol::transmission::client_signed_bytes;
use crate::protocol::version::{self, SERVER_VERSIONS};
use crate::transport::block::{BlockCodec, BLOCK_SIZE, MAX_ENCRYPTED_CONTENT};
use crate::transport::certs::{self, ServerCredentials};
use crate::transport::tls::{self, AcceptState, ClientCapture, TlsOptions};
use crate::transport::tls_chacha::{RecordKey, NONCE_LEN, TAG_LEN};

/// SENDs verified together in `Fixture::verify_send_batch`: a few connections' SENDs reaching an
/// owner in one turn.
pub const SENDS_PER_BATCH: usize = 8;

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
    /// `SENDS_PER_BATCH` SENDs of a full 16,048-byte body, each signed by its own sender key.
    sends: Vec<([u8; 32], Vec<u8>, [u8; 64])>,
    dh_secret: [u8; 32],
    msg_id: [u8; 24],
    msg_plain: Vec<u8>,
    block_content: Vec<u8>,
    session_id: [u8; 32],
    chain_secret: [u8; 32],
    send_codec: BlockCodec,
    /// The relay's record protection of its ChaCha20-Poly1305 suite (`transport::tls_chacha`),
    /// one key per direction.
    tls_sealer: RecordKey,
    tls_opener: RecordKey,
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
        let tls_sealer = RecordKey::new(&[9u8; 32], true).expect("OpenSSL keys ChaCha20-Poly1305");
        let tls_opener = RecordKey::new(&[9u8; 32], false).expect("OpenSSL keys ChaCha20-Poly1305");
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
            sends: (0..SENDS_PER_BATCH as u32)
                .map(|i| {
                    let mut seed = [11u8; 32];
                    seed[..4].copy_from_slice(&i.to_le_bytes());
                    let sk = ed25519_dalek::SigningKey::from_bytes(&seed);
                    let mut body = b"SEND  ".to_vec();
                    body.resize(6 + 16_048, 0x64);
                    let signed =
                        client_signed_bytes(18, &session_id, &[1u8; 24], &[2u8; 24], &body);
                    let sig = auth::sign_ed25519(&sk, &signed);
                    (sk.verifying_key().to_bytes(), signed, sig)
                })
                .collect(),
            dh_secret: [4u8; 32],
            msg_id: [6u8; 24],
            // Timestamp, flags and a full body, as a stored 16 KB message gives.
            msg_plain: vec![0x61; 16_064 + 11],
            block_content: vec![0x62; MAX_ENCRYPTED_CONTENT],
            session_id,
            chain_secret,
            send_codec: BlockCodec::client(&session_id, &chain_secret),
            tls_sealer,
            tls_opener,
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

    /// One SEND's signature over its 16,048-byte body, verified alone (its SHA-512 over the body
    /// included), as an owner does when one SEND reaches it alone.
    pub fn verify_send(&self) -> bool {
        let (key, msg, sig) = &self.sends[0];
        auth::ed25519_verify(key, black_box(msg), sig)
    }

    /// `SENDS_PER_BATCH` SENDs of different connections verified in one batch, as an owner does
    /// with the block parts its inbox held together (`Owner::batch_verify_across`).
    pub fn verify_send_batch(&self) -> bool {
        let items: Vec<Item> = self
            .sends
            .iter()
            .map(|(key, msg, sig)| Item { key, msg, sig })
            .collect();
        auth::ed25519_verify_batch(black_box(&items))
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

    fn tls_nonce(&mut self) -> [u8; NONCE_LEN] {
        self.tls_seq += 1;
        let mut n = [0u8; NONCE_LEN];
        n[4..].copy_from_slice(&self.tls_seq.to_be_bytes());
        n
    }

    /// One 16 KB TLS record sealed in place (ChaCha20-Poly1305; record header as AAD).
    pub fn tls_seal(&mut self, record: &mut Vec<u8>) {
        record.clear();
        record.resize(TLS_RECORD_BYTES + 1, 0x63);
        let nonce = self.tls_nonce();
        let tag = self
            .tls_sealer
            .seal(&nonce, &TLS_RECORD_AAD, record)
            .expect("record seals");
        record.extend_from_slice(&tag);
    }

    /// A sealed record and its sequence number, for `tls_open`; not part of the floor.
    pub fn record_for_open(&mut self) -> (u64, Vec<u8>) {
        let mut rec = Vec::with_capacity(TLS_RECORD_BYTES + 17);
        self.tls_seal(&mut rec);
        (self.tls_seq, rec)
    }

    /// Opens one 16 KB TLS record in place; returns its plaintext length.
    pub fn tls_open(&mut self, seq: u64, record: &mut [u8]) -> usize {
        let mut n = [0u8; NONCE_LEN];
        n[4..].copy_from_slice(&seq.to_be_bytes());
        let plain = record.len() - TAG_LEN;
        let (body, tag) = record.split_at_mut(plain);
        let tag: [u8; TAG_LEN] = (&*tag).try_into().expect("a 16-byte tag");
        assert!(
            self.tls_opener.open(&n, &TLS_RECORD_AAD, body, &tag),
            "record opens"
        );
        plain
    }
}

/// The record header of a 16 KB record, its AAD.
const TLS_RECORD_AAD: [u8; 5] = [23, 3, 3, 0x40, 0x11];

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
    /// The relay's side of one TLS 1.3 and SMP handshake (`HandshakeFixture`); NaN when it could
    /// not be measured.
    pub handshake_us: f64,
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

    /// The relay's side of one connection's TLS 1.3 and SMP handshakes.
    pub fn per_handshake_us(&self) -> f64 {
        self.handshake_us
    }

    /// The floor of a reconnect run: every connection's handshakes, every SUB, and every waiting
    /// message delivered (and ACKed).
    pub fn reconnect_us(&self, handshakes: u64, subs: u64, delivered: u64) -> f64 {
        handshakes as f64 * self.per_handshake_us() + self.run_us(subs, delivered, 0)
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
            handshake_us: f64::MAX,
        };
        const ROUNDS: usize = 5;
        const N: usize = 100;
        let handshakes = HandshakeFixture::new();
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
            let handshake = handshakes
                .as_ref()
                .map_err(String::clone)
                .and_then(|h| h.mean_us(HANDSHAKES_PER_ROUND));
            // One failed round makes the term unknown (NaN), whatever the other rounds gave.
            floor.handshake_us = match handshake {
                Ok(us) if !floor.handshake_us.is_nan() => floor.handshake_us.min(us),
                _ => f64::NAN,
            };
        }
        floor
    }
}

/// Handshakes timed per round of `Floor::measure` (each about 0.5 ms with both sides).
const HANDSHAKES_PER_ROUND: usize = 20;
/// Flights a TLS 1.3 handshake takes between the two sides in memory: ClientHello, the server's
/// flight, the client's Finished; more means it is not progressing.
const MAX_FLIGHTS: usize = 8;

/// One connection's handshakes, the relay's side timed (see the module comment): a fresh
/// identity as `init` makes it, the relay's TLS server config, and an SMP client's config.
pub struct HandshakeFixture {
    creds: ServerCredentials,
    server: Arc<rustls::ServerConfig>,
    client: Arc<rustls::ClientConfig>,
}

impl HandshakeFixture {
    /// Generates the identity (written to a temporary directory and loaded back, as a start
    /// reads it) and the two configs.
    pub fn new() -> Result<Self, String> {
        let dir = super::proc::TempDir::new("floor-identity").map_err(|e| e.to_string())?;
        certs::generate("127.0.0.1")
            .and_then(|g| g.write_files(dir.path()))
            .map_err(|e| format!("identity: {e}"))?;
        let creds = certs::load(dir.path()).map_err(|e| format!("identity: {e}"))?;
        let server =
            tls::server_config(&creds, &TlsOptions::default()).map_err(|e| e.to_string())?;
        let client = tls::client_config(vec![tls::ALPN_SMP.to_vec()]).map_err(|e| e.to_string())?;
        Ok(HandshakeFixture {
            creds,
            server,
            client,
        })
    }

    /// The mean relay-side time of `n` handshakes, in µs.
    pub fn mean_us(&self, n: usize) -> Result<f64, String> {
        let mut total = Duration::ZERO;
        for _ in 0..n {
            total += self.handshake()?;
        }
        Ok(total.as_secs_f64() * 1e6 / n.max(1) as f64)
    }

    /// One connection: TLS, then the SMP hellos; returns the time the relay's side took.
    pub fn handshake(&self) -> Result<Duration, String> {
        let e = |e: tls::TlsError| e.to_string();
        let io = |e: std::io::Error| e.to_string();
        let localhost = std::net::IpAddr::from([127, 0, 0, 1]);
        let mut client = ClientCapture::new(
            &self.client,
            rustls::pki_types::ServerName::IpAddress(localhost.into()),
        )
        .map_err(e)?;
        let mut server = AcceptState::new(&self.server).map_err(e)?;
        let mut relay = Duration::ZERO;
        let (mut to_server, mut to_client) = (Vec::new(), Vec::new());
        let mut flights = 0;
        while client.is_handshaking()
            || client.connection().wants_write()
            || server.is_handshaking()
        {
            flights += 1;
            if flights > MAX_FLIGHTS {
                return Err("the in-memory TLS handshake did not complete".into());
            }
            to_server.clear();
            while client.connection().wants_write() {
                client.write_tls_to(&mut to_server).map_err(e)?;
            }
            let t = Instant::now();
            if !to_server.is_empty() {
                server.feed(&to_server).map_err(e)?;
            }
            server.take_output(&mut to_client);
            relay += t.elapsed();
            let mut from_server = &to_client[..];
            while !from_server.is_empty() {
                client.read_tls_from(&mut from_server).map_err(e)?;
            }
            to_client.clear();
        }
        let t = Instant::now();
        let (mut sconn, session_id) = server.finish().map_err(e)?;
        relay += t.elapsed();
        let (mut cconn, client_session_id) = client.finish().map_err(e)?;

        // The server hello, as `server/conn` writes it.
        let t = Instant::now();
        let server_key = x25519_dalek::StaticSecret::random_from_rng(rand::rngs::OsRng);
        let server_pub = x25519_dalek::PublicKey::from(&server_key);
        let hello = ServerHello {
            versions: SERVER_VERSIONS,
            session_id: session_id.clone(),
            cert_key: Some(CertChainPubKey {
                chain: self.creds.chain_der.clone(),
                signed_key: self.creds.leaf_key.signed_x25519_key(server_pub.as_bytes()),
            }),
            web_proof: None,
        };
        let mut block = vec![0u8; BLOCK_SIZE];
        pad::pad_into(&hello.encode(), &mut block).map_err(|e| format!("{e:?}"))?;
        sconn.writer().write_all(&block).map_err(io)?;
        to_client.clear();
        while sconn.wants_write() {
            sconn.write_tls(&mut to_client).map_err(io)?;
        }
        relay += t.elapsed();

        // The client's answer, untimed.
        let mut from_server = &to_client[..];
        while !from_server.is_empty() {
            cconn.read_tls(&mut from_server).map_err(io)?;
            cconn.process_new_packets().map_err(|e| e.to_string())?;
        }
        let mut got = vec![0u8; BLOCK_SIZE];
        cconn.reader().read_exact(&mut got).map_err(io)?;
        let peer_chain: Vec<Vec<u8>> = cconn
            .peer_certificates()
            .unwrap_or_default()
            .iter()
            .map(|c| c.as_ref().to_vec())
            .collect();
        let params = HandshakeParams {
            key_hash: self.creds.key_hash.to_vec(),
            versions: crate::client::CLIENT_VERSIONS,
            version: None,
            send_key: true,
            proxy_server: false,
            service: None,
            check_identity: true,
            web_challenge: None,
        };
        let (client_hello, _) =
            client_handshake::answer(&got, &client_session_id, &peer_chain, &params)
                .map_err(|e| format!("client hello: {e:?}"))?;
        cconn.writer().write_all(&client_hello[..]).map_err(io)?;
        to_server.clear();
        while cconn.wants_write() {
            cconn.write_tls(&mut to_server).map_err(io)?;
        }

        // The relay reads and checks the client hello and derives the block keys.
        let t = Instant::now();
        let mut from_client = &to_server[..];
        while !from_client.is_empty() {
            sconn.read_tls(&mut from_client).map_err(io)?;
            sconn.process_new_packets().map_err(|e| e.to_string())?;
        }
        sconn.reader().read_exact(&mut block).map_err(io)?;
        let content = pad::unpad(&block).map_err(|e| format!("{e:?}"))?;
        let hello = ClientHello::decode(content).map_err(|e| format!("client hello: {e:?}"))?;
        if hello.key_hash[..] != self.creds.key_hash[..] || !SERVER_VERSIONS.contains(hello.version)
        {
            return Err("the client hello names another relay or version".into());
        }
        let secret = hello
            .client_key
            .map(|k| sxbox::dh(&server_key.to_bytes(), &k))
            .ok_or("the client hello has no key")?;
        let codec = (hello.version >= version::ENCRYPTED_BLOCK)
            .then(|| BlockCodec::server(&session_id, &secret));
        relay += t.elapsed();
        match codec {
            Some(c) if c.is_encrypted() => Ok(relay),
            _ => Err("the handshake did not agree on block encryption".into()),
        }
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
        assert!(fx.verify_send() && fx.verify_send_batch());
        assert_eq!(fx.sxbox().len(), MSG_BODY_PADDED_LEN + sxbox::TAG_LEN);
        let (mut rx, mut b) = fx.block_for_decode();
        assert_eq!(
            Fixture::block_decode(&mut rx, &mut b),
            MAX_ENCRYPTED_CONTENT
        );
        let (seq, mut r) = fx.record_for_open();
        assert_eq!(fx.tls_open(seq, &mut r), TLS_RECORD_BYTES + 1);
    }

    /// Both sides of the in-memory handshake agree (the client checks the relay's identity and
    /// signed key; the relay checks the client hello), and the relay's part takes some time.
    #[test]
    fn the_handshake_fixture_completes_a_handshake() {
        let h = HandshakeFixture::new().expect("fixture");
        let t = h.handshake().expect("handshake");
        assert!(t > Duration::ZERO);
    }
}
