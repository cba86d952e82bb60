//! SMP codecs: pure encode/decode of every byte layout of `reference/smp-wire.md`, no I/O.

pub mod encoding;
