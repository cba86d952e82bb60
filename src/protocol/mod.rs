//! SMP codecs: pure encode/decode of every byte layout of `reference/smp-wire.md`, no I/O.

pub mod batch;
pub mod command;
pub mod encoding;
pub mod error;
pub mod forward;
pub mod handshake;
pub mod pad;
pub mod response;
pub mod transmission;
pub mod version;
