#!/usr/bin/env bash
# The test command: installs dependencies, builds, and runs every CPU test (ctest label `cpu`).
# On a machine with a GPU, `scripts/test.sh gpu` runs the GPU parity tests instead.
set -euo pipefail
cd "$(dirname "$0")/.."
label=${1:-cpu}
scripts/setup.sh
# The OpenAI JS SDK client test (ctest js_openai_sdk) needs tests/js/node_modules: install the
# pinned package from the committed lock file (node/npm from Debian when missing).
if ! command -v npm >/dev/null; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nodejs npm
fi
if [ "$label" = cpu ]; then (cd tests/js && npm ci --no-audit --no-fund --loglevel=error); fi
BUILD_DIR=${DSV41_BUILD_DIR:-build}
ctest --test-dir "$BUILD_DIR" -L "$label" --output-on-failure -j "${DSV41_TEST_JOBS:-$(nproc)}"
