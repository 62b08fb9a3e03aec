"""Write whole pages into Lacquer's shared memcached tier, so Lacquer serves them without asking
the application (the format is docs/entry-format.md). Needs only a memcached client: pymemcache.

    writer = PageWriter(["10.0.0.1:11211", "10.0.0.2:11211"])   # the servers, as Lacquer lists them
    writer.write("shop.example", "/products?id=7", b"<html>...", max_age=300,
                 headers=[("Content-Type", "text/html"), ("Surrogate-Key", "product-7")])
    writer.delete("shop.example", "/products?id=7")

The host is the Host header the client sends (lowercased, with the port when it sends one); the
path includes the query string exactly as sent. Lacquer nodes keep a copy they read for their
`local_ttl`: to replace a page everywhere at once, purge it (admin API) first, then write it.
"""

import bisect
import hashlib
import struct
import sys
import time
import zlib

from pymemcache.client.base import Client


def _f32(x):
    return struct.unpack("f", struct.pack("f", x))[0]


class KetamaRing:
    """libmemcached's weighted ketama (MEMCACHED_BEHAVIOR_KETAMA_WEIGHTED), as Lacquer places keys:
    pymemcache's HashClient places them differently, so one Client per server is used with this."""

    def __init__(self, servers, weights=None):
        weights = [max(w, 1) for w in (weights or [1] * len(servers))]
        total, n = sum(weights), len(servers)
        points = []
        for index, (name, weight) in enumerate(zip(servers, weights)):
            host, port = name.rsplit(":", 1)
            label = host if port == "11211" else name  # libmemcached leaves the default port out
            hashes = int(_f32(_f32(_f32(_f32(_f32(weight) / _f32(total)) * 160.0) / 4.0) * _f32(n)))
            for j in range(hashes):
                digest = hashlib.md5(f"{label}-{j}".encode()).digest()
                for h in range(4):
                    points.append((struct.unpack_from("<I", digest, 4 * h)[0], index))
        points.sort()
        self.points, self.servers = points, list(servers)

    def server_for(self, key):
        """The server holding `key`: the first point at or after the key's MD5, wrapping."""
        hashed = struct.unpack_from("<I", hashlib.md5(key.encode()).digest())[0]
        i = bisect.bisect_left(self.points, (hashed, -1))
        return self.servers[self.points[i % len(self.points)][1]]


def primary_key(host, path):
    """The cache key's text: the host as the client sent it, lowercased, then path and query."""
    return host.lower() + path


def memcached_key(host, path, namespace="lq"):
    digest = hashlib.blake2b(primary_key(host, path).encode(), digest_size=16).hexdigest()
    return f"{namespace}:{digest}"


def encode_page(logical_key, body, status=200, headers=(), max_age=300, swr=0, sie=0, now=None):
    """A complete entry (kind 1): head, freshness and body, sealed with a CRC-32."""
    now_ms = int((time.time() if now is None else now) * 1000)
    key = logical_key.encode()
    out = bytearray(b"LQ" + bytes([1, 1, 0]) + struct.pack(">H", len(key)) + key)
    # created and epoch (the Age reference) are now; fresh until now + max_age
    out += struct.pack(">QQQII", now_ms, now_ms, now_ms + max_age * 1000, swr, sie)
    out += bytes([0])  # no variance: write pages that do not Vary
    out += struct.pack(">HH", status, len(headers))
    for name, value in headers:
        name, value = name.encode("ascii"), value.encode("latin-1")
        out += struct.pack(">H", len(name)) + name + struct.pack(">I", len(value)) + value
    out += struct.pack(">Q", len(body)) + body
    return bytes(out + struct.pack(">I", zlib.crc32(out)))


class PageWriter:
    """Writes pages to the server ketama places each on, with the TTL Lacquer itself would use."""

    def __init__(self, servers, namespace="lq", keep=3600):
        self.ring, self.namespace, self.keep = KetamaRing(servers), namespace, keep
        self.clients = {}
        for name in servers:
            host, port = name.rsplit(":", 1)
            self.clients[name] = Client((host, int(port)), connect_timeout=1, timeout=1)

    def _client(self, key):
        return self.clients[self.ring.server_for(key)]

    def write(self, host, path, body, status=200, headers=(), max_age=300, swr=0, sie=0):
        if len(body) + 16384 > 1024 * 1024:
            raise ValueError("larger pages need chunks (docs/entry-format.md, kind 2 and 3)")
        key = memcached_key(host, path, self.namespace)
        value = encode_page(primary_key(host, path), body, status, headers, max_age, swr, sie)
        ttl = max_age + max(swr, sie) + self.keep
        if not self._client(key).set(key, value, expire=ttl, noreply=False):
            raise RuntimeError(f"memcached did not store {key}")
        return key

    def delete(self, host, path):
        """Removes the shared copy; nodes drop theirs after local_ttl (purge to drop them now)."""
        key = memcached_key(host, path, self.namespace)
        return self._client(key).delete(key, noreply=False)


def main(argv):
    """lacquer_pages.py SERVERS HOST PATH MAX_AGE [Name:Value ...] < body"""
    servers, host, path, max_age = argv[1].split(","), argv[2], argv[3], int(argv[4])
    headers = [tuple(h.split(":", 1)) for h in argv[5:]]
    headers = [(name.strip(), value.strip()) for name, value in headers]
    key = PageWriter(servers).write(host, path, sys.stdin.buffer.read(), headers=headers,
                                    max_age=max_age)
    print(key)


if __name__ == "__main__":
    main(sys.argv)
