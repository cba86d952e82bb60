//! Binding the SMP ports, on IPv6 and IPv4 (IPv4 alone where IPv6 is disabled): the start-up
//! check that no other process listens there, and each shard's listener.
//!
//! Both set `SO_REUSEADDR`, as the reference's listeners do (`simplex-chat/simplexmq`,
//! `src/Simplex/Messaging/Transport/Server.hs`, `startTCPServer`): the sockets a listener accepts
//! inherit its options, and after a stop or a crash with clients connected they stay in FIN-WAIT-2
//! for up to `tcp_fin_timeout` (60 s). Linux lets a new socket bind next to them only when both
//! sides have `SO_REUSEADDR`, so without it a relay restarted at once could not listen for a minute.
//! A listening socket still conflicts, so the check keeps finding another relay on the port.

use std::io;
use std::net::{SocketAddr, TcpListener};
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, Socket, Type};

/// How long a bind that finds the port in use is retried: a process that has just exited (a
/// supervisor restarting the relay at once) can hold its listeners a few milliseconds longer, as
/// io_uring releases them after the exit.
const IN_USE_RETRY: Duration = Duration::from_secs(1);
const IN_USE_PAUSE: Duration = Duration::from_millis(20);

/// Backlog of each shard's listener (glommio's own `TcpListener::bind` uses the same).
const BACKLOG: i32 = 1024;

/// Whether another process listens on `port`: a listener without `SO_REUSEPORT` is refused while
/// anyone listens there. Shards listen with `SO_REUSEPORT`, which would otherwise let this relay
/// silently share a port with another process and get half its connections.
pub fn check_port_free(port: u16) -> io::Result<()> {
    retry_in_use(|| bind(port, false).map(drop))
}

/// A shard's listener on `port`: `SO_REUSEPORT` (every shard listens on every port and the kernel
/// spreads connections) and `SO_REUSEADDR` (see the module comment).
pub fn shard_listener(port: u16) -> io::Result<TcpListener> {
    retry_in_use(|| bind(port, true))
}

/// Binds `port` on every address, IPv6 and IPv4 (one dual-stack socket, whose IPv4 peers appear
/// as IPv4-mapped addresses), or on IPv4 alone where IPv6 is disabled: the reference fails to
/// start there (simplexmq #1431).
fn bind(port: u16, reuse_port: bool) -> io::Result<TcpListener> {
    match bind_on(SocketAddr::from(([0u16; 8], port)), reuse_port) {
        Err(e) if ipv6_missing(&e) => bind_on(SocketAddr::from(([0, 0, 0, 0], port)), reuse_port),
        r => r,
    }
}

/// The errors of a machine without IPv6 (no address family, no `::` to bind), as against the
/// port being taken.
fn ipv6_missing(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EAFNOSUPPORT) | Some(libc::EADDRNOTAVAIL) | Some(libc::EPROTONOSUPPORT)
    )
}

fn bind_on(addr: SocketAddr, reuse_port: bool) -> io::Result<TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    if addr.is_ipv6() {
        socket.set_only_v6(false)?;
    }
    socket.set_reuse_address(true)?;
    if reuse_port {
        socket.set_reuse_port(true)?;
    }
    socket.bind(&addr.into())?;
    socket.listen(BACKLOG)?;
    Ok(socket.into())
}

fn retry_in_use<T>(mut f: impl FnMut() -> io::Result<T>) -> io::Result<T> {
    let deadline = Instant::now() + IN_USE_RETRY;
    loop {
        match f() {
            Err(e) if e.kind() == io::ErrorKind::AddrInUse && Instant::now() < deadline => {
                std::thread::sleep(IN_USE_PAUSE)
            }
            r => return r,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_listeners_share_a_port_and_the_check_sees_them() {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .unwrap()
            .port();
        check_port_free(port).unwrap();
        let a = shard_listener(port).unwrap();
        let b = shard_listener(port).unwrap();
        let e = check_port_free(port).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::AddrInUse, "{e}");
        drop((a, b));
        check_port_free(port).unwrap();
    }
}
