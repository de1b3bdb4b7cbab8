#include "dist/tp_head.h"

#include <spdlog/spdlog.h>

#include <chrono>

namespace dsv41::dist {

TpHead::TpHead(const TpHeadOptions& o, Identity id, std::shared_ptr<TcpCollective> tcp)
    : opt_(o), id_(std::move(id)), tcp_(std::move(tcp)) {
  DSV_CHECK(o.world_size >= 2, "tensor parallel needs --world-size >= 2 (got {})", o.world_size);
  links_.resize(static_cast<size_t>(o.world_size));
  active_.resize(static_cast<size_t>(o.world_size));
  last_reason_.assign(static_cast<size_t>(o.world_size), "not connected yet");
  listener_ = listen_tcp(o.master_addr, o.master_port);
  port_ = bound_port(listener_);
  tcp_->set_abort_check([this]() -> std::string {
    std::lock_guard lk(mu_);
    if (stop_) return "rank 0 is shutting down";
    for (size_t r = 1; r < active_.size(); ++r)
      if (!active_[r] || active_[r]->dead) return fmt::format("rank {}: {}", r, last_reason_[r]);
    return {};
  });
  spdlog::info("tensor parallel: rank 0 listening on {}:{} for {} worker(s)", o.master_addr, port_, o.world_size - 1);
  listen_thread_ = std::thread([this] { listen_loop(); });
  heartbeat_thread_ = std::thread([this] { heartbeat_loop(); });
}

TpHead::~TpHead() {
  // Stop first: a worker that exits on EXIT closes its link, which must not count as a failure
  // (nor cascade to the others before they got their EXIT).
  stop_ = true;
  std::vector<std::shared_ptr<Link>> links;
  {
    std::lock_guard lk(mu_);
    for (auto& l : links_)
      if (l && !l->dead) links.push_back(l);
  }
  for (auto& l : links) {
    try {
      send_to(*l, opt_.exit_workers_on_close ? kExit : kGoodbye, {});
    } catch (const std::exception&) {
    }
  }
  tcp_->interrupt();
  std::vector<std::shared_ptr<Link>> all;
  {
    std::lock_guard lk(mu_);
    all = retired_;
    for (auto& l : links_)
      if (l) all.push_back(l);
  }
  for (auto& l : all) {
    l->ctrl.shutdown();
    l->data.shutdown();
  }
  tcp_->set_abort_check(nullptr);  // it points at this object
  if (listen_thread_.joinable()) listen_thread_.join();
  if (heartbeat_thread_.joinable()) heartbeat_thread_.join();
  for (auto& l : all)
    if (l->reader.joinable()) l->reader.join();
}

void TpHead::send_to(Link& l, uint32_t type, const std::vector<uint8_t>& payload) {
  std::lock_guard lk(l.send_mu);
  send_frame(l.ctrl, type, payload, [&l]() -> std::string { return l.dead ? "link closed" : ""; }, 5000,
             "control link");
}

void TpHead::mark_dead(const std::shared_ptr<Link>& l, const std::string& reason) {
  bool was_active = false;
  {
    std::lock_guard lk(mu_);
    if (l->dead) return;
    l->dead = true;
    l->dead_reason = reason;
    if (links_[static_cast<size_t>(l->rank)] == l) last_reason_[static_cast<size_t>(l->rank)] = reason;
    was_active = active_[static_cast<size_t>(l->rank)] == l;
    if (was_active) {
      epoch_ok_ = false;
      last_reason_[static_cast<size_t>(l->rank)] = reason;
    }
  }
  l->ctrl.shutdown();
  l->data.shutdown();
  if (was_active) tcp_->interrupt();  // a collective blocked on this rank returns now
  if (!stop_) spdlog::warn("tensor parallel: rank {} lost: {}", l->rank, reason);
  cv_.notify_all();
  if (!was_active || stop_) return;
  // The epoch is over for everyone: the other workers' data links were just shut down, so they
  // must rejoin too (a fresh handshake gives each a fresh data link).
  std::vector<std::shared_ptr<Link>> others;
  {
    std::lock_guard lk(mu_);
    for (auto& o : active_)
      if (o && o != l && !o->dead) others.push_back(o);
  }
  for (auto& o : others) mark_dead(o, fmt::format("the group lost rank {}; rejoining", l->rank));
}

void TpHead::listen_loop() {
  while (!stop_) {
    Socket s = accept_tcp(listener_, 200);
    if (!s.valid()) continue;
    try {
      handle_connection(std::move(s));
    } catch (const std::exception& e) {
      spdlog::warn("tensor parallel: bad connection on the control port: {}", e.what());
    }
  }
}

void TpHead::handle_connection(Socket s) {
  Frame f = recv_frame(s, nullptr, 5000, "handshake");
  if (f.type == kHello) {
    const Hello h = decode_hello(f.payload);
    const std::string why = check_hello(h, opt_.world_size, id_);
    if (!why.empty()) {
      spdlog::error("tensor parallel: refused worker claiming rank {}: {}", h.rank, why);
      const std::vector<uint8_t> msg(why.begin(), why.end());
      send_frame(s, kReject, msg, nullptr, 2000, "handshake");
      return;
    }
    auto l = std::make_shared<Link>();
    l->rank = h.rank;
    l->last_seen_ms = now_ms();
    std::shared_ptr<Link> old;
    {
      std::lock_guard lk(mu_);
      l->session = next_session_++;
      old = links_[static_cast<size_t>(h.rank)];
    }
    if (old && !old->dead) {
      // A second live process for one rank (or a restart racing the old link's timeout): no
      // answer, the newcomer retries; a really dead old link is declared so within the timeout.
      spdlog::warn("tensor parallel: rank {} is already connected and alive; a second process for it must wait",
                   h.rank);
      return;
    }
    send_frame(s, kWelcome, encode_welcome(l->session, opt_.run), nullptr, 5000, "handshake");
    l->ctrl = std::move(s);
    {
      std::lock_guard lk(mu_);
      if (old) retired_.push_back(old);
      links_[static_cast<size_t>(h.rank)] = l;
      last_reason_[static_cast<size_t>(h.rank)] = "connected, loading its weights";
    }
    spdlog::info("tensor parallel: rank {} joined (session {}, device {})", h.rank, l->session, h.device);
    l->reader = std::thread([this, l] { reader_loop(l); });
    return;
  }
  if (f.type == kDataJoin) {
    WireReader r(f.payload, "DATA_JOIN");
    const int rank = static_cast<int>(r.u32());
    const uint64_t session = r.u64();
    r.done();
    std::lock_guard lk(mu_);
    DSV_CHECK(rank >= 1 && rank < opt_.world_size, "data link for rank {} outside the world", rank);
    auto& l = links_[static_cast<size_t>(rank)];
    DSV_CHECK(l && l->session == session && !l->dead, "data link of rank {} for an unknown session {}", rank,
              session);
    l->data = std::move(s);
    cv_.notify_all();
    return;
  }
  fail("unexpected first message type {} (not a dsv41-serve worker?)", f.type);
}

void TpHead::reader_loop(std::shared_ptr<Link> l) {
  const auto abort = [this, &l]() -> std::string { return stop_ || l->dead ? "closed" : ""; };
  try {
    while (!stop_ && !l->dead) {
      Frame f = recv_frame(l->ctrl, abort, 0, "control link");
      l->last_seen_ms = now_ms();
      if (f.type == kReady) {
        {
          std::lock_guard lk(mu_);
          l->ready = true;
          last_reason_[static_cast<size_t>(l->rank)] = "ready, waiting for the next step to join";
        }
        spdlog::info("tensor parallel: rank {} ready", l->rank);
        cv_.notify_all();
      } else if (f.type == kWorkerError) {
        mark_dead(l, "the worker failed a step: " + std::string(f.payload.begin(), f.payload.end()));
      } else if (f.type == kLoadFailed) {
        const std::string msg(f.payload.begin(), f.payload.end());
        {
          std::lock_guard lk(mu_);
          l->load_error = msg;
        }
        mark_dead(l, "the worker cannot load its share of the model: " + msg);
      }
    }
  } catch (const std::exception& e) {
    if (!stop_) mark_dead(l, fmt::format("control link lost ({})", e.what()));
  }
}

void TpHead::heartbeat_loop() {
  const auto timeout_ms = static_cast<int64_t>(opt_.heartbeat_timeout_s * 1000);
  while (!stop_) {
    std::this_thread::sleep_for(std::chrono::milliseconds(kHeartbeatMs));
    std::vector<std::shared_ptr<Link>> links;
    {
      std::lock_guard lk(mu_);
      for (auto& l : links_)
        if (l && !l->dead) links.push_back(l);
    }
    for (auto& l : links) {
      if (stop_) break;
      if (now_ms() - l->last_seen_ms > timeout_ms) {
        mark_dead(l, fmt::format("no heartbeat for {:.1f} s (worker hung, stopped or unreachable)",
                                 opt_.heartbeat_timeout_s));
        continue;
      }
      try {
        send_to(*l, kHeartbeat, {});
      } catch (const std::exception& e) {
        mark_dead(l, fmt::format("cannot send a heartbeat ({})", e.what()));
      }
    }
  }
}

uint64_t TpHead::ensure_epoch() {
  std::lock_guard lk(mu_);
  if (epoch_ok_) {
    for (size_t r = 1; r < active_.size(); ++r)
      if (active_[r]->dead) throw RankLost(static_cast<int>(r), last_reason_[r]);
    return epoch_;
  }
  for (size_t r = 1; r < links_.size(); ++r) {
    const auto& l = links_[r];
    if (!l || l->dead || !l->ready || !l->data.valid())
      throw RankLost(static_cast<int>(r), last_reason_[r]);
  }
  tcp_->detach_all();
  for (size_t r = 1; r < links_.size(); ++r) {
    tcp_->attach(static_cast<int>(r), std::move(links_[r]->data));
    last_reason_[r] = "ready";
  }
  active_ = links_;
  epoch_ok_ = true;
  ++epoch_;
  spdlog::info("tensor parallel: all {} ranks ready (epoch {})", opt_.world_size, epoch_.load());
  return epoch_;
}

void TpHead::send_plan(const Plan& p) {
  const std::vector<uint8_t> payload = encode(p);
  std::vector<std::shared_ptr<Link>> act;
  {
    std::lock_guard lk(mu_);
    act = active_;
  }
  for (size_t r = 1; r < act.size(); ++r) {
    try {
      send_to(*act[r], kPlan, payload);
    } catch (const std::exception& e) {
      mark_dead(act[r], fmt::format("cannot send the step plan ({})", e.what()));
      std::lock_guard lk(mu_);
      throw RankLost(static_cast<int>(r), last_reason_[r]);
    }
  }
}

void TpHead::break_epoch(int rank, const std::string& reason) {
  std::vector<std::shared_ptr<Link>> act;
  {
    std::lock_guard lk(mu_);
    act = active_;
  }
  for (size_t r = 1; r < act.size(); ++r)
    if (act[r]) mark_dead(act[r], fmt::format("step abandoned on rank {} ({}); the worker must rejoin", rank, reason));
}

void TpHead::wait_ready(double timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  auto next_log = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  std::unique_lock lk(mu_);
  while (true) {
    // A worker that cannot load (bad path, missing shard, out of memory) has exited: waiting out
    // the timeout would only delay its message. A later link for that rank replaces this one.
    for (size_t r = 1; r < links_.size(); ++r) {
      const auto& l = links_[r];
      if (l && l->dead && !l->load_error.empty())
        fail("tensor parallel: rank {} failed while loading its share of the model: {}", r, l->load_error);
    }
    int missing = -1;
    for (size_t r = 1; r < links_.size() && missing < 0; ++r) {
      const auto& l = links_[r];
      if (!l || l->dead || !l->ready || !l->data.valid()) missing = static_cast<int>(r);
    }
    if (missing < 0 || epoch_ok_) return;
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline)
      fail("tensor parallel: rank {} did not become ready within {:.0f} s ({}); start it with `dsv41-serve --rank {} "
           "--world-size {} --master-addr ADDR --master-port {} --model DIR`",
           missing, timeout_s, last_reason_[static_cast<size_t>(missing)], missing, opt_.world_size, port_);
    if (now >= next_log) {
      spdlog::info("tensor parallel: waiting for rank {} ({})", missing, last_reason_[static_cast<size_t>(missing)]);
      next_log = now + std::chrono::seconds(10);
    }
    cv_.wait_for(lk, std::chrono::milliseconds(200));
  }
}

std::string TpHead::load_failure() const {
  std::lock_guard lk(mu_);
  for (size_t r = 1; r < links_.size(); ++r) {
    const auto& l = links_[r];
    if (l && !l->load_error.empty()) return fmt::format("rank {}: {}", r, l->load_error);
  }
  return {};
}

std::string TpHead::unavailable_reason() const {
  std::lock_guard lk(mu_);
  for (size_t r = 1; r < links_.size(); ++r) {
    const auto& l = epoch_ok_ ? active_[r] : links_[r];
    if (!l || l->dead || !l->ready) return fmt::format("rank {}: {}", r, last_reason_[r]);
  }
  return {};
}

}  // namespace dsv41::dist
