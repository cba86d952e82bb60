//! Serving the web site (`web/site.rs`) on the shards: on `[WEB] http` over plain TCP, on
//! `[WEB] https` over TLS with the web certificate (a port of its own), and to the clients of a
//! shared SMP port that named a host (TLS SNI) and did not ask for a WebSocket
//! (`server/conn/mod.rs`). Each shard listens on the site's ports (SO_REUSEPORT, as the SMP ports).
//!
//! Bounded as the other listeners: `limits::WEB_MAX_CONNECTIONS` connections over all shards on
//! the site's own ports (a shared port's clients count among the SMP connections), request heads of
//! at most `WEB_MAX_REQUEST_BYTES` and `WEB_MAX_HEADERS` lines, each within
//! `WEB_REQUEST_TIMEOUT`, answers written within `WEB_WRITE_TIMEOUT`, `WEB_MAX_REQUESTS_PER_CONNECTION`
//! requests a connection. Only `GET` and `HEAD`; a request with a body is refused.

use std::cell::RefCell;
use std::future::Future;
use std::io;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures_lite::{AsyncReadExt, AsyncWriteExt};
use glommio::net::{TcpListener, TcpStream};

use crate::limits::{
    WEB_MAX_CONNECTIONS, WEB_MAX_REQUESTS_PER_CONNECTION, WEB_MAX_REQUEST_BYTES,
    WEB_REQUEST_TIMEOUT, WEB_WRITE_TIMEOUT,
};
use crate::log_limit::{self, RateLimited};
use crate::server::conn::tls_stream::{self, SharedTls, TlsStream};
use crate::server::conn::{accept, ws};
use crate::server::shard::context::ShardContext;
use crate::web::http::{self, Answer, Refusal, Request, Status};
use crate::web::site::Site;

static REFUSED_FULL: RateLimited = RateLimited::new("web connection limit reached");

/// Accepts the site's connections on one of its own ports: `tls` set on `[WEB] https`.
pub async fn accept_loop(
    listener: TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    ctx: Rc<ShardContext>,
) {
    loop {
        let Ok(sock) = listener.accept().await else {
            glommio::timer::Timer::new(Duration::from_millis(50)).await;
            continue;
        };
        // A peer that reset before this accept has no address, and is gone anyway.
        let Ok(peer) = sock.peer_addr() else {
            continue;
        };
        // At the bound the new connection is closed at once (dropped). The admission's place in
        // a handshake is dropped at once: the site's connections have no bound per address.
        let Ok((slot, _)) = ctx.web_admission.admit(peer.ip()) else {
            log_limit::warn(&REFUSED_FULL, |suppressed| {
                tracing::warn!(
                    max = WEB_MAX_CONNECTIONS,
                    suppressed,
                    "web connection limit reached, closing a new connection"
                )
            });
            continue;
        };
        let (ctx, tls) = (ctx.clone(), tls.clone());
        glommio::spawn_local(async move {
            let result = match tls {
                None => serve_plain(sock, &ctx).await,
                Some(config) => serve_https(sock, &ctx, &config).await,
            };
            if let Err(e) = result {
                tracing::debug!(error = %e, "web connection ended");
            }
            drop(slot);
        })
        .detach();
    }
}

/// `f`, or `TimedOut` after `limit`.
async fn within<T>(limit: Duration, f: impl Future<Output = io::Result<T>>) -> io::Result<T> {
    futures_lite::future::or(f, async {
        glommio::timer::Timer::new(limit).await;
        Err(io::ErrorKind::TimedOut.into())
    })
    .await
}

