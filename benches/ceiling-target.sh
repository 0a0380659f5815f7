#!/usr/bin/env bash
# `loadgen ceiling --target` against built `ratelimit` binaries, alternated (BENCHMARKS.md
# §14): each binary is started afresh per run on the memory store with the benchmark
# limits, the ceiling scenario drives it from the load generator's clients, and the
# ratio line is printed per run.
#
#   benches/ceiling-target.sh base=/tmp/plain pgo=target/release/ratelimit
#
# Env: RUNS (2), ROUNDS (6, the scenario's rounds), SECS (2, per leg), PORT (50682).
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-2} ROUNDS=${ROUNDS:-6} SECS=${SECS:-2} PORT=${PORT:-50682}
[ $# -gt 0 ] || set -- "main=target/release/ratelimit"
cargo bench --bench loadgen --locked --no-run >/dev/null 2>&1
loadgen=$(ls -t target/release/deps/loadgen-* | grep -v '\.d$' | head -1)
for run in $(seq 1 "$RUNS"); do
  for spec in "$@"; do
    label=${spec%%=*} bin=${spec#*=}
    "$bin" serve --listen "127.0.0.1:$PORT" --limits benches/limits.toml --log warn &
    server=$!
    for _ in $(seq 1 100); do (exec 3<>/dev/tcp/127.0.0.1/"$PORT") 2>/dev/null && break; sleep 0.1; done
    echo "## $label, run $run"
    "$loadgen" ceiling --target "http://127.0.0.1:$PORT" --rounds "$ROUNDS" --duration "${SECS}s" 2>/dev/null |
      grep -E '^- Check / Health'
    kill -TERM "$server" && wait "$server"
  done
done
