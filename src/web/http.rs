//! The HTTP/1.1 the web site needs, and no more (RFC 9110, 9112): a request head parsed within
//! the bounds of `limits` (`WEB_MAX_REQUEST_BYTES`, `WEB_MAX_HEADERS`), `GET` and `HEAD` only, no
//! request bodies, and the answers' heads. The serving loop is `server/web.rs`; what is served is
//! `site.rs`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::limits::WEB_MAX_HEADERS;

/// A request the site answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// `HEAD`: the answer's head only.
    pub head_only: bool,
    /// The path, percent-decoded, without its query.
    pub path: String,
    /// Whether the connection stays open after the answer (HTTP/1.1 unless `Connection: close`;
    /// HTTP/1.0 only with `Connection: keep-alive`).
    pub keep_alive: bool,
    /// `If-Modified-Since`, in seconds since the epoch, when it is a date this parser reads
    /// (IMF-fixdate, the form RFC 9110 §5.6.7 says senders use).
    pub if_modified_since: Option<u64>,
    /// `Accept-Encoding` names gzip.
    pub accepts_gzip: bool,
    /// `Upgrade: websocket`: a web client of SMP, which `server/conn/ws.rs` answers.
    pub websocket: bool,
}

/// Why a request is refused; each is answered with its status and the connection closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Not a request line and headers as RFC 9112 writes them, or a request with a body.
    Bad,
    /// A method other than `GET` and `HEAD`.
    Method,
    /// A head longer than `WEB_MAX_REQUEST_BYTES` or with more than `WEB_MAX_HEADERS` lines.
    TooLarge,
    /// Not HTTP/1.0 or 1.1.
    Version,
}

impl Refusal {
    pub fn status(self) -> Status {
        match self {
            Refusal::Bad => Status::BadRequest,
            Refusal::Method => Status::MethodNotAllowed,
            Refusal::TooLarge => Status::HeadersTooLarge,
            Refusal::Version => Status::VersionNotSupported,
        }
    }
}

/// The statuses the site answers with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Ok,
    NotModified,
    BadRequest,
    NotFound,
    MethodNotAllowed,
    HeadersTooLarge,
    VersionNotSupported,
}

impl Status {
    pub fn line(self) -> &'static str {
        match self {
            Status::Ok => "200 OK",
            Status::NotModified => "304 Not Modified",
            Status::BadRequest => "400 Bad Request",
            Status::NotFound => "404 Not Found",
            Status::MethodNotAllowed => "405 Method Not Allowed",
            Status::HeadersTooLarge => "431 Request Header Fields Too Large",
            Status::VersionNotSupported => "505 HTTP Version Not Supported",
        }
    }
}

/// The length of the request head at the start of `buf`, its empty line included, once it is all
/// there.
pub fn head_len(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4)
}

