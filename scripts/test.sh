#!/usr/bin/env bash
# The test command: installs dependencies, builds, and runs every CPU test (ctest label `cpu`).
# On a machine with a GPU, `scripts/test.sh gpu` runs the GPU parity tests instead.
set -euo pipefail
cd "$(dirname "$0")/.."
label=${1:-cpu}
scripts/setup.sh
BUILD_DIR=${DSV41_BUILD_DIR:-build}
ctest --test-dir "$BUILD_DIR" -L "$label" --output-on-failure -j "${DSV41_TEST_JOBS:-$(nproc)}"
