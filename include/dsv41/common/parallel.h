// A small fixed thread pool for the CPU reference paths. Work is split into contiguous ranges;
// results must not depend on the split (each index is computed by exactly one thread).
#pragma once
#include <cstdint>
#include <functional>

namespace dsv41 {

// Number of worker threads (env DSV41_THREADS, else hardware concurrency).
int num_threads();

// Calls fn(begin, end) over a partition of [0, n). Runs inline when n is small or when
// called from inside a parallel region (no nesting).
void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t min_chunk = 1);

}  // namespace dsv41
