// Start-up weight uploads through pinned staging (src/cuda_model/cuda_upload.h) leave exactly the
// source bytes on the device: pieces smaller and larger than a slot, unaligned offsets, slots
// reused many times over (tiny slots), and sources freed right after upload() returns.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "cuda_model/cuda_upload.h"
#include "dsv41/common/error.h"

using dsv41::model::cuda::StagedUploader;
using dsv41::ops::gpu::DeviceBuffer;

namespace {

std::vector<uint8_t> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

// Uploads `sizes` pieces back to back into one buffer through `up` and checks the device copy.
void check_pieces(StagedUploader& up, const std::vector<size_t>& sizes, uint32_t seed) {
  size_t total = 0;
  for (size_t s : sizes) total += s;
  const std::vector<uint8_t> want = random_bytes(total, seed);
  DeviceBuffer d(total);
  size_t off = 0;
  for (size_t s : sizes) {
    std::vector<uint8_t> src(want.begin() + static_cast<std::ptrdiff_t>(off),
                             want.begin() + static_cast<std::ptrdiff_t>(off + s));
    up.upload(d, src.data(), s, off);  // src is freed right after: upload() must have copied it
    off += s;
  }
  up.finish();
  EXPECT_EQ(d.to_host<uint8_t>(total), want);
}

TEST(StagedUpload, SmallSlotsWrapManyTimes) {
  StagedUploader up(4096, 2);
  check_pieces(up, {1, 7, 4096, 4095, 4097, 100000, 3, 12289, 1}, 1);
  EXPECT_EQ(up.bytes_uploaded(), 1u + 7 + 4096 + 4095 + 4097 + 100000 + 3 + 12289 + 1);
}

TEST(StagedUpload, PiecesLargerThanTheParallelCopySplit) {
  // Pieces of several MiB go through the parallel host copy; slots of 3 MiB split them unevenly.
  StagedUploader up(size_t{3} << 20, 3);
  check_pieces(up, {(size_t{5} << 20) + 17, 1 << 20, 255, (size_t{9} << 20) + 1}, 2);
}

TEST(StagedUpload, VectorsAndSeveralBuffers) {
  StagedUploader up(8192, 4);
  const std::vector<uint8_t> a = random_bytes(50000, 3);
  std::vector<float> b(3001);
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(i) * 0.25f - 7.0f;
  DeviceBuffer da = up.from(a);
  DeviceBuffer db = up.from(b);
  up.finish();
  EXPECT_EQ(da.to_host<uint8_t>(a.size()), a);
  EXPECT_EQ(db.to_host<float>(b.size()), b);
}

TEST(StagedUpload, OverrunIsAnError) {
  StagedUploader up(4096, 2);
  DeviceBuffer d(100);
  const std::vector<uint8_t> src(64, 1);
  EXPECT_THROW(up.upload(d, src.data(), 64, 40), dsv41::Error);
}

}  // namespace
