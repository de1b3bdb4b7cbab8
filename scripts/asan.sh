#!/usr/bin/env bash
# AddressSanitizer + LeakSanitizer (+ UBSan) run of the server tests: the engine loop, the API,
# the state pool, the runtime guards and the real-socket concurrency test (64 streams with random
# disconnects); CI runs it as its sanitizer job (.ci/run). Uses its own build
# folder (build-asan, or $DSV41_ASAN_BUILD_DIR) configured with -DDSV41_SANITIZE=ON.
#   scripts/asan.sh            # build + run
#   scripts/asan.sh FILTER     # a gtest filter instead of the default set
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${DSV41_ASAN_BUILD_DIR:-build-asan}
FILTER=${1:-'Scheduler.*:Api.*:Chat.*:Socket.*:Sampling.*:StatePool.*:StateBudget.*:RuntimeGuards.*'}
# -O1 (what AddressSanitizer's authors advise) and line tables only: stack traces keep their file
# and line, and the instrumented build compiles much faster than at -O2 -g on CI's two cores.
cmake -S . -B "$BUILD_DIR" -G Ninja -DDSV41_CUDA=OFF -DDSV41_SANITIZE=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" >/dev/null
cmake --build "$BUILD_DIR" -j "${DSV41_JOBS:-2}" --target test_serve
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:strict_string_checks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
"$BUILD_DIR/tests/test_serve" --gtest_filter="$FILTER"
echo "asan: clean"
