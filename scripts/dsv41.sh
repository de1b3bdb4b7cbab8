#!/usr/bin/env bash
# Operate a two-rank dsv41-serve deployment (rank 0 = head with the HTTP server, here; rank 1 =
# headless worker, over ssh).
#
#   scripts/dsv41.sh start   [worker]   start rank 1 then rank 0 (or only the worker), wait for /health
#   scripts/dsv41.sh stop    [worker]   SIGTERM, SIGKILL after DSV41_STOP_TIMEOUT_S
#   scripts/dsv41.sh restart [worker]
#   scripts/dsv41.sh status  [worker]   both ranks' state and rank 0's /health (exit 0 = all running, 3 = not)
#   scripts/dsv41.sh logs    [worker] [-f] [-n N]
#   scripts/dsv41.sh sync               copy the checkpoint (and Engram folder) to the worker (rsync, resumable)
#
# Configuration: one KEY=VALUE file, configs/dsv41.env by default (DSV41_ENV=FILE to override; see
# configs/dsv41.env.example). DSV41_* variables already set in the environment override the file.
# DSV41_REMOTE=local runs rank 1 as a local process instead of over ssh (tests, single host).
# Each rank gets the NCCL/Gloo settings of `dsv41-serve fabric --env` run on its own host, unless
# those variables are already set. Pid files and logs: DSV41_LOG_DIR/rank{0,1}.{pid,log}.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PROG=dsv41.sh

die() { echo "$PROG: error: $*" >&2; exit 1; }
say() { echo "$PROG: $*"; }

usage() {
  sed -n '2,16p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
}

