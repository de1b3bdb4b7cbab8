// The NCCL collective backend on two GPUs of one host (label `gpu2`: needs two CUDA devices; the
// `gpu` label's one-GPU machine does not run it). One thread per rank, each on its own device, as
// two tensor-parallel processes would be. Checks the results against host arithmetic (also for
// all-reduces enqueued on a caller stream, with their counters and timing), that a rank
// that stops answering makes its peer's call throw instead of hanging, and prints the all-reduce
// time per size (the measured cost the TP projection in bench/RESULTS.md uses).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <thread>
#include <vector>

#include "dist/nccl_collective.h"

using namespace dsv41;
using namespace dsv41::dist;

namespace {

constexpr int kWorld = 2;

void cuda_ok(cudaError_t e) { ASSERT_EQ(e, cudaSuccess) << cudaGetErrorString(e); }

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

// Runs fn(rank, collective) on one thread per rank; every rank's exception is kept.
void on_ranks(const std::function<void(int, DeviceCollective&)>& fn, const std::vector<AbortCheck>& aborts = {}) {
  const std::vector<uint8_t> id = nccl_unique_id();
  std::vector<std::exception_ptr> errors(kWorld);
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld; ++r) {
    threads.emplace_back([&, r] {
      try {
        cudaSetDevice(r);
        auto c = make_nccl_collective(r, kWorld, id, r, aborts.empty() ? AbortCheck{} : aborts[r]);
        fn(r, *c);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kWorld; ++r)
    if (errors[r]) std::rethrow_exception(errors[r]);
}

// Rank 0's abort check when rank 1 skips a collective: rank 1 is reported lost 300 ms after the
// test starts, once it has left (the heartbeat monitor's verdict in a real run).
AbortCheck lost_after_rank1_leaves(const std::atomic<bool>& rank1_done, std::chrono::steady_clock::time_point t0) {
  return [&rank1_done, t0]() -> std::string {
    if (rank1_done && std::chrono::steady_clock::now() - t0 > std::chrono::milliseconds(300))
      return "rank 1 stopped answering (test)";
    return {};
  };
}

TEST(NcclCollective, NeedsTwoDevices) { ASSERT_GE(device_count(), kWorld) << "label gpu2 runs on a machine with two GPUs"; }

TEST(NcclCollective, AllReduceSumsEveryRank) {
  ASSERT_GE(device_count(), kWorld);
  const size_t n = 4096 + 7;  // not a multiple of anything NCCL might chunk by
  std::vector<std::vector<float>> results(kWorld);
  on_ranks([&](int r, DeviceCollective& c) {
    EXPECT_EQ(c.rank(), r);
    EXPECT_EQ(c.world_size(), kWorld);
    EXPECT_STREQ(c.backend(), "nccl");
    // Small integers: the sum is exact in fp32 whatever order NCCL adds in.
    std::vector<float> h(n);
    for (size_t i = 0; i < n; ++i) h[i] = static_cast<float>((i * 7 + r * 13) % 101) - 50.0f;
    float* d = nullptr;
    cuda_ok(cudaMalloc(&d, n * sizeof(float)));
    cuda_ok(cudaMemcpy(d, h.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    c.all_reduce_sum(d, n);
    results[r].resize(n);
    cuda_ok(cudaMemcpy(results[r].data(), d, n * sizeof(float), cudaMemcpyDeviceToHost));
    cudaFree(d);
  });
  for (int r = 0; r < kWorld; ++r)
    for (size_t i = 0; i < n; ++i) {
      float want = 0;
      for (int q = 0; q < kWorld; ++q) want += static_cast<float>((i * 7 + q * 13) % 101) - 50.0f;
      ASSERT_EQ(results[r][i], want) << "rank " << r << " element " << i;
    }
}

TEST(NcclCollective, AllGatherOfUnequalParts) {
  ASSERT_GE(device_count(), kWorld);
  const std::vector<size_t> counts = {1000, 37};  // unequal: exercises the broadcast-per-rank path
  const size_t total = counts[0] + counts[1];
  std::vector<std::vector<uint8_t>> results(kWorld);
  on_ranks([&](int r, DeviceCollective& c) {
    std::vector<uint8_t> mine(counts[r]);
    for (size_t i = 0; i < mine.size(); ++i) mine[i] = static_cast<uint8_t>(i * 31 + r * 101 + 5);
    uint8_t *send = nullptr, *out = nullptr;
    cuda_ok(cudaMalloc(&send, counts[r]));
    cuda_ok(cudaMalloc(&out, total));
    cuda_ok(cudaMemset(out, 0xEE, total));
    cuda_ok(cudaMemcpy(send, mine.data(), counts[r], cudaMemcpyHostToDevice));
    c.all_gather(send, counts, out);
    results[r].resize(total);
    cuda_ok(cudaMemcpy(results[r].data(), out, total, cudaMemcpyDeviceToHost));
    cudaFree(send);
    cudaFree(out);
  });
  for (int r = 0; r < kWorld; ++r) {
    size_t off = 0;
    for (int q = 0; q < kWorld; ++q) {
      for (size_t i = 0; i < counts[q]; ++i)
        ASSERT_EQ(results[r][off + i], static_cast<uint8_t>(i * 31 + q * 101 + 5)) << "rank " << r << " part " << q;
      off += counts[q];
    }
  }
}

// How the CUDA engine calls it: all-reduces enqueued on the caller's stream behind its own work,
// no wait per call; the engine's wait polls check_alive; settle() then collects the event timing
// (DSV41_TP_TIMING=1) into the counters /metrics shows.
TEST(NcclCollective, AllReducesOnTheCallersStreamAreOrderedCountedAndTimed) {
  ASSERT_GE(device_count(), kWorld);
  ASSERT_EQ(setenv("DSV41_TP_TIMING", "1", 1), 0);
  const size_t n = 3 * 4096 + 5;
  std::vector<std::vector<float>> results(kWorld);
  std::vector<CollectiveStats> stats(kWorld);
  on_ranks([&](int r, DeviceCollective& c) {
    cudaStream_t s = nullptr;
    cuda_ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    std::vector<float> h(n);
    for (size_t i = 0; i < n; ++i) h[i] = static_cast<float>((i * 5 + r * 11) % 61) - 30.0f;
    float* d = nullptr;
    cuda_ok(cudaMalloc(&d, n * sizeof(float)));
    cuda_ok(cudaMemsetAsync(d, 0, n * sizeof(float), s));
    // Pinned, so the copy is queued behind the memset rather than done at once.
    float* pinned = nullptr;
    cuda_ok(cudaMallocHost(&pinned, n * sizeof(float)));
    std::copy(h.begin(), h.end(), pinned);
    cuda_ok(cudaMemcpyAsync(d, pinned, n * sizeof(float), cudaMemcpyHostToDevice, s));
    c.all_reduce_sum_on(d, n, s);  // S
    c.all_reduce_sum_on(d, n, s);  // 2 S: the second must follow the first on the stream
    for (int i = 0;; ++i) {
      const cudaError_t e = cudaStreamQuery(s);
      if (e == cudaSuccess) break;
      ASSERT_EQ(e, cudaErrorNotReady) << cudaGetErrorString(e);
      c.check_alive("test");
      poll_backoff(i);
    }
    c.settle();
    stats[r] = c.stats();
    results[r].resize(n);
    cuda_ok(cudaMemcpy(results[r].data(), d, n * sizeof(float), cudaMemcpyDeviceToHost));
    cudaFreeHost(pinned);
    cudaFree(d);
    cudaStreamDestroy(s);
  });
  unsetenv("DSV41_TP_TIMING");
  for (int r = 0; r < kWorld; ++r) {
    for (size_t i = 0; i < n; ++i) {
      float want = 0;
      for (int q = 0; q < kWorld; ++q) want += static_cast<float>((i * 5 + q * 11) % 61) - 30.0f;
      ASSERT_EQ(results[r][i], 2 * want) << "rank " << r << " element " << i;
    }
    EXPECT_EQ(stats[r].all_reduce_calls, 2u);
    EXPECT_EQ(stats[r].all_reduce_bytes, 2 * n * sizeof(float));
    EXPECT_EQ(stats[r].timed_calls, 2u);
    EXPECT_GT(stats[r].seconds, 0.0);
    EXPECT_LT(stats[r].seconds, 10.0);
  }
}

// The engine's case of a lost peer: the all-reduce is already on its compute stream when rank 1
// goes silent. Polling check_alive must throw the tensor-parallel error once the abort check
// fires, and the abort must end the NCCL kernel so the stream drains (later waits do not hang).
TEST(NcclCollective, SilentPeerEndsAnEnqueuedAllReduce) {
  ASSERT_GE(device_count(), kWorld);
  const auto t0 = std::chrono::steady_clock::now();
  std::atomic<bool> rank1_done{false};
  const AbortCheck rank0_abort = lost_after_rank1_leaves(rank1_done, t0);
  std::string rank0_error;
  bool drained = false;
  on_ranks(
      [&](int r, DeviceCollective& c) {
        if (r == 1) {
          rank1_done = true;
          return;
        }
        cudaStream_t s = nullptr;
        cuda_ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        float* d = nullptr;
        cuda_ok(cudaMalloc(&d, 1024 * sizeof(float)));
        try {
          c.all_reduce_sum_on(d, 1024, s);
          for (int i = 0; cudaStreamQuery(s) == cudaErrorNotReady; ++i) {
            c.check_alive("all_reduce");
            poll_backoff(i);
          }
        } catch (const TpUnavailable& e) {
          rank0_error = e.what();
        }
        const auto t1 = std::chrono::steady_clock::now();
        while (cudaStreamQuery(s) == cudaErrorNotReady && std::chrono::steady_clock::now() - t1 < std::chrono::seconds(10))
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        drained = cudaStreamQuery(s) != cudaErrorNotReady;
        // Every later call fails at once, naming the aborted communicator.
        try {
          c.all_reduce_sum_on(d, 1024, s);
          ADD_FAILURE() << "an all-reduce after the abort did not throw";
        } catch (const TpUnavailable& e) {
          EXPECT_NE(std::string(e.what()).find("aborted"), std::string::npos) << e.what();
        }
        if (drained) {
          cudaFree(d);
          cudaStreamDestroy(s);
        }
      },
      {rank0_abort, AbortCheck{}});
  EXPECT_NE(rank0_error.find("tensor-parallel"), std::string::npos) << rank0_error;
  EXPECT_TRUE(drained) << "the aborted all-reduce kept the stream busy for 10 s";
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(25));
}

// Rank 1 never joins the all-reduce; rank 0's abort check (the heartbeat monitor in a real run)
// reports it lost after 300 ms: the call must throw the tensor-parallel error, not hang.
TEST(NcclCollective, SilentPeerMakesTheCallThrow) {
  ASSERT_GE(device_count(), kWorld);
  const auto t0 = std::chrono::steady_clock::now();
  std::atomic<bool> rank1_done{false};
  const AbortCheck rank0_abort = lost_after_rank1_leaves(rank1_done, t0);
  std::string rank0_error;
  try {
    on_ranks(
        [&](int r, DeviceCollective& c) {
          if (r == 1) {
            rank1_done = true;
            return;  // skips the collective: its communicator is torn down with the thread
          }
          float* d = nullptr;
          cuda_ok(cudaMalloc(&d, 1024 * sizeof(float)));
          try {
            c.all_reduce_sum(d, 1024);
          } catch (const TpUnavailable& e) {
            rank0_error = e.what();
          }
          cudaFree(d);
        },
        {rank0_abort, AbortCheck{}});
  } catch (const std::exception& e) {
    FAIL() << "unexpected error: " << e.what();
  }
  EXPECT_NE(rank0_error.find("tensor-parallel"), std::string::npos) << rank0_error;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(20));
}

// All-reduce time per call for the sizes a decode/prefill step of the released model moves
// (dim 4096 fp32 = 16 KiB per token; batches and prefill chunks up to 32 MiB). Printed, and
// checked only for being finite and positive: speed is judged by benchmarks, not tests.
TEST(NcclCollective, AllReduceTimePerSize) {
  ASSERT_GE(device_count(), kWorld);
  const std::vector<size_t> sizes = {4096, 4 * 4096, 64 * 4096, 2048 * 4096};
  std::vector<std::vector<double>> us(kWorld, std::vector<double>(sizes.size()));
  on_ranks([&](int r, DeviceCollective& c) {
    float* d = nullptr;
    cuda_ok(cudaMalloc(&d, sizes.back() * sizeof(float)));
    cuda_ok(cudaMemset(d, 0, sizes.back() * sizeof(float)));
    for (size_t s = 0; s < sizes.size(); ++s) {
      for (int i = 0; i < 5; ++i) c.all_reduce_sum(d, sizes[s]);  // warm-up
      const int iters = 50;
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < iters; ++i) c.all_reduce_sum(d, sizes[s]);
      us[r][s] = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / iters;
    }
    cudaFree(d);
  });
  for (size_t s = 0; s < sizes.size(); ++s) {
    const double bytes = static_cast<double>(sizes[s]) * sizeof(float);
    std::printf("nccl all_reduce_sum fp32 %10.0f bytes: rank0 %8.1f us, rank1 %8.1f us (%.2f GB/s algbw)\n", bytes,
                us[0][s], us[1][s], bytes / us[0][s] / 1e3);
    EXPECT_GT(us[0][s], 0.0);
    EXPECT_LT(us[0][s], 1e6);
  }
}

}  // namespace
