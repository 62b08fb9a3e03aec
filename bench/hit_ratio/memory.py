#!/usr/bin/env python3
"""Memory held by a proxy during a bench/hit_ratio.sh replay, from the 2-second samples.

usage: memory.py summary SAMPLES LABEL PROXY ZIPF CACHE_MB   one JSON line: mean and peak of
                                                             PSS, tmpfs and both, second half
       memory.py mean MEMORY.jsonl LABEL                     LABEL's mean tmpfs footprint, MB

The second half of the samples is the steady state (the cache is full long before).
"""
import json
import sys


def summary(samples, label, proxy, zipf, cache_mb):
    rows = [tuple(map(int, line.split())) for line in open(samples) if len(line.split()) == 2]
    steady = rows[len(rows) // 2:] or [(0, 0)]
    pss = [r[0] for r in steady]
    tmpfs = [r[1] for r in steady]
    total = [p + t for p, t in steady]
    print(json.dumps({
        "label": label, "proxy": proxy, "zipf": float(zipf), "cache_mb": int(cache_mb),
        "pss_mean_mb": round(sum(pss) / len(pss)), "pss_peak_mb": max(pss),
        "tmpfs_mean_mb": round(sum(tmpfs) / len(tmpfs)), "tmpfs_peak_mb": max(tmpfs),
        "total_mean_mb": round(sum(total) / len(total)), "total_peak_mb": max(total),
    }))


def mean(memory, label):
    print(next(m["tmpfs_mean_mb"] for m in map(json.loads, open(memory)) if m["label"] == label))


if __name__ == "__main__":
    {"summary": summary, "mean": mean}[sys.argv[1]](*sys.argv[2:])
