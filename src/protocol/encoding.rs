//! The primitive SMP encodings (simplexmq `Encoding.hs`): a strict reader over a byte slice and
//! the matching writers. Every codec of the protocol is built from these.

/// The input did not have the shape the parser expected. Callers map it to the protocol error that
/// fits their layer (`ERR BLOCK`, `ERR CMD SYNTAX`, a handshake `PARSE` error, ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeError;

pub type DResult<T> = Result<T, DecodeError>;

/// A strict cursor over the input. Methods consume bytes or fail without consuming.
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    /// Bytes not consumed yet.
    pub fn rest(&self) -> &'a [u8] {
        &self.buf[self.pos..]
    }

    pub fn position(&self) -> usize {
        self.pos
    }

    pub fn is_empty(&self) -> bool {
        self.pos >= self.buf.len()
    }

    /// Fails unless the whole input was consumed (the reference's `parseAll`).
    pub fn end(&self) -> DResult<()> {
        if self.is_empty() {
            Ok(())
        } else {
            Err(DecodeError)
        }
    }

    pub fn take(&mut self, n: usize) -> DResult<&'a [u8]> {
        let end = self.pos.checked_add(n).ok_or(DecodeError)?;
        if end > self.buf.len() {
            return Err(DecodeError);
        }
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    pub fn array<const N: usize>(&mut self) -> DResult<[u8; N]> {
        let s = self.take(N)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    pub fn byte(&mut self) -> DResult<u8> {
        Ok(self.take(1)?[0])
    }

    /// Looks at the next byte without consuming it.
    pub fn peek(&self) -> Option<u8> {
        self.buf.get(self.pos).copied()
    }

    /// Consumes `c` if it is the next byte.
    pub fn char(&mut self, c: u8) -> DResult<()> {
        if self.peek() == Some(c) {
            self.pos += 1;
            Ok(())
        } else {
            Err(DecodeError)
        }
    }

    pub fn space(&mut self) -> DResult<()> {
        self.char(b' ')
    }

    pub fn word16(&mut self) -> DResult<u16> {
        Ok(u16::from_be_bytes(self.array()?))
    }

    pub fn word32(&mut self) -> DResult<u32> {
        Ok(u32::from_be_bytes(self.array()?))
    }

    pub fn int64(&mut self) -> DResult<i64> {
        Ok(i64::from_be_bytes(self.array()?))
    }

    /// `'T'` or `'F'`.
    pub fn bool(&mut self) -> DResult<bool> {
        match self.peek() {
            Some(b'T') => {
                self.pos += 1;
                Ok(true)
            }
            Some(b'F') => {
                self.pos += 1;
                Ok(false)
            }
            _ => Err(DecodeError),
        }
    }

    /// One length byte, then the bytes.
    pub fn short(&mut self) -> DResult<&'a [u8]> {
        let save = self.pos;
        let n = self.byte()? as usize;
        self.take(n).inspect_err(|_| self.pos = save)
    }

    /// Word16 length, then the bytes.
    pub fn large(&mut self) -> DResult<&'a [u8]> {
        let save = self.pos;
        let n = self.word16()? as usize;
        self.take(n).inspect_err(|_| self.pos = save)
    }

    /// The rest of the input.
    pub fn tail(&mut self) -> &'a [u8] {
        let s = &self.buf[self.pos..];
        self.pos = self.buf.len();
        s
    }

    /// `'0'` for Nothing, `'1'` then the value for Just.
    pub fn maybe<T>(&mut self, f: impl FnOnce(&mut Self) -> DResult<T>) -> DResult<Option<T>> {
        let save = self.pos;
        match self.byte()? {
            b'0' => Ok(None),
            b'1' => f(self).map(Some).inspect_err(|_| self.pos = save),
            _ => {
                self.pos = save;
                Err(DecodeError)
            }
        }
    }

    /// Count byte, then that many items (`List`); `non_empty` rejects a count of 0.
    pub fn list<T>(
        &mut self,
        non_empty: bool,
        mut f: impl FnMut(&mut Self) -> DResult<T>,
    ) -> DResult<Vec<T>> {
        let save = self.pos;
        let n = self.byte()? as usize;
        if non_empty && n == 0 {
            self.pos = save;
            return Err(DecodeError);
        }
        let mut v = Vec::with_capacity(n);
        for _ in 0..n {
            match f(self) {
                Ok(x) => v.push(x),
                Err(e) => {
                    self.pos = save;
                    return Err(e);
                }
            }
        }
        Ok(v)
    }

    /// Runs `f`; on failure the cursor is restored (the reference's backtracking `optional`).
    pub fn attempt<T>(&mut self, f: impl FnOnce(&mut Self) -> DResult<T>) -> Option<T> {
        let save = self.pos;
        match f(self) {
            Ok(x) => Some(x),
            Err(_) => {
                self.pos = save;
                None
            }
        }
    }
}

/// The value does not fit its length prefix (a `shortString` over 255 bytes, a `Large` over 65535).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EncodeError;

