#!/usr/bin/env bash
# The neutral load line of issue 15 (BENCHMARKS.md §11): h2load, 16 connections × 8
# streams, one prepared gRPC frame per stream, against `ratelimit serve` on the memory
# store, for `RateLimiter/Check` and the same server's `grpc.health.v1.Health/Check`.
#
# Each binary given is started once per round; rounds alternate the binaries (and, inside
# a binary's turn, Check and Health/Check) so a drift in the machine's load hits all alike.
# Prints one line per leg: label, RPC, requests/s, mean, sd, sd/mean, max, 2xx, load.
#
#   benches/h2load.sh                                   # target/release/ratelimit, 2 rounds
#   ROUNDS=3 benches/h2load.sh before=/tmp/old after=target/release/ratelimit
#
# Env: ROUNDS (2), SECS (3, measured seconds per leg), PORT (50051), KEY (k), NICE
# (a `nice` level for server and h2load, e.g. -15 on a shared machine; empty: none),
# SERVER_CPU / LOAD_CPU (pin the server / h2load to these CPUs with taskset; empty: no).
# Needs h2load (Debian: nghttp2-client) and xxd.
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS=${ROUNDS:-2}
SECS=${SECS:-3}
PORT=${PORT:-50051}
KEY=${KEY:-k}
[ $# -gt 0 ] || set -- "main=target/release/ratelimit"
run=()
[ -n "${NICE:-}" ] && run=(nice -n "$NICE")
srv=("${run[@]}") load=("${run[@]}")
[ -n "${SERVER_CPU:-}" ] && srv+=(taskset -c "$SERVER_CPU")
[ -n "${LOAD_CPU:-}" ] && load+=(taskset -c "$LOAD_CPU")

dir=$(mktemp -d)
trap 'kill -TERM ${server:-} 2>/dev/null || true; rm -rf "$dir"' EXIT

# The frame is the gRPC prefix (0 = not compressed, then the length as 4 bytes
# big-endian) and the protobuf CheckRequest: key (field 1), limit "bench" (2), cost 1 (3).
{ printf '\x0a'; printf '%02x' "${#KEY}" | xxd -r -p; printf '%s' "$KEY"
  printf '\x12\x05bench\x18\x01'; } > "$dir/check.pb"
{ printf '\x00'; printf '%08x' "$(stat -c%s "$dir/check.pb")" | xxd -r -p; cat "$dir/check.pb"; } > "$dir/check.bin"
printf '\x00\x00\x00\x00\x00' > "$dir/health.bin" # an empty HealthCheckRequest

leg() { # label rpc-name path frame
  local out
  out=$("${load[@]}" h2load -D "$SECS" --warm-up-time 1 -c 16 -m 8 \
    -H 'content-type: application/grpc' -H 'te: trailers' -d "$4" \
    "http://127.0.0.1:$PORT$3" 2>&1)
  awk -v label="$1" -v rpc="$2" -v load="$(cut -d' ' -f1 /proc/loadavg)" '
    function us(v) { if (v ~ /ms$/) return v * 1000; if (v ~ /us$/) return v + 0; return v * 1e6 }
    /^finished in/ { rps = $4 }
    /^status codes:/ { ok = $3 }
    /^time for request:/ { max = $5; mean = us($6); sd = us($7) }
    END { printf "%s | %s | %d req/s | mean %.0f us | sd %.0f us | sd/mean %.2f | max %s | 2xx %s | load %s\n",
          label, rpc, rps, mean, sd, (mean ? sd / mean : 0), max, ok, load }' <<< "$out"
}

for round in $(seq 1 "$ROUNDS"); do
  for spec in "$@"; do
    label=${spec%%=*} bin=${spec#*=}
    "${srv[@]}" "$bin" serve --listen "127.0.0.1:$PORT" --limits benches/limits.toml --log warn &
    server=$!
    for _ in $(seq 1 100); do (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && break; sleep 0.1; done
    legs=("check /bladbase.ratelimit.v1.RateLimiter/Check $dir/check.bin"
          "health /grpc.health.v1.Health/Check $dir/health.bin")
    (( round % 2 == 0 )) && legs=("${legs[1]}" "${legs[0]}")
    for l in "${legs[@]}"; do
      read -r rpc path frame <<< "$l"
      leg "$label r$round" "$rpc" "$path" "$frame"
    done
    kill -TERM "$server"; wait "$server" 2>/dev/null || true
    server=
  done
done
