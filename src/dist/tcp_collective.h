// The CPU collective backend over TCP. Rank 0 is the hub: every other rank holds one data socket
// to it. all_gather: each worker sends its part to rank 0, rank 0 returns every part the worker
// lacks. all_reduce_sum: rank 0 receives every rank's values, adds them in rank order, returns the
// sums. Sockets are attached per session (a restarted worker brings a new one); waits ask the
// abort check (heartbeat monitor) every 100 ms.
#pragma once
#include <mutex>
#include <vector>

#include "dist/net.h"
#include "dsv41/dist/collective.h"

namespace dsv41::dist {

class TcpCollective final : public Collective {
 public:
  TcpCollective(int rank, int world);
  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  const char* backend() const override { return "tcp"; }
  void all_gather(const void* send, std::span<const size_t> counts, void* out) override;
  void all_reduce_sum(float* data, size_t n) override;
  CollectiveStats stats() const override;

  // Rank 0: the socket to `peer`; other ranks: the socket to rank 0 (peer = 0).
  void attach(int peer, Socket s);
  void detach_all();
  // Shuts the sockets down so a blocked collective returns at once (any thread).
  void interrupt();
  // Called between poll slices; a non-empty reason aborts the collective with RankLost.
  void set_abort_check(AbortCheck check) { abort_ = std::move(check); }
  uint64_t bytes_sent() const { return bytes_sent_; }
  uint64_t bytes_received() const { return bytes_recv_; }

 private:
  const Socket& peer(int r) const;
  RankLost lost(int r, const std::string& transfer_error) const;
  void send(int r, const void* p, size_t n);
  void recv(int r, void* p, size_t n);

  int rank_, world_;
  std::vector<Socket> peers_;
  std::mutex mu_;  // attach/interrupt vs. each other (collectives run on one thread)
  AbortCheck abort_;
  uint64_t bytes_sent_ = 0, bytes_recv_ = 0;
  mutable std::mutex stats_mu_;  // stats_ vs. a metrics reader
  CollectiveStats stats_;
};

}  // namespace dsv41::dist
