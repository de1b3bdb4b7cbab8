// The headless worker rank: connect to rank 0 (retrying: either side may start first), handshake,
// load this rank's share, join the data link, then follow the step plans. A reader thread takes
// every control frame (so heartbeats keep flowing during long steps) and a heartbeat thread sends
// ours; losing rank 0 drops the session's sequences and goes back to connecting.
#include <spdlog/spdlog.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <type_traits>

#include "dist/nccl_collective.h"
#include "dist/protocol.h"
#include "dist/tcp_collective.h"
#include "dsv41/dist/tp_runtime.h"
#include "runtime/serve_startup.h"

namespace dsv41::dist {
namespace {

constexpr int kRetryMs = 300;

// One session with rank 0: the control socket, its reader and heartbeat threads.
class Session {
 public:
  Session(Socket ctrl, double timeout_s) : ctrl_(std::move(ctrl)), timeout_ms_(static_cast<int64_t>(timeout_s * 1000)) {
    last_seen_ = now_ms();
    reader_ = std::thread([this] { read_loop(); });
    beat_ = std::thread([this] { beat_loop(); });
  }
  ~Session() {
    close("session over");
    if (reader_.joinable()) reader_.join();
    if (beat_.joinable()) beat_.join();
  }

  void send(uint32_t type, const std::vector<uint8_t>& payload) {
    std::lock_guard lk(send_mu_);
    send_frame(ctrl_, type, payload, [this] { return lost_reason(); }, 5000, "control link to rank 0");
  }
  // Next frame other than a heartbeat; throws when the session is lost.
  Frame next() {
    std::unique_lock lk(mu_);
    while (true) {
      if (!queue_.empty()) {
        Frame f = std::move(queue_.front());
        queue_.pop_front();
        return f;
      }
      if (!lost_.empty()) fail("{}", lost_);
      cv_.wait_for(lk, std::chrono::milliseconds(100));
    }
  }
  std::string lost_reason() {
    std::lock_guard lk(mu_);
    return lost_;
  }
  void close(const std::string& why) {
    {
      std::lock_guard lk(mu_);
      if (lost_.empty()) lost_ = why;
    }
    ctrl_.shutdown();
    cv_.notify_all();
  }

 private:
  void read_loop() {
    try {
      while (lost_reason().empty()) {
        Frame f = recv_frame(ctrl_, [this] { return lost_reason(); }, 0, "control link to rank 0");
        last_seen_ = now_ms();
        if (f.type == kHeartbeat) continue;
        std::lock_guard lk(mu_);
        queue_.push_back(std::move(f));
        cv_.notify_all();
      }
    } catch (const std::exception& e) {
      close(fmt::format("rank 0 lost: {}", e.what()));
    }
  }
  void beat_loop() {
    while (lost_reason().empty()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(kHeartbeatMs));
      if (now_ms() - last_seen_ > timeout_ms_) {
        close(fmt::format("rank 0 lost: no heartbeat for {:.1f} s", static_cast<double>(timeout_ms_) / 1000));
        break;
      }
      try {
        send(kHeartbeat, {});
      } catch (const std::exception& e) {
        close(fmt::format("rank 0 lost: {}", e.what()));
      }
    }
  }

