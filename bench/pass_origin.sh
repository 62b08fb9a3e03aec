#!/usr/bin/env bash
# An origin for the miss and pass benchmarks (bench/miss_instructions.sh, bench/pass_through.sh):
# nginx answering at once, from memory, with a 1 KB page whose caching headers depend on the path.
# Written as a start script in the shared harness's style (../shared/bench/origin/nginx.sh): it
# writes its config and execs nginx in the foreground, so the caller stops it by its PID.
#
#   /cacheable/ANY   200, 1 KB, Cache-Control: public, max-age=3600 (every new URL is a miss)
#   /nostore/ANY     200, 1 KB, Cache-Control: no-store (a pass: forwarded, never stored)
#   /custom/ANY      as /nostore/, with `X-Request-Id` (a name outside pingora-http's titled list,
#                    so the answer's head needs its case map: pingora-core 0027)
#   /post/ANY        200, 1 KB, no Cache-Control (the answer to a POST, which is always forwarded)
#   /__status        nginx stub_status (origin request count)
#
# Any method gets the same answer (`return` reads and discards a request body).
# env: LISTEN_PORT RUN_DIR [WORKERS=1]
set -euo pipefail
: "${LISTEN_PORT:?}" "${RUN_DIR:?}" "${WORKERS:=1}"
mkdir -p "$RUN_DIR/tmp"
PAGE=$(printf 'x%.0s' $(seq 1 1023))
cat >"$RUN_DIR/origin.conf" <<CONF
worker_processes $WORKERS;
daemon off;
pid $RUN_DIR/origin.pid;
error_log $RUN_DIR/origin-error.log warn;
worker_rlimit_nofile 65536;
events { worker_connections 8192; }
http {
    access_log off;
    default_type text/html;
    client_body_temp_path $RUN_DIR/tmp/body;
    proxy_temp_path $RUN_DIR/tmp/proxy;
    fastcgi_temp_path $RUN_DIR/tmp/fastcgi;
    uwsgi_temp_path $RUN_DIR/tmp/uwsgi;
    scgi_temp_path $RUN_DIR/tmp/scgi;
    keepalive_requests 1000000;
    server {
        listen 127.0.0.1:$LISTEN_PORT backlog=4096;
        location /cacheable/ {
            add_header Cache-Control "public, max-age=3600" always;
            return 200 "$PAGE\n";
        }
        location /nostore/ {
            add_header Cache-Control "no-store" always;
            return 200 "$PAGE\n";
        }
        location /custom/ {
            add_header Cache-Control "no-store" always;
            add_header X-Request-Id "5f0c1b2a-9d3e-4c61-8a7f-2b4e6d8c0a13" always;
            return 200 "$PAGE\n";
        }
        location /post/ { return 200 "$PAGE\n"; }
        location = /__status { stub_status; }
    }
}
CONF
exec nginx -c "$RUN_DIR/origin.conf" -p "$RUN_DIR" -e "$RUN_DIR/origin-error.log"