/// Parses a whole request head (as `head_len` delimits it).
pub fn parse(head: &[u8]) -> Result<Request, Refusal> {
    let head = std::str::from_utf8(head).map_err(|_| Refusal::Bad)?;
    let head = head.strip_suffix("\r\n\r\n").ok_or(Refusal::Bad)?;
    let mut lines = head.split("\r\n");
    let line = lines.next().ok_or(Refusal::Bad)?;
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(Refusal::Bad);
    };
    let http10 = match version {
        "HTTP/1.1" => false,
        "HTTP/1.0" => true,
        v if v.starts_with("HTTP/") => return Err(Refusal::Version),
        _ => return Err(Refusal::Bad),
    };
    if method.is_empty() || !method.bytes().all(|b| b.is_ascii_uppercase()) {
        return Err(Refusal::Bad);
    }
    let mut request = Request {
        head_only: method == "HEAD",
        path: decode_path(target)?,
        keep_alive: !http10,
        if_modified_since: None,
        accepts_gzip: false,
        websocket: false,
    };
    let mut headers = 0;
    for line in lines {
        headers += 1;
        if headers > WEB_MAX_HEADERS {
            return Err(Refusal::TooLarge);
        }
        // RFC 9112 §5: no whitespace before the colon; obsolete line folding is refused (§5.2).
        let (name, value) = line.split_once(':').ok_or(Refusal::Bad)?;
        if name.is_empty() || name.ends_with([' ', '\t']) || line.starts_with([' ', '\t']) {
            return Err(Refusal::Bad);
        }
        let value = value.trim_matches([' ', '\t']);
        let has_token = |token: &str| {
            value
                .split(',')
                .any(|t| t.trim().eq_ignore_ascii_case(token))
        };
        match name.to_ascii_lowercase().as_str() {
            "connection" if has_token("close") => request.keep_alive = false,
            "connection" if has_token("keep-alive") => request.keep_alive = true,
            "upgrade" => request.websocket = has_token("websocket"),
            "if-modified-since" => request.if_modified_since = parse_http_date(value),
            "accept-encoding" => {
                request.accepts_gzip = value.split(',').any(|t| {
                    let mut p = t.split(';');
                    let coding = p.next().unwrap_or("").trim();
                    // `gzip;q=0` refuses it.
                    let refused =
                        p.any(|q| matches!(q.trim(), "q=0" | "q=0.0" | "q=0.00" | "q=0.000"));
                    coding.eq_ignore_ascii_case("gzip") && !refused
                })
            }
            // A body is neither needed nor read: a request that announces one is refused, so that
            // its bytes are never taken for the next request.
            "content-length" if value != "0" => return Err(Refusal::Bad),
            "transfer-encoding" => return Err(Refusal::Bad),
            _ => {}
        }
    }
    // The WebSocket upgrade is a GET too (RFC 6455 §4.1).
    if !matches!(method, "GET" | "HEAD") {
        return Err(Refusal::Method);
    }
    Ok(request)
}

/// The path of an origin-form target (`/a/b?q`), percent-decoded; `*`, absolute forms, NUL and
/// paths that are not UTF-8 are refused.
fn decode_path(target: &str) -> Result<String, Refusal> {
    let path = target.split(['?', '#']).next().unwrap_or("");
    if !path.starts_with('/') {
        return Err(Refusal::Bad);
    }
    let bytes = path.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = bytes.get(i + 1..i + 3).ok_or(Refusal::Bad)?;
                let hex = std::str::from_utf8(hex).map_err(|_| Refusal::Bad)?;
                out.push(u8::from_str_radix(hex, 16).map_err(|_| Refusal::Bad)?);
                i += 3;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    let path = String::from_utf8(out).map_err(|_| Refusal::Bad)?;
    if path.contains(['\0', '\\']) {
        return Err(Refusal::Bad);
    }
    Ok(path)
}

/// One answer's head. `body_len` is the length of the body a `GET` gets (a `HEAD` gets the same
/// head and no body).
pub struct Answer<'a> {
    pub status: Status,
    pub content_type: Option<&'a str>,
    pub body_len: usize,
    pub last_modified: Option<u64>,
    pub gzip: bool,
    /// Whether the response may be cached without asking again (the site's media), or must be
    /// revalidated each time (pages, which a new start may change).
    pub immutable_for: Option<Duration>,
    pub keep_alive: bool,
}

/// What every answer of the site carries: nothing the pages do not need may load or run (no
/// other host, no inline script or style), and no page may be framed or leak its address.
pub const SECURITY_HEADERS: &str = "Content-Security-Policy: default-src 'none'; \
     script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'none'; \
     base-uri 'none'; form-action 'none'; frame-ancestors 'none'\r\n\
     X-Content-Type-Options: nosniff\r\n\
     Referrer-Policy: no-referrer\r\n";

