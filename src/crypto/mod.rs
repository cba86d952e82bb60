//! Cryptography of SMP: key encodings, signatures and authenticators, SXbox, the block-encryption chains.
//! Everything here is pure computation over byte slices; `../../shared/reference/smp-wire.md` §7 is the
//! source of every layout.

pub mod keys;
