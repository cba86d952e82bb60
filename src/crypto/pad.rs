//! Length-prefixed padding (`pad`/`unPad` of simplexmq's `src/Simplex/Messaging/Crypto.hs`):
//! `Word16 len ‖ msg ‖ '#'…`. Used for blocks, handshake messages and encrypted bodies.

use std::fmt;

/// The padding byte.
pub const PAD_BYTE: u8 = b'#';
/// The longest message a Word16 length prefix may announce for padding (the reference's limit).
pub const MAX_PAD_MESSAGE: usize = 65533;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PadError {
    /// The message does not fit the padded length (or exceeds 65533 bytes).
    TooLarge,
    /// The input is shorter than its length prefix says.
    Malformed,
}

impl fmt::Display for PadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PadError::TooLarge => "message too large to pad",
            PadError::Malformed => "bad padded message",
        })
    }
}

impl std::error::Error for PadError {}

/// `pad(msg, len)`: a `len`-byte buffer.
pub fn pad(msg: &[u8], len: usize) -> Result<Vec<u8>, PadError> {
    let mut out = vec![0u8; len];
    pad_into(msg, &mut out)?;
    Ok(out)
}

/// Pads into `out`, whose length is the padded length.
pub fn pad_into(msg: &[u8], out: &mut [u8]) -> Result<(), PadError> {
    let n = msg.len();
    if n > MAX_PAD_MESSAGE || n.checked_add(2).is_none_or(|m| m > out.len()) {
        return Err(PadError::TooLarge);
    }
    let (len_bytes, rest) = out.split_at_mut(2);
    len_bytes.copy_from_slice(&(n as u16).to_be_bytes());
    let (body, padding) = rest.split_at_mut(n);
    body.copy_from_slice(msg);
    padding.fill(PAD_BYTE);
    Ok(())
}

/// `unPad`: the announced bytes; whatever follows them is ignored, as in the reference.
pub fn unpad(padded: &[u8]) -> Result<&[u8], PadError> {
    let (len_bytes, rest) = padded.split_at_checked(2).ok_or(PadError::Malformed)?;
    let n = u16::from_be_bytes([len_bytes[0], len_bytes[1]]) as usize;
    rest.get(..n).ok_or(PadError::Malformed)
}

#[cfg(test)]
mod tests {
    use super::*;

    // The padding cases of simplexmq `tests/CoreTests/CryptoTests.hs` and `tests/XFTPWebTests.hs`.
    #[test]
    fn pad_unpad_table() {
        assert_eq!(pad(b"abc", 5).unwrap(), b"\x00\x03abc");
        assert_eq!(pad(b"abc", 4), Err(PadError::TooLarge));
        assert_eq!(unpad(b"\x00\x00").unwrap(), b"");
        assert_eq!(unpad(b"\x00"), Err(PadError::Malformed));
        assert_eq!(unpad(b""), Err(PadError::Malformed));
        assert_eq!(unpad(b"\x00\x03abc").unwrap(), b"abc");
        assert_eq!(unpad(b"\x00\x03ab"), Err(PadError::Malformed));

        let big = vec![7u8; 65533];
        let p = pad(&big, 65535).unwrap();
        assert_eq!(p.len(), 65535);
        assert_eq!(unpad(&p).unwrap(), &big[..]);
        assert_eq!(pad(&[7u8; 65534], 65536), Err(PadError::TooLarge));

        let mut expect = b"\x00\x05hello".to_vec();
        expect.extend_from_slice(&[b'#'; 249]);
        assert_eq!(pad(b"hello", 256).unwrap(), expect);
        let mut expect = b"\x00\x02ab".to_vec();
        expect.extend_from_slice(&[b'#'; 12]);
        assert_eq!(pad(b"ab", 16).unwrap(), expect);
    }

    #[test]
    fn pad_into_fills_the_whole_buffer() {
        let mut buf = [0u8; 8];
        pad_into(b"xy", &mut buf).unwrap();
        assert_eq!(&buf, b"\x00\x02xy####");
        assert_eq!(pad_into(b"xy", &mut [0u8; 3]), Err(PadError::TooLarge));
        assert_eq!(unpad(&buf).unwrap(), b"xy");
    }
}
