#include "dsv41/engram/row_store.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "dsv41/common/error.h"

namespace dsv41::engram {

namespace {

using Clock = std::chrono::steady_clock;

// The submitting thread wakes one worker for a whole batch of tasks, and each worker that takes a
// task while more are queued wakes the next: a wake-up is a futex system call (several µs), and a
// decode step's prefetch (24 rows a token) is issued right before the step's first kernel, so one
// wake per task there held the GPU idle ~0.1 ms a token at batch 1 and ~0.4 ms at batch 4 (H200).
// A thread waiting for a fetch runs that fetch's still-queued tasks itself (try_run_one).
class IoPool {
 public:
  explicit IoPool(int n) {
    for (int i = 0; i < std::max(1, n); ++i) threads_.emplace_back([this] { loop(); });
  }
  ~IoPool() { stop(); }
  // Queues `fs`, tagged with `owner` (their fetch), behind everything queued before.
  void submit_all(const void* owner, std::vector<std::function<void()>> fs) {
    if (fs.empty()) return;
    {
      std::lock_guard lk(mu_);
      for (auto& f : fs) q_.push_back({owner, std::move(f)});
    }
    cv_.notify_one();
  }
  // Runs the next queued task on the calling thread if it belongs to `owner`; false otherwise.
  bool try_run_one(const void* owner) {
    std::function<void()> f;
    {
      std::lock_guard lk(mu_);
      if (q_.empty() || q_.front().first != owner) return false;
      f = std::move(q_.front().second);
      q_.pop_front();
    }
    f();
    return true;
  }
  void stop() {  // runs what is queued, then joins
    {
      std::lock_guard lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_)
      if (t.joinable()) t.join();
  }

