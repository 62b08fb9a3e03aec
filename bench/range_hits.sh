#!/usr/bin/env bash
# Range hits (RFC 9110 §14) side by side with nginx and Varnish, on the shared harness.
#
# Video players and download managers ask for parts of large objects. The shared harness has no
# such scenario, so this runs a copy of it (../shared/bench, copied to a scratch directory, left
# as it is) with two more, both hits of the harness's 1 MB object:
#   range512k  `Range: bytes=262144-786431` (the middle 512 KB)
#   range4k    `Range: bytes=0-4095` (a player's first probe)
# Everything else is the harness's own (bench/run.sh: the tree's release build as `lacquer`).
#
#   bench/range_hits.sh --run-id r1 --rounds 5
#   PROXIES=nginx,varnish,lacquer,other bench/range_hits.sh --proxy "other=/tmp/lacquer-b ..." --rounds 5
#   SCENARIOS=range512k,range4k,hit1m bench/range_hits.sh
set -euo pipefail
cd "$(dirname "$0")/.."
SHARED=$(cd ../shared/bench && pwd)
COPY=$(mktemp -d /tmp/range-harness.XXXXXX)
cp -r "$SHARED"/. "$COPY"
python3 - "$COPY/lib/bench.py" <<'PY'
import sys
path = sys.argv[1]
text = open(path).read()
anchor = '    "hit1m": dict(path="/1m.bin", desc="hot hit, 1 MB object (optional)"),\n'
assert anchor in text, "the harness's hit1m scenario moved: update bench/range_hits.sh"
text = text.replace(anchor, anchor + '''\
    "range512k": dict(path="/1m.bin", headers=["Range: bytes=262144-786431"],
                      desc="hot hit, 512 KB range of the 1 MB object"),
    "range4k": dict(path="/1m.bin", headers=["Range: bytes=0-4095"],
                    desc="hot hit, first 4 KB of the 1 MB object"),
''')
open(path, "w").write(text)
PY
PROXIES=${PROXIES:-nginx,varnish,lacquer} SCENARIOS=${SCENARIOS:-range512k,range4k} \
  HARNESS=$COPY exec bench/run.sh "$@"
