// The state pool counts and limits, but the bytes come from the memory the model names
// (Model::state_memory(): the heap for host engines, device memory for the CUDA engine). These
// tests put recording and untouchable upstreams under the pool and under the scheduler.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <map>
#include <mutex>
#include <random>
#include <stdexcept>

#include "dsv41/common/error.h"
#include "sched/scheduler.h"
#include "rule_helpers.h"
#include "test_model.h"

using namespace dsv41;
using namespace std::chrono_literals;

namespace {

// Heap memory that remembers every live block (pointer -> size, alignment) it handed out.
class RecordingMemory final : public std::pmr::memory_resource {
 public:
  int64_t live_bytes() const { std::lock_guard lk(mu_); return live_bytes_; }
  int64_t peak_bytes() const { std::lock_guard lk(mu_); return peak_; }
  int64_t allocations() const { std::lock_guard lk(mu_); return allocations_; }
  size_t live_blocks() const { std::lock_guard lk(mu_); return live_.size(); }
  int64_t mismatched_frees() const { std::lock_guard lk(mu_); return mismatched_; }
  bool owns(const void* p) const { std::lock_guard lk(mu_); return live_.count(p) > 0; }

 private:
  void* do_allocate(size_t bytes, size_t alignment) override {
    void* p = std::pmr::new_delete_resource()->allocate(bytes, alignment);
    std::lock_guard lk(mu_);
    live_[p] = {bytes, alignment};
    live_bytes_ += static_cast<int64_t>(bytes);
    peak_ = std::max(peak_, live_bytes_);
    ++allocations_;
    return p;
  }
  void do_deallocate(void* p, size_t bytes, size_t alignment) override {
    {
      std::lock_guard lk(mu_);
      auto it = live_.find(p);
      if (it == live_.end() || it->second.first != bytes || it->second.second != alignment) ++mismatched_;
      if (it != live_.end()) live_.erase(it);
      live_bytes_ -= static_cast<int64_t>(bytes);
    }
    std::pmr::new_delete_resource()->deallocate(p, bytes, alignment);
  }
  bool do_is_equal(const std::pmr::memory_resource& o) const noexcept override { return this == &o; }

  mutable std::mutex mu_;
  std::map<const void*, std::pair<size_t, size_t>> live_;
  int64_t live_bytes_ = 0, peak_ = 0, allocations_ = 0, mismatched_ = 0;
};

// Stands in for device memory: addresses inside pages the host may not read or write (any access
// by the pool would fault), handed out by a bump pointer.
class UntouchableMemory final : public std::pmr::memory_resource {
 public:
  explicit UntouchableMemory(size_t bytes) : size_(bytes) {
    base_ = static_cast<std::byte*>(::mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  }
  ~UntouchableMemory() override { ::munmap(base_, size_); }
  bool inside(const void* p, size_t n) const {
    auto* b = static_cast<const std::byte*>(p);
    return b >= base_ && b + n <= base_ + size_;
  }
  int64_t frees = 0;

 private:
  void* do_allocate(size_t bytes, size_t alignment) override {
    next_ = (next_ + alignment - 1) / alignment * alignment;
    if (next_ + bytes > size_) throw std::bad_alloc();
    void* p = base_ + next_;
    next_ += bytes;
    return p;
  }
  void do_deallocate(void*, size_t, size_t) override { ++frees; }
  bool do_is_equal(const std::pmr::memory_resource& o) const noexcept override { return this == &o; }

  std::byte* base_ = nullptr;
  size_t size_ = 0, next_ = 0;
};

// Refuses every allocation (an exhausted device).
class RefusingMemory final : public std::pmr::memory_resource {
  void* do_allocate(size_t bytes, size_t) override { fail("no device memory for {} bytes", bytes); }
  void do_deallocate(void*, size_t, size_t) override {}
  bool do_is_equal(const std::pmr::memory_resource& o) const noexcept override { return this == &o; }
};

// The rule test double whose states must live in a memory of its choosing.
class UpstreamRuleModel final : public test_support::RuleModel {
 public:
  UpstreamRuleModel(ModelConfig c, std::pmr::memory_resource& m) : RuleModel(std::move(c)), memory_(m) {}
  std::pmr::memory_resource& state_memory() const override { return memory_; }

