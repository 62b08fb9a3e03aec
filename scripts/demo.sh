#!/usr/bin/env bash
# Builds Lacquer, starts the bundled slow demo origin on 127.0.0.1:8080 and Lacquer in front of it
# on 127.0.0.1:6081, shows a miss then a hit, and keeps both running until Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo build --release --bins
ORIGIN=${ORIGIN:-127.0.0.1:8080}
LISTEN=${LISTEN:-127.0.0.1:6081}
target/release/demo-origin --listen "$ORIGIN" & origin_pid=$!
target/release/lacquer --upstream "$ORIGIN" --listen "$LISTEN" & proxy_pid=$!
trap 'kill $proxy_pid $origin_pid 2>/dev/null' EXIT INT TERM
for _ in $(seq 50); do curl -s -o /dev/null "http://$LISTEN/" && break; sleep 0.1; done
echo
for i in 1 2; do
  echo "--- request $i: curl -si http://$LISTEN/static/app.css"
  curl -s -o /dev/null -w "status %{http_code}, %{time_total}s\n" -D - "http://$LISTEN/static/app.css" \
    | grep -iE '^(cache-status|age|x-render-count)|^status'
done
echo
echo "Lacquer is serving http://$LISTEN/ in front of the demo origin at http://$ORIGIN/ (Ctrl-C stops both)."
wait $proxy_pid