pub fn put_word16(out: &mut Vec<u8>, v: u16) {
    out.extend_from_slice(&v.to_be_bytes());
}

pub fn put_word32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_be_bytes());
}

pub fn put_int64(out: &mut Vec<u8>, v: i64) {
    out.extend_from_slice(&v.to_be_bytes());
}

pub fn put_bool(out: &mut Vec<u8>, v: bool) {
    out.push(if v { b'T' } else { b'F' });
}

/// `shortString`. Callers that cannot produce more than 255 bytes by construction may use
/// [`put_short_unchecked`].
pub fn put_short(out: &mut Vec<u8>, s: &[u8]) -> Result<(), EncodeError> {
    let n = u8::try_from(s.len()).map_err(|_| EncodeError)?;
    out.push(n);
    out.extend_from_slice(s);
    Ok(())
}

/// `shortString` of a value known to be at most 255 bytes (ids, keys, signatures).
pub fn put_short_unchecked(out: &mut Vec<u8>, s: &[u8]) {
    debug_assert!(s.len() <= 255, "shortString over 255 bytes");
    out.push(s.len() as u8);
    out.extend_from_slice(s);
}

/// The longest value a `Large` holds (its length is a `Word16`).
pub const MAX_LARGE: usize = u16::MAX as usize;

/// `Large` of a value known to be at most [`MAX_LARGE`] bytes: link data, which a block (16 KiB)
/// bounds when it arrives and every store checks when it reads it back
/// (`QueueLink::fits`), and the relay's own certificates. Should that ever not hold, a
/// debug build stops here and a release one writes the first `MAX_LARGE` bytes under a length
/// that matches them, so that the rest of the stream still parses.
pub fn put_large_unchecked(out: &mut Vec<u8>, s: &[u8]) {
    debug_assert!(s.len() <= MAX_LARGE, "Large value over {MAX_LARGE} bytes");
    let s = &s[..s.len().min(MAX_LARGE)];
    put_word16(out, s.len() as u16);
    out.extend_from_slice(s);
}

pub fn put_large(out: &mut Vec<u8>, s: &[u8]) -> Result<(), EncodeError> {
    let n = u16::try_from(s.len()).map_err(|_| EncodeError)?;
    put_word16(out, n);
    out.extend_from_slice(s);
    Ok(())
}

/// `Maybe`: `'0'`, or `'1'` followed by what `f` writes.
pub fn put_maybe<T>(out: &mut Vec<u8>, v: Option<T>, f: impl FnOnce(&mut Vec<u8>, T)) {
    match v {
        None => out.push(b'0'),
        Some(x) => {
            out.push(b'1');
            f(out, x)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The encoding cases of simplexmq `tests/XFTPWebTests.hs`, with the bytes they encode to.
    #[test]
    fn primitive_vectors() {
        let mut o = Vec::new();
        put_word16(&mut o, 42);
        assert_eq!(o, [0x00, 0x2a]);
        o.clear();
        put_word32(&mut o, 100000);
        assert_eq!(o, [0x00, 0x01, 0x86, 0xa0]);
        o.clear();
        put_int64(&mut o, -42);
        assert_eq!(o, [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xd6]);
        o.clear();
        put_int64(&mut o, 1234567890123456789);
        assert_eq!(o, [0x11, 0x22, 0x10, 0xf4, 0x7d, 0xe9, 0x81, 0x15]);
        o.clear();
        put_short(&mut o, b"hello").unwrap();
        assert_eq!(o, b"\x05hello");
        o.clear();
        put_maybe(&mut o, Some(&b"hello"[..]), |o, s| {
            put_short_unchecked(o, s)
        });
        assert_eq!(o, b"1\x05hello");
        o.clear();
        put_maybe::<()>(&mut o, None, |_, _| {});
        assert_eq!(o, b"0");
        assert!(put_short(&mut o, &[0u8; 256]).is_err());
    }

    #[test]
    fn reader_is_strict_and_backtracks() {
        let mut r = Reader::new(b"\x03\x02ab\x02cd\x02ef");
        let l = r.list(false, |r| r.short().map(|s| s.to_vec())).unwrap();
        assert_eq!(l, vec![b"ab".to_vec(), b"cd".to_vec(), b"ef".to_vec()]);
        assert!(r.end().is_ok());

        let mut r = Reader::new(b"\x00");
        assert!(r.list(true, |r| r.byte()).is_err());
        assert_eq!(r.position(), 0);

        let mut r = Reader::new(b"\x05abc");
        assert!(r.short().is_err());
        assert_eq!(r.position(), 0);

        let mut r = Reader::new(b"1\x05hello");
        assert_eq!(r.maybe(|r| r.short()).unwrap(), Some(&b"hello"[..]));
        let mut r = Reader::new(b"X");
        assert!(r.bool().is_err());
        assert_eq!(r.attempt(|r| r.byte()), Some(b'X'));
    }
}
