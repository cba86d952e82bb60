//! The transport, in one test binary: TLS and tls-unique (`tls_unique.rs`, `service_tls.rs`), the
//! SMP handshake (`handshake.rs`), blocks and batches (`blocks.rs`), hostile peers and half-open
//! connections (`bad_input.rs`), the decoders' fuzzer (`fuzz_decode.rs`) and the web site's HTTP
//! side (`web_site.rs`).

#[path = "../common/mod.rs"]
mod common;
#[path = "../support/mod.rs"]
mod support;

mod bad_input;
mod blocks;
mod fuzz_decode;
mod handshake;
mod service_tls;
mod tls_unique;
mod web_site;
