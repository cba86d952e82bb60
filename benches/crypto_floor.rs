//! The crypto floor (issue 5): exactly the cryptography the relay must do per SUB and per
//! delivered 16 KB message, each operation alone, then the floors built from them. The operations
//! are `smp_relay::load::floor::Fixture`'s, the same that `smp-load` times before each report.
//!
//! Run: `cargo bench --bench crypto_floor`. After criterion's lines it prints the per-SUB and
//! per-message floors from the medians criterion measured.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, BatchSize, Criterion};

use smp_relay::load::floor::{Fixture, Floor, HandshakeFixture};
use smp_relay::transport::block::BLOCK_SIZE;

fn bench(c: &mut Criterion) {
    let mut fx = Fixture::new();
    let mut g = c.benchmark_group("floor");
    g.bench_function("ed25519_verify_sub", |b| b.iter(|| black_box(fx.verify())));
    g.bench_function("ed25519_verify_batch_135", |b| {
        b.iter(|| black_box(fx.verify_batch()))
    });
    g.bench_function("ed25519_verify_batch_135_cold_keys", |b| {
        b.iter(|| black_box(fx.verify_batch_cold()))
    });
    g.bench_function("ed25519_verify_send_16k_alone", |b| {
        b.iter(|| black_box(fx.verify_send()))
    });
    g.bench_function("ed25519_verify_send_16k_batch_8", |b| {
        b.iter(|| black_box(fx.verify_send_batch()))
    });
    g.bench_function("sxbox_msg_body_16k", |b| b.iter(|| black_box(fx.sxbox())));
    let mut out = Box::new([0u8; BLOCK_SIZE]);
    g.bench_function("block_encode_16k", |b| b.iter(|| fx.block_encode(&mut out)));
    g.bench_function("block_decode_16k", |b| {
        b.iter_batched(
            || fx.block_for_decode(),
            |(mut rx, mut block)| black_box(Fixture::block_decode(&mut rx, &mut block)),
            BatchSize::SmallInput,
        )
    });
    let mut rec = Vec::new();
    g.bench_function("tls_seal_16k_chacha20", |b| {
        b.iter(|| fx.tls_seal(&mut rec))
    });
    let mut opener = Fixture::new();
    let sealed: Vec<_> = (0..1).map(|_| opener.record_for_open()).collect();
    let (seq, record) = sealed[0].clone();
    g.bench_function("tls_open_16k_chacha20", |b| {
        b.iter_batched(
            || record.clone(),
            |mut r| black_box(opener.tls_open(seq, &mut r)),
            BatchSize::SmallInput,
        )
    });
    // The relay's side only: each iteration's client side runs untimed (`HandshakeFixture`).
    // A handshake that fails is counted as no time and said below.
    let failed = std::cell::Cell::new(None);
    match HandshakeFixture::new() {
        Ok(hs) => {
            g.bench_function("handshake_relay_side", |b| {
                b.iter_custom(|iters| {
                    (0..iters)
                        .map(|_| {
                            hs.handshake().unwrap_or_else(|e| {
                                failed.set(Some(e));
                                Duration::ZERO
                            })
                        })
                        .sum()
                })
            });
        }
        Err(e) => failed.set(Some(e)),
    }
    if let Some(e) = failed.take() {
        eprintln!("handshake_relay_side: {e}");
    }
    g.finish();
}

/// Criterion's median estimate of one benchmark, in µs, from its saved estimates.
fn median_us(name: &str) -> Option<f64> {
    let dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::PathBuf::from("target"));
    let text = std::fs::read_to_string(
        dir.join("criterion/floor")
            .join(name)
            .join("new/estimates.json"),
    )
    .ok()?;
    let i = text.find("\"median\"")?;
    let rest = &text[i..];
    let j = rest.find("\"point_estimate\":")? + "\"point_estimate\":".len();
    let num: String = rest[j..]
        .chars()
        .take_while(|c| c.is_ascii_digit() || matches!(c, '.' | 'e' | 'E' | '-' | '+'))
        .collect();
    num.parse::<f64>().ok().map(|ns| ns / 1000.0)
}

fn summary() {
    let get = |n: &str| median_us(n).unwrap_or(f64::NAN);
    let f = Floor {
        verify_us: get("ed25519_verify_sub"),
        verify_batched_us: get("ed25519_verify_batch_135") / 135.0,
        verify_batched_cold_us: get("ed25519_verify_batch_135_cold_keys") / 135.0,
        sxbox_us: get("sxbox_msg_body_16k"),
        block_enc_us: get("block_encode_16k"),
        block_dec_us: get("block_decode_16k"),
        tls_seal_us: get("tls_seal_16k_chacha20"),
        tls_open_us: get("tls_open_16k_chacha20"),
        handshake_us: get("handshake_relay_side"),
    };
    println!("\ncrypto floor from criterion medians (µs):");
    println!(
        "  per SUB      {:8.1}  = batched verify, key first seen {:.1} + (block dec {:.1} + TLS open {:.1} + block enc {:.1} + TLS seal {:.1}) / 135",
        f.per_sub_us(),
        f.verify_batched_cold_us,
        f.block_dec_us,
        f.tls_open_us,
        f.block_enc_us,
        f.tls_seal_us
    );
    println!(
        "  per delivery {:8.1}  = MSG sxbox {:.1} + block enc {:.1} + TLS seal {:.1} + batched ACK verify {:.1}",
        f.per_delivery_us(),
        f.sxbox_us,
        f.block_enc_us,
        f.tls_seal_us,
        f.verify_batched_us
    );
    println!(
        "  per SEND     {:8.1}  = TLS open {:.1} + block dec {:.1} + SEND verify {:.1}",
        f.per_send_us(),
        f.tls_open_us,
        f.block_dec_us,
        f.verify_us
    );
    println!(
        "  a SEND's own verification over its 16 KB body: alone {:.1}, in a batch of {} {:.1} each (the floor counts a SUB-sized one)",
        get("ed25519_verify_send_16k_alone"),
        smp_relay::load::floor::SENDS_PER_BATCH,
        get("ed25519_verify_send_16k_batch_8") / smp_relay::load::floor::SENDS_PER_BATCH as f64
    );
    println!(
        "  per message  {:8.1}  = per delivery + per SEND",
        f.per_message_us()
    );
    println!(
        "  per handshake {:7.1}  = the relay's side of TLS 1.3 + the SMP hellos",
        f.per_handshake_us()
    );
    println!(
        "  (one Ed25519 verification alone {:.1}; per signature in a batch of 135 {:.1}, {:.1} with keys first seen)",
        f.verify_us, f.verify_batched_us, f.verify_batched_cold_us
    );
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = bench
}

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
    summary();
}