/// The answer to one request (or to one refused): its head and its body (none for `HEAD`, `304`
/// and refusals of a connection that closes), and whether the connection stays open.
fn answer(site: Option<&Site>, request: Result<Request, Refusal>) -> (Vec<u8>, &[u8], bool) {
    const NOT_FOUND: &[u8] = b"Not found\n";
    let now = SystemTime::now();
    let (req, site) = match (request, site) {
        (Ok(req), Some(site)) => (req, site),
        (Ok(req), None) => {
            let a = plain(Status::NotFound, NOT_FOUND.len(), req.keep_alive);
            return (a.head(now), body_of(&req, NOT_FOUND), req.keep_alive);
        }
        (Err(refusal), _) => {
            let a = plain(refusal.status(), 0, false);
            return (a.head(now), &[], false);
        }
    };
    let Some(file) = site.lookup(&req.path) else {
        let a = plain(Status::NotFound, NOT_FOUND.len(), req.keep_alive);
        return (a.head(now), body_of(&req, NOT_FOUND), req.keep_alive);
    };
    let fresh = req
        .if_modified_since
        .is_some_and(|since| since >= site.generated_at);
    let gzipped = file.gzip.as_deref().filter(|_| req.accepts_gzip);
    let body = gzipped.unwrap_or(&file.body);
    let a = Answer {
        status: if fresh {
            Status::NotModified
        } else {
            Status::Ok
        },
        content_type: Some(file.content_type),
        body_len: body.len(),
        last_modified: Some(site.generated_at),
        gzip: gzipped.is_some() && !fresh,
        immutable_for: file.max_age,
        keep_alive: req.keep_alive,
    };
    let body = if fresh { &[][..] } else { body_of(&req, body) };
    (a.head(now), body, req.keep_alive)
}

fn plain(status: Status, body_len: usize, keep_alive: bool) -> Answer<'static> {
    Answer {
        status,
        content_type: Some("text/plain; charset=utf-8"),
        body_len,
        last_modified: None,
        gzip: false,
        immutable_for: None,
        keep_alive,
    }
}

fn body_of<'a>(req: &Request, body: &'a [u8]) -> &'a [u8] {
    if req.head_only {
        &[]
    } else {
        body
    }
}

/// Plain HTTP: requests read into one buffer (a pipelined request's bytes stay in it for the
/// next turn), each answered in turn.
async fn serve_plain(mut sock: TcpStream, ctx: &ShardContext) -> io::Result<()> {
    let site = ctx.site.as_deref();
    let mut buf: Vec<u8> = Vec::new();
    let mut chunk = [0u8; 2048];
    for _ in 0..WEB_MAX_REQUESTS_PER_CONNECTION {
        let head = within(WEB_REQUEST_TIMEOUT, async {
            loop {
                if let Some(len) = http::head_len(&buf) {
                    return Ok(Some(len));
                }
                if buf.len() >= WEB_MAX_REQUEST_BYTES {
                    return Ok(None);
                }
                let n = sock.read(&mut chunk).await?;
                if n == 0 {
                    return Err(io::ErrorKind::UnexpectedEof.into());
                }
                buf.extend_from_slice(&chunk[..n]);
            }
        })
        .await?;
        let request = match head {
            Some(len) if len <= WEB_MAX_REQUEST_BYTES => http::parse(&buf[..len]),
            _ => Err(Refusal::TooLarge),
        };
        let (head_bytes, body, keep_alive) = answer(site, request);
        within(WEB_WRITE_TIMEOUT, async {
            sock.write_all(&head_bytes).await?;
            sock.write_all(body).await?;
            sock.flush().await
        })
        .await?;
        if !keep_alive {
            break;
        }
        if let Some(len) = head {
            buf.drain(..len);
        }
    }
    let _ = sock.close().await;
    Ok(())
}

/// HTTPS on a port of its own: TLS with the web certificate, then as `serve_tls`.
async fn serve_https(
    mut sock: TcpStream,
    ctx: &ShardContext,
    config: &Arc<rustls::ServerConfig>,
) -> io::Result<()> {
    let _ = sock.set_nodelay(true);
    let accepted = within(ctx.config.tls_timeout, async {
        accept::tls_accept(&mut sock, &ctx.read_scratch, config, None)
            .await
            .map_err(|e| io::Error::other(e.to_string()))
    })
    .await?;
    let tls: SharedTls = Rc::new(RefCell::new(TlsStream::new(
        sock,
        accepted.0,
        ctx.read_scratch.clone(),
    )));
    let result = serve_tls(&tls, ctx, None).await;
    tls_stream::close(&tls).await;
    result
}

