//! Cryptography of SMP: key encodings, signatures and authenticators, SXbox, the block-encryption chains.
//! Everything here is pure computation over byte slices; simplexmq `Crypto.hs` is the
//! source of every layout.

pub mod auth;
pub mod chain;
pub mod ed25519;
pub mod hash;
pub mod keys;
pub mod pad;
pub mod signed_key;
pub mod sodium;
pub mod sxbox;
