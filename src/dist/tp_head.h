// Rank 0's side of the control plane: the listener (handshakes, data-link joins), one reader
// thread per worker link (heartbeats, READY, errors, EOF), and a heartbeat thread (sends pings,
// declares silent links dead). The engine thread adopts ready links at step boundaries (a new
// epoch), sends plans, and runs collectives over the TcpCollective this class feeds.
#pragma once
#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "dist/net.h"
#include "dist/protocol.h"
#include "dist/tcp_collective.h"

namespace dsv41::dist {

class TpHead {
 public:
  TpHead(const TpHeadOptions& o, Identity id, std::shared_ptr<TcpCollective> tcp);
  ~TpHead();  // sends EXIT or GOODBYE, stops the threads
  int port() const { return port_; }

  // Engine thread, at a step boundary: adopts a complete set of ready links when the current epoch
  // is broken or absent. Returns the epoch to run in; throws RankLost when some rank is not ready.
  uint64_t ensure_epoch();
  uint64_t epoch() const { return epoch_.load(); }
  // Sends a plan to every worker of the current epoch (throws RankLost on a dead link).
  void send_plan(const Plan& p);
  // Marks the current epoch broken (after a step failed half-way): workers are sent GOODBYE so
  // they drop their state and rejoin.
  void break_epoch(int rank, const std::string& reason);
  // Blocks until all ranks are ready; throws after timeout_s, or at once when a worker reports
  // that it cannot load its share (with its message).
  void wait_ready(double timeout_s);
  std::string unavailable_reason() const;
  // "rank R: message" when a worker reported that it cannot load its share, else empty (lets a
  // wait that precedes READY, e.g. forming the NCCL communicator, end at once).
  std::string load_failure() const;

 private:
  struct Link {
    int rank = 0;
    uint64_t session = 0;
    Socket ctrl, data;
    std::mutex send_mu;
    std::atomic<int64_t> last_seen_ms{0};
    std::atomic<bool> ready{false}, dead{false};
    std::string dead_reason;  // under TpHead::mu_
    std::string load_error;   // under TpHead::mu_: the worker reported it cannot load its share
    std::thread reader;
  };

  void listen_loop();
  void handle_connection(Socket s);
  void reader_loop(std::shared_ptr<Link> l);
  void heartbeat_loop();
  void mark_dead(const std::shared_ptr<Link>& l, const std::string& reason);
  void send_to(Link& l, uint32_t type, const std::vector<uint8_t>& payload);

  TpHeadOptions opt_;
  Identity id_;
  std::shared_ptr<TcpCollective> tcp_;
  Socket listener_;
  int port_ = 0;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::shared_ptr<Link>> links_;   // [rank] latest link (index 0 unused)
  std::vector<std::shared_ptr<Link>> active_;  // [rank] links of the current epoch
  std::vector<std::string> last_reason_;       // [rank] why it is not ready
  std::vector<std::shared_ptr<Link>> retired_;  // replaced links whose reader threads must be joined
  std::atomic<uint64_t> epoch_{0};
  bool epoch_ok_ = false;
  uint64_t next_session_ = 1;
  std::atomic<bool> stop_{false};
  std::thread listen_thread_, heartbeat_thread_;
};

}  // namespace dsv41::dist