  Socket ctrl_;
  int64_t timeout_ms_;
  std::atomic<int64_t> last_seen_{0};
  std::mutex mu_, send_mu_;
  std::condition_variable cv_;
  std::deque<Frame> queue_;
  std::string lost_;
  std::thread reader_, beat_;
};

Socket connect_retrying(const TpWorkerOptions& o) {
  int64_t next_log = now_ms();
  while (true) {
    std::string why;
    Socket s = connect_tcp(o.master_addr, o.master_port, 2000, &why);
    if (s.valid()) return s;
    if (now_ms() >= next_log) {
      spdlog::info("rank {}: waiting for rank 0 at {}:{} ({})", o.rank, o.master_addr, o.master_port, why);
      next_log = now_ms() + 10000;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(kRetryMs));
  }
}

// Executes one plan on this rank's model (CpuModel, or CudaModel on the CUDA path) and states.
template <class M>
void execute(M& m, std::map<uint64_t, std::unique_ptr<SeqState>>& seqs, const Plan& p) {
  constexpr bool kCpu = std::is_same_v<M, model::CpuModel>;
  auto cpu_only = [&](const char* what) {
    if (!kCpu) fail("plan {}: {} is not available with the CUDA backend at --world-size > 1", p.step, what);
  };
  auto get = [&](uint64_t id) -> SeqState& {
    auto it = seqs.find(id);
    DSV_CHECK(it != seqs.end(), "plan {}: unknown sequence {}", p.step, id);
    return *it->second;
  };
  auto check_position = [&](const PlanOp& op, const SeqState& s) {
    DSV_CHECK(s.n_past == op.n_past, "plan {}: sequence {} is at position {} here but {} on rank 0", p.step, op.seq,
              s.n_past, op.n_past);
  };
  for (size_t i = 0; i < p.ops.size(); ++i) {
    const PlanOp& op = p.ops[i];
    if constexpr (!kCpu) {
      // Rank 0 hands a step's forwards to the CUDA engine as one batch (tp_model.cpp), which runs
      // their one-token decode steps as one pass; the same items in the same order here make the
      // same passes and so the same collectives. (Rank 0 puts a step's forwards after its other ops.)
      if (op.kind == OpKind::forward) {
        size_t end = i;
        while (end < p.ops.size() && p.ops[end].kind == OpKind::forward) ++end;
        std::vector<ForwardItem> items;
        std::vector<std::vector<float>> logits(end - i);
        for (size_t j = i; j < end; ++j) {
          const PlanOp& f = p.ops[j];
          SeqState& s = get(f.seq);
          check_position(f, s);
          s.prompt_len = f.prompt_len;
          ForwardItem it;
          it.state = &s;
          it.tokens = f.tokens;
          it.all_logits = f.all_logits;
          it.logits = f.want_logits ? &logits[j - i] : nullptr;  // the LM head runs on every rank or none
          items.push_back(it);
        }
        m.forward(items);
        i = end - 1;
        continue;
      }
    }
    switch (op.kind) {
      case OpKind::new_seq:
        DSV_CHECK(!seqs.count(op.seq), "plan {}: sequence {} exists already", p.step, op.seq);
        seqs[op.seq] = m.new_sequence();
        break;
      case OpKind::free_seq: seqs.erase(op.seq); break;
      case OpKind::clone:
        cpu_only("cloning a sequence state");
        if constexpr (kCpu) seqs[op.seq2] = m.clone_state(get(op.seq));
        break;
      case OpKind::restore:
        cpu_only("restoring a sequence state");
        if constexpr (kCpu) m.restore_state(get(op.seq), get(op.seq2));
        break;
      case OpKind::forward: {
        SeqState& s = get(op.seq);
        check_position(op, s);
        s.prompt_len = op.prompt_len;
        std::vector<float> logits;
        m.forward_sequence(s, op.tokens, op.all_logits, op.want_logits ? &logits : nullptr);
        break;
      }
      case OpKind::draft: {
        SeqState& s = get(op.seq);
        check_position(op, s);
        cpu_only("DSpark drafting");
        if constexpr (kCpu) (void)m.dspark_draft(s, op.anchor);
        break;
      }
    }
  }
}

}  // namespace

