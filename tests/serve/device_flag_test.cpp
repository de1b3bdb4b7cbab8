// --device: cpu, cuda or auto. Combinations the CUDA engine cannot serve are refused with one
// precise message before anything loads or listens (no GPU is needed to see them).
#include <gtest/gtest.h>

#include <string>

#include "../support/process.h"
#include "../support/run_cli.h"

namespace {

const std::string kModel = std::string(DSV41_FIXTURES_DIR) + "/tiny-s0/model";

dsv41::test::CliResult serve(const std::string& args) {
  return dsv41::test::run_cli("--model " + kModel + " --port " + std::to_string(dsv41::test::free_port()) + " " + args,
                              dsv41::test::Stderr::kMerge);
}

}  // namespace

TEST(DeviceFlag, UnknownDeviceIsRefused) {
  const auto r = serve("--device tpu");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.out.find("--device tpu: expected cpu, cuda or auto"), std::string::npos) << r.out;
}

TEST(DeviceFlag, CudaTensorParallelWithDsparkSpeculationIsRefused) {
  // CUDA tensor parallelism (tests/gpu2_tp) does not split the DSpark stages yet.
  const auto r = serve("--device cuda --world-size 2 --rank 0 --spec-method dspark");
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("--device cuda: speculative decoding (--spec-method dspark) with tensor parallelism "
                       "(--world-size 2) runs on the CPU engine only"),
            std::string::npos)
      << r.out;
}

#if !DSV41_HAS_CUDA
TEST(DeviceFlag, CudaWithoutCudaInTheBuildSaysSo) {
  const auto r = serve("--device cuda");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.out.find("--device cuda: this dsv41-serve was built without CUDA"), std::string::npos) << r.out;
}
#endif
