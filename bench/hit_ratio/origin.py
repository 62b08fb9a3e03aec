#!/usr/bin/env python3
"""The origin of bench/hit_ratio.sh and bench/shared_tier.sh: bodies of the size in the URL, counted.

usage: origin.py PORT

`GET /o/<id>/<size>` answers 200 with `<size>` bytes (a slice of one fixed, incompressible 1 MB
buffer, `application/octet-stream`, so no proxy can code it smaller) and
`Cache-Control: public, max-age=86400`. Every such request is counted, with its body bytes,
under the value of its `X-Trace-Part` request header (the replay client's slice of the trace;
proxies forward it on a miss), so hit ratios are measured where the misses land, not taken from
a proxy's word. `GET /__stats` returns the counts as JSON; `GET /__reset` zeroes them.

A dependency-free asyncio protocol (HTTP/1.1 keep-alive, GET only, no request bodies): the
body is written from a memoryview, so a response costs the kernel's copy and little else.
"""
import asyncio
import json
import random
import sys
from email.utils import formatdate

PORT = int(sys.argv[1])
BODY = memoryview(random.Random(1).randbytes(1_000_000))
counts = {}  # part -> [requests, body bytes]


def head(status, length, extra=b""):
    return (b"HTTP/1.1 %s\r\nDate: %s\r\nContent-Length: %d\r\n%s\r\n"
            % (status, formatdate(usegmt=True).encode(), length, extra))


class Origin(asyncio.Protocol):
    def connection_made(self, transport):
        self.t = transport
        self.buf = b""

    def data_received(self, data):
        self.buf += data
        while True:
            i = self.buf.find(b"\r\n\r\n")
            if i < 0:
                return
            req, self.buf = self.buf[:i], self.buf[i + 4:]
            line, _, fields = req.partition(b"\r\n")
            parts = line.split()
            path = parts[1] if len(parts) > 1 else b"/"
            close = b"\nconnection: close" in b"\n" + fields.lower()
            self.answer(path, fields, close)
            if close:
                self.t.close()
                return

    def answer(self, path, fields, close):
        conn = b"Connection: close\r\n" if close else b""
        seg = path.split(b"/")
        if len(seg) == 4 and seg[1] == b"o" and seg[3].isdigit() and int(seg[3]) <= len(BODY):
            size = int(seg[3])
            part = "-"
            for f in fields.split(b"\r\n"):
                name, _, value = f.partition(b":")
                if name.strip().lower() == b"x-trace-part":
                    part = value.strip().decode()
            c = counts.setdefault(part, [0, 0])
            c[0] += 1
            c[1] += size
            self.t.write(head(b"200 OK", size, conn + b"Content-Type: application/octet-stream\r\n"
                              b"Cache-Control: public, max-age=86400\r\n"))
            self.t.write(BODY[:size])
            return
        if path == b"/__stats":
            body = json.dumps(counts).encode()
        elif path == b"/__reset":
            counts.clear()
            body = b"{}"
        else:
            self.t.write(head(b"404 Not Found", 0, conn + b"Cache-Control: no-store\r\n"))
            return
        self.t.write(head(b"200 OK", len(body), conn + b"Cache-Control: no-store\r\n") + body)


async def main():
    server = await asyncio.get_running_loop().create_server(Origin, "127.0.0.1", PORT, backlog=1024)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
