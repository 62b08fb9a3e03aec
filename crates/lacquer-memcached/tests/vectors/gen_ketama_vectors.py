#!/usr/bin/env python3
"""Generate ketama placement vectors for crates/lacquer-memcached/src/ketama.rs.

Two independent references are used, each written to its own file:

* ketama_uhashring.json -- from the `uhashring` package (PyPI) in its
  ketama-compatible mode, `HashRing(nodes, hash_fn="ketama")`.  Always made.
* ketama_libmemcached.json -- from the real libmemcached C library (Debian
  package `libmemcached11`, libmemcached-awesome 1.1.x) driven through ctypes
  with MEMCACHED_BEHAVIOR_KETAMA_WEIGHTED, asking `memcached_generate_hash()`
  which server owns each key.  Made only when the library can be loaded.

Known differences between the two references (why both files exist):

* libmemcached hashes a server on the default port 11211 as "host-N", any other
  port as "host:port-N"; uhashring (like the original libketama) hashes the
  node name as given.  The uhashring rings therefore use non-default ports.
* libmemcached computes the points of a weighted server in 32-bit float
  arithmetic, floor(float(w/total) * 160 / 4 * n) hashes of 4 points each;
  uhashring uses exact integers, (40 * n * w) // total.  They differ for a few
  weight combinations, e.g. weights 7,2,5,10,1 (2/25 * 200 = 15.99999 in
  float).  The uhashring weighted ring uses weights on which both agree (this
  script checks that); ketama_libmemcached.json includes a ring where they do not.
* uhashring picks the first point strictly greater than the key hash,
  libmemcached the first point greater or equal.  They differ only when a key
  hashes exactly onto a point, which none of these keys does.

Usage: pip install uhashring; apt-get install libmemcached11;
       python3 crates/lacquer-memcached/tests/vectors/gen_ketama_vectors.py
The output is deterministic, so re-running it must not change the files.
"""

import ctypes
import ctypes.util
import json
import os
import random

from uhashring import HashRing

HERE = os.path.dirname(os.path.abspath(__file__))

# libmemcached's memcached_behavior_t: MEMCACHED_BEHAVIOR_KETAMA_WEIGHTED.
MEMCACHED_BEHAVIOR_KETAMA_WEIGHTED = 16


def make_keys():
    """About 200 deterministic ASCII keys: URL-like, short, long, odd punctuation."""
    rnd = random.Random(20240611)
    keys = []
    for i in range(120):
        keys.append(f"lacquer:GET:http://example.com/obj/{i}")
    for i in range(30):
        host = rnd.choice(["example.com", "cdn.example.org", "static.test", "a.b.c.d.example"])
        path = "/".join(rnd.choice(["img", "css", "v2", "assets", "x", "2024"]) for _ in range(3))
        keys.append(f"lacquer:GET:https://{host}/{path}/file{i}.jpg?w={rnd.randint(1, 4000)}")
    keys += ["a", "b", "z", "0", "1", "key", "foo", "bar", "k:1", "~!@#$%^&*()_+"]
    keys += [f"s{i}" for i in range(10)]
    alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789:/._-"
    for length in (64, 128, 200, 249, 250):
        for _ in range(4):
            keys.append("".join(rnd.choice(alphabet) for _ in range(length)))
    for i in range(10):
        keys.append(f"lacquer:HEAD:http://example.com/very/long/path/{'seg/' * (i * 5)}end{i}")
    assert len(keys) == len(set(keys))
    return keys


def libmemcached_weighted_points(weights):
    """libmemcached-awesome's per-server point count (see hosts.cc update_continuum)."""
    import struct

    def f32(x):
        return struct.unpack("f", struct.pack("f", x))[0]

    n, total = len(weights), sum(max(w, 1) for w in weights)
    out = []
    for w in weights:
        pct = f32(f32(max(w, 1)) / f32(total))
        v = f32(f32(f32(pct * 160.0) / 4.0) * f32(n))
        out.append(int(v) * 4)
    return out


def uhashring_ring(servers):
    nodes = {name: {"weight": weight} for name, weight in servers}
    ring = HashRing(nodes, hash_fn="ketama")
    weights = [w for _, w in servers]
    # Guard: this ring must be one where uhashring and libmemcached agree.
    exact = [(40 * len(servers) * w) // sum(weights) * 4 for w in weights]
    assert exact == libmemcached_weighted_points(weights), (servers, exact)
    assert [ring.distribution[name] for name, _ in servers] == exact
    return ring.get_node


def load_libmemcached():
    path = ctypes.util.find_library("memcached") or "libmemcached.so.11"
    try:
        lib = ctypes.CDLL(path)
    except OSError:
        return None
    lib.memcached_create.restype = ctypes.c_void_p
    lib.memcached_create.argtypes = [ctypes.c_void_p]
    lib.memcached_free.argtypes = [ctypes.c_void_p]
    lib.memcached_behavior_set.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64]
    lib.memcached_server_add_with_weight.argtypes = [
        ctypes.c_void_p, ctypes.c_char_p, ctypes.c_uint16, ctypes.c_uint32]
    lib.memcached_generate_hash.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
    lib.memcached_generate_hash.restype = ctypes.c_uint32
    lib.memcached_lib_version.restype = ctypes.c_char_p
    return lib


