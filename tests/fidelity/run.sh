#!/usr/bin/env bash
# Fidelity check of rtdb-emulator against the official Firebase Admin Python SDK.
#
# Builds the emulator, starts it on a free port, runs check_emulator.py with
# FIREBASE_DATABASE_EMULATOR_HOST pointing at it, stops the emulator and exits with the
# script's status. Needs `firebase-admin` importable by ${PYTHON:-python3}, e.g.:
#   python3 -m venv /tmp/fvenv && /tmp/fvenv/bin/pip install firebase-admin
#   PYTHON=/tmp/fvenv/bin/python bash tests/fidelity/run.sh
# Honours CARGO_TARGET_DIR (default: target/ in the workspace).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$root"
PYTHON="${PYTHON:-python3}"

if ! "$PYTHON" -c 'import firebase_admin' 2>/dev/null; then
    echo "run.sh: firebase-admin is not importable by $PYTHON (pip install firebase-admin)" >&2
    exit 2
fi

# RTDB_EMULATOR_BIN: an emulator binary already built (scripts/test passes the one
# `cargo test` built); otherwise build it here.
if [ -n "${RTDB_EMULATOR_BIN:-}" ] && [ -x "$RTDB_EMULATOR_BIN" ]; then
    bin="$RTDB_EMULATOR_BIN"
else
    cargo build -p rtdb-emulator
    target_dir="${CARGO_TARGET_DIR:-target}"
    case "$target_dir" in
        /*) ;;
        *) target_dir="$root/$target_dir" ;;
    esac
    bin="$target_dir/debug/rtdb-emulator"
fi

port="$("$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()')"
log="$(mktemp)"
"$bin" --host 127.0.0.1 --port "$port" >"$log" 2>&1 &
emu_pid=$!
cleanup() {
    kill "$emu_pid" 2>/dev/null || true
    wait "$emu_pid" 2>/dev/null || true
    rm -f "$log"
}
trap cleanup EXIT

ready=0
for _ in $(seq 1 100); do
    if "$PYTHON" -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/.emulator/stats', timeout=1)" 2>/dev/null; then
        ready=1
        break
    fi
    if ! kill -0 "$emu_pid" 2>/dev/null; then
        echo "run.sh: the emulator exited early:" >&2
        cat "$log" >&2
        exit 1
    fi
    sleep 0.1
done
if [ "$ready" != 1 ]; then
    echo "run.sh: the emulator did not answer on port $port" >&2
    cat "$log" >&2
    exit 1
fi
echo "run.sh: emulator pid $emu_pid on 127.0.0.1:$port"

status=0
FIREBASE_DATABASE_EMULATOR_HOST="127.0.0.1:$port" "$PYTHON" "$here/check_emulator.py" || status=$?
if [ "$status" != 0 ]; then
    echo "run.sh: emulator log:" >&2
    cat "$log" >&2
fi
exit "$status"
