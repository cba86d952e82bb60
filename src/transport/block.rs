//! Fixed 16384-byte blocks (simplexmq `Transport.hs`, `tPutBlock`; keys from `Crypto.hs`): every
//! unit on the stream is one padded block, and from v11 with a client key each block after the
//! handshake is sealed with the next key of its direction's chain. Sans-I/O: the caller reads and
//! writes whole blocks.

use std::fmt;

use crate::crypto::chain::{init_chains, ChainKey};
use crate::crypto::sxbox::{open_in_place, seal_in_place, TAG_LEN};
use crate::protocol::pad::{pad_into, unpad, PAD_BYTE};

pub const BLOCK_SIZE: usize = 16384;
/// Content of a plain block: the block less the 2-byte pad length.
pub const MAX_PLAIN_CONTENT: usize = BLOCK_SIZE - 2;
/// Content of an encrypted block: the block less the tag and the pad length.
pub const MAX_ENCRYPTED_CONTENT: usize = BLOCK_SIZE - TAG_LEN - 2;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockError {
    /// The content does not fit in one block.
    TooLarge,
    /// The tag did not verify; the receive chain has still advanced.
    Decrypt,
    /// The pad length claims more bytes than the block holds.
    Pad,
}

impl fmt::Display for BlockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BlockError::TooLarge => "content too large for one block",
            BlockError::Decrypt => "block failed to decrypt",
            BlockError::Pad => "block has an invalid padding length",
        })
    }
}

impl std::error::Error for BlockError {}

struct Chains {
    send: ChainKey,
    recv: ChainKey,
}

/// The block state of one connection, one per direction pair.
pub struct BlockCodec {
    chains: Option<Chains>,
}

impl fmt::Debug for BlockCodec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BlockCodec")
            .field("encrypted", &self.is_encrypted())
            .finish()
    }
}

impl BlockCodec {
    /// Handshake blocks and sessions without block encryption.
    pub fn plain() -> Self {
        BlockCodec { chains: None }
    }

    pub fn server(session_id: &[u8], secret: &[u8; 32]) -> Self {
        let (ck1, ck2) = init_chains(session_id, secret);
        BlockCodec {
            chains: Some(Chains {
                send: ck1,
                recv: ck2,
            }),
        }
    }

    pub fn client(session_id: &[u8], secret: &[u8; 32]) -> Self {
        let (ck1, ck2) = init_chains(session_id, secret);
        BlockCodec {
            chains: Some(Chains {
                send: ck2,
                recv: ck1,
            }),
        }
    }

    pub fn is_encrypted(&self) -> bool {
        self.chains.is_some()
    }

    /// Too-large content is rejected before the send chain moves, so nothing is skipped.
    pub fn encode(&mut self, content: &[u8], out: &mut [u8; BLOCK_SIZE]) -> Result<(), BlockError> {
        match &mut self.chains {
            None => pad_into(content, out).map_err(|_| BlockError::TooLarge),
            Some(chains) => {
                if content.len() > MAX_ENCRYPTED_CONTENT {
                    return Err(BlockError::TooLarge);
                }
                let (key, nonce) = chains.send.next();
                let (tag, body) = out.split_at_mut(TAG_LEN);
                pad_into(content, body).map_err(|_| BlockError::TooLarge)?;
                tag.copy_from_slice(&seal_in_place(&key, &nonce, body));
                Ok(())
            }
        }
    }