 private:
  void loop() {
    for (;;) {
      std::function<void()> f;
      bool more = false;
      {
        std::unique_lock lk(mu_);
        cv_.wait(lk, [&] { return stop_ || !q_.empty(); });
        if (q_.empty()) return;
        f = std::move(q_.front().second);
        q_.pop_front();
        more = !q_.empty();
      }
      if (more) cv_.notify_one();  // the chain: the next worker takes the next task
      f();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<const void*, std::function<void()>>> q_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

// CLOCK (second chance) cache of rows keyed by (layer, row).
class RowCache {
 public:
  RowCache(uint64_t capacity_rows, size_t row_bytes)
      : cap_(capacity_rows), rb_(row_bytes), keys_(capacity_rows, kEmpty), ref_(capacity_rows, 0) {
    arena_.resize(static_cast<size_t>(capacity_rows) * row_bytes);
    map_.reserve(static_cast<size_t>(capacity_rows));
  }
  static uint64_t key(int64_t layer, int64_t row) { return (static_cast<uint64_t>(layer) << 48) | static_cast<uint64_t>(row); }
  uint64_t capacity() const { return cap_; }
  uint64_t size() const { return map_.size(); }
  // Caller holds the lock.
  bool get(uint64_t k, uint8_t* out) {
    auto it = map_.find(k);
    if (it == map_.end()) return false;
    ref_[it->second] = 1;
    std::copy_n(&arena_[it->second * rb_], rb_, out);
    return true;
  }
  void put(uint64_t k, const uint8_t* row) {
    if (cap_ == 0 || map_.count(k)) return;
    while (ref_[hand_]) {
      ref_[hand_] = 0;
      hand_ = (hand_ + 1) % cap_;
    }
    const uint64_t slot = hand_;
    hand_ = (hand_ + 1) % cap_;
    if (keys_[slot] != kEmpty) map_.erase(keys_[slot]);
    keys_[slot] = k;
    ref_[slot] = 0;  // a new row must be hit once before it survives a sweep
    std::copy_n(row, rb_, &arena_[slot * rb_]);
    map_.emplace(k, slot);
  }
  mutable std::mutex mu;

 private:
  static constexpr uint64_t kEmpty = ~0ull;
  uint64_t cap_;
  size_t rb_;
  std::vector<uint64_t> keys_;
  std::vector<uint8_t> ref_;
  std::vector<uint8_t> arena_;
  std::unordered_map<uint64_t, uint64_t> map_;
  uint64_t hand_ = 0;
};

}  // namespace

struct EngramFetch::State {
  int64_t layer = 0;
  size_t row_bytes = 0;
  int64_t head_dim = 0;
  std::vector<int64_t> ids;  // sorted, distinct
  std::vector<uint8_t> data;  // ids.size() × row_bytes
  mutable std::mutex mu;
  mutable std::condition_variable cv;
  size_t pending = 0;
  std::exception_ptr error;
  IoPool* pool = nullptr;  // the store's: wait() runs this fetch's queued reads itself
};

namespace {
// The store's reader threads: the configured queue depth, capped by what the source can use.
int reader_threads(const EngramRowSource& src, int configured) {
  const int n = std::max(1, configured), cap = src.max_useful_readers();
  return cap > 0 ? std::min(n, cap) : n;
}
}  // namespace

struct EngramStore::Impl {
  const EngramRowSource* source = nullptr;
  EngramGeometry g;
  int io_threads = 1;
  RowCache cache;
  mutable std::mutex metrics_mu;
  EngramMetrics m;
  struct Second {
    int64_t sec = -1;
    uint64_t rows = 0, bytes = 0;
  };
  std::array<Second, 16> window{};
  Clock::time_point t0 = Clock::now();
  IoPool pool;  // last: its threads stop before the members above go away

  Impl(const EngramRowSource* src, const EngramStoreOptions& o)
      : source(src),
        g(src->geometry()),
        io_threads(reader_threads(*src, o.io_threads)),
        cache(static_cast<uint64_t>(std::max(0.0, o.cache_gib) * 1073741824.0) /
                  static_cast<uint64_t>(std::max<int64_t>(1, src->geometry().row_bytes)),
              static_cast<size_t>(src->geometry().row_bytes)),
        pool(io_threads) {}

  int64_t now_sec() const {
    return std::chrono::duration_cast<std::chrono::seconds>(Clock::now() - t0).count();
  }

  // Reads rows [begin, end) of the fetch's miss list into its buffer.
  void run_task(const std::shared_ptr<EngramFetch::State>& s, std::shared_ptr<std::vector<size_t>> misses, size_t begin,
                size_t end) {
    std::array<uint64_t, kEngramLatencyBounds.size() + 1> hist{};
    double lat_sum = 0.0;
    size_t done = begin;
    std::exception_ptr err;
    try {
      for (; done < end; ++done) {
        const size_t i = (*misses)[done];
        const auto a = Clock::now();
        source->read_rows(s->layer, std::span<const int64_t>(&s->ids[i], 1), &s->data[i * s->row_bytes]);
        const double dt = std::chrono::duration<double>(Clock::now() - a).count();
        lat_sum += dt;
        size_t b = 0;
        while (b < kEngramLatencyBounds.size() && dt > kEngramLatencyBounds[b]) ++b;
        ++hist[b];
      }
    } catch (...) {
      err = std::current_exception();
    }
    const uint64_t ok = done - begin;
    if (cache.capacity() > 0 && ok > 0) {
      std::lock_guard lk(cache.mu);
      for (size_t k = begin; k < done; ++k) {
        const size_t i = (*misses)[k];
        cache.put(RowCache::key(s->layer, s->ids[i]), &s->data[i * s->row_bytes]);
      }
    }
    {
      std::lock_guard lk(metrics_mu);
      m.rows_read += ok;
      m.bytes_read += ok * s->row_bytes;
      for (size_t b = 0; b < hist.size(); ++b) m.latency_buckets[b] += hist[b];
      m.latency_sum_s += lat_sum;
      const int64_t sec = now_sec();
      Second& w = window[static_cast<size_t>(sec) % window.size()];
      if (w.sec != sec) w = {sec, 0, 0};
      w.rows += ok;
      w.bytes += ok * s->row_bytes;
    }
    // The error counter moves before the waiter can wake up (it wakes when pending reaches 0).
    bool first_error = false;
    if (err) {
      std::lock_guard lk(s->mu);
      if (!s->error) {
        s->error = err;
        first_error = true;
      }
    }
    if (first_error) {
      std::lock_guard lk(metrics_mu);
      ++m.read_errors;
    }
    std::lock_guard lk(s->mu);
    if (--s->pending == 0) s->cv.notify_all();
  }
};

EngramStore::EngramStore(std::shared_ptr<const EngramRowSource> source, const EngramStoreOptions& opts)
    : source_(std::move(source)) {
  DSV_CHECK(source_ != nullptr, "engram store: no row source");
  impl_ = std::make_shared<Impl>(source_.get(), opts);
  impl_->m.cache_capacity_rows = impl_->cache.capacity();
}

EngramStore::~EngramStore() {
  if (impl_) impl_ = nullptr;  // Impl's pool joins after finishing queued reads
}

const EngramGeometry& EngramStore::geometry() const { return impl_->g; }
int EngramStore::io_threads() const { return impl_->io_threads; }

std::shared_ptr<EngramFetch> EngramStore::prefetch(int64_t layer, std::span<const int64_t> ids) {
  Impl& I = *impl_;
  const EngramGeometry& g = I.g;
  DSV_CHECK(layer >= 0 && layer < g.n_layers(), "engram: layer index {} out of range ({} Engram layers)", layer,
            g.n_layers());
  auto s = std::make_shared<EngramFetch::State>();
  s->layer = layer;
  s->row_bytes = static_cast<size_t>(g.row_bytes);
  s->head_dim = g.head_dim;
  s->ids.assign(ids.begin(), ids.end());
  std::sort(s->ids.begin(), s->ids.end());
  s->ids.erase(std::unique(s->ids.begin(), s->ids.end()), s->ids.end());
  for (int64_t r : s->ids)
    if (!I.source->covers(layer, r)) {
      if (r < 0 || r >= g.rows[static_cast<size_t>(layer)])
        fail("engram: row {} out of range for Engram layer {} ({} rows)", r, g.layer_ids[static_cast<size_t>(layer)],
             g.rows[static_cast<size_t>(layer)]);
      fail("engram: row {} of Engram layer {} is not held by {}", r, g.layer_ids[static_cast<size_t>(layer)],
           I.source->describe());
    }
  s->data.resize(s->ids.size() * s->row_bytes);
  auto misses = std::make_shared<std::vector<size_t>>();
  if (I.cache.capacity() > 0) {
    std::lock_guard lk(I.cache.mu);
    for (size_t i = 0; i < s->ids.size(); ++i)
      if (!I.cache.get(RowCache::key(layer, s->ids[i]), &s->data[i * s->row_bytes])) misses->push_back(i);
  } else {
    misses->resize(s->ids.size());
    for (size_t i = 0; i < misses->size(); ++i) (*misses)[i] = i;
  }
  {
    std::lock_guard lk(I.metrics_mu);
    I.m.rows_requested += ids.size();
    I.m.rows_unique += s->ids.size();
    I.m.cache_hits += s->ids.size() - misses->size();
    I.m.cache_misses += misses->size();
  }
  if (!misses->empty()) {
    // Small tasks keep every I/O thread busy (queue depth = io_threads) without one task per row.
    const size_t n = misses->size();
    const size_t chunk = std::clamp<size_t>(n / (static_cast<size_t>(I.io_threads) * 4), 1, 16);
    const size_t tasks = (n + chunk - 1) / chunk;
    s->pending = tasks;
    std::vector<std::function<void()>> fs;
    fs.reserve(tasks);
    for (size_t t = 0; t < tasks; ++t) {
      const size_t b = t * chunk, e = std::min(n, b + chunk);
      Impl* ip = impl_.get();
      fs.emplace_back([ip, s, misses, b, e] { ip->run_task(s, misses, b, e); });
    }
    s->pool = &I.pool;
    I.pool.submit_all(s.get(), std::move(fs));
  }
  return std::make_shared<EngramFetch>(s);
}

void EngramStore::read_rows(int64_t layer, std::span<const int64_t> ids, uint8_t* out) {
  prefetch(layer, ids)->copy_rows(ids, out);
}

void EngramStore::read_dequant(int64_t layer, std::span<const int64_t> ids, float* out) {
  prefetch(layer, ids)->dequant_rows(ids, out);
}

EngramMetrics EngramStore::metrics() const {
  const Impl& I = *impl_;
  EngramMetrics out;
  int64_t now;
  {
    std::lock_guard lk(I.metrics_mu);
    out = I.m;
    now = I.now_sec();
    constexpr int64_t kSpan = 10;
    uint64_t rows = 0, bytes = 0;
    for (const auto& w : I.window)
      if (w.sec >= 0 && w.sec > now - kSpan) rows += w.rows, bytes += w.bytes;
    const double span = static_cast<double>(std::min<int64_t>(kSpan, now + 1));
    out.rows_per_s = static_cast<double>(rows) / span;
    out.bytes_per_s = static_cast<double>(bytes) / span;
  }
  {
    std::lock_guard lk(I.cache.mu);
    out.cache_rows = I.cache.size();
  }
  out.cache_capacity_rows = I.cache.capacity();
  const uint64_t lookups = out.cache_hits + out.cache_misses;
  out.cache_hit_rate = lookups ? static_cast<double>(out.cache_hits) / static_cast<double>(lookups) : 0.0;
  return out;
}

// ---- EngramFetch ----

int64_t EngramFetch::layer() const { return s_->layer; }
size_t EngramFetch::unique_rows() const { return s_->ids.size(); }

bool EngramFetch::ready() const {
  std::lock_guard lk(s_->mu);
  return s_->pending == 0;
}

void EngramFetch::wait() const {
  // Reads of this fetch still queued run here rather than wait for a worker to wake (each wake-up
  // takes several µs); the queue is in order, so they are at its front once earlier work is taken.
  if (s_->pool)
    while (s_->pool->try_run_one(s_.get())) {
    }
  std::unique_lock lk(s_->mu);
  s_->cv.wait(lk, [&] { return s_->pending == 0; });
  if (s_->error) std::rethrow_exception(s_->error);
}

const uint8_t* EngramFetch::row(int64_t id) const {
  auto it = std::lower_bound(s_->ids.begin(), s_->ids.end(), id);
  DSV_CHECK(it != s_->ids.end() && *it == id, "engram: row {} was not prefetched", id);
  return &s_->data[static_cast<size_t>(it - s_->ids.begin()) * s_->row_bytes];
}

void EngramFetch::copy_rows(std::span<const int64_t> ids, uint8_t* out) const {
  wait();
  for (size_t i = 0; i < ids.size(); ++i) std::copy_n(row(ids[i]), s_->row_bytes, out + i * s_->row_bytes);
}

void EngramFetch::dequant_rows(std::span<const int64_t> ids, float* out) const {
  wait();
  for (size_t i = 0; i < ids.size(); ++i) dequant_row(row(ids[i]), s_->head_dim, out + i * static_cast<size_t>(s_->head_dim));
}

// ---- Prometheus text ----

std::string format_engram_metrics(const EngramMetrics& m) {
  std::string o;
  auto family = [&](const char* name, const char* type, const char* help) {
    o += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  };
  auto counter = [&](const char* name, const char* help, uint64_t v) {
    family(name, "counter", help);
    o += fmt::format("{} {}\n", name, v);
  };
  auto gauge = [&](const char* name, const char* help, double v) {
    family(name, "gauge", help);
    o += fmt::format("{} {}\n", name, v);
  };
  counter("dsv41_engram_rows_requested_total", "Engram rows asked for (positions x columns).", m.rows_requested);
  counter("dsv41_engram_rows_unique_total", "Engram rows left after in-batch deduplication.", m.rows_unique);
  counter("dsv41_engram_cache_hits_total", "Distinct Engram rows served by the row cache.", m.cache_hits);
  counter("dsv41_engram_cache_misses_total", "Distinct Engram rows read from storage.", m.cache_misses);
  counter("dsv41_engram_rows_read_total", "Engram rows read from storage.", m.rows_read);
  counter("dsv41_engram_read_bytes_total", "Bytes of Engram rows read from storage.", m.bytes_read);
  counter("dsv41_engram_read_errors_total", "Engram prefetches that failed with an I/O error.", m.read_errors);
  gauge("dsv41_engram_rows_per_second", "Engram rows read per second over the last 10 s.", m.rows_per_s);
  gauge("dsv41_engram_bytes_per_second", "Engram bytes read per second over the last 10 s.", m.bytes_per_s);
  gauge("dsv41_engram_cache_hit_rate", "Row cache hits / lookups since start.", m.cache_hit_rate);
  gauge("dsv41_engram_cache_rows", "Rows held by the Engram row cache.", static_cast<double>(m.cache_rows));
  gauge("dsv41_engram_cache_capacity_rows", "Row capacity of the Engram row cache.",
        static_cast<double>(m.cache_capacity_rows));
  family("dsv41_engram_read_latency_seconds", "histogram", "Latency of one Engram row read from storage.");
  uint64_t cum = 0;
  for (size_t b = 0; b < kEngramLatencyBounds.size(); ++b) {
    cum += m.latency_buckets[b];
    o += fmt::format("dsv41_engram_read_latency_seconds_bucket{{le=\"{}\"}} {}\n", kEngramLatencyBounds[b], cum);
  }
  cum += m.latency_buckets.back();
  o += fmt::format("dsv41_engram_read_latency_seconds_bucket{{le=\"+Inf\"}} {}\n", cum);
  o += fmt::format("dsv41_engram_read_latency_seconds_sum {}\n", m.latency_sum_s);
  o += fmt::format("dsv41_engram_read_latency_seconds_count {}\n", cum);
  return o;
}

}  // namespace dsv41::engram