# ---- configuration --------------------------------------------------------------------------
abs_path() {  # relative paths in the file are relative to the checkout
  case "$1" in
    "") echo "" ;;
    /*) echo "$1" ;;
    *) echo "$ROOT/$1" ;;
  esac
}

load_config() {
  ENV_FILE=$(abs_path "${DSV41_ENV:-configs/dsv41.env}")
  [ -f "$ENV_FILE" ] ||
    die "no configuration file $ENV_FILE (copy configs/dsv41.env.example to configs/dsv41.env, or set DSV41_ENV=FILE)"
  # Values set in the caller's environment win over the file.
  local -A keep=()
  local v
  for v in $(compgen -v DSV41_ || true); do keep[$v]=${!v}; done
  set -a
  # shellcheck disable=SC1090
  source "$ENV_FILE" || die "$ENV_FILE could not be read by bash"
  set +a
  for v in "${!keep[@]}"; do export "$v=${keep[$v]}"; done

  BIN=$(abs_path "${DSV41_BIN:-build/dsv41-serve}")
  WORLD=${DSV41_WORLD_SIZE:-2}
  REMOTE=${DSV41_REMOTE:-ssh}
  case "$REMOTE" in ssh | local) ;; *) die "DSV41_REMOTE must be ssh or local, got '$REMOTE'" ;; esac
  [[ "$WORLD" =~ ^[12]$ ]] || die "DSV41_WORLD_SIZE must be 1 or 2, got '$WORLD'"
  HOST=${DSV41_HOST:-127.0.0.1}
  PORT=${DSV41_PORT:-8888}
  MASTER_ADDR=${DSV41_MASTER_ADDR:-127.0.0.1}
  MASTER_PORT=${DSV41_MASTER_PORT:-29500}
  MODEL=${DSV41_MODEL:-}
  WORKER_HOST=${DSV41_WORKER_HOST:-}
  if [ "$REMOTE" = local ]; then
    WORKER_ADDR=${DSV41_WORKER_ADDR:-127.0.0.1}
  else
    WORKER_ADDR=${DSV41_WORKER_ADDR:-${WORKER_HOST#*@}}
  fi
  LOG_DIR=$(abs_path "${DSV41_LOG_DIR:-logs}")
  WORKER_LOG_DIR=${DSV41_WORKER_LOG_DIR:-$LOG_DIR}
  WORKER_BIN=${DSV41_WORKER_BIN:-$BIN}
  WORKER_MODEL=${DSV41_WORKER_MODEL:-$MODEL}
  ENGRAM_DIR=${DSV41_ENGRAM_DIR:-}
  WORKER_ENGRAM_DIR=${DSV41_WORKER_ENGRAM_DIR:-$ENGRAM_DIR}
  START_TIMEOUT=${DSV41_START_TIMEOUT_S:-900}
  STOP_TIMEOUT=${DSV41_STOP_TIMEOUT_S:-30}
  read -r -a SSH_OPTS <<<"${DSV41_SSH_OPTS:-}"
  read -r -a EXTRA_ARGS <<<"${DSV41_EXTRA_ARGS:-}"
  read -r -a WORKER_EXTRA_ARGS <<<"${DSV41_WORKER_EXTRA_ARGS:-}"
  if [ "$WORLD" = 2 ] && [ "$REMOTE" = ssh ] && [ -z "$WORKER_HOST" ]; then
    die "DSV41_WORKER_HOST is not set in $ENV_FILE (or use DSV41_REMOTE=local, or DSV41_WORLD_SIZE=1)"
  fi
  mkdir -p "$LOG_DIR"
}

# ---- running things on the worker -------------------------------------------------------------
# Joins arguments into one shell-quoted command line.
quote() {
  local out="" a
  for a in "$@"; do out+=" $(printf '%q' "$a")"; done
  echo "${out# }"
}

# Runs a bash script on the worker (over ssh, or locally with DSV41_REMOTE=local).
on_worker() {
  if [ "$REMOTE" = local ]; then
    bash -c "$1"
  else
    ssh "${SSH_OPTS[@]}" -- "$WORKER_HOST" "bash -c $(printf '%q' "$1")"
  fi
}

worker_label() { if [ "$REMOTE" = local ]; then echo "local"; else echo "$WORKER_HOST"; fi; }

# Shell functions shared by the local and remote sides (sent as text to the worker).
# A pid counts as running only if it exists, is not a zombie, and is a dsv41 rank (pid reuse guard).
COMMON_FUNCS=$(
  cat <<'EOF'
rank_pid() { local f=$1; [ -f "$f" ] || return 1; local p; p=$(cat "$f" 2>/dev/null) || return 1; [[ "$p" =~ ^[0-9]+$ ]] || return 1; echo "$p"; }
is_running() {
  local p=$1 st
  kill -0 "$p" 2>/dev/null || return 1
  st=$(sed -n 's/^[0-9]* (.*) \([A-Za-z]\).*/\1/p' "/proc/$p/stat" 2>/dev/null || true)
  [ "$st" != Z ] || return 1
  tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | grep -q -- '--rank' || return 1
}
# Exports NCCL_*/GLOO_* lines of `dsv41-serve fabric --env` unless the variable is already set.
apply_fabric() {
  local line k v
  while IFS= read -r line; do
    [[ "$line" =~ ^[A-Z][A-Z0-9_]*=[^[:space:]]*$ ]] || continue
    k=${line%%=*}; v=${line#*=}
    if [ -z "${!k+x}" ]; then export "$k=$v"; fi
  done
}
# start_rank RANK LOGDIR PEER BIN ARGS... : starts one rank in the background, detached.
start_rank() {
  local rank=$1 dir=$2 peer=$3 bin=$4; shift 4
  local pidf="$dir/rank$rank.pid" log="$dir/rank$rank.log" p fab
  mkdir -p "$dir"
  if p=$(rank_pid "$pidf") && is_running "$p"; then echo "already-running $p"; return 0; fi
  [ -x "$bin" ] || { echo "no-binary $bin"; return 1; }
  printf '=== %s rank %s starting ===\n' "$(date -u +%FT%TZ)" "$rank" >>"$log"
  if [ -n "$peer" ]; then fab=$("$bin" fabric --env --peer "$peer" 2>>"$log") || fab=""; else fab=$("$bin" fabric --env 2>>"$log") || fab=""; fi
  apply_fabric <<<"$fab"
  env | grep -E '^(NCCL|GLOO)_' | sort | sed 's/^/fabric env: /' >>"$log" || true
  if command -v setsid >/dev/null; then
    setsid "$bin" "$@" >>"$log" 2>&1 </dev/null &
  else
    nohup "$bin" "$@" >>"$log" 2>&1 </dev/null &
  fi
  p=$!
  echo "$p" >"$pidf"
  echo "started $p"
}
# stop_rank RANK LOGDIR TIMEOUT
stop_rank() {
  local rank=$1 dir=$2 timeout=$3 p i
  local pidf="$dir/rank$rank.pid"
  if ! p=$(rank_pid "$pidf") || ! is_running "$p"; then rm -f "$pidf"; echo "not-running"; return 0; fi
  kill -TERM "$p" 2>/dev/null || true
  for ((i = 0; i < timeout * 10; i++)); do is_running "$p" || break; sleep 0.1; done
  if is_running "$p"; then kill -KILL "$p" 2>/dev/null || true; sleep 0.2; rm -f "$pidf"; echo "killed $p"; return 0; fi
  rm -f "$pidf"
  echo "stopped $p"
}
# rank_state RANK LOGDIR: "running PID" / "stopped" / "dead PID" (stale pid file)
rank_state() {
  local p
  if ! p=$(rank_pid "$1/rank$2.pid" 2>/dev/null); then echo stopped; return; fi
  if is_running "$p"; then echo "running $p"; else echo "dead $p"; fi
}
EOF
)
eval "$COMMON_FUNCS"