int run_worker(const TpWorkerOptions& o) {
  DSV_CHECK(o.world_size >= 2, "--rank {} needs --world-size >= 2", o.rank);
  DSV_CHECK(o.rank >= 1 && o.rank < o.world_size, "--rank {} must be in 1..{} for --world-size {}", o.rank,
            o.world_size - 1, o.world_size);
  DSV_CHECK(!o.model_dir.empty(), "--model DIR is required");
  DSV_CHECK(o.device == "cpu" || o.device == "cuda" || o.device == "auto", "--device {}: expected cpu, cuda or auto",
            o.device);
  const bool use_cuda = o.device == "cuda";  // auto: the CPU engine (the CUDA path needs rank 0 on CUDA too)
  int cuda_device = o.cuda_device;
  if (use_cuda && cuda_device < 0) {
    std::string why;
    const int n = runtime::cuda_device_count(&why);
    DSV_CHECK(n > 0, "--device cuda: {}", why);
    cuda_device = o.rank % n;
  }
  Hello hello;
  hello.rank = o.rank;
  hello.world_size = o.world_size;
  hello.device = use_cuda ? "cuda" : "cpu";
  hello.id = compute_identity(o.model_dir, o.engram_token_map);

  auto tcp = std::make_shared<TcpCollective>(o.rank, o.world_size);
  std::unique_ptr<model::CpuModel> model;
  TpRunOptions loaded;
  while (true) {
    Socket ctrl = connect_retrying(o);
    send_frame(ctrl, kHello, encode(hello), nullptr, 5000, "handshake");
    Frame reply;
    try {
      reply = recv_frame(ctrl, nullptr, 15000, "handshake");
    } catch (const Error& e) {
      spdlog::warn("rank {}: handshake with rank 0 failed ({}); retrying", o.rank, e.what());
      std::this_thread::sleep_for(std::chrono::milliseconds(kRetryMs));
      continue;
    }
    if (reply.type == kReject)
      fail("rank 0 refused rank {}: {}", o.rank, std::string(reply.payload.begin(), reply.payload.end()));
    DSV_CHECK(reply.type == kWelcome, "handshake: unexpected reply type {} from rank 0", reply.type);
    uint64_t session = 0;
    TpRunOptions run;
    decode_welcome(reply.payload, session, run);
    spdlog::info("rank {}: joined rank 0 at {}:{} (session {})", o.rank, o.master_addr, o.master_port, session);

    Session ses(std::move(ctrl), o.heartbeat_timeout_s);
    // CUDA path: the NCCL communicator belongs to this head's session (its unique id came in
    // WELCOME), so the collective and the model sharing it live for the session only.
    std::shared_ptr<Collective> nccl;
    std::unique_ptr<model::CudaModel> cuda_model;
    std::map<uint64_t, std::unique_ptr<SeqState>> seqs;
    try {
      if (use_cuda) {
        DSV_CHECK(!run.nccl_id.empty(),
                  "rank 0 runs the CPU engine but this rank was started with --device cuda; start every rank with the "
                  "same --device");
#if defined(DSV41_HAS_NCCL)
        spdlog::info("rank {}: joining the NCCL communicator on CUDA device {}", o.rank, cuda_device);
        nccl = make_nccl_collective(o.rank, o.world_size, run.nccl_id, cuda_device, [&ses] { return ses.lost_reason(); });
        model::CudaModelOptions co;
        co.engram_token_map = o.engram_token_map;
        co.engram_storage.engram_dir = o.engram_dir;
        co.engram_storage.engram_packed = o.engram_packed;
        co.engram_storage.cache_gib = o.engram_cache_gib;
        co.dspark = run.dspark;
        co.corrected_index_keys = run.corrected_index_keys;
        co.device = cuda_device;
        co.tp = nccl;
        spdlog::info("rank {}: loading its share of {} on CUDA device {}", o.rank, o.model_dir, cuda_device);
        cuda_model = model::CudaModel::load(o.model_dir, co);
#else
        fail("--device cuda with --world-size > 1 needs a build with CUDA and NCCL (this one has none)");
#endif
      } else if (!run.nccl_id.empty()) {
        fail("rank 0 runs the CUDA backend but this rank was started with --device {}; start every rank with "
             "--device cuda",
             o.device);
      } else if (!model || loaded.dspark != run.dspark || loaded.corrected_index_keys != run.corrected_index_keys) {
        model.reset();
        model::CpuModelOptions mo;
        mo.engram_token_map = o.engram_token_map;
        mo.engram_storage.engram_dir = o.engram_dir;
        mo.engram_storage.engram_packed = o.engram_packed;
        mo.engram_storage.cache_gib = o.engram_cache_gib;
        mo.dspark = run.dspark;
        mo.corrected_index_keys = run.corrected_index_keys;
        mo.tp = tcp;
        spdlog::info("rank {}: loading its share of {}", o.rank, o.model_dir);
        model = model::CpuModel::load(o.model_dir, mo);
        loaded = run;
      }
      Socket data = connect_tcp(o.master_addr, o.master_port, 5000);
      DSV_CHECK(data.valid(), "cannot open the data link to rank 0 at {}:{}", o.master_addr, o.master_port);
      WireWriter w;
      w.u32(static_cast<uint32_t>(o.rank));
      w.u64(session);
      send_frame(data, kDataJoin, w.bytes(), nullptr, 5000, "data link");
      tcp->detach_all();
      tcp->attach(0, std::move(data));
      tcp->set_abort_check([&ses] { return ses.lost_reason(); });
      ses.send(kReady, {});
      spdlog::info("rank {}: ready", o.rank);
      while (true) {
        Frame f = ses.next();
        if (f.type == kPlan) {
          const Plan p = decode_plan(f.payload);
          try {
            if (cuda_model) execute(*cuda_model, seqs, p);
            else execute(*model, seqs, p);
          } catch (const RankLost&) {
            throw;
          } catch (const std::exception& e) {
            const std::string msg = fmt::format("rank {}: {}", o.rank, e.what());
            try {
              ses.send(kWorkerError, std::vector<uint8_t>(msg.begin(), msg.end()));
            } catch (const std::exception&) {
            }
            throw;
          }
        } else if (f.type == kExit) {
          spdlog::info("rank {}: rank 0 is done; exiting", o.rank);
          tcp->detach_all();
          return 0;
        } else if (f.type == kGoodbye) {
          spdlog::info("rank {}: rank 0 ended the session", o.rank);
          break;
        }
      }
    } catch (const std::exception& e) {
      if (use_cuda ? !cuda_model : !model) {
        // This rank cannot load its share: a configuration error, not a lost link. Rank 0 is told
        // so that it fails at once with this message instead of waiting for a ready that never comes.
        const std::string msg = e.what();
        try {
          ses.send(kLoadFailed, std::vector<uint8_t>(msg.begin(), msg.end()));
        } catch (const std::exception&) {
        }
        throw;
      }
      spdlog::warn("rank {}: session {} ended: {}", o.rank, session, e.what());
    }
    tcp->set_abort_check(nullptr);
    tcp->detach_all();
    ses.close("session over");
  }
}

}  // namespace dsv41::dist