    /// Like `encode`, but `write` puts the content straight into the block (into a slice of the
    /// largest content size) and returns its length, so no content buffer is built and copied.
    /// `None` from `write`, or a length over the limit, is `TooLarge` and the send chain does not
    /// move.
    pub fn encode_with(
        &mut self,
        out: &mut [u8; BLOCK_SIZE],
        write: impl FnOnce(&mut [u8]) -> Option<usize>,
    ) -> Result<(), BlockError> {
        let encrypted = self.chains.is_some();
        let (head, body) = out.split_at_mut(if encrypted { TAG_LEN } else { 0 });
        let (len_bytes, content) = body.split_at_mut(2);
        let n = write(content)
            .filter(|&n| n <= content.len())
            .ok_or(BlockError::TooLarge)?;
        len_bytes.copy_from_slice(&(n as u16).to_be_bytes());
        content[n..].fill(PAD_BYTE);
        if let Some(chains) = &mut self.chains {
            let (key, nonce) = chains.send.next();
            head.copy_from_slice(&seal_in_place(&key, &nonce, body));
        }
        Ok(())
    }

    /// Returns the unpadded content, decrypting in place. The receive chain advances even when the
    /// block fails, because the peer's send chain advanced for it too.
    pub fn decode<'a>(&mut self, block: &'a mut [u8; BLOCK_SIZE]) -> Result<&'a [u8], BlockError> {
        match &mut self.chains {
            None => unpad(block).map_err(|_| BlockError::Pad),
            Some(chains) => {
                let (key, nonce) = chains.recv.next();
                let (tag, body) = block.split_at_mut(TAG_LEN);
                let tag: [u8; TAG_LEN] = (&*tag).try_into().map_err(|_| BlockError::Decrypt)?;
                open_in_place(&key, &nonce, &tag, body).map_err(|_| BlockError::Decrypt)?;
                let body: &'a [u8] = body;
                unpad(body).map_err(|_| BlockError::Pad)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypto::sxbox;

    fn seq<const N: usize>(from: u8) -> [u8; N] {
        std::array::from_fn(|i| from + i as u8)
    }

    fn pair() -> (BlockCodec, BlockCodec) {
        let session_id = seq::<32>(1);
        let secret = seq::<32>(0x21);
        (
            BlockCodec::server(&session_id, &secret),
            BlockCodec::client(&session_id, &secret),
        )
    }

    fn new_block() -> Box<[u8; BLOCK_SIZE]> {
        Box::new([0u8; BLOCK_SIZE])
    }

    #[test]
    fn limits() {
        assert_eq!(MAX_PLAIN_CONTENT, 16382);
        assert_eq!(MAX_ENCRYPTED_CONTENT, 16366);
    }

    #[test]
    fn plain_block_round_trip_and_layout() {
        let mut codec = BlockCodec::plain();
        assert!(!codec.is_encrypted());
        let mut block = new_block();
        codec.encode(b"PING", &mut block).unwrap();
        assert_eq!(&block[..6], b"\x00\x04PING");
        assert!(block[6..].iter().all(|&b| b == b'#'));
        assert_eq!(codec.decode(&mut block).unwrap(), b"PING");

        let max = vec![7u8; MAX_PLAIN_CONTENT];
        codec.encode(&max, &mut block).unwrap();
        assert_eq!(codec.decode(&mut block).unwrap(), &max[..]);
        assert_eq!(
            codec.encode(&[7u8; MAX_PLAIN_CONTENT + 1], &mut block),
            Err(BlockError::TooLarge)
        );
    }

    #[test]
    fn plain_block_with_bad_length_is_a_pad_error() {
        let mut block = new_block();
        block[..2].copy_from_slice(&16383u16.to_be_bytes());
        assert_eq!(BlockCodec::plain().decode(&mut block), Err(BlockError::Pad));
    }

    #[test]
    fn first_server_block_uses_the_v2_chain_step() {
        let (mut server, _) = pair();
        assert!(server.is_encrypted());
        let mut block = new_block();
        server.encode(b"hello", &mut block).unwrap();
        let key: [u8; 32] =
            hex::decode("7255ff71fe29b29d85a19d8198c29031b430ff2f1765f3b4fe6b2c136e7054a8")
                .unwrap()
                .try_into()
                .unwrap();
        let nonce: [u8; 24] = hex::decode("83f3fdec12bc0a5c0048579bae195f07c53145184b86d83c")
            .unwrap()
            .try_into()
            .unwrap();
        assert_eq!(
            sxbox::open_padded(&key, &nonce, &block[..]).unwrap(),
            b"hello"
        );
    }

    #[test]
    fn encrypted_round_trip_both_directions_in_step() {
        let (mut server, mut client) = pair();
        let mut block = new_block();
        for i in 0..5u8 {
            let down = vec![i; 100 + usize::from(i)];
            server.encode(&down, &mut block).unwrap();
            assert_eq!(client.decode(&mut block).unwrap(), &down[..]);

            let up = vec![i ^ 0xff; MAX_ENCRYPTED_CONTENT - usize::from(i)];
            client.encode(&up, &mut block).unwrap();
            assert_eq!(server.decode(&mut block).unwrap(), &up[..]);
        }
    }

    #[test]
    fn the_two_directions_use_different_keys() {
        let (mut server, mut client) = pair();
        let mut from_server = new_block();
        let mut from_client = new_block();
        server.encode(b"same", &mut from_server).unwrap();
        client.encode(b"same", &mut from_client).unwrap();
        assert_ne!(from_server[..], from_client[..]);
        // A block cannot be reflected back to its sender.
        assert_eq!(server.decode(&mut from_server), Err(BlockError::Decrypt));
    }

    #[test]
    fn tampered_block_fails_and_next_block_still_decodes() {
        let (mut server, mut client) = pair();
        let mut block = new_block();
        client.encode(b"first", &mut block).unwrap();
        block[100] ^= 1;
        assert_eq!(server.decode(&mut block), Err(BlockError::Decrypt));

        client.encode(b"second", &mut block).unwrap();
        assert_eq!(server.decode(&mut block).unwrap(), b"second");
    }

    #[test]
    fn too_large_encrypted_content_does_not_advance_the_chain() {
        let (mut server, mut client) = pair();
        let mut block = new_block();
        assert_eq!(
            server.encode(&[0u8; MAX_ENCRYPTED_CONTENT + 1], &mut block),
            Err(BlockError::TooLarge)
        );
        server.encode(b"after", &mut block).unwrap();
        assert_eq!(client.decode(&mut block).unwrap(), b"after");
    }

    #[test]
    fn plain_codec_cannot_read_encrypted_block() {
        let (mut server, _) = pair();
        let mut block = new_block();
        server.encode(b"x", &mut block).unwrap();
        let mut plain = BlockCodec::plain();
        // Random ciphertext either fails the length check or yields garbage, never "x".
        assert_ne!(plain.decode(&mut block).ok(), Some(&b"x"[..]));
    }

    #[test]
    fn encode_with_writes_the_same_blocks_as_encode() {
        for (mut a, mut b) in [
            (BlockCodec::plain(), BlockCodec::plain()),
            (
                BlockCodec::server(&seq::<32>(1), &seq::<32>(2)),
                BlockCodec::server(&seq::<32>(1), &seq::<32>(2)),
            ),
        ] {
            for len in [0usize, 1, 500, MAX_ENCRYPTED_CONTENT] {
                let content: Vec<u8> = (0..len).map(|i| i as u8).collect();
                let mut x = new_block();
                let mut y = new_block();
                a.encode(&content, &mut x).unwrap();
                b.encode_with(&mut y, |out| {
                    out[..len].copy_from_slice(&content);
                    Some(len)
                })
                .unwrap();
                assert_eq!(x[..], y[..], "len {len}");
            }
            // A writer that fails leaves the chain where it was: the next blocks still agree.
            assert_eq!(
                b.encode_with(&mut new_block(), |_| None),
                Err(BlockError::TooLarge)
            );
            let mut x = new_block();
            let mut y = new_block();
            a.encode(b"after", &mut x).unwrap();
            b.encode_with(&mut y, |out| {
                out[..5].copy_from_slice(b"after");
                Some(5)
            })
            .unwrap();
            assert_eq!(x[..], y[..]);
        }
    }
}
