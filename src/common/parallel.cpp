#include "dsv41/common/parallel.h"

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace dsv41 {
namespace {

thread_local bool t_in_parallel = false;

class Pool {
 public:
  explicit Pool(int n) {
    for (int i = 0; i < n - 1; ++i) workers_.emplace_back([this] { loop(); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }
  int size() const { return static_cast<int>(workers_.size()) + 1; }

  void run(int n_tasks, const std::function<void(int)>& task) {
    std::lock_guard<std::mutex> run_lock(run_mu_);  // one parallel region at a time
    {
      std::lock_guard<std::mutex> lk(mu_);
      task_ = &task;
      n_tasks_ = n_tasks;
      next_ = 0;
      done_ = 0;
      error_ = nullptr;
      ++generation_;
    }
    cv_.notify_all();
    work();
    std::unique_lock<std::mutex> lk(mu_);
    done_cv_.wait(lk, [&] { return done_ == n_tasks_; });
    task_ = nullptr;
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void work() {
    t_in_parallel = true;
    for (;;) {
      int i;
      {
        std::lock_guard<std::mutex> lk(mu_);
        if (!task_ || next_ >= n_tasks_) break;
        i = next_++;
      }
      try {
        (*task_)(i);
      } catch (...) {
        std::lock_guard<std::mutex> lk(mu_);
        if (!error_) error_ = std::current_exception();
      }
      std::lock_guard<std::mutex> lk(mu_);
      if (++done_ == n_tasks_) done_cv_.notify_all();
    }
    t_in_parallel = false;
  }
  void loop() {
    uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
      }
      work();
    }
  }

  std::vector<std::thread> workers_;
  std::mutex mu_, run_mu_;
  std::condition_variable cv_, done_cv_;
  const std::function<void(int)>* task_ = nullptr;
  int n_tasks_ = 0, next_ = 0, done_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
};

Pool& pool() {
  static Pool p(num_threads());
  return p;
}

}  // namespace

int num_threads() {
  static const int n = [] {
    if (const char* e = std::getenv("DSV41_THREADS")) {
      int v = std::atoi(e);
      if (v > 0) return v;
    }
    return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  }();
  return n;
}

void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t min_chunk) {
  if (n <= 0) return;
  const int64_t max_tasks = std::max<int64_t>(1, n / std::max<int64_t>(1, min_chunk));
  const int64_t n_tasks = std::min<int64_t>(max_tasks, static_cast<int64_t>(num_threads()) * 4);
  if (n_tasks <= 1 || t_in_parallel || num_threads() == 1) {
    fn(0, n);
    return;
  }
  const int64_t chunk = (n + n_tasks - 1) / n_tasks;
  pool().run(static_cast<int>(n_tasks), [&](int i) {
    const int64_t b = i * chunk, e = std::min(n, b + chunk);
    if (b < e) fn(b, e);
  });
}

}  // namespace dsv41
