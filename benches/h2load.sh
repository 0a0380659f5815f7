#!/usr/bin/env bash
# The neutral load line of issue 15 (BENCHMARKS.md §11): h2load, 16 connections × 8
# streams, one prepared gRPC frame per stream, against `ratelimit serve` on the memory
# store, for `RateLimiter/Check` and the same server's `grpc.health.v1.Health/Check`.
#
# Each binary given is started once per round; rounds alternate the binaries (and, inside
# a binary's turn, Check and Health/Check) so a drift in the machine's load hits all alike.
# Prints one line per leg: label, RPC, requests/s, mean, sd, sd/mean, max, 2xx, load.
# With SLICES=1, h2load also logs every request (`--log-file`) and a second line gives
# p50/p99/p99.9 and the spread *within* 10 ms slices ("in-slice sd/mean"): what is left
# of sd/mean once the machine's stalls, which move whole slices, are taken out.
#
#   benches/h2load.sh                                   # target/release/ratelimit, 2 rounds
#   ROUNDS=3 benches/h2load.sh before=/tmp/old after=target/release/ratelimit
#
# Env: ROUNDS (2), SECS (3, measured seconds per leg), SLICES (empty), PORT (50051), KEY (k), NICE
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

# Per-request log (start µs, status, latency µs): percentiles and the in-slice spread.
# Slices are numbered within 1,000 s (mawk prints larger numbers as floats, merging keys).
slices() { # label rpc-name log
  sort -n -k3,3 "$3" | awk -v label="$1" -v rpc="$2" '
    { lat[NR] = $3; t = int(($1 % 1e9) / 10000); n[t]++; s[t] += $3; ss[t] += $3 * $3; sum += $3 }
    END {
      for (t in n) if (n[t] > 20) { v += ss[t] - s[t] * s[t] / n[t]; m += n[t] }
      printf "%s | %s | p50 %d us | p99 %d us | p99.9 %d us | in-slice sd/mean %.2f\n", label, rpc,
        lat[int(NR * 0.5) + 1], lat[int(NR * 0.99) + 1], lat[int(NR * 0.999) + 1],
        (m ? sqrt(v / m) / (sum / NR) : 0) }'
}

leg() { # label rpc-name path frame
  local out log=()
  [ -n "${SLICES:-}" ] && { rm -f "$dir/leg.log"; log=(--log-file="$dir/leg.log"); }
  out=$("${load[@]}" h2load -D "$SECS" --warm-up-time 1 -c 16 -m 8 "${log[@]}" \
    -H 'content-type: application/grpc' -H 'te: trailers' -d "$4" \
    "http://127.0.0.1:$PORT$3" 2>&1)
  awk -v label="$1" -v rpc="$2" -v load="$(cut -d' ' -f1 /proc/loadavg)" '
    function us(v) { if (v ~ /ms$/) return v * 1000; if (v ~ /us$/) return v + 0; return v * 1e6 }
    /^finished in/ { rps = $4 }
    /^status codes:/ { ok = $3 }
    /^time for request:/ { max = $5; mean = us($6); sd = us($7) }
    END { printf "%s | %s | %d req/s | mean %.0f us | sd %.0f us | sd/mean %.2f | max %s | 2xx %s | load %s\n",
          label, rpc, rps, mean, sd, (mean ? sd / mean : 0), max, ok, load }' <<< "$out"
  if [ -n "${SLICES:-}" ]; then slices "$1" "$2" "$dir/leg.log"; fi
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
