#!/usr/bin/env bash
# Start-up time to first token: starts the server on a checkpoint, waits for /health, sends a
# one-token completion and prints the seconds from launch to /health and to that first token,
# followed by the server's own start-up phase summary. Run it twice to see a warm page cache.
#   scripts/bench_startup.sh MODEL_DIR [extra server flags, e.g. --device cuda]
#   DSV41_BIN (default build/dsv41-serve), PORT (default 18931)
set -euo pipefail
MODEL=${1:?usage: scripts/bench_startup.sh MODEL_DIR [server flags...]}
shift
BIN=${DSV41_BIN:-build/dsv41-serve}
PORT=${PORT:-18931}
LOG=$(mktemp)
t0=$(date +%s.%N)
"$BIN" --model "$MODEL" --port "$PORT" "$@" 2>"$LOG" &
pid=$!
trap 'kill $pid 2>/dev/null || true; rm -f "$LOG"' EXIT
until curl -fs "http://127.0.0.1:$PORT/health" >/dev/null; do
  kill -0 $pid 2>/dev/null || { cat "$LOG" >&2; echo "the server exited" >&2; exit 1; }
  sleep 0.05
done
t1=$(date +%s.%N)
curl -fs "http://127.0.0.1:$PORT/v1/completions" -H 'Content-Type: application/json' \
  -d '{"prompt": [0, 100, 200, 300], "max_tokens": 1, "temperature": 0}' >/dev/null
t2=$(date +%s.%N)
echo "ready (/health 200): $(echo "$t1 - $t0" | bc) s"
echo "first token:         $(echo "$t2 - $t0" | bc) s"
grep -E "start-up took|memory budget|loading weights|cpu model loaded|cuda model:|pinned staging" "$LOG" | sed 's/^/  server: /' || true
