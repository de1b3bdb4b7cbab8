#!/usr/bin/env bash
# The test command: installs dependencies, builds, and runs every CPU test (ctest label `cpu`).
# On a machine with a GPU, `scripts/test.sh gpu` runs the GPU parity tests instead.
set -euo pipefail
cd "$(dirname "$0")/.."
label=${1:-cpu}
t0=$(date +%s)
scripts/setup.sh
echo "test: setup and build took $(( $(date +%s) - t0 )) s"
# The OpenAI JS SDK client test (ctest js_openai_sdk) needs tests/js/node_modules: install the
# pinned package from the committed lock file (node/npm from Debian when missing).
if ! command -v npm >/dev/null; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nodejs npm
fi
# Bounded so a stalled registry fails the run with a message instead of eating CI's time limit.
if [ "$label" = cpu ]; then
  (cd tests/js && timeout 600 npm ci --no-audit --no-fund --loglevel=error --fetch-timeout=60000 --fetch-retries=2) ||
    { echo "test: npm ci failed or took over 600 s (tests/js/node_modules)" >&2; exit 1; }
fi
BUILD_DIR=${DSV41_BUILD_DIR:-build}
t1=$(date +%s)
# A hung test fails after 600 s, named, instead of running into CI's time limit.
ctest --test-dir "$BUILD_DIR" -L "$label" --output-on-failure --timeout 600 -j "${DSV41_TEST_JOBS:-$(nproc)}"
echo "test: ctest took $(( $(date +%s) - t1 )) s"
