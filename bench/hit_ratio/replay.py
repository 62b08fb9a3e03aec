#!/usr/bin/env python3
"""Replays a trace through a proxy and reports hit ratios measured at the origin.

usage: replay.py TRACE PROXY_HOST:PORT ORIGIN_HOST:PORT [--conns C] [--parts P] [--label L]
       [--json OUT] [--rate R]

CONNS keep-alive connections take the trace's lines in order (each takes the next unsent line),
so the proxy sees the trace's order up to CONNS requests of reordering. Each request carries
`X-Trace-Part: k`, k = its position's slice of the trace (P equal slices); the origin counts what
reaches it per slice. Every answer must be 200 with exactly the size in its URL, else it counts
as an error. At the end the origin's counts are read and, per slice and in all:
  hit ratio      = 1 - origin requests / client requests
  byte hit ratio = 1 - origin body bytes / client body bytes
The second half (slices P/2..P-1) is the steady state; the whole run includes the cold start.
"""
import argparse
import asyncio
import json
import sys
import time


async def http_get(host, port, path):
    r, w = await asyncio.open_connection(host, port)
    w.write(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
    data = await r.read()
    w.close()
    return data.split(b"\r\n\r\n", 1)[1]


class Replay:
    def __init__(self, paths, parts):
        self.paths = paths
        self.parts = parts
        self.next = 0
        self.requests = [0] * parts
        self.bytes = [0] * parts
        self.errors = 0
        self.start = time.monotonic()

    def part_of(self, index):
        return index * self.parts // len(self.paths)

    async def connection(self, host, port, rate):
        reader = writer = None
        while self.next < len(self.paths):
            index = self.next
            self.next += 1
            if rate:
                await asyncio.sleep(max(0.0, self.start + index / rate - time.monotonic()))
            path = self.paths[index]
            part = self.part_of(index)
            request = f"GET {path} HTTP/1.1\r\nHost: {host}\r\nX-Trace-Part: {part}\r\n\r\n".encode()
            try:
                head = None
                if writer is not None:
                    # A kept-alive connection the proxy closed meanwhile (nginx closes one after
                    # 1000 requests) fails before any byte of the answer: send again on a new one.
                    try:
                        writer.write(request)
                        head = await reader.readuntil(b"\r\n\r\n")
                    except (OSError, asyncio.IncompleteReadError) as e:
                        if getattr(e, "partial", b""):
                            raise
                        writer.close()
                        writer = None
                if writer is None:
                    reader, writer = await asyncio.open_connection(host, port)
                    writer.write(request)
                    head = await reader.readuntil(b"\r\n\r\n")
                status = head[9:12]
                length = None
                for field in head.split(b"\r\n")[1:]:
                    name, _, value = field.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                if length is None:
                    raise ValueError(f"{path}: no Content-Length")
                await reader.readexactly(length)
                if status != b"200" or length != int(path.rsplit("/", 1)[1]):
                    raise ValueError(f"{path}: status {status.decode()} length {length}")
                self.requests[part] += 1
                self.bytes[part] += length
            except (OSError, ValueError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as e:
                self.errors += 1
                if self.errors <= 5:
                    print(f"replay: error: {e!r}", file=sys.stderr)
                if writer is not None:
                    writer.close()
                reader = writer = None
        if writer is not None:
            writer.close()


def ratio(origin, client):
    return 1 - origin / client if client else float("nan")


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("proxy")
    ap.add_argument("origin")
    ap.add_argument("--conns", type=int, default=32)
    ap.add_argument("--parts", type=int, default=10)
    ap.add_argument("--rate", type=float, default=0, help="requests per second at most (0: as fast as it goes)")
    ap.add_argument("--label", default="")
    ap.add_argument("--json")
    a = ap.parse_args()
    with open(a.trace) as f:
        paths = f.read().split()
    ohost, oport = a.origin.rsplit(":", 1)
    phost, pport = a.proxy.rsplit(":", 1)
    await http_get(ohost, oport, "/__reset")

    replay = Replay(paths, a.parts)
    await asyncio.gather(*(replay.connection(phost, pport, a.rate) for _ in range(a.conns)))
    elapsed = time.monotonic() - replay.start
    await asyncio.sleep(0.5)  # a fill still being read by the proxy after its client went
    origin = json.loads(await http_get(ohost, oport, "/__stats"))

    o_req = [origin.get(str(k), [0, 0])[0] for k in range(a.parts)]
    o_bytes = [origin.get(str(k), [0, 0])[1] for k in range(a.parts)]
    half = a.parts // 2
    result = {
        "label": a.label,
        "requests": sum(replay.requests),
        "errors": replay.errors,
        "seconds": round(elapsed, 1),
        "origin_requests": sum(o_req),
        "origin_requests_untagged": sum(v[0] for k, v in origin.items() if not k.isdigit()),
        "hit_ratio": ratio(sum(o_req), sum(replay.requests)),
        "byte_hit_ratio": ratio(sum(o_bytes), sum(replay.bytes)),
        "hit_ratio_2nd_half": ratio(sum(o_req[half:]), sum(replay.requests[half:])),
        "byte_hit_ratio_2nd_half": ratio(sum(o_bytes[half:]), sum(replay.bytes[half:])),
        "hit_ratio_by_part": [round(ratio(o, c), 4) for o, c in zip(o_req, replay.requests)],
        "client_bytes": sum(replay.bytes),
        "origin_bytes": sum(o_bytes),
    }
    print(f"{a.label:<24} {result['requests']:>8} req {result['errors']:>4} err "
          f"{result['seconds']:>6.1f} s  origin {result['origin_requests']:>7} req  "
          f"hit {100 * result['hit_ratio']:5.1f} %  byte hit {100 * result['byte_hit_ratio']:5.1f} %  "
          f"2nd half: hit {100 * result['hit_ratio_2nd_half']:5.1f} % "
          f"byte hit {100 * result['byte_hit_ratio_2nd_half']:5.1f} %")
    if a.json:
        with open(a.json, "a") as f:
            f.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    asyncio.run(main())
