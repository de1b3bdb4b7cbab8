// The Engram row store the engine talks to: asynchronous prefetch of a batch's rows with
// in-batch deduplication, a bounded CLOCK cache of rows across batches, an I/O thread pool for
// queue depth, and counters for /metrics.
//
// Use (the hash ids of a whole batch are known before layer 0):
//   auto f1 = store.prefetch(0, ids_layer1);   // returns at once; reads run on the pool
//   auto f2 = store.prefetch(1, ids_layer14);
//   ... layers 0 .. ...
//   f1->dequant_rows(ids_layer1, rows_f32);    // waits for the reads, throws their I/O error
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "dsv41/engram/row_source.h"

namespace dsv41::engram {

struct EngramStoreOptions {
  double cache_gib = 0.0;  // row cache bound (--engram-cache-gib); 0 = no cache
  int io_threads = 64;     // concurrent positioned reads (queue depth)
};

// Read latency histogram bucket upper bounds, in seconds (one read = one row).
inline constexpr std::array<double, 14> kEngramLatencyBounds = {10e-6,  25e-6,  50e-6, 100e-6, 250e-6, 500e-6, 1e-3,
                                                                2.5e-3, 5e-3,   10e-3, 25e-3,  50e-3,  0.1,    1.0};

struct EngramMetrics {
  // counters since start
  uint64_t rows_requested = 0;  // positions × columns asked for
  uint64_t rows_unique = 0;     // after deduplication within each prefetch
  uint64_t cache_hits = 0;      // unique rows served by the cache
  uint64_t cache_misses = 0;    // unique rows read from storage
  uint64_t rows_read = 0;       // rows read successfully
  uint64_t bytes_read = 0;
  uint64_t read_errors = 0;     // failed prefetches
  std::array<uint64_t, kEngramLatencyBounds.size() + 1> latency_buckets{};  // last = +Inf (not cumulative)
  double latency_sum_s = 0.0;
  // gauges
  uint64_t cache_rows = 0, cache_capacity_rows = 0;
  double rows_per_s = 0.0, bytes_per_s = 0.0;  // over the last ~10 s
  double cache_hit_rate = 0.0;                 // hits / (hits + misses) since start
};

// Prometheus text exposition of the metrics (names in docs/ENGRAM.md), one family per metric.
std::string format_engram_metrics(const EngramMetrics& m);

class EngramFetch;

class EngramStore {
 public:
  EngramStore(std::shared_ptr<const EngramRowSource> source, const EngramStoreOptions& opts = {});
  ~EngramStore();  // waits for reads in flight
  EngramStore(const EngramStore&) = delete;
  EngramStore& operator=(const EngramStore&) = delete;

  const EngramGeometry& geometry() const;
  const EngramRowSource& source() const { return *source_; }
  // Reader threads: EngramStoreOptions::io_threads, capped by the source's max_useful_readers().
  int io_threads() const;

  // Starts reading the distinct rows among `ids` of Engram layer `layer` (position in
  // engram_layer_ids). Returns at once; out-of-range ids throw here.
  std::shared_ptr<EngramFetch> prefetch(int64_t layer, std::span<const int64_t> ids);
  // prefetch + wait + copy: out gets ids.size() rows of row_bytes.
  void read_rows(int64_t layer, std::span<const int64_t> ids, uint8_t* out);
  // prefetch + wait + dequant_row: out gets ids.size() × head_dim floats.
  void read_dequant(int64_t layer, std::span<const int64_t> ids, float* out);

  EngramMetrics metrics() const;

  struct Impl;

 private:
  std::shared_ptr<const EngramRowSource> source_;
  std::shared_ptr<Impl> impl_;
};

// The rows of one prefetch. Thread-safe; may outlive nothing but its store.
class EngramFetch {
 public:
  int64_t layer() const;
  size_t unique_rows() const;
  bool ready() const;
  // Blocks until every read finished; rethrows the first I/O error (dsv41::Error).
  void wait() const;
  // After the reads: row ids[i] (each must be among the prefetched ids) to out + i·row_bytes.
  void copy_rows(std::span<const int64_t> ids, uint8_t* out) const;
  // Same, dequantised (MODEL.md §5.3): out + i·head_dim.
  void dequant_rows(std::span<const int64_t> ids, float* out) const;

  struct State;
  explicit EngramFetch(std::shared_ptr<State> s) : s_(std::move(s)) {}

 private:
  const uint8_t* row(int64_t id) const;
  std::shared_ptr<State> s_;
};

}  // namespace dsv41::engram
