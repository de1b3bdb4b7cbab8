// Shared helpers for the EXL3 tests: fixture access and small numeric comparisons.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <unistd.h>

#include "dsv41/exl3/exl3_tensors.h"
#include "dsv41/loader/safetensors.h"

namespace dsv41::exl3::test {

// A test whose temporary files and folders (under ::testing::TempDir()) are removed afterwards.
class TempDirTest : public ::testing::Test {
 protected:
  // A fresh (removed) path TempDir()/<pid>_name; it is deleted again when the test ends. The pid
  // keeps concurrent runs of the same test (ctest -j, several build folders) apart.
  std::string temp_path(const std::string& name) {
    const std::filesystem::path p =
        std::filesystem::path(::testing::TempDir()) / (std::to_string(::getpid()) + "_" + name);
    std::filesystem::remove_all(p);
    created_.push_back(p.string());
    return p.string();
  }
  void TearDown() override {
    std::error_code ec;
    for (const auto& p : created_) std::filesystem::remove_all(p, ec);
  }

 private:
  std::vector<std::string> created_;
};

inline std::string fixture_path() { return std::string(DSV41_FIXTURES_DIR) + "/exl3/exl3_mul1_k256_n384.safetensors"; }

inline TensorLookup lookup_in(const SafetensorsFile& f) {
  return [&f](const std::string& name) { return f.find(name); };
}

inline std::vector<uint16_t> u16_of(const TensorInfo& t) {
  std::vector<uint16_t> v(t.nbytes / 2);
  std::memcpy(v.data(), t.data, t.nbytes);
  return v;
}

// sqrt(sum (a-b)^2 / sum b^2); infinite when the sizes differ, so a short result cannot pass.
inline double rms_rel(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size() || b.empty()) return INFINITY;
  double num = 0, den = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    num += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    den += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(num / den);
}

// max |a-b| / max |b|; infinite when the sizes differ.
inline double max_rel(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size() || b.empty()) return INFINITY;
  double num = 0, den = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    num = std::max(num, std::fabs(static_cast<double>(a[i]) - b[i]));
    den = std::max(den, std::fabs(static_cast<double>(b[i])));
  }
  return num / den;
}

}  // namespace dsv41::exl3::test
