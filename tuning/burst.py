#!/usr/bin/env python3
"""The listen-backlog measurement of tuning/README.md: opens N TCP connections to HOST:PORT at
once (non-blocking connects), waits until every one is established (or 10 s), and prints the
seconds taken, the connections not established, and the kernel's listen-queue overflows and drops
during the burst (TcpExt ListenOverflows, ListenDrops).

Usage: burst.py HOST PORT N (the client needs N open files: ulimit -n)."""
import select, socket, sys, time, json

def tcpext():
    lines = [l.split() for l in open('/proc/net/netstat') if l.startswith('TcpExt:')]
    return dict(zip(lines[0][1:], map(int, lines[1][1:])))

host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
before = tcpext()
socks = []
t0 = time.time()
for _ in range(n):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setblocking(False)
    s.connect_ex((host, port))
    socks.append(s)
pending = {s.fileno(): s for s in socks}
ep = select.epoll()
for fd in pending:
    ep.register(fd, select.EPOLLOUT)
done, slow = 0, 0
while pending and time.time() - t0 < 10:
    for fd, ev in ep.poll(0.1):
        ep.unregister(fd)
        s = pending.pop(fd)
        if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0:
            done += 1
            if time.time() - t0 > 0.9:
                slow += 1
elapsed = time.time() - t0
# The accept queue overflow shows when the server side has not accepted: wait a moment for the
# relay to drain, then read the counters.
time.sleep(1.5)
after = tcpext()
print(json.dumps({
    "connections": n, "established": done, "not_established": len(pending),
    "established_after_0_9_s": slow, "seconds": round(elapsed, 3),
    "listen_overflows": after["ListenOverflows"] - before["ListenOverflows"],
    "listen_drops": after["ListenDrops"] - before["ListenDrops"],
}))
for s in socks:
    s.close()
