#include "sched/candidate_sort.h"

#include <algorithm>
#include <bit>
#include <vector>

#include "dsv41/common/parallel.h"

namespace dsv41::sched {
namespace {

constexpr uint32_t kSign = 0x80000000u;

// Unsigned order of the key = descending order of the value; -0 and +0 share the key of +0
// (v + 0.0f turns -0 into +0 and keeps every other value). Branch-free: logits' signs are random,
// and a branch per entry mispredicted half the time cost more than the radix passes.
uint32_t descending_key(float v) {
  const uint32_t u = std::bit_cast<uint32_t>(v + 0.0f);
  const uint32_t flip = (0u - (u >> 31)) | kSign;  // negative: all bits; positive: the sign bit
  return ~(u ^ flip);
}

uint64_t entry_of(float v, int32_t id) {
  return static_cast<uint64_t>(descending_key(v)) << 32 | static_cast<uint32_t>(id);
}

// Below this many kept candidates a partial sort beats sorting the whole row.
constexpr int32_t kPartialSortMax = 1024;
// Radix digits of 11 bits (3 passes over the 32-bit key): 2048 counters per task keep the
// per-task histograms small enough to split a pass over the thread pool.
constexpr int kDigitBits = 11;
constexpr int kDigits = 1 << kDigitBits;
// Rows are split into at most this many tasks of at least kTaskMin entries (beyond ~8 tasks a
// 129k row gains nothing: the pool's dispatch costs more than the work each task sheds).
constexpr int64_t kMaxTasks = 8, kTaskMin = 16384;

struct Scratch {
  std::vector<uint64_t> a, b;
  std::vector<int32_t> hist;  // [task][digit]
  std::vector<int32_t> ids;   // the partial sort's candidates
};

Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

// Stable LSD radix sort of a[0, n) by the upper 32 bits (the key); b is the second buffer. Each
// pass: per-task digit counts over contiguous slices, exclusive offsets in (digit, task) order,
// then each task scatters its slice; slices and digits in order keep the sort stable.
void radix_sort_keys(Scratch& s, int64_t n) {
  const int64_t tasks = std::clamp<int64_t>(std::min<int64_t>(num_threads(), n / kTaskMin), 1, kMaxTasks);
  const int64_t slice = (n + tasks - 1) / tasks;
  s.hist.resize(static_cast<size_t>(tasks * kDigits));
  for (int shift = 32; shift < 64; shift += kDigitBits) {
    const uint64_t mask = (uint64_t{1} << std::min(kDigitBits, 64 - shift)) - 1;
    const uint64_t* src = s.a.data();
    uint64_t* dst = s.b.data();
    std::fill(s.hist.begin(), s.hist.end(), 0);
    parallel_for(tasks, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        int32_t* h = s.hist.data() + t * kDigits;
        for (int64_t i = t * slice, e = std::min(n, i + slice); i < e; ++i) ++h[(src[i] >> shift) & mask];
      }
    });
    int64_t at = 0;
    bool moves = true;
    for (int d = 0; d < kDigits; ++d) {
      const int64_t before = at;
      for (int64_t t = 0; t < tasks; ++t) {
        const int32_t c = s.hist[static_cast<size_t>(t * kDigits + d)];
        s.hist[static_cast<size_t>(t * kDigits + d)] = static_cast<int32_t>(at);
        at += c;
      }
      if (at - before == n) moves = false;  // every key has this digit: the pass would copy
    }
    if (!moves) continue;
    parallel_for(tasks, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        int32_t* h = s.hist.data() + t * kDigits;
        for (int64_t i = t * slice, e = std::min(n, i + slice); i < e; ++i) dst[h[(src[i] >> shift) & mask]++] = src[i];
      }
    });
    s.a.swap(s.b);
  }
}

}  // namespace

float candidate_value(uint64_t entry) {
  const uint32_t ascending = ~static_cast<uint32_t>(entry >> 32);
  const uint32_t flip = (ascending & kSign) ? kSign : ~0u;  // a positive value had its sign bit set
  return std::bit_cast<float>(ascending ^ flip);
}

std::span<const uint64_t> sort_candidates(std::span<const float> v, int32_t keep) {
  const int64_t n = static_cast<int64_t>(v.size());
  keep = static_cast<int32_t>(std::clamp<int64_t>(keep, 1, n));
  Scratch& s = scratch();
  s.a.resize(static_cast<size_t>(n));
  if (keep <= kPartialSortMax) {
    std::vector<int32_t>& ids = s.ids;
    ids.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) ids[static_cast<size_t>(i)] = static_cast<int32_t>(i);
    auto first = [&](int32_t x, int32_t y) {
      return v[x] > v[y] || (v[x] == v[y] && x < y);  // == holds for -0 and +0
    };
    std::partial_sort(ids.begin(), ids.begin() + keep, ids.end(), first);
    for (int32_t i = 0; i < keep; ++i) s.a[static_cast<size_t>(i)] = entry_of(v[ids[i]], ids[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) s.a[static_cast<size_t>(i)] = entry_of(v[static_cast<size_t>(i)], static_cast<int32_t>(i));
    s.b.resize(static_cast<size_t>(n));
    radix_sort_keys(s, n);
  }
  return std::span<const uint64_t>(s.a.data(), static_cast<size_t>(keep));
}

}  // namespace dsv41::sched
