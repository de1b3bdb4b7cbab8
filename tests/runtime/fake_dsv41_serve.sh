#!/usr/bin/env bash
# Stands in for the dsv41-serve binary in the launcher tests (DSV41_BIN / DSV41_WORKER_BIN point
# here). Rank 0 answers GET /health over HTTP (python3 -m http.server on --host/--port); rank 1
# just runs until SIGTERM. Both record their arguments and NCCL/Gloo environment under
# $FAKE_STATE_DIR/rank<r>.{args,env}. `fabric ...` runs the real binary ($FAKE_REAL_BIN) so the
# launcher consumes real `fabric --env` output.
# Knobs: FAKE_FAIL_RANK=r (that rank exits 1 at start), FAKE_START_DELAY=s (rank 0 serves late).
set -u
if [ "${1:-}" = fabric ]; then
  [ -n "${FAKE_REAL_BIN:-}" ] || { echo "NCCL_IB_DISABLE=1"; exit 0; }
  exec "$FAKE_REAL_BIN" "$@"
fi
state=${FAKE_STATE_DIR:?FAKE_STATE_DIR is not set}
rank=0 port=8888 host=127.0.0.1
args=("$@")
while [ $# -gt 0 ]; do
  case "$1" in
    --rank) rank=$2; shift 2 ;;
    --port) port=$2; shift 2 ;;
    --host) host=$2; shift 2 ;;
    *) shift ;;
  esac
done
printf '%s\n' "${args[@]}" >"$state/rank$rank.args"
env | grep -E '^(NCCL|GLOO)_' | sort >"$state/rank$rank.env" || true
echo "fake rank $rank starting (pid $$)"
if [ "${FAKE_FAIL_RANK:-}" = "$rank" ]; then
  echo "fake rank $rank: error: cannot load the model" >&2
  exit 1
fi
child=""
trap 'echo "fake rank $rank: SIGTERM, exiting"; [ -n "$child" ] && kill "$child" 2>/dev/null; exit 0' TERM INT
if [ "$rank" = 0 ]; then
  sleep "${FAKE_START_DELAY:-0}"
  www="$state/www"
  mkdir -p "$www"
  echo '{"status":"ok","rank":0}' >"$www/health"
  python3 -m http.server "$port" --bind "$host" --directory "$www" >/dev/null 2>&1 &
  child=$!
else
  sleep 86400 &
  child=$!
fi
echo "fake rank $rank ready"
wait "$child"