 private:
  std::pmr::memory_resource& memory_;
};

}  // namespace

TEST(StatePoolUpstream, HostEnginesKeepTheHeap) {
  sched::StatePool pool(1 << 20, 16);
  EXPECT_EQ(pool.upstream(), std::pmr::new_delete_resource());
  test_support::RuleModel m(test_support::tiny_config());
  EXPECT_EQ(&m.state_memory(), std::pmr::new_delete_resource());  // the Model default
  sched::Scheduler s(m, sched::SchedulerOptions{});
  EXPECT_EQ(s.pool().upstream(), &m.state_memory());
  EXPECT_THROW(sched::StatePool(1 << 20, 16, nullptr), Error);
}

TEST(StatePoolUpstream, EveryByteComesFromAndReturnsToTheUpstream) {
  RecordingMemory up;
  sched::StatePool pool(1 << 20, 16, &up);
  void* a = pool.allocate(1000, 256);
  void* b = pool.allocate(24, 8);
  EXPECT_TRUE(up.owns(a));
  EXPECT_TRUE(up.owns(b));
  EXPECT_EQ(up.live_bytes(), 1024);
  EXPECT_EQ(pool.used_bytes(), 1024);
  EXPECT_EQ(pool.live_allocations(), 2);
  pool.deallocate(a, 1000, 256);
  EXPECT_FALSE(up.owns(a));
  EXPECT_EQ(up.live_bytes(), 24);
  EXPECT_EQ(pool.used_bytes(), 24);
  pool.deallocate(b, 24, 8);
  EXPECT_EQ(up.live_blocks(), 0u);
  EXPECT_EQ(up.mismatched_frees(), 0);  // size and alignment passed through unchanged
  EXPECT_EQ(pool.used_bytes(), 0);
  EXPECT_EQ(pool.peak_bytes(), 1024);
}

TEST(StatePoolUpstream, ThePoolNeverTouchesUpstreamMemory) {
  // Device memory in disguise: the pool must only count and pass pointers on.
  UntouchableMemory up(1 << 20);
  sched::StatePool pool(1 << 20, 16, &up);
  std::vector<std::pair<void*, size_t>> blocks;
  for (size_t n : {4096u, 100u, 65536u, 7u}) {
    void* p = pool.allocate(n, 256);
    EXPECT_TRUE(up.inside(p, n));
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 256, 0u);
    blocks.emplace_back(p, n);
  }
  EXPECT_EQ(pool.used_bytes(), 4096 + 100 + 65536 + 7);
  for (auto& [p, n] : blocks) pool.deallocate(p, n, 256);
  EXPECT_EQ(up.frees, 4);
  EXPECT_EQ(pool.used_bytes(), 0);
  EXPECT_EQ(pool.live_allocations(), 0);
}

TEST(StatePoolUpstream, ARefusedAllocationIsNotCounted) {
  RefusingMemory up;
  sched::StatePool pool(1 << 20, 16, &up);
  EXPECT_THROW((void)pool.allocate(4096, 64), Error);
  EXPECT_EQ(pool.used_bytes(), 0);
  EXPECT_EQ(pool.live_allocations(), 0);
  EXPECT_EQ(pool.peak_bytes(), 0);
}

TEST(StatePoolUpstream, TheSchedulerDrawsStatesFromTheModelsMemory) {
  // Growth and preemption as in the scheduler tests, with every state byte in the model's memory.
  RecordingMemory up;
  UpstreamRuleModel m(test_support::tiny_config(), up);
  const auto b = sched::state_bytes(m.config());
  sched::SchedulerOptions o;
  o.max_num_seqs = 8;
  o.max_num_batched_tokens = 64;
  // About two and a half sequences of 100 tokens: six must take turns (preemption).
  o.kv_cache_gib = 2.5 * static_cast<double>(b.packed_fixed + 112 * b.packed_per_token) / (1024.0 * 1024.0 * 1024.0);
  sched::Scheduler s(m, o);
  EXPECT_EQ(s.pool().upstream(), &up);
  // All six queued before the loop starts, so that they compete for the pool whatever the thread
  // timing (submitted to a running loop, the first could finish before the last arrive).
  std::vector<std::shared_ptr<sched::TokenChannel>> chans;
  for (int i = 0; i < 6; ++i) chans.push_back(s.submit([&] {
    sched::GenerationRequest r;
    r.prompt = test_support::random_prompt(300 + i, 20);
    r.max_tokens = 80;
    r.sampling.temperature = 0;
    return r;
  }()));
  s.start();
  for (int i = 0; i < 6; ++i) EXPECT_EQ(test_support::drain_ids(*chans[i]), test_support::rule_greedy(m, test_support::random_prompt(300 + i, 20), 80)) << i;
  EXPECT_GT(s.stats().preemptions_total, 0);
  s.stop();
  EXPECT_GT(up.allocations(), 6);  // states were created (and grown) in the upstream
  EXPECT_EQ(up.peak_bytes(), s.pool().peak_bytes());
  EXPECT_LE(up.peak_bytes(), s.pool().capacity_bytes() + static_cast<int64_t>(m.state_bytes(s.max_model_len())));
  EXPECT_EQ(up.live_blocks(), 0u);
  EXPECT_EQ(up.live_bytes(), 0);
  EXPECT_EQ(up.mismatched_frees(), 0);
  EXPECT_EQ(s.pool().used_bytes(), 0);
  EXPECT_EQ(m.live(), 0);
}
