//! SMP codecs: pure encode/decode of every byte layout of SMP (simplexmq `Protocol.hs`,
//! `Transport.hs`, `Encoding.hs`), no I/O.

pub mod batch;
pub mod command;
pub mod encoding;
pub mod error;
pub mod handshake;
pub mod pad;
pub mod response;
pub mod transmission;
pub mod version;
