#!/usr/bin/env bash
# Starts the scripted server, runs the OpenAI SDK client test against it, stops the server.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
server="$1"
if [ ! -d "$here/node_modules/openai" ]; then
  echo "js test: $here/node_modules/openai is missing: run 'npm ci' in tests/js (.ci/run does)" >&2
  exit 1
fi
command -v node >/dev/null || { echo "js test: node is not installed" >&2; exit 1; }
out=$(mktemp)
"$server" > "$out" 2>/dev/null &
pid=$!
trap 'kill $pid 2>/dev/null || true; wait $pid 2>/dev/null || true; rm -f "$out"' EXIT
for _ in $(seq 100); do
  grep -q '^PORT ' "$out" && break
  sleep 0.1
done
port=$(sed -n 's/^PORT //p' "$out")
[ -n "$port" ] || { echo "js test: the scripted server did not start" >&2; exit 1; }
DSV41_TEST_URL="http://127.0.0.1:$port/v1" node --test "$here/client.test.mjs"
