#!/usr/bin/env python3
"""The fixed request trace of bench/hit_ratio.sh: Zipf popularity over a catalog of sized URLs.

usage: make_trace.py OUT --objects N --requests R --zipf S --seed SEED

Writes R lines, one URL path each, `/o/<id>/<size>`. Object `id` (1..N) is requested with
probability proportional to id^-S (id 1 is the most popular). Its body size is a function of
`id` and SEED alone (splitmix64 of both), independent of its popularity, and it is written into
the URL, so every proxy and the origin agree on it without sharing anything but the URL.

The size mix (object count, not bytes): 85 % pages, log-uniform 2-50 KB; 12 % images,
log-uniform 50-250 KB; 3 % media, log-uniform 250 KB-1 MB (1,000,000 bytes). Mean 43.7 KB over the 1,000,000 objects of
seed 18 (40.7 GiB in all).

Same arguments, same file: `random.Random(SEED)` (Mersenne Twister) and the integer mix are
stable across Python 3 versions. Pure standard library.
"""
import argparse
import itertools
import math
import random

MASK64 = (1 << 64) - 1

# (share of objects, smallest bytes, largest bytes), log-uniform inside each class.
SIZE_CLASSES = [
    (0.85, 2_000, 50_000),
    (0.12, 50_000, 250_000),
    (0.03, 250_000, 1_000_000),
]


def splitmix64(x):
    """A well-mixed 64-bit hash of an integer (Steele et al.'s SplitMix64 finaliser)."""
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def size_of(object_id, seed):
    """The body size of an object: its class, then a log-uniform point inside the class."""
    h1 = splitmix64(object_id * 2 + seed * 0x100000001)
    h2 = splitmix64(h1)
    pick = h1 / 2**64
    within = h2 / 2**64
    for share, lo, hi in SIZE_CLASSES:
        if pick < share:
            break
        pick -= share
    return int(round(lo * math.exp(within * math.log(hi / lo))))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--objects", type=int, default=1_000_000)
    ap.add_argument("--requests", type=int, required=True)
    ap.add_argument("--zipf", type=float, required=True)
    ap.add_argument("--seed", type=int, required=True)
    a = ap.parse_args()

    cum = list(itertools.accumulate(k ** -a.zipf for k in range(1, a.objects + 1)))
    rng = random.Random(a.seed)
    ids = rng.choices(range(1, a.objects + 1), cum_weights=cum, k=a.requests)
    sizes = {}
    with open(a.out, "w") as f:
        for i in ids:
            s = sizes.get(i)
            if s is None:
                s = sizes[i] = size_of(i, a.seed)
            f.write(f"/o/{i}/{s}\n")
    distinct = len(sizes)
    distinct_bytes = sum(sizes.values())
    total_bytes = sum(sizes[i] for i in ids)
    print(f"trace {a.out}: {a.requests} requests, zipf s={a.zipf}, {distinct} distinct URLs "
          f"({distinct_bytes / 2**20:.0f} MiB), {total_bytes / 2**30:.2f} GiB requested, "
          f"mean object {total_bytes / a.requests / 1000:.1f} KB per request")


if __name__ == "__main__":
    main()
