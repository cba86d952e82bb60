//! SMP codecs: pure encode/decode of every byte layout of SMP (simplexmq `Protocol.hs`,
//! `Transport.hs`, `Encoding.hs`), no I/O.

pub mod batch;
pub mod command;
pub mod encoding;
pub mod error;
pub mod forward;
pub mod handshake;
pub mod ids_hash;
/// Padding is the reference's `Crypto.hs` `pad`/`unPad`, kept in `crypto` (which sealing needs)
/// and named here too, where the wire formats use it.
pub use crate::crypto::pad;
pub mod response;
pub mod transmission;
pub mod version;
