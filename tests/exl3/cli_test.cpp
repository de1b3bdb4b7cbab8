// `dsv41-serve exl3-dequant` run as a process against the fixture.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "exl3_test_util.h"

namespace dsv41::exl3 {
namespace {

namespace fs = std::filesystem;

class Exl3DequantCli : public test::TempDirTest {};

int run(const std::string& args) {
  const std::string cmd = std::string(DSV41_BINARY) + " " + args + " > /dev/null 2>&1";
  const int rc = std::system(cmd.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

TEST_F(Exl3DequantCli, MatchesFixtureForEveryK) {
  auto ref = SafetensorsFile::open(test::fixture_path());
  for (int K : {2, 3, 4}) {
    const std::string p = "k" + std::to_string(K);
    const std::string out = temp_path("exl3_dequant_" + p + ".safetensors");
    ASSERT_EQ(run("exl3-dequant --in " + test::fixture_path() + " --prefix " + p + " --out " + out), 0) << p;
    auto f = SafetensorsFile::open(out);
    const TensorInfo* hat = f->find("w_hat");
    const TensorInfo* full = f->find("w_full");
    ASSERT_NE(hat, nullptr);
    ASSERT_NE(full, nullptr);
    EXPECT_EQ(hat->dtype, DType::F16);
    EXPECT_EQ(full->dtype, DType::F32);
    EXPECT_EQ(hat->shape, (std::vector<int64_t>{256, 384}));
    EXPECT_EQ(full->shape, (std::vector<int64_t>{256, 384}));
    EXPECT_EQ(test::u16_of(*hat), test::u16_of(*ref->find(p + ".ref_w_hat_f16"))) << p;
    EXPECT_LT(test::rms_rel(tensor_to_f32(*full), tensor_to_f32(*ref->find(p + ".ref_w_full_f32"))), 2e-3) << p;
  }
}

TEST_F(Exl3DequantCli, BadInputExitsWithError) {
  const std::string out = temp_path("exl3_dequant_bad.safetensors");
  EXPECT_EQ(run("exl3-dequant --in " + test::fixture_path() + " --prefix k7 --out " + out), 1);
  EXPECT_EQ(run("exl3-dequant --in /nonexistent.safetensors --prefix k2 --out " + out), 1);
  EXPECT_FALSE(fs::exists(out));
}

}  // namespace
}  // namespace dsv41::exl3
