//! Block content as a batch of transmissions (simplexmq `Protocol.hs`, `batchTransmissions_`):
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

/// The item bytes of a batch of `count` transmissions and `bytes` item bytes after one more
/// transmission of `len` bytes, or `None` when that would break the count or the byte limit. The
/// one rule for `BatchWriter::try_push`, `batch_prefix_len` and `write_batch`.
fn grown(count: usize, bytes: usize, len: usize) -> Option<usize> {
    let total = bytes.checked_add(2)?.checked_add(len)?;
    (count < MAX_BATCH_TRANSMISSIONS && total <= MAX_BATCH_BYTES).then_some(total)
}

/// How many of `ts` (from the first) the next block takes: as many as fit the count and byte
/// limits, in order, as `BatchWriter::try_push` decides. 0 means the first does not fit even alone.
pub fn batch_prefix_len<T: AsRef<[u8]>>(ts: &[T]) -> usize {
    let mut bytes = 0;
    let mut n = 0;
    for t in ts {
        match grown(n, bytes, t.as_ref().len()) {
            Some(b) => bytes = b,
            None => break,
        }
        n += 1;
    }
    n
}

/// Writes the block content of `ts` (count byte, then each `Large` item) at the start of `out`;
/// returns its length. `None` (nothing meaningful written) when `ts` is empty, breaks a limit, or
/// `out` is too short.
pub fn write_batch<T: AsRef<[u8]>>(ts: &[T], out: &mut [u8]) -> Option<usize> {
    if ts.is_empty() {
        return None;
    }
    let mut bytes = 0;
    for (i, t) in ts.iter().enumerate() {
        let t = t.as_ref();
        let start = 1 + bytes;
        bytes = grown(i, bytes, t.len())?;
        // `grown` keeps the total under MAX_BATCH_BYTES < 65536, so the length fits a Word16.
        let item = out.get_mut(start..1 + bytes)?;
        item[..2].copy_from_slice(&(t.len() as u16).to_be_bytes());
        item[2..].copy_from_slice(t);
    }
    // At most MAX_BATCH_TRANSMISSIONS (255) items passed `grown`.
    *out.first_mut()? = ts.len() as u8;
    Some(1 + bytes)
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
        if grown(self.count, self.items.len(), t.len()).is_none() {
            return false;
        }
        // Within MAX_BATCH_BYTES < 65536, so the length fits a Word16.
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

/// Block packing counts of the reference's `BatchingTests` (simplexmq
/// `tests/CoreTests/BatchingTests.hs`), built with this crate's encoders, which pins the
/// per-version transmission sizes.
#[cfg(test)]
mod packing {
    use super::*;
    use crate::protocol::command::{Command, MsgFlags};
    use crate::protocol::response::BrokerMsg;
    use crate::protocol::transmission::{encode_client_transmission, encode_server_transmission};
    use crate::protocol::version::{max_message_length, Version};

    const SESS: [u8; 32] = [3; 32];

    fn signed_sub(v: Version, i: u8) -> Vec<u8> {
        encode_client_transmission(v, &SESS, &[i; 64], None, &[i; 24], &[!i; 24], b"SUB")
    }

    fn server(v: Version, corr: &[u8], msg: &BrokerMsg) -> Vec<u8> {
        let mut t = Vec::new();
        encode_server_transmission(v, &SESS, corr, &[9; 24], &msg.to_bytes(v), &mut t);
        t
    }

    /// How many copies of `t` one block takes.
    fn fill(t: &[u8]) -> usize {
        let mut w = BatchWriter::new();
        while w.try_push(t) {}
        w.len()
    }

    #[test]
    fn signed_subs_per_block() {
        for v in 16..=20 {
            assert_eq!(signed_sub(v, 1).len() + 2, 121);
            assert_eq!(fill(&signed_sub(v, 1)), 135, "v{v}");
        }
        for v in 7..=15 {
            // no service slot: one byte less each (120), and 136 × 120 = 16320 fits
            assert_eq!(fill(&signed_sub(v, 1)), 136, "v{v}");
        }
        assert_eq!(signed_sub(6, 1).len() + 2, 153);
        assert_eq!(fill(&signed_sub(6, 1)), 106);

        let subs: Vec<Vec<u8>> = (0..300).map(|i| signed_sub(20, i as u8)).collect();
        let blocks = batch_transmissions(&subs).unwrap();
        let counts: Vec<usize> = blocks
            .iter()
            .map(|b| parse_batch(b).unwrap().len())
            .collect();
        assert_eq!(counts, [135, 135, 30]);
        assert!(blocks.iter().all(|b| b.len() <= 1 + MAX_BATCH_BYTES));
    }

    #[test]
    fn events_per_block() {
        let end = server(20, b"", &BrokerMsg::End);
        assert_eq!(fill(&end), 255);
        let ends: Vec<Vec<u8>> = (0..300).map(|_| end.clone()).collect();
        let counts: Vec<usize> = batch_transmissions(&ends)
            .unwrap()
            .iter()
            .map(|b| parse_batch(b).unwrap().len())
            .collect();
        assert_eq!(counts, [255, 45]);

        let nmsg = server(
            20,
            b"",
            &BrokerMsg::Nmsg {
                nonce: [1; 24],
                enc_meta: vec![2; 144],
            },
        );
        assert_eq!(fill(&nmsg), 80);
    }

    #[test]
    fn four_soks_and_a_full_msg_fit() {
        let v = 20;
        let sok = server(v, &[5; 24], &BrokerMsg::Sok(None));
        let msg = server(
            v,
            &[6; 24],
            &BrokerMsg::Msg {
                msg_id: vec![7; 24],
                body: vec![8; max_message_length(v)],
            },
        );
        let mut w = BatchWriter::new();
        for _ in 0..4 {
            assert!(w.try_push(&sok));
        }
        assert!(w.try_push(&msg));
        let mut w = BatchWriter::new();
        for _ in 0..5 {
            assert!(w.try_push(&sok));
        }
        assert!(!w.try_push(&msg));
        let five: Vec<Vec<u8>> = [vec![sok; 5], vec![msg]].concat();
        assert_eq!(batch_transmissions(&five).unwrap().len(), 2);
    }

    #[test]
    fn oversized_send_is_rejected() {
        let send = Command::Send {
            flags: MsgFlags::new(false),
            body: vec![1; 17000],
        };
        let t = encode_client_transmission(
            20,
            &SESS,
            &[1; 64],
            None,
            &[2; 24],
            &[3; 24],
            &send.to_bytes(20),
        );
        assert_eq!(batch_transmissions(&[signed_sub(20, 1), t]), Err(LargeMsg));
    }

    #[test]
    fn write_batch_equals_the_batch_writer_and_splits_alike() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(9);
        for _ in 0..200 {
            let ts: Vec<Vec<u8>> = (0..rng.gen_range(1..300))
                .map(|_| {
                    let len = if rng.gen_bool(0.05) {
                        rng.gen_range(0..16_400)
                    } else {
                        rng.gen_range(0..200)
                    };
                    vec![rng.gen::<u8>(); len]
                })
                .collect();
            let mut rest = &ts[..];
            while !rest.is_empty() {
                let n = batch_prefix_len(rest);
                let mut w = BatchWriter::new();
                let mut m = 0;
                while m < rest.len() && w.try_push(&rest[m]) {
                    m += 1;
                }
                assert_eq!(n, m);
                if n == 0 {
                    assert!(rest[0].len() > MAX_TRANSMISSION_BYTES);
                    rest = &rest[1..];
                    continue;
                }
                let mut out = vec![0u8; 1 + MAX_BATCH_BYTES];
                let len = write_batch(&rest[..n], &mut out).unwrap();
                assert_eq!(&out[..len], &w.content()[..]);
                rest = &rest[n..];
            }
        }
        let mut small = [0u8; 10];
        assert_eq!(write_batch(&[vec![1u8; 20]], &mut small), None);
        assert_eq!(write_batch::<Vec<u8>>(&[], &mut small), None);
    }
}
