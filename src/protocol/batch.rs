//! Block content as a batch of transmissions (`reference/smp-wire.md` §3.2):
//! `byte(n) 1*n(Large transmission)`, 1 <= n <= 255, packed greedily up to 16365 bytes of items.

use std::fmt;

use super::encoding::{DecodeError, Reader};

/// The count byte caps a batch.
pub const MAX_BATCH_TRANSMISSIONS: usize = 255;
/// Bytes of `Large`-encoded items per block: 16384 − 2 (pad length) − 1 (count) − 16 (block
/// encryption tag). The reference uses this limit whether or not the block is encrypted.
pub const MAX_BATCH_BYTES: usize = 16365;
/// The longest single transmission that fits a batch (its `Large` prefix takes 2 bytes).
pub const MAX_TRANSMISSION_BYTES: usize = MAX_BATCH_BYTES - 2;

/// A transmission cannot fit a block even on its own (`TELargeMsg` on the sending side).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LargeMsg;

impl fmt::Display for LargeMsg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("transmission does not fit in a block")
    }
}

impl std::error::Error for LargeMsg {}

/// Splits block content into its transmissions. Strict: the count must be 1..=255, exactly that
/// many items must follow and nothing after them.
pub fn parse_batch(content: &[u8]) -> Result<Vec<&[u8]>, DecodeError> {
    let mut r = Reader::new(content);
    let items = r.list(true, |r| r.large())?;
    r.end()?;
    Ok(items)
}

/// Accumulates transmissions for one block.
#[derive(Debug, Clone, Default)]
pub struct BatchWriter {
    /// The `Large`-encoded items, without the count byte.
    items: Vec<u8>,
    count: usize,
}

impl BatchWriter {
    pub fn new() -> Self {
        BatchWriter {
            items: Vec::with_capacity(MAX_BATCH_BYTES),
            count: 0,
        }
    }

    /// Adds one transmission (unencoded bytes); `false`, leaving the batch unchanged, when it
    /// would exceed the count or byte limit.
    pub fn try_push(&mut self, t: &[u8]) -> bool {
        let Some(total) = self.items.len().checked_add(2 + t.len()) else {
            return false;
        };
        if self.count >= MAX_BATCH_TRANSMISSIONS || total > MAX_BATCH_BYTES {
            return false;
        }
        // total <= MAX_BATCH_BYTES < 65536, so the length fits a Word16.
        self.items
            .extend_from_slice(&(t.len() as u16).to_be_bytes());
        self.items.extend_from_slice(t);
        self.count += 1;
        true
    }

    pub fn len(&self) -> usize {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Bytes the block content will take (count byte included).
    pub fn content_len(&self) -> usize {
        1 + self.items.len()
    }

    /// The block content: count byte, then the items.
    pub fn content(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.content_len());
        self.write_content(&mut out);
        out
    }

    /// Appends the block content to `out`.
    pub fn write_content(&self, out: &mut Vec<u8>) {
        debug_assert!(self.count <= MAX_BATCH_TRANSMISSIONS);
        out.push(self.count as u8);
        out.extend_from_slice(&self.items);
    }

    pub fn clear(&mut self) {
        self.items.clear();
        self.count = 0;
    }
}

/// Packs transmissions in order into as few block contents as greedy filling gives. Fails if
/// any single transmission cannot fit a block.
pub fn batch_transmissions(ts: &[Vec<u8>]) -> Result<Vec<Vec<u8>>, LargeMsg> {
    let mut blocks = Vec::new();
    let mut w = BatchWriter::new();
    for t in ts {
        if w.try_push(t) {
            continue;
        }
        if w.is_empty() {
            return Err(LargeMsg);
        }
        blocks.push(w.content());
        w.clear();
        if !w.try_push(t) {
            return Err(LargeMsg);
        }
    }
    if !w.is_empty() {
        blocks.push(w.content());
    }
    Ok(blocks)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_is_strict() {
        assert_eq!(
            parse_batch(b"\x02\x00\x01a\x00\x02bc").unwrap(),
            vec![&b"a"[..], &b"bc"[..]]
        );
        assert!(parse_batch(b"").is_err());
        assert!(parse_batch(b"\x00").is_err());
        // fewer items than counted, trailing bytes, truncated item
        assert!(parse_batch(b"\x02\x00\x01a").is_err());
        assert!(parse_batch(b"\x01\x00\x01ab").is_err());
        assert!(parse_batch(b"\x01\x00\x05ab").is_err());
        assert_eq!(parse_batch(b"\x01\x00\x00").unwrap(), vec![&b""[..]]);
    }

    #[test]
    fn writer_limits() {
        let mut w = BatchWriter::new();
        assert!(w.is_empty());
        // exactly the byte limit fits
        assert!(w.try_push(&vec![1u8; MAX_TRANSMISSION_BYTES]));
        assert!(!w.try_push(b""));
        assert_eq!(w.content_len(), 1 + MAX_BATCH_BYTES);
        assert_eq!(parse_batch(&w.content()).unwrap().len(), 1);
        w.clear();
        assert!(!w.try_push(&vec![1u8; MAX_TRANSMISSION_BYTES + 1]));
        for _ in 0..MAX_BATCH_TRANSMISSIONS {
            assert!(w.try_push(b"x"));
        }
        assert!(!w.try_push(b"x"));
        assert_eq!(w.len(), 255);
        let c = w.content();
        assert_eq!(c[0], 255);
        assert_eq!(parse_batch(&c).unwrap().len(), 255);
    }

    #[test]
    fn greedy_packing_keeps_order() {
        let ts: Vec<Vec<u8>> = (0..300u16).map(|i| i.to_be_bytes().to_vec()).collect();
        let blocks = batch_transmissions(&ts).unwrap();
        assert_eq!(blocks.len(), 2);
        let all: Vec<&[u8]> = blocks
            .iter()
            .flat_map(|b| parse_batch(b).unwrap())
            .collect();
        assert_eq!(all.len(), 300);
        assert!(all.iter().zip(&ts).all(|(a, b)| *a == &b[..]));
        assert_eq!(
            batch_transmissions(&[vec![0u8; 10], vec![0u8; 17000]]),
            Err(LargeMsg)
        );
        assert_eq!(batch_transmissions(&[]).unwrap().len(), 0);
    }
}