/// The site over an established TLS stream, from the request `first` (already read, as on a
/// shared port: `None` reads it) to the connection's end.
pub async fn serve_tls(
    tls: &SharedTls,
    ctx: &ShardContext,
    mut first: Option<Option<Vec<u8>>>,
) -> io::Result<()> {
    let site = ctx.site.as_deref();
    for _ in 0..WEB_MAX_REQUESTS_PER_CONNECTION {
        let head = match first.take() {
            Some(head) => head,
            None => {
                within(
                    WEB_REQUEST_TIMEOUT,
                    ws::read_head(tls, WEB_MAX_REQUEST_BYTES),
                )
                .await?
            }
        };
        let request = match &head {
            Some(head) => http::parse(head),
            None => Err(Refusal::TooLarge),
        };
        let (head_bytes, body, keep_alive) = answer(site, request);
        tls.borrow_mut().queue_parts(&[&head_bytes, body])?;
        within(WEB_WRITE_TIMEOUT, tls_stream::flush(tls)).await?;
        if !keep_alive {
            break;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get(site: Option<&Site>, text: &str) -> (String, Vec<u8>, bool) {
        let (head, body, keep) = answer(site, http::parse(text.as_bytes()));
        (String::from_utf8(head).unwrap(), body.to_vec(), keep)
    }

    #[test]
    fn answers_follow_the_request() {
        let site = Site::generate(&[], 1_000).unwrap();
        let s = Some(&site);
        let (h, body, keep) = get(s, "GET /a/ HTTP/1.1\r\n\r\n");
        assert!(h.starts_with("HTTP/1.1 200 OK\r\n") && keep, "{h}");
        assert_eq!(body, site.lookup("/a/").unwrap().body);
        let (h, body, _) = get(s, "HEAD /a HTTP/1.1\r\n\r\n");
        assert!(h.contains(&format!(
            "Content-Length: {}\r\n",
            site.lookup("/a").unwrap().body.len()
        )));
        assert!(body.is_empty());
        let (h, body, _) = get(
            s,
            "GET /media/qr.js HTTP/1.1\r\nAccept-Encoding: gzip\r\n\r\n",
        );
        assert!(
            h.contains("Content-Encoding: gzip") && h.contains("max-age="),
            "{h}"
        );
        assert_eq!(
            body,
            site.lookup("/media/qr.js").unwrap().gzip.clone().unwrap()
        );
        let since = http::http_date(1_000);
        let (h, body, _) = get(
            s,
            &format!("GET / HTTP/1.1\r\nIf-Modified-Since: {since}\r\n\r\n"),
        );
        assert!(
            h.starts_with("HTTP/1.1 304 ") && !h.contains("Content-Length") && body.is_empty(),
            "{h}"
        );
        let since = http::http_date(999);
        let (h, _, _) = get(
            s,
            &format!("GET / HTTP/1.1\r\nIf-Modified-Since: {since}\r\n\r\n"),
        );
        assert!(h.starts_with("HTTP/1.1 200 "), "{h}");
        let (h, _, keep) = get(s, "GET /../etc/passwd HTTP/1.1\r\n\r\n");
        assert!(h.starts_with("HTTP/1.1 404 ") && keep, "{h}");
        let (h, body, keep) = get(s, "DELETE / HTTP/1.1\r\n\r\n");
        assert!(
            h.starts_with("HTTP/1.1 405 ") && h.contains("Allow: GET, HEAD") && !keep,
            "{h}"
        );
        assert!(body.is_empty());
        let (h, _, _) = get(None, "GET / HTTP/1.1\r\n\r\n");
        assert!(h.starts_with("HTTP/1.1 404 "), "{h}");
    }
}
