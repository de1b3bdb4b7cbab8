#!/usr/bin/env bash
# The main job on a fresh machine: build, make a small random DeepSeek-V4.1-architecture model
# with the real DeepSeek vocabulary, serve it with the OpenAI-compatible API, print a curl line.
#
# The weights are RANDOM: the server works end to end (tokenizer, chat format, batching, streaming,
# tool-call parsing) but the text it generates is meaningless. For the real model, point the
# server at the released checkpoint folder instead:
#   build/dsv41-serve --model /path/to/DeepSeek-V4.1-Flash --host 127.0.0.1 --port 8888
#
# Environment: DSV41_BUILD_DIR (default build), DSV41_DEMO_DIR (default build/demo-model),
# DSV41_PORT (default 8888), DSV41_API_KEY (optional bearer key).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${DSV41_BUILD_DIR:-build}
DEMO_DIR=${DSV41_DEMO_DIR:-$BUILD_DIR/demo-model}
PORT=${DSV41_PORT:-8888}
TOKENIZER=tests/fixtures/tokenizer/deepseek_v3_tokenizer.json

# 1. Build (installs Debian packages when missing).
scripts/setup.sh
BIN=$BUILD_DIR/dsv41-serve

# 2. A small random model: the tiny test architecture with the real 129,280-token vocabulary.
if [ ! -f "$DEMO_DIR/config.json" ]; then
  echo "demo: writing a random model to $DEMO_DIR"
  "$BIN" mkmodel --config scripts/demo-model-config.json --format fp8 --seed 1 --out "$DEMO_DIR"
  cp "$TOKENIZER" "$DEMO_DIR/tokenizer.json"
  "$BIN" engram-map --tokenizer "$DEMO_DIR/tokenizer.json" --out "$DEMO_DIR/engram_token_map.safetensors"
fi

# 3. Serve on the GPU when there is one and this build has CUDA (the CUDA kernels library is part
#    of it), else on the CPU engine.
DEVICE=cpu
if grep -q dsv41_kernels "$BUILD_DIR/build.ninja" 2>/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  DEVICE=cuda
fi
echo "demo: starting the server on 127.0.0.1:$PORT (device $DEVICE)"
"$BIN" --model "$DEMO_DIR" --served-model-name demo --engram-token-map "$DEMO_DIR/engram_token_map.safetensors" \
  --host 127.0.0.1 --port "$PORT" --device "$DEVICE" --kv-cache-gib 1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' INT TERM
for _ in $(seq 300); do
  curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && break
  kill -0 $SERVER 2>/dev/null || { echo "demo: the server exited" >&2; exit 1; }
  sleep 0.2
done
AUTH=""
[ -n "${DSV41_API_KEY:-}" ] && AUTH=" -H 'Authorization: Bearer $DSV41_API_KEY'"
CURL="curl -s http://127.0.0.1:$PORT/v1/chat/completions -H 'Content-Type: application/json'$AUTH -d '{\"model\": \"demo\", \"messages\": [{\"role\": \"user\", \"content\": \"Hello!\"}], \"max_tokens\": 24, \"chat_template_kwargs\": {\"thinking\": false}}'"
echo
echo "demo: the server is up (random weights: the answer is meaningless text). Try:"
echo
echo "  $CURL"
echo
eval "$CURL"
echo
echo
echo "demo: serving until Ctrl-C (pid $SERVER)"
wait $SERVER
