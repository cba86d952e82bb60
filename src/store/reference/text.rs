//! The pieces the reference's text files share (simplexmq `Encoding/String.hs`, `strEncode`):
//! fields separated by single spaces, byte strings as base64url (padding optional when read, as
//! the reference's `base64urlP` accepts), keys as base64url DER SubjectPublicKeyInfo, lists
//! comma-separated, integers in decimal, and a bounded line reader.

use std::io::BufRead;

use crate::crypto::hash::b64url_decode;
use crate::crypto::keys::PublicAuthKey;

/// The longest line read from a reference file. A message line is at most about 22 KB (a 16 KB
/// body in base64url) and a queue record with link data a few KB, so a longer line can only be
/// damage; it is reported as unparseable and skipped without being kept in memory.
pub const MAX_LINE_BYTES: usize = 256 * 1024;

/// A line's fields, read left to right.
pub struct Fields<'a> {
    rest: Option<&'a str>,
}

impl<'a> Fields<'a> {
    pub fn new(line: &'a str) -> Self {
        Fields { rest: Some(line) }
    }

    /// The next field (up to the next space), or an error naming `what` was expected.
    pub fn next(&mut self, what: &str) -> Result<&'a str, String> {
        let rest = self
            .rest
            .ok_or_else(|| format!("the line ends where {what} was expected"))?;
        Ok(match rest.split_once(' ') {
            Some((field, after)) => {
                self.rest = Some(after);
                field
            }
            None => {
                self.rest = None;
                rest
            }
        })
    }

    /// The next field without its `prefix` (e.g. `rid=`).
    pub fn named(&mut self, prefix: &str) -> Result<&'a str, String> {
        let f = self.next(&format!("`{prefix}`"))?;
        f.strip_prefix(prefix)
            .ok_or_else(|| format!("expected `{prefix}`, found {:?}", shorten(f)))
    }

    /// Whether the next field starts with `prefix`.
    pub fn at(&self, prefix: &str) -> bool {
        self.rest.is_some_and(|r| r.starts_with(prefix))
    }

    /// Everything left of the line (`None` once every field was read).
    pub fn rest(&mut self) -> Option<&'a str> {
        self.rest.take()
    }

    pub fn end(&self) -> Result<(), String> {
        match self.rest {
            None => Ok(()),
            Some(r) => Err(format!("unexpected text at the end: {:?}", shorten(r))),
        }
    }
}

/// The start of `s`, for error messages.
pub fn shorten(s: &str) -> String {
    match s.char_indices().nth(40) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}

/// A non-empty base64url byte string (the reference's parser refuses empty ones).
pub fn b64(field: &str, what: &str) -> Result<Vec<u8>, String> {
    let ok = !field.is_empty()
        && field
            .trim_end_matches('=')
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_');
    ok.then(|| b64url_decode(field))
        .flatten()
        .filter(|b| !b.is_empty())
        .ok_or_else(|| format!("{what} is not base64url: {:?}", shorten(field)))
}

/// A base64url byte string that may be empty (an empty link data part, an absent value).
pub fn b64_or_empty(field: &str, what: &str) -> Result<Vec<u8>, String> {
    if field.is_empty() {
        Ok(Vec::new())
    } else {
        b64(field, what)
    }
}

/// Base64url of exactly `N` bytes (message IDs, nonces, DH secrets).
pub fn fixed<const N: usize>(field: &str, what: &str) -> Result<[u8; N], String> {
    let b = b64(field, what)?;
    let n = b.len();
    b.try_into()
        .map_err(|_| format!("{what} has {n} bytes, not {N}"))
}

/// A public key: base64url of its DER SubjectPublicKeyInfo (Ed25519, Ed448 or X25519).
pub fn key(field: &str, what: &str) -> Result<PublicAuthKey, String> {
    PublicAuthKey::from_spki(&b64(field, what)?)
        .map_err(|_| format!("{what} is not an Ed25519, Ed448 or X25519 public key"))
}

/// A non-empty comma-separated list of keys.
pub fn keys(field: &str, what: &str) -> Result<Vec<PublicAuthKey>, String> {
    field.split(',').map(|k| key(k, what)).collect()
}