impl Answer<'_> {
    /// The head's bytes; `now` is the `Date`.
    pub fn head(&self, now: SystemTime) -> Vec<u8> {
        let mut h = format!(
            "HTTP/1.1 {}\r\nServer: smp-relay\r\nDate: {}\r\n{SECURITY_HEADERS}",
            self.status.line(),
            http_date(epoch_secs(now)),
        );
        if let Some(t) = self.content_type {
            h += &format!("Content-Type: {t}\r\n");
        }
        if self.status != Status::NotModified {
            h += &format!("Content-Length: {}\r\n", self.body_len);
        }
        if let Some(at) = self.last_modified {
            h += &format!("Last-Modified: {}\r\n", http_date(at));
        }
        match self.immutable_for {
            Some(d) => h += &format!("Cache-Control: public, max-age={}\r\n", d.as_secs()),
            None => h += "Cache-Control: no-cache\r\n",
        }
        if self.gzip {
            h += "Content-Encoding: gzip\r\n";
        }
        if self.status == Status::Ok || self.status == Status::NotModified {
            h += "Vary: Accept-Encoding\r\n";
        }
        if self.status == Status::MethodNotAllowed {
            h += "Allow: GET, HEAD\r\n";
        }
        h += if self.keep_alive {
            "Connection: keep-alive\r\n\r\n"
        } else {
            "Connection: close\r\n\r\n"
        };
        h.into_bytes()
    }
}

