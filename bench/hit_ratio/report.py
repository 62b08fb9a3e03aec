#!/usr/bin/env python3
"""The markdown report of bench/hit_ratio.sh: one table per Zipf exponent, then the hit ratio by
tenth of the trace (how quickly each proxy reaches its steady state).

usage: report.py RESULTS.jsonl MEMORY.jsonl TRACES.txt --title T --setup S

`read_runs` and `pct` serve tier_report.py too.
"""
import argparse
import json


def pct(x):
    return f"{100 * x:.1f} %"


def mem(r):
    """Second-half mean (peak) of the proxy's PSS, plus its tmpfs cache files if it has any."""
    if "pss_mean_mb" not in r:
        return ""
    text = f"{r['pss_mean_mb']} ({r['pss_peak_mb']})"
    if r["tmpfs_peak_mb"]:
        text += f" + {r['tmpfs_mean_mb']} ({r['tmpfs_peak_mb']})"
    return text


def read_runs(default_title):
    """Parses the command line shared with tier_report.py, prints the report's heading and
    returns the runs (one per replay), each with the memory figures of its label merged in."""
    ap = argparse.ArgumentParser()
    ap.add_argument("results")
    ap.add_argument("memory")
    ap.add_argument("traces")
    ap.add_argument("--title", default=default_title)
    ap.add_argument("--setup", default="")
    a = ap.parse_args()
    memory = {m["label"]: m for m in map(json.loads, open(a.memory))}
    runs = []
    for r in map(json.loads, open(a.results)):
        r.update(memory.get(r["label"], {}))
        runs.append(r)
    print(f"# {a.title}\n\n{a.setup}\n")
    for line in open(a.traces):
        print(f"- {line.strip()}")
    return runs


def main():
    runs = read_runs("Hit ratio")
    for z in sorted({r["zipf"] for r in runs}):
        rows = [r for r in runs if r["zipf"] == z]
        base = next((r for r in rows if r["proxy"] == "lacquer"), None)
        print(f"\n## Zipf s = {z}\n")
        print("| proxy | requests | errors | origin requests | hit ratio | byte hit ratio "
              "| hit ratio, 2nd half | byte hit ratio, 2nd half | origin requests / lacquer's "
              "| cache MB set | memory MB, mean (peak): PSS + tmpfs | seconds |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            rel = f"{r['origin_requests'] / base['origin_requests']:.2f}" if base else ""
            print(f"| {r['proxy']} | {r['requests']} | {r['errors']} | {r['origin_requests']} "
                  f"| {pct(r['hit_ratio'])} | {pct(r['byte_hit_ratio'])} "
                  f"| {pct(r['hit_ratio_2nd_half'])} | {pct(r['byte_hit_ratio_2nd_half'])} "
                  f"| {rel} | {r.get('cache_mb', '')} | {mem(r)} | {r['seconds']} |")
        parts = len(rows[0]["hit_ratio_by_part"])
        print(f"\nHit ratio by tenth of the trace (s = {z}):\n")
        print("| proxy | " + " | ".join(str(k + 1) for k in range(parts)) + " |")
        print("|---|" + "---|" * parts)
        for r in rows:
            print(f"| {r['proxy']} | " + " | ".join(f"{100 * h:.1f}" for h in r["hit_ratio_by_part"]) + " |")


if __name__ == "__main__":
    main()