# Runs one of the COMMON_FUNCS on the worker with quoted arguments.
worker_call() { on_worker "$COMMON_FUNCS
$(quote "$@")"; }

# ---- HTTP ---------------------------------------------------------------------------------------
probe_host() { case "$HOST" in 0.0.0.0 | "" | "::" | "[::]") echo 127.0.0.1 ;; *) echo "$HOST" ;; esac; }

# Prints the body of GET /health; fails unless the answer is 200.
http_health() {
  local h
  h=$(probe_host)
  if command -v curl >/dev/null; then
    local auth=()
    [ -n "${DSV41_API_KEY:-}" ] && auth=(-H "Authorization: Bearer $DSV41_API_KEY")
    curl -fsS -m 3 "${auth[@]}" "http://$h:$PORT/health" 2>/dev/null
  else
    local resp
    # shellcheck disable=SC2016  # $0/$1 are expanded by the inner bash
    resp=$(timeout 3 bash -c 'exec 3<>"/dev/tcp/$0/$1"; printf "GET /health HTTP/1.0\r\nHost: %s\r\n\r\n" "$0" >&3; cat <&3' "$h" "$PORT" 2>/dev/null) || return 1
    [[ "$resp" =~ ^HTTP/[0-9.]+\ 200 ]] || return 1
    printf '%s\n' "${resp#*$'\r\n\r\n'}"
  fi
}

show_log_tail() {  # RANK
  if [ "$1" = 0 ]; then
    tail -n 20 "$LOG_DIR/rank0.log" 2>/dev/null | sed 's/^/  rank0.log: /' >&2 || true
  else
    on_worker "tail -n 20 $(printf '%q' "$WORKER_LOG_DIR/rank1.log")" 2>/dev/null | sed 's/^/  rank1.log: /' >&2 || true
  fi
}

# ---- commands -----------------------------------------------------------------------------------
worker_args() {
  local a=(--rank 1 --world-size 2 --model "$WORKER_MODEL" --master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT")
  [ -n "${DSV41_DEVICE:-}" ] && a+=(--device "$DSV41_DEVICE")
  [ -n "${DSV41_ENGRAM_TOKEN_MAP:-}" ] && a+=(--engram-token-map "$DSV41_ENGRAM_TOKEN_MAP")
  [ -n "${DSV41_LOG_LEVEL:-}" ] && a+=(--log-level "$DSV41_LOG_LEVEL")
  printf '%s\0' "${a[@]}" ${WORKER_EXTRA_ARGS[@]+"${WORKER_EXTRA_ARGS[@]}"}
}

start_worker() {
  [ -n "$WORKER_MODEL" ] || die "DSV41_MODEL (or DSV41_WORKER_MODEL) is not set"
  local args=() out
  mapfile -d '' -t args < <(worker_args)
  out=$(worker_call start_rank 1 "$WORKER_LOG_DIR" "$MASTER_ADDR" "$WORKER_BIN" "${args[@]}") ||
    die "could not start rank 1 on $(worker_label): ${out:-ssh failed}"
  case "$out" in
    already-running*) say "rank 1 ($(worker_label)) already running (pid ${out##* })" ;;
    started*)
      sleep 1  # a worker that cannot load its model usually dies at once
      if [ "$(worker_call rank_state "$WORKER_LOG_DIR" 1)" != "running ${out##* }" ]; then
        show_log_tail 1
        die "rank 1 on $(worker_label) exited right after start (log: $WORKER_LOG_DIR/rank1.log)"
      fi
      say "rank 1 started on $(worker_label) (pid ${out##* }, log $WORKER_LOG_DIR/rank1.log)"
      ;;
    *) die "unexpected answer from the worker: $out" ;;
  esac
}

