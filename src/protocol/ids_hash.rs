//! Service queue ID hashes (simplexmq `Protocol.hs`, `IdsHash`): MD5 of each queue's ID, combined
//! by XOR, 16 zero bytes for none.

use md5::{Digest, Md5};

/// The ID hash of one queue: MD5 of its ID.
pub fn id_hash(id: &[u8]) -> [u8; 16] {
    Md5::digest(id).into()
}

/// `a ⊕= b`.
pub fn xor_into(a: &mut [u8; 16], b: &[u8; 16]) {
    for (x, y) in a.iter_mut().zip(b) {
        *x ^= y;
    }
}
