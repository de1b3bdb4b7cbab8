#include "dist/tcp_collective.h"

#include <chrono>
#include <cstring>

namespace dsv41::dist {

Range split_range(int64_t total, int rank, int world, int64_t align) {
  DSV_CHECK(world >= 1 && rank >= 0 && rank < world, "split_range: rank {} of world {}", rank, world);
  DSV_CHECK(total >= 0 && align >= 1, "split_range: total {} align {}", total, align);
  const int64_t units = (total + align - 1) / align;
  Range r;
  r.begin = std::min(total, units * rank / world * align);
  r.end = std::min(total, units * (rank + 1) / world * align);
  return r;
}

TcpCollective::TcpCollective(int rank, int world) : rank_(rank), world_(world) {
  DSV_CHECK(world >= 1 && rank >= 0 && rank < world, "rank {} is outside world size {}", rank, world);
  peers_.resize(static_cast<size_t>(world));
}

void TcpCollective::attach(int peer, Socket s) {
  std::lock_guard lk(mu_);
  DSV_CHECK(peer >= 0 && peer < world_ && peer != rank_, "attach: bad peer {}", peer);
  peers_[static_cast<size_t>(peer)] = std::move(s);
}

void TcpCollective::detach_all() {
  std::lock_guard lk(mu_);
  for (auto& p : peers_) p.close();
}

void TcpCollective::interrupt() {
  std::lock_guard lk(mu_);
  for (auto& p : peers_) p.shutdown();
}

RankLost TcpCollective::lost(int r, const std::string& transfer_error) const {
  // A link shut down by the heartbeat monitor fails with "connection closed"; its reason is the
  // useful one ("no heartbeat for 3.0 s ..."), so it wins when there is one.
  std::string why = abort_ ? abort_() : std::string();
  if (why.empty()) return RankLost(r, transfer_error);
  const std::string own = fmt::format("rank {}: ", r);
  if (why.rfind(own, 0) == 0) return RankLost(r, why.substr(own.size()));
  return RankLost(r, why);
}

const Socket& TcpCollective::peer(int r) const {
  const Socket& s = peers_[static_cast<size_t>(r)];
  if (!s.valid()) throw RankLost(r, "not connected");
  return s;
}

void TcpCollective::send(int r, const void* p, size_t n) {
  if (n == 0) return;
  try {
    send_all(peer(r), p, n, abort_, 0, "tensor-parallel data link");
  } catch (const RankLost&) {
    throw;
  } catch (const Error& e) {
    throw lost(r, e.what());
  }
  bytes_sent_ += n;
}

void TcpCollective::recv(int r, void* p, size_t n) {
  if (n == 0) return;
  try {
    recv_all(peer(r), p, n, abort_, 0, "tensor-parallel data link");
  } catch (const RankLost&) {
    throw;
  } catch (const Error& e) {
    throw lost(r, e.what());
  }
  bytes_recv_ += n;
}

namespace {
using Clock = std::chrono::steady_clock;

// Counts a call that returned normally (one that threw ends the run's collectives anyway).
void count_call(std::mutex& mu, CollectiveStats& s, bool reduce, size_t bytes, Clock::time_point t0) {
  const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
  std::lock_guard<std::mutex> lk(mu);
  (reduce ? s.all_reduce_calls : s.all_gather_calls) += 1;
  (reduce ? s.all_reduce_bytes : s.all_gather_bytes) += bytes;
  s.timed_calls += 1;
  s.seconds += dt;
}
}  // namespace

CollectiveStats TcpCollective::stats() const {
  std::lock_guard<std::mutex> lk(stats_mu_);
  return stats_;
}

void TcpCollective::all_gather(const void* send_buf, std::span<const size_t> counts, void* out) {
  DSV_CHECK(counts.size() == static_cast<size_t>(world_), "all_gather: {} counts for world size {}", counts.size(),
            world_);
  const auto t0 = Clock::now();
  std::vector<size_t> off(static_cast<size_t>(world_) + 1, 0);
  for (int r = 0; r < world_; ++r) off[r + 1] = off[r] + counts[r];
  auto* o = static_cast<uint8_t*>(out);
  if (send_buf != o + off[rank_]) std::memmove(o + off[rank_], send_buf, counts[rank_]);
  if (world_ == 1) return;
  if (rank_ == 0) {
    for (int r = 1; r < world_; ++r) recv(r, o + off[r], counts[r]);
    // Each worker gets everything but its own part (two sends: before it and after it).
    for (int r = 1; r < world_; ++r) {
      send(r, o, off[r]);
      send(r, o + off[r + 1], off[world_] - off[r + 1]);
    }
  } else {
    send(0, o + off[rank_], counts[rank_]);
    recv(0, o, off[rank_]);
    recv(0, o + off[rank_ + 1], off[world_] - off[rank_ + 1]);
  }
  count_call(stats_mu_, stats_, false, off[world_], t0);
}

void TcpCollective::all_reduce_sum(float* data, size_t n) {
  if (world_ == 1 || n == 0) return;
  const auto t0 = Clock::now();
  if (rank_ == 0) {
    std::vector<float> part(n);
    for (int r = 1; r < world_; ++r) {
      recv(r, part.data(), n * sizeof(float));
      for (size_t i = 0; i < n; ++i) data[i] += part[i];  // rank order: reproducible sums
    }
    for (int r = 1; r < world_; ++r) send(r, data, n * sizeof(float));
  } else {
    send(0, data, n * sizeof(float));
    recv(0, data, n * sizeof(float));
  }
  count_call(stats_mu_, stats_, true, n * sizeof(float), t0);
}

}  // namespace dsv41::dist