start_head() {
  [ -n "$MODEL" ] || die "DSV41_MODEL is not set in $ENV_FILE"
  local args=(--rank 0 --world-size "$WORLD" --config "$ENV_FILE" --model "$MODEL" --host "$HOST" --port "$PORT"
              --master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT")
  args+=(${EXTRA_ARGS[@]+"${EXTRA_ARGS[@]}"})
  local peer=""
  [ "$WORLD" = 2 ] && peer=$WORKER_ADDR
  local out
  out=$(start_rank 0 "$LOG_DIR" "$peer" "$BIN" "${args[@]}") || die "could not start rank 0: $out"
  case "$out" in
    already-running*) say "rank 0 already running (pid ${out##* })"; return 0 ;;
  esac
  local pid=${out##* }
  say "rank 0 started (pid $pid, log $LOG_DIR/rank0.log); waiting for http://$(probe_host):$PORT/health"
  local deadline=$((SECONDS + START_TIMEOUT)) body
  while ((SECONDS < deadline)); do
    if ! is_running "$pid"; then
      show_log_tail 0
      return 1
    fi
    if [ "$WORLD" = 2 ] && [[ "$(worker_call rank_state "$WORKER_LOG_DIR" 1)" != running* ]]; then
      show_log_tail 1
      say "rank 1 on $(worker_label) died while rank 0 was starting" >&2
      return 1
    fi
    if body=$(http_health); then
      say "healthy after $((SECONDS - deadline + START_TIMEOUT)) s: $body"
      return 0
    fi
    sleep 0.25
  done
  say "rank 0 did not become healthy within $START_TIMEOUT s (DSV41_START_TIMEOUT_S)" >&2
  show_log_tail 0
  return 1
}

cmd_start() {
  if [ "${1:-}" = worker ]; then
    [ "$WORLD" = 2 ] || die "DSV41_WORLD_SIZE=1: there is no worker"
    start_worker
    return
  fi
  [ "$WORLD" = 2 ] && start_worker
  if ! start_head; then
    # Leave nothing half-started behind.
    stop_rank 0 "$LOG_DIR" "$STOP_TIMEOUT" >/dev/null
    [ "$WORLD" = 2 ] && worker_call stop_rank 1 "$WORKER_LOG_DIR" "$STOP_TIMEOUT" >/dev/null
    die "start failed; both ranks stopped (logs in $LOG_DIR)"
  fi
  cmd_status
}

cmd_stop() {
  local out
  if [ "${1:-}" != worker ]; then
    out=$(stop_rank 0 "$LOG_DIR" "$STOP_TIMEOUT")
    say "rank 0: $out"
  fi
  if [ "$WORLD" = 2 ]; then
    out=$(worker_call stop_rank 1 "$WORKER_LOG_DIR" "$STOP_TIMEOUT") || die "could not reach the worker $(worker_label)"
    say "rank 1 ($(worker_label)): $out"
  fi
}

cmd_status() {
  local all=0 st body
  if [ "${1:-}" != worker ]; then
    st=$(rank_state "$LOG_DIR" 0)
    case "$st" in
      running*)
        if body=$(http_health); then
          say "rank 0: running (pid ${st#running }), http://$(probe_host):$PORT/health: $body"
        else
          say "rank 0: running (pid ${st#running }), /health not answering (starting or unhealthy)"
          all=3
        fi
        ;;
      dead*) say "rank 0: not running (stale pid file, pid ${st#dead })"; all=3 ;;
      *) say "rank 0: stopped"; all=3 ;;
    esac
  fi
  if [ "$WORLD" = 2 ]; then
    st=$(worker_call rank_state "$WORKER_LOG_DIR" 1) || st="unreachable"
    case "$st" in
      running*)
        local last
        last=$(on_worker "tail -n 1 $(printf '%q' "$WORKER_LOG_DIR/rank1.log")" 2>/dev/null || true)
        say "rank 1 ($(worker_label)): running (pid ${st#running }), last log line: $last"
        ;;
      dead*) say "rank 1 ($(worker_label)): not running (stale pid file, pid ${st#dead })"; all=3 ;;
      unreachable) say "rank 1 ($(worker_label)): cannot reach the worker"; all=3 ;;
      *) say "rank 1 ($(worker_label)): stopped"; all=3 ;;
    esac
  fi
  return $all
}

