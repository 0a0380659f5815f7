#!/usr/bin/env bash
# Instructions the service spends per check under scenario (a)'s load (BENCHMARKS.md §7).
#
# Runs `ratelimit serve` (release + debug symbols) under valgrind's callgrind, zeroes its
# counters once it is up, drives N checks at it with the load generator (--target), dumps
# the counters, and prints instructions per check plus the top functions. Counting
# instructions instead of timing makes before/after comparisons exact on a shared,
# noisy machine (perf's hardware counters are not available here).
#
#   benches/profile-callgrind.sh               # 20,000 checks, 10,000 keys, 16 clients
#   N=20000 KEYS=1 CLIENTS=16 benches/profile-callgrind.sh
#
# Env: N, KEYS, CLIENTS, PORT, OUT (output dir), PROF_TARGET (target dir of the profiled
# build), CARGO_TARGET_DIR (target dir of the load generator), SERVE_ARGS (more flags for
# `ratelimit serve`, e.g. "--metrics-listen 127.0.0.1:0" to count the Prometheus recorder).
set -euo pipefail
cd "$(dirname "$0")/.."

N=${N:-20000}
KEYS=${KEYS:-10000}
CLIENTS=${CLIENTS:-16}
PORT=${PORT:-50999}
OUT=${OUT:-/tmp/ratelimit-callgrind}
PROF_TARGET=${PROF_TARGET:-/tmp/target-bench-prof}
mkdir -p "$OUT"

echo "== building the service with debug symbols ($PROF_TARGET) and the load generator"
CARGO_TARGET_DIR=$PROF_TARGET CARGO_PROFILE_RELEASE_DEBUG=true \
  cargo build --release --bin ratelimit
loadgen=$(cargo bench --bench loadgen --no-run --message-format=json 2>/dev/null |
  sed -n 's/.*"executable":"\([^"]*loadgen[^"]*\)".*/\1/p' | tail -1)
[ -x "$loadgen" ] || { echo "load generator not found" >&2; exit 1; }

echo "== starting the service under callgrind on 127.0.0.1:$PORT"
rm -f "$OUT"/callgrind.out.*
valgrind --tool=callgrind --callgrind-out-file="$OUT/callgrind.out.%p" \
  "$PROF_TARGET/release/ratelimit" serve --listen "127.0.0.1:$PORT" \
  --limits benches/limits.toml --log warn ${SERVE_ARGS:-} &
server=$!
trap 'kill -TERM $server 2>/dev/null || true' EXIT
for _ in $(seq 1 120); do
  (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && break
  sleep 0.5
done

# Warm up on the same keys (every key's counter exists: the measured checks are the
# steady state of a window, not first hits; --fresh-window keeps warm-up and measurement
# in one 60 s window), then count only the measured checks.
prefix="prof$$"
warm=$((KEYS > 2000 ? KEYS : 2000))
"$loadgen" run --target "http://127.0.0.1:$PORT" --limit bench --keys "$KEYS" --key-prefix "$prefix" \
  --concurrency "$CLIENTS" --requests "$warm" --duration 300s --fresh-window 50s \
  --label warmup >/dev/null
callgrind_control --zero "$server" >/dev/null
"$loadgen" run --target "http://127.0.0.1:$PORT" --limit bench --keys "$KEYS" --key-prefix "$prefix" \
  --concurrency "$CLIENTS" --requests "$N" --duration 300s --label profiled | grep -E '^\| (run|profiled) '
callgrind_control --dump=measured "$server" >/dev/null
kill -TERM "$server"
wait "$server" || true
trap - EXIT

dump=$(ls -t "$OUT"/callgrind.out.*.* 2>/dev/null | head -1)
[ -n "$dump" ] || { echo "no callgrind dump found in $OUT" >&2; exit 1; }
echo "== $dump"
python3 benches/callgrind_summary.py "$dump" "$N"
