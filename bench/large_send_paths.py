#!/usr/bin/env python3
"""The kernel's cost of the ways a cached body can go into a loopback TCP socket (issue 18 item 3).

    python3 bench/large_send_paths.py [SIZE] [ROUNDS]     # defaults: 102400 bytes, 11 rounds

The sender is pinned to CPU 1 and a reader draining the socket to CPU 0; each round sends the
body N times each way and the figure is the sender thread's system time per body (getrusage),
median over the rounds. The ways:

  sends     the head with the first ~4 KB chunk, then a send per 64 KB stored chunk (Lacquer
            before the vectored write: three sendto for 100 KB)
  writev    the head and every chunk in one sendmsg (pingora-core patch 0006)
  sendfile  the head, then the body from a memory file (memfd) with sendfile(2)
  zerocopy  the head, then the body with MSG_ZEROCOPY (completions drained)

System time is what wall-clock runs on a shared machine cannot show; the receiver's copy is in
the reader's time, not here. Loopback only: over a real NIC, sendfile and MSG_ZEROCOPY avoid a
copy that loopback delivery makes anyway.
"""
import os
import resource
import socket
import sys

SIZE = int(sys.argv[1]) if len(sys.argv) > 1 else 100 * 1024
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 11
N = max(200, 300_000_000 // SIZE)
MSG_ZEROCOPY = 0x4000000
SO_ZEROCOPY = 60

head = os.urandom(250)
body = os.urandom(SIZE)
chunks = [body[:3911]] + [body[i : i + 65536] for i in range(3911, SIZE, 65536)]
memfd = os.memfd_create("body")
os.write(memfd, body)

listener = socket.socket()
listener.bind(("127.0.0.1", 0))
listener.listen(1)
reader = os.fork()
if reader == 0:
    os.sched_setaffinity(0, {0})
    conn = socket.create_connection(listener.getsockname())
    buf = bytearray(1 << 20)
    while conn.recv_into(buf):
        pass
    os._exit(0)
os.sched_setaffinity(0, {1})
sock, _ = listener.accept()
sock.setsockopt(socket.SOL_SOCKET, SO_ZEROCOPY, 1)


def send_vectored(bufs):
    bufs = [memoryview(b) for b in bufs]
    while bufs:
        n = sock.sendmsg(bufs)
        while bufs and n >= len(bufs[0]):
            n -= len(bufs[0])
            bufs.pop(0)
        if bufs:
            bufs[0] = bufs[0][n:]


def send_once(way):
    if way == "sends":
        sock.sendall(head + chunks[0])
        for chunk in chunks[1:]:
            sock.sendall(chunk)
    elif way == "writev":
        send_vectored([head] + chunks)
    elif way == "sendfile":
        sock.sendall(head)
        off = 0
        while off < SIZE:
            off += os.sendfile(sock.fileno(), memfd, off, SIZE - off)
    else:
        sock.sendall(head)
        view, off = memoryview(body), 0
        while off < SIZE:
            try:
                off += sock.send(view[off:], MSG_ZEROCOPY)
            except BlockingIOError:
                pass
            try:
                while True:
                    sock.recvmsg(1, 1024, socket.MSG_ERRQUEUE | socket.MSG_DONTWAIT)
            except OSError:
                pass


def system_us_per_body(way):
    before = resource.getrusage(resource.RUSAGE_THREAD).ru_stime
    for _ in range(N):
        send_once(way)
    return (resource.getrusage(resource.RUSAGE_THREAD).ru_stime - before) / N * 1e6


ways = ("sends", "writev", "sendfile", "zerocopy")
results = {way: [] for way in ways}
for _ in range(ROUNDS):
    for way in ways:
        results[way].append(system_us_per_body(way))
for way in ways:
    runs = sorted(results[way])
    print(f"{way:9s} {SIZE} B: median {runs[len(runs) // 2]:6.1f} us system per body "
          f"(rounds: {' '.join(f'{r:.1f}' for r in runs)})")
sock.close()
os.waitpid(reader, 0)