cmd_logs() {
  local which=0 follow=0 lines=100
  while [ $# -gt 0 ]; do
    case "$1" in
      worker) which=1 ;;
      -f | --follow) follow=1 ;;
      -n) [ $# -ge 2 ] || die "-n needs a number"; lines=$2; shift ;;
      *) die "logs: unknown argument '$1'" ;;
    esac
    shift
  done
  [[ "$lines" =~ ^[0-9]+$ ]] || die "-n needs a number, got '$lines'"
  local t=(tail -n "$lines")
  [ "$follow" = 1 ] && t+=(-F)
  if [ "$which" = 0 ]; then
    [ -f "$LOG_DIR/rank0.log" ] || die "no log yet: $LOG_DIR/rank0.log"
    "${t[@]}" "$LOG_DIR/rank0.log"
  else
    [ "$WORLD" = 2 ] || die "DSV41_WORLD_SIZE=1: there is no worker"
    on_worker "$(quote "${t[@]}" "$WORKER_LOG_DIR/rank1.log")"
  fi
}

sync_dir() {  # SRC DEST what
  local src=$1 dest=$2 what=$3
  [ -d "$src" ] || die "$what folder $src does not exist"
  if [ "$REMOTE" = local ] && [ "$(cd "$src" && pwd -P)" = "$(mkdir -p "$dest" && cd "$dest" && pwd -P)" ]; then
    say "$what: $src is already the worker's folder"
    return 0
  fi
  on_worker "mkdir -p $(printf '%q' "$dest")" || die "cannot create $dest on $(worker_label)"
  local target=$dest/
  local rs=(rsync -a --partial --append-verify --human-readable --info=progress2)
  if [ "$REMOTE" = ssh ]; then
    target="$WORKER_HOST:$dest/"
    rs+=(-e "ssh ${SSH_OPTS[*]}")
  fi
  say "sync $what: $src/ -> $target"
  "${rs[@]}" "$src/" "$target" || die "rsync of $what failed (re-run '$PROG sync' to resume)"
}

cmd_sync() {
  [ "$WORLD" = 2 ] || die "DSV41_WORLD_SIZE=1: there is no worker to sync to"
  command -v rsync >/dev/null || die "rsync is not installed on this host (apt-get install rsync)"
  [ -n "$MODEL" ] || die "DSV41_MODEL is not set"
  sync_dir "$MODEL" "$WORKER_MODEL" "checkpoint"
  if [ -n "$ENGRAM_DIR" ]; then sync_dir "$ENGRAM_DIR" "$WORKER_ENGRAM_DIR" "Engram"; fi
  say "sync done"
}

main() {
  local cmd=${1:-}
  [ $# -gt 0 ] && shift
  case "$cmd" in
    -h | --help | help | "") usage; [ -n "$cmd" ] || exit 2; exit 0 ;;
  esac
  case "$cmd" in
    start | stop | restart | status | logs | sync) ;;
    *) die "unknown command '$cmd' (start|stop|restart|status|logs|sync)" ;;
  esac
  case "${1:-}" in "" | worker) ;; *) [ "$cmd" = logs ] || die "$cmd: unknown argument '$1' (only 'worker')" ;; esac
  load_config
  case "$cmd" in
    start) cmd_start "$@" ;;
    stop) cmd_stop "$@" ;;
    restart) cmd_stop "$@"; cmd_start "$@" ;;
    status) cmd_status "$@" ;;
    logs) cmd_logs "$@" ;;
    sync) [ $# -eq 0 ] || die "sync takes no arguments"; cmd_sync ;;
  esac
}

main "$@"
