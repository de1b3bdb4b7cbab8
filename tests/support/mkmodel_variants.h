// Random checkpoints made by `dsv41-serve mkmodel` (DSV41_BINARY) from a fixture's config, and the
// set of storage formats the engine tests run: the release's FP8/FP4 layout and EXL3 with every
// codebook (mul1, 3inst, mcg), several bit widths (1, 2.5 = mixed 2/3, 3, 8), head bits (2, 6 =
// default, 8, 16 = unquantized F16) and mtp bits. Shared by the CPU format tests
// (tests/model/checkpoint_formats_test.cpp) and the CUDA parity tests (tests/gpu_model/).
#pragma once
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "run_cli.h"

namespace dsv41::test {

struct MkmodelVariant {
  std::string name;     // test label and folder name
  std::string fixture;  // config source: <fixtures>/<fixture>/model/config.json
  std::string args;     // mkmodel format arguments
  uint64_t seed;
  // gtest prints a parameter in test listings (ctest names); the label says it all.
  friend void PrintTo(const MkmodelVariant& v, std::ostream* os) { *os << v.name; }
};

// The FP8/FP4 release layout on both fixture configs.
inline std::vector<MkmodelVariant> mkmodel_fp8_variants() {
  return {{"fp8_s0", "tiny-s0", "--format fp8", 3}, {"fp8_long", "tiny-long", "--format fp8", 4}};
}

// EXL3 checkpoints covering the codebooks, bit widths, head and mtp bits.
inline std::vector<MkmodelVariant> mkmodel_exl3_variants() {
  return {{"exl3_mul1_b3", "tiny-s0", "--format exl3 --bits 3 --codebook mul1", 1},
          {"exl3_3inst_b1_head16", "tiny-s0", "--format exl3 --bits 1 --codebook 3inst --head-bits 16 --mtp-bits 2", 2},
          {"exl3_mcg_b2_5", "tiny-long", "--format exl3 --bits 2.5 --codebook mcg --head-bits 8 --mtp-bits 1", 5},
          {"exl3_mul1_b8", "tiny-s0", "--format exl3 --bits 8 --head-bits 2 --mtp-bits 8", 6}};
}

// Runs mkmodel for `v` (plus `extra` arguments) into folder `out`.
inline CliResult run_mkmodel(const std::string& fixtures_dir, const MkmodelVariant& v, const std::string& out,
                             const std::string& extra = {}) {
  return run_cli("mkmodel --config " + fixtures_dir + "/" + v.fixture + "/model/config.json " + v.args +
                     (extra.empty() ? "" : " " + extra) + " --seed " + std::to_string(v.seed) + " --out " + out,
                 Stderr::kMerge);
}

}  // namespace dsv41::test
