#!/usr/bin/env python3
"""Writes the seed corpus of the fuzz targets (corpus/<target>/), from the entry format in
docs/entry-format.md: well-formed entries, manifests and chunks, and heads whose framing lies
(a Content-Length longer or shorter than the body, Transfer-Encoding, a 204 with a body, a 206).
Run from anywhere; rerun after a format change. Seeds are payloads: the targets append the CRC."""

import os
import struct
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
KEY = b"shop.example/fuzz"
NOW_MS = 1_795_000_000_000


def prefix(kind):
    return b"LQ" + bytes([1, kind, 0]) + struct.pack(">H", len(KEY)) + KEY


def meta(status, fields, variance=None):
    out = struct.pack(">QQQII", NOW_MS, NOW_MS, NOW_MS + 300_000, 5, 7)
    out += b"\x00" if variance is None else b"\x01" + variance
    out += struct.pack(">HH", status, len(fields))
    for name, value in fields:
        out += struct.pack(">H", len(name)) + name + struct.pack(">I", len(value)) + value
    return out


def complete(status, fields, body):
    return prefix(1) + meta(status, fields) + struct.pack(">Q", len(body)) + body


def manifest(fields, body, pieces, write_id=7):
    return prefix(2) + meta(200, fields) + struct.pack(
        ">QQII", write_id, len(body), pieces, zlib.crc32(body))


def chunk(index, data, write_id=7):
    return prefix(3) + struct.pack(">QII", write_id, index, len(data)) + data


def seal(payload):
    return payload + struct.pack(">I", zlib.crc32(payload))


def record(payload):
    return struct.pack(">H", len(payload)) + payload


def write(target, name, data):
    folder = os.path.join(HERE, "corpus", target)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, name), "wb") as f:
        f.write(data)


BODY = b"the body as stored, eighteen and more"
TYPE = (b"content-type", b"text/html")
heads = {
    "plain": (200, [TYPE]),
    "length-longer": (200, [TYPE, (b"content-length", b"1000")]),
    "length-shorter": (200, [(b"content-length", b"3")]),
    "length-twice": (200, [(b"content-length", b"37"), (b"content-length", b"40")]),
    "chunked": (200, [(b"transfer-encoding", b"chunked")]),
    "connection": (200, [(b"connection", b"close, x-a"), (b"x-a", b"1"), (b"keep-alive", b"1")]),
    "no-content-with-body": (204, [(b"content-length", b"5")]),
    "partial": (206, [(b"content-range", b"bytes 0-9/100")]),
    "not-found": (404, [TYPE]),
}
for name, (status, fields) in heads.items():
    write("entry_decode", f"complete-{name}", complete(status, fields, BODY))
write("entry_decode", "complete-empty-body", complete(200, [], b""))
write("entry_decode", "complete-sealed", seal(complete(200, [TYPE], BODY)))
write("entry_decode", "manifest", manifest([TYPE], BODY, 3))
write("entry_decode", "manifest-huge-count", prefix(2) + meta(200, []) + struct.pack(
    ">QQII", 7, 2**64 - 1, 2**32 - 1, 0))
write("entry_decode", "chunk", chunk(0, BODY[:10]))
write("entry_decode", "chunk-sealed", seal(chunk(1, BODY[10:])))

pieces = [BODY[:12], BODY[12:25], BODY[25:]]
for name, (status, fields) in heads.items():
    data = record(manifest(fields, BODY, 3)) + b"".join(
        record(chunk(i, p)) for i, p in enumerate(pieces))
    write("chunk_assembly", f"manifest-{name}", data)
write("chunk_assembly", "missing-chunk",
      record(manifest([TYPE], BODY, 3)) + record(chunk(0, pieces[0])) + b"\xff\xff"
      + record(chunk(2, pieces[2])))
write("chunk_assembly", "other-write",
      record(manifest([TYPE], BODY, 3)) + b"".join(
          record(chunk(i, p, write_id=8)) for i, p in enumerate(pieces)))
write("chunk_assembly", "one-chunk", record(manifest([], BODY, 1)) + record(chunk(0, BODY)))

# request_head: HTTP/1 requests as clients send them, well-formed and the framings that
# tests/request_smuggling.rs refuses
requests = {
    "get": b"GET /page?q=1 HTTP/1.1\r\nHost: shop.example\r\nUser-Agent: x\r\n\r\n",
    "http10-no-host": b"GET / HTTP/1.0\r\n\r\n",
    "absolute-form": b"GET http://shop.example/a HTTP/1.1\r\nHost: shop.example\r\n\r\n",
    "options-star": b"OPTIONS * HTTP/1.1\r\nHost: shop.example\r\n\r\n",
    "post-length": b"POST /form HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello",
    "post-chunked": b"POST /form HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
                    b"5;ext=1\r\nhello\r\n0\r\nTrailer: x\r\n\r\n",
    "te-and-length": b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    "length-list": b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3, 3\r\n\r\nabc",
    "two-hosts": b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
    "host-with-path": b"GET / HTTP/1.1\r\nHost: a/b?c#d\r\n\r\n",
    "pipelined": b"GET /1 HTTP/1.1\r\nHost: a\r\n\r\nGET /2 HTTP/1.1\r\nHost: a\r\n\r\n",
    "obs-fold": b"GET / HTTP/1.1\r\nHost: a\r\nX: 1\r\n 2\r\n\r\n",
}
for name, data in requests.items():
    write("request_head", name, data)
