#!/usr/bin/env python3
"""The markdown report of bench/shared_tier.sh: isolated against shared nodes, per node count.

usage: tier_report.py RESULTS.jsonl MEMORY.jsonl TRACES.txt --title T --setup S
"""
from report import pct, read_runs


def main():
    runs = {(r["mode"], r["nodes"]): r for r in read_runs("Shared tier")}
    print("\n| nodes | mode | cache memory MB (local + memcached) | requests | errors | origin requests "
          "| hit ratio | byte hit ratio | hit ratio, 2nd half | byte hit ratio, 2nd half "
          "| origin requests / isolated | memcached: items, MB held, evictions | PSS MB: nodes + memcached |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for n in sorted({n for _, n in runs}):
        iso = runs.get(("isolated", n))
        for mode in ("isolated", "shared"):
            r = runs.get((mode, n))
            if r is None:
                continue
            local = r["nodes"] * r["local_mb"]
            mem = f"{local} + {r['total_mb'] - local}" if mode == "shared" else f"{local}"
            rel = f"{r['origin_requests'] / iso['origin_requests']:.2f}" if iso else ""
            mc = (f"{r['mc_curr_items']}, {r['mc_bytes'] // 2**20}, {r['mc_evictions']}"
                  if "mc_bytes" in r else "")
            print(f"| {n} | {mode} | {mem} | {r['requests']} | {r['errors']} | {r['origin_requests']} "
                  f"| {pct(r['hit_ratio'])} | {pct(r['byte_hit_ratio'])} "
                  f"| {pct(r['hit_ratio_2nd_half'])} | {pct(r['byte_hit_ratio_2nd_half'])} "
                  f"| {rel} | {mc} | {r['nodes_pss_mb']} + {r['memcached_pss_mb']} |")
    print("\nHit ratio by tenth of the trace:\n")
    parts = len(next(iter(runs.values()))["hit_ratio_by_part"])
    print("| nodes | mode | " + " | ".join(str(k + 1) for k in range(parts)) + " |")
    print("|---|---|" + "---|" * parts)
    for (mode, n), r in sorted(runs.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        print(f"| {n} | {mode} | " + " | ".join(f"{100 * h:.1f}" for h in r["hit_ratio_by_part"]) + " |")


if __name__ == "__main__":
    main()