pub fn epoch_secs(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

const DAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
const MONTHS: [&str; 12] = [
    "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
];

/// `secs` since the epoch as an IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`).
pub fn http_date(secs: u64) -> String {
    let days = secs / 86_400;
    let rem = secs % 86_400;
    let (y, m, d) = civil_from_days(days as i64);
    format!(
        "{}, {d:02} {} {y:04} {:02}:{:02}:{:02} GMT",
        DAYS[(days % 7) as usize],
        MONTHS[(m - 1) as usize],
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// An IMF-fixdate; `None` for anything else (the obsolete forms are not read: such a client gets
/// the whole answer, which is always correct).
pub fn parse_http_date(s: &str) -> Option<u64> {
    let (_, rest) = s.split_once(", ")?;
    let mut p = rest.split(' ');
    let (Some(d), Some(mon), Some(y), Some(time), Some("GMT"), None) =
        (p.next(), p.next(), p.next(), p.next(), p.next(), p.next())
    else {
        return None;
    };
    let d: u32 = d.parse().ok()?;
    let m = MONTHS.iter().position(|x| *x == mon)? as u32 + 1;
    let y: i64 = y.parse().ok()?;
    let mut t = time.split(':').map(|x| x.parse::<u64>().ok());
    let (Some(Some(hh)), Some(Some(mm)), Some(Some(ss)), None) =
        (t.next(), t.next(), t.next(), t.next())
    else {
        return None;
    };
    if !(1..=31).contains(&d) || hh > 23 || mm > 59 || ss > 60 {
        return None;
    }
    let days = days_from_civil(y, m, d);
    u64::try_from(days)
        .ok()
        .map(|days| days * 86_400 + hh * 3600 + mm * 60 + ss)
}

/// The civil date of a day count since 1970-01-01 (H. Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// The day count since 1970-01-01 of a civil date (the inverse of `civil_from_days`).
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let m = i64::from(m);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(text: &str) -> Result<Request, Refusal> {
        parse(text.as_bytes())
    }

    #[test]
    fn a_get_is_read_with_the_headers_the_site_uses() {
        let r = req(
            "GET /a/%7Ex?q=1 HTTP/1.1\r\nHost: x\r\nAccept-Encoding: br, gzip;q=0.5\r\n\
                     If-Modified-Since: Sun, 06 Nov 1994 08:49:37 GMT\r\n\r\n",
        )
        .unwrap();
        assert_eq!(r.path, "/a/~x");
        assert!(r.keep_alive && r.accepts_gzip && !r.head_only && !r.websocket);
        assert_eq!(r.if_modified_since, Some(784_111_777));
        let r = req("HEAD / HTTP/1.0\r\nAccept-Encoding: gzip;q=0\r\n\r\n").unwrap();
        assert!(r.head_only && !r.keep_alive && !r.accepts_gzip);
        let r = req("GET / HTTP/1.1\r\nConnection: Close\r\n\r\n").unwrap();
        assert!(!r.keep_alive);
    }

    #[test]
    fn what_the_site_does_not_serve_is_refused_with_its_status() {
        assert_eq!(req("POST / HTTP/1.1\r\n\r\n"), Err(Refusal::Method));
        assert_eq!(req("GET / HTTP/2.0\r\n\r\n"), Err(Refusal::Version));
        assert_eq!(
            req("GET / HTTP/1.1\r\nContent-Length: 5\r\n\r\n"),
            Err(Refusal::Bad)
        );
        assert_eq!(
            req("GET / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"),
            Err(Refusal::Bad)
        );
        assert_eq!(req("GET http://x/ HTTP/1.1\r\n\r\n"), Err(Refusal::Bad));
        assert_eq!(req("GET /%00 HTTP/1.1\r\n\r\n"), Err(Refusal::Bad));
        assert_eq!(req("GET /%zz HTTP/1.1\r\n\r\n"), Err(Refusal::Bad));
        assert_eq!(req("GET /a\\b HTTP/1.1\r\n\r\n"), Err(Refusal::Bad));
        assert_eq!(req("GET / HTTP/1.1\r\nHost : x\r\n\r\n"), Err(Refusal::Bad));
        assert_eq!(req("GET / HTTP/1.1\r\n folded\r\n\r\n"), Err(Refusal::Bad));
        assert_eq!(req("GET  / HTTP/1.1\r\n\r\n"), Err(Refusal::Bad));
        let many: String = (0..=WEB_MAX_HEADERS)
            .map(|i| format!("X-{i}: v\r\n"))
            .collect();
        assert_eq!(
            req(&format!("GET / HTTP/1.1\r\n{many}\r\n")),
            Err(Refusal::TooLarge)
        );
        let enough: String = (0..WEB_MAX_HEADERS)
            .map(|i| format!("X-{i}: v\r\n"))
            .collect();
        assert!(req(&format!("GET / HTTP/1.1\r\n{enough}\r\n")).is_ok());
    }

    #[test]
    fn dates_go_both_ways() {
        for secs in [0, 784_111_777, 951_782_400, 1_709_164_800, 4_102_444_799] {
            assert_eq!(
                parse_http_date(&http_date(secs)),
                Some(secs),
                "{}",
                http_date(secs)
            );
        }
        assert_eq!(http_date(784_111_777), "Sun, 06 Nov 1994 08:49:37 GMT");
        assert_eq!(http_date(951_782_400), "Tue, 29 Feb 2000 00:00:00 GMT");
        assert_eq!(parse_http_date("Sunday, 06-Nov-94 08:49:37 GMT"), None);
        assert_eq!(parse_http_date("Sun, 06 Nov 1994 24:49:37 GMT"), None);
    }

    #[test]
    fn the_head_of_an_answer_says_length_type_and_caching() {
        let a = Answer {
            status: Status::Ok,
            content_type: Some("text/html; charset=utf-8"),
            body_len: 12,
            last_modified: Some(784_111_777),
            gzip: true,
            immutable_for: None,
            keep_alive: false,
        };
        let h = String::from_utf8(a.head(UNIX_EPOCH)).unwrap();
        assert!(h.starts_with("HTTP/1.1 200 OK\r\n"), "{h}");
        for line in [
            "Content-Length: 12\r\n",
            "Content-Type: text/html; charset=utf-8\r\n",
            "Last-Modified: Sun, 06 Nov 1994 08:49:37 GMT\r\n",
            "Content-Encoding: gzip\r\n",
            "Cache-Control: no-cache\r\n",
            "Date: Thu, 01 Jan 1970 00:00:00 GMT\r\n",
        ] {
            assert!(h.contains(line), "{line:?} in {h}");
        }
        assert!(h.ends_with("Connection: close\r\n\r\n"));
        assert_eq!(head_len(h.as_bytes()), Some(h.len()));
    }
}
