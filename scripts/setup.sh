#!/usr/bin/env bash
# Installs every Debian dependency (idempotent, non-interactive) and builds dsv41-serve into
# build/ (or $DSV41_BUILD_DIR). CUDA is used when nvcc is found (DSV41_CUDA=AUTO|ON|OFF).
set -euo pipefail
cd "$(dirname "$0")/.."

PKGS=(build-essential cmake ninja-build ccache pkg-config git
      libcpp-httplib-dev nlohmann-json3-dev libspdlog-dev libfmt-dev libcli11-dev
      libgtest-dev libgmock-dev libibverbs-dev libpcre2-dev libutf8proc-dev)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  echo "setup: installing ${missing[*]}"
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

BUILD_DIR=${DSV41_BUILD_DIR:-build}
CUDA_MODE=${DSV41_CUDA:-AUTO}
EXTRA=()
[ -n "${CUDA_ARCHS:-}" ] && EXTRA+=("-DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCHS}")
cmake -S . -B "$BUILD_DIR" -G Ninja -DDSV41_CUDA="$CUDA_MODE" "${EXTRA[@]}" ${DSV41_CMAKE_ARGS:-}
cmake --build "$BUILD_DIR" -j "${DSV41_JOBS:-$(nproc)}"
echo "setup: built $BUILD_DIR/dsv41-serve"
