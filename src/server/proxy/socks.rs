//! SOCKS5 `CONNECT` by domain name (RFC 1928, no authentication), for `.onion` destinations
//! through Tor (`--socks-proxy`). The name goes to the SOCKS server unresolved, as Tor requires.

use futures_lite::{AsyncReadExt, AsyncWriteExt};
use glommio::net::TcpStream;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SocksError {
    #[error("SOCKS proxy I/O: {0}")]
    Io(String),
    #[error("SOCKS proxy refused: {0}")]
    Refused(&'static str),
    #[error("host name too long for SOCKS")]
    NameTooLong,
}

impl From<std::io::Error> for SocksError {
    fn from(e: std::io::Error) -> Self {
        SocksError::Io(e.to_string())
    }
}

/// The request of a `CONNECT` to `host:port` by name.
pub fn connect_request(host: &str, port: u16) -> Result<Vec<u8>, SocksError> {
    let name = host.as_bytes();
    let len = u8::try_from(name.len()).map_err(|_| SocksError::NameTooLong)?;
    let mut req = vec![5, 1, 0, 3, len];
    req.extend_from_slice(name);
    req.extend_from_slice(&port.to_be_bytes());
    Ok(req)
}

fn reply_error(code: u8) -> &'static str {
    match code {
        1 => "general failure",
        2 => "connection not allowed by ruleset",
        3 => "network unreachable",
        4 => "host unreachable",
        5 => "connection refused",
        6 => "TTL expired",
        7 => "command not supported",
        8 => "address type not supported",
        _ => "unknown error",
    }
}

/// Asks the SOCKS server on `sock` to connect to `host:port`; afterwards `sock` carries the
/// destination's bytes.
pub async fn connect(sock: &mut TcpStream, host: &str, port: u16) -> Result<(), SocksError> {
    let request = connect_request(host, port)?;
    sock.write_all(&[5, 1, 0]).await?;
    let mut choice = [0u8; 2];
    sock.read_exact(&mut choice).await?;
    if choice != [5, 0] {
        return Err(SocksError::Refused("no acceptable authentication method"));
    }
    sock.write_all(&request).await?;
    let mut head = [0u8; 4];
    sock.read_exact(&mut head).await?;
    if head[0] != 5 {
        return Err(SocksError::Refused("not a SOCKS5 reply"));
    }
    if head[1] != 0 {
        return Err(SocksError::Refused(reply_error(head[1])));
    }
    // The bound address, which nothing here needs.
    let addr_len = match head[3] {
        1 => 4,
        4 => 16,
        3 => {
            let mut n = [0u8; 1];
            sock.read_exact(&mut n).await?;
            usize::from(n[0])
        }
        _ => return Err(SocksError::Refused("bad address type in reply")),
    };
    let mut rest = vec![0u8; addr_len + 2];
    sock.read_exact(&mut rest).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_by_name() {
        assert_eq!(
            connect_request("abc.onion", 5223).unwrap(),
            [&[5, 1, 0, 3, 9][..], b"abc.onion", &[0x14, 0x67]].concat()
        );
        assert_eq!(
            connect_request(&"a".repeat(256), 1),
            Err(SocksError::NameTooLong)
        );
    }
}
