// Inputs of the GPU linear tests and benchmarks: random weights written as a checkpoint (so the CPU
// reference reads them through its own loader) and activations quantised on the device.
#pragma once
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "dsv41/loader/checkpoint.h"
#include "dsv41/loader/safetensors.h"
#include "dsv41/ops/gpu_buffer.h"
#include "dsv41/ops/gpu_ops.h"

namespace dsv41::test {

// A checkpoint folder under the temp dir holding the tensors added to `w`; removed on destruction.
struct TempCheckpoint {
  std::string dir;
  std::unique_ptr<Checkpoint> ck;
  explicit TempCheckpoint(const SafetensorsWriter& w) {
    char tmpl[] = "/tmp/dsv41_gpu_linear_XXXXXX";
    const char* d = mkdtemp(tmpl);
    if (!d) throw std::runtime_error("mkdtemp failed");
    dir = d;
    w.write(dir + "/weights.safetensors");
    ck = Checkpoint::open(dir);
  }
  ~TempCheckpoint() {
    ck.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  TempCheckpoint(const TempCheckpoint&) = delete;
  TempCheckpoint& operator=(const TempCheckpoint&) = delete;
};

// ActQuant8 of x on the device (verified exact by GpuOps.ActQuant8Exact); finished before the
// constructor returns, so calls on any stream may read it.
struct QuantAct {
  ops::gpu::DeviceBuffer x, codes, scales;
  QuantAct(const std::vector<float>& xv, int64_t rows, int64_t k)
      : x(ops::gpu::DeviceBuffer::from(xv)),
        codes(static_cast<size_t>(rows * k)),
        scales(static_cast<size_t>(rows * (k / 32)) * 4) {
    ops::gpu::ActQuantArgs a;
    a.x = x.as<float>();
    a.rows = rows;
    a.k = k;
    a.x_stride = k;
    a.codes = codes.as<uint8_t>();
    a.scales = scales.as<float>();
    ops::gpu::act_quant8(a, nullptr);
    ops::gpu::check_cuda(cudaDeviceSynchronize(), "act_quant8");
  }
};

}  // namespace dsv41::test