/// A signed decimal integer.
pub fn int(field: &str, what: &str) -> Result<i64, String> {
    field
        .parse()
        .map_err(|_| format!("{what} is not a number: {:?}", shorten(field)))
}

/// `T` or `F`.
pub fn boolean(field: &str, what: &str) -> Result<bool, String> {
    match field {
        "T" => Ok(true),
        "F" => Ok(false),
        _ => Err(format!("{what} is not T or F: {:?}", shorten(field))),
    }
}

/// One line as [`read_line`] gives it.
pub enum Line {
    Text(String),
    /// Not UTF-8, or longer than [`MAX_LINE_BYTES`]: what to report.
    Bad(String),
}

/// The next line of `input` without its `\n` (or `\r\n`), `None` at the end. A line longer than
/// [`MAX_LINE_BYTES`] is read to its end and dropped.
pub fn read_line(input: &mut impl BufRead, buf: &mut Vec<u8>) -> std::io::Result<Option<Line>> {
    buf.clear();
    let mut too_long = false;
    let mut any = false;
    loop {
        let chunk = input.fill_buf()?;
        if chunk.is_empty() {
            break;
        }
        any = true;
        let (part, used, done) = match chunk.iter().position(|&b| b == b'\n') {
            Some(i) => (&chunk[..i], i + 1, true),
            None => (chunk, chunk.len(), false),
        };
        if buf.len() + part.len() > MAX_LINE_BYTES {
            too_long = true;
        } else if !too_long {
            buf.extend_from_slice(part);
        }
        input.consume(used);
        if done {
            break;
        }
    }
    if !any {
        return Ok(None);
    }
    if too_long {
        return Ok(Some(Line::Bad(format!(
            "a line longer than {MAX_LINE_BYTES} bytes"
        ))));
    }
    if buf.last() == Some(&b'\r') {
        buf.pop();
    }
    Ok(Some(match std::str::from_utf8(buf) {
        Ok(s) => Line::Text(s.to_string()),
        Err(_) => Line::Bad("a line that is not UTF-8 text".into()),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_split_on_single_spaces_and_keep_empty_ones() {
        let mut f = Fields::new("CREATE rid=YWJj sk= queue_mode=M");
        assert_eq!(f.next("tag").unwrap(), "CREATE");
        assert_eq!(f.named("rid=").unwrap(), "YWJj");
        assert_eq!(f.named("sk=").unwrap(), "");
        assert!(f.at("queue_mode="));
        assert!(f.named("rk=").unwrap_err().contains("expected `rk=`"));
        assert!(f.end().is_ok());
    }

    #[test]
    fn base64url_with_or_without_padding_never_empty() {
        assert_eq!(b64("YWI=", "x").unwrap(), b"ab");
        assert_eq!(b64("YWI", "x").unwrap(), b"ab");
        assert_eq!(b64("-_8", "x").unwrap(), vec![0xfb, 0xff]);
        assert!(b64("", "x").is_err());
        assert!(b64("YW+=", "x").is_err(), "standard alphabet");
        assert_eq!(b64_or_empty("", "x").unwrap(), b"");
        assert!(fixed::<3>("YWI", "id")
            .unwrap_err()
            .contains("has 2 bytes, not 3"));
    }

    #[test]
    fn lines_are_bounded_and_may_end_without_a_newline() {
        let long = "x".repeat(MAX_LINE_BYTES + 1);
        let text = format!("one\r\n{long}\nthree");
        let mut input = std::io::BufReader::with_capacity(1024, text.as_bytes());
        let mut buf = Vec::new();
        let mut got = Vec::new();
        while let Some(l) = read_line(&mut input, &mut buf).unwrap() {
            got.push(match l {
                Line::Text(s) => s,
                Line::Bad(why) => format!("bad: {why}"),
            });
        }
        assert_eq!(
            got,
            vec![
                "one".to_string(),
                format!("bad: a line longer than {MAX_LINE_BYTES} bytes"),
                "three".to_string()
            ]
        );
    }
}