def libmemcached_ring(lib, servers):
    memc = lib.memcached_create(None)
    for name, weight in servers:
        host, port = name.rsplit(":", 1)
        rc = lib.memcached_server_add_with_weight(memc, host.encode(), int(port), weight)
        assert rc == 0, rc
    assert lib.memcached_behavior_set(memc, MEMCACHED_BEHAVIOR_KETAMA_WEIGHTED, 1) == 0
    names = [name for name, _ in servers]
    return lambda key: names[lib.memcached_generate_hash(memc, key.encode(), len(key))]


def point_label_keys(servers):
    """Keys that hash exactly onto a ring point: the labels of each server's first
    digest, as libmemcached spells them ("host-0" on port 11211, else
    "host:port-0").  They pin down that a key equal to a point belongs to that
    point's server (libmemcached: first point >= hash; uhashring: first point >
    hash, so these are only in the libmemcached file)."""
    keys = []
    for name, _ in servers:
        host, port = name.rsplit(":", 1)
        keys.append(f"{host}-0" if port == "11211" else f"{name}-0")
    return keys


def emit(path, generator, rings, keys, make_lookup, extra_keys=lambda servers: []):
    out = {"generator": generator, "rings": []}
    for ring_id, servers in rings:
        lookup = make_lookup(servers)
        out["rings"].append({
            "id": ring_id,
            "servers": [[name, weight] for name, weight in servers],
            "cases": [[key, lookup(key)] for key in keys + extra_keys(servers)],
        })
    with open(path, "w") as f:
        # One case per line keeps diffs readable.
        f.write("{\n")
        f.write(f'  "generator": {json.dumps(out["generator"])},\n')
        f.write('  "rings": [\n')
        for i, ring in enumerate(out["rings"]):
            f.write("    {\n")
            f.write(f'      "id": {json.dumps(ring["id"])},\n')
            f.write(f'      "servers": {json.dumps(ring["servers"])},\n')
            f.write('      "cases": [\n')
            lines = [f"        {json.dumps(c)}" for c in ring["cases"]]
            f.write(",\n".join(lines) + "\n")
            f.write("      ]\n")
            f.write("    }" + ("," if i + 1 < len(out["rings"]) else "") + "\n")
        f.write("  ]\n}\n")
    return out


UHASHRING_RINGS = [
    ("three_equal", [(f"127.0.0.1:{p}", 1) for p in (11311, 11312, 11313)]),
    ("five_equal", [(f"cache-{i}.internal:{11212 + i}", 1) for i in range(5)]),
    ("weighted", [("10.1.0.1:11300", 1), ("10.1.0.2:11300", 2),
                  ("10.1.0.3:11300", 3), ("10.1.0.4:11300", 5)]),
]

LIBMEMCACHED_RINGS = UHASHRING_RINGS + [
    ("default_port", [(f"10.0.0.{i}:11211", 1) for i in (1, 2, 3)]),
    ("mixed_ports", [("mc-a:11211", 1), ("mc-b:11212", 1), ("mc-c:11211", 1), ("mc-d:22122", 1)]),
    ("weighted_float_rounding", [(f"w{i}:11300", w) for i, w in enumerate([7, 2, 5, 10, 1])]),
    ("weight_zero_is_one", [("z0:11300", 0), ("z1:11300", 1), ("z2:11300", 1)]),
    ("single", [("only:11300", 1)]),
    ("ten_equal", [(f"10.2.0.{i}:11211", 1) for i in range(1, 11)]),
]


def main():
    import uhashring
    keys = make_keys()
    version = getattr(uhashring, "__version__", None)
    if version is None:
        from importlib.metadata import version as pkg_version
        version = pkg_version("uhashring")
    uh = emit(os.path.join(HERE, "ketama_uhashring.json"),
              f"uhashring {version} HashRing(nodes, hash_fn='ketama')",
              UHASHRING_RINGS, keys, uhashring_ring)
    lib = load_libmemcached()
    if lib is None:
        print("libmemcached not found: ketama_libmemcached.json not regenerated")
        return
    lm = emit(os.path.join(HERE, "ketama_libmemcached.json"),
              f"libmemcached {lib.memcached_lib_version().decode()} MEMCACHED_BEHAVIOR_KETAMA_WEIGHTED",
              LIBMEMCACHED_RINGS, keys, lambda servers: libmemcached_ring(lib, servers),
              point_label_keys)
    # Cross-check: on the shared rings the two references must agree exactly.
    for a, b in zip(uh["rings"], lm["rings"]):
        assert a["cases"] == b["cases"][:len(keys)], a["id"]
        for key, server in b["cases"][len(keys):]:
            assert key.startswith(server.replace(":11211", "") + "-"), (key, server)
    print(f"{len(keys)} keys; uhashring and libmemcached agree on {len(uh['rings'])} shared rings")


if __name__ == "__main__":
    main()
