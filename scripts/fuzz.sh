#!/usr/bin/env bash
# Builds the libFuzzer targets with clang in build-fuzz/ (or $DSV41_FUZZ_BUILD_DIR) and runs each
# for N seconds (default 20): `scripts/fuzz.sh [SECONDS]`. Corpora persist in build-fuzz/corpus/,
# so repeated runs go deeper. Prints one "fuzz: TARGET: N execs in S s" line per target and
# exits non-zero on the first finding (a crash file is left in build-fuzz/findings/).
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-20}
BUILD=${DSV41_FUZZ_BUILD_DIR:-build-fuzz}
command -v clang++ >/dev/null || { echo "fuzz: clang++ not found (apt-get install clang)" >&2; exit 2; }

cmake -S . -B "$BUILD" -G Ninja -DDSV41_CUDA=OFF -DDSV41_FUZZ=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ >/dev/null
cmake --build "$BUILD" -j "${DSV41_JOBS:-2}" --target fuzz_safetensors fuzz_config

# Seeds: small valid and invalid safetensors images, and the configs the project ships.
seed_st="$BUILD/corpus/safetensors" seed_cfg="$BUILD/corpus/config"
mkdir -p "$seed_st" "$seed_cfg" "$BUILD/findings"
st_image() {  # header json -> 8-byte little-endian length + header + 16 data bytes
  local h=$1 n=${#1}
  printf "$(printf '\\x%02x\\x%02x\\x00\\x00\\x00\\x00\\x00\\x00' $((n & 255)) $((n >> 8)))"
  printf '%s' "$h"
  printf '\x00\x00\x80\x3f\x00\x00\x00\x40\x01\x02\x03\x04\x05\x06\x07\x08'
}
st_image '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F8_E4M3","shape":[2,4],"data_offsets":[8,16]}}' >"$seed_st/two"
st_image '{"__metadata__":{"format":"pt"},"w":{"dtype":"BF16","shape":[2,2],"data_offsets":[0,8]},"z":{"dtype":"I8","shape":[0],"data_offsets":[8,8]}}' >"$seed_st/meta"
st_image '{"x":{"dtype":"I16","shape":[1,2,2],"data_offsets":[0,8]},"m":{"dtype":"I32","shape":[],"data_offsets":[8,12]}}' >"$seed_st/exl3"
cp tests/fixtures/tiny-s0/model/config.json "$seed_cfg/tiny-s0.json"
cp tests/fixtures/tiny-long/model/config.json "$seed_cfg/tiny-long.json"
cp configs/deepseek-v4.1-flash.json "$seed_cfg/released.json"

status=0
for target in fuzz_safetensors fuzz_config; do
  corpus=$seed_st; [ "$target" = fuzz_config ] && corpus=$seed_cfg
  log="$BUILD/$target.log"
  if ! "$BUILD/tests/fuzz/$target" -max_total_time="$secs" -max_len=8192 -print_final_stats=1 \
      -artifact_prefix="$BUILD/findings/$target-" "$corpus" >"$log" 2>&1; then
    echo "fuzz: $target: FINDING (see $log and $BUILD/findings/)" >&2
    tail -n 40 "$log" >&2
    status=1
  fi
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo 0)
  echo "fuzz: $target: $execs execs in $secs s (corpus $(ls "$corpus" | wc -l) inputs)"
done
exit $status
