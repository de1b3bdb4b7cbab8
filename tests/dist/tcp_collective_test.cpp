// The TCP collective backend, the split helper and the control-plane encoding, in process.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "dist/net.h"
#include "dist/protocol.h"
#include "dist/tcp_collective.h"
#include "dist/tp_linear.h"

using namespace dsv41;
using namespace dsv41::dist;

namespace {

// Three ranks over loopback: rank 0 the hub.
struct Trio {
  std::vector<std::shared_ptr<TcpCollective>> c;
  Trio() {
    Socket l = listen_tcp("127.0.0.1", 0);
    const int port = bound_port(l);
    for (int r = 0; r < 3; ++r) c.push_back(std::make_shared<TcpCollective>(r, 3));
    for (int r = 1; r < 3; ++r) {
      Socket s = connect_tcp("127.0.0.1", port, 2000);
      Socket a = accept_tcp(l, 2000);
      EXPECT_TRUE(s.valid() && a.valid());
      c[r]->attach(0, std::move(s));
      c[0]->attach(r, std::move(a));
    }
  }
  template <class F>
  void run(F f) {
    std::vector<std::thread> t;
    for (int r = 0; r < 3; ++r) t.emplace_back([&, r] { f(*c[r], r); });
    for (auto& x : t) x.join();
  }
};

}  // namespace

TEST(TcpCollective, AllGatherUnequalPartsAndAllReduceInRankOrder) {
  Trio t;
  const std::vector<size_t> counts = {3, 0, 5};
  std::vector<std::vector<uint8_t>> got(3);
  std::vector<std::vector<float>> sums(3);
  t.run([&](TcpCollective& c, int r) {
    std::vector<uint8_t> mine(counts[r], static_cast<uint8_t>(10 * (r + 1)));
    for (size_t i = 0; i < mine.size(); ++i) mine[i] = static_cast<uint8_t>(mine[i] + i);
    got[r].assign(8, 0);
    c.all_gather(mine.data(), counts, got[r].data());
    std::vector<float> v = {1e8f * (r == 0), 1.0f, static_cast<float>(r)};
    if (r == 2) v[0] = -1e8f;
    c.all_reduce_sum(v.data(), v.size());
    sums[r] = v;
  });
  const std::vector<uint8_t> expect = {10, 11, 12, 30, 31, 32, 33, 34};
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(got[r], expect) << "rank " << r;
    // ((1e8 + 1) + 1 - 1e8 ...) in rank order: 1e8 + 0 + (-1e8) = 0; 1+1+1 = 3; 0+1+2 = 3
    EXPECT_EQ(sums[r], (std::vector<float>{0.0f, 3.0f, 3.0f})) << "rank " << r;
    // What each rank's /metrics would count: one call of each, the whole gathered bytes, the
    // reduced buffer once, both calls timed (TCP calls block).
    const CollectiveStats st = t.c[r]->stats();
    EXPECT_EQ(st.all_gather_calls, 1u) << "rank " << r;
    EXPECT_EQ(st.all_gather_bytes, 8u) << "rank " << r;
    EXPECT_EQ(st.all_reduce_calls, 1u) << "rank " << r;
    EXPECT_EQ(st.all_reduce_bytes, 12u) << "rank " << r;
    EXPECT_EQ(st.timed_calls, 2u) << "rank " << r;
    EXPECT_GT(st.seconds, 0.0) << "rank " << r;
  }
  const std::string text = format_collective_metrics(t.c[0]->stats());
  EXPECT_NE(text.find("\ndsv41_tp_all_reduce_calls_total 1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("\ndsv41_tp_all_gather_bytes_total 8\n"), std::string::npos) << text;
  EXPECT_NE(text.find("# TYPE dsv41_tp_collective_seconds_total counter"), std::string::npos) << text;
}

TEST(TcpCollective, ALostPeerThrowsRankLostNamingIt) {
  Trio t;
  std::atomic<int> lost_rank{-1};
  std::string msg;
  t.c[2]->detach_all();  // rank 2 vanishes
  std::thread r0([&] {
    std::vector<uint8_t> out(3);
    const std::vector<size_t> counts = {1, 1, 1};
    try {
      uint8_t v = 1;
      t.c[0]->all_gather(&v, counts, out.data());
    } catch (const RankLost& e) {
      lost_rank = e.rank();
      msg = e.what();
    }
  });
  std::thread r1([&] {
    std::vector<uint8_t> out(3);
    const std::vector<size_t> counts = {1, 1, 1};
    uint8_t v = 2;
    try {
      t.c[1]->all_gather(&v, counts, out.data());
    } catch (const Error&) {
    }
  });
  r0.join();
  t.c[0]->interrupt();
  r1.join();
  EXPECT_EQ(lost_rank, 2);
  EXPECT_NE(msg.find("tensor-parallel rank 2 is unavailable"), std::string::npos) << msg;
}

TEST(TcpCollective, AbortCheckEndsABlockedCollective) {
  Trio t;
  std::atomic<bool> dead{false};
  t.c[0]->set_abort_check([&]() -> std::string { return dead ? "rank 1: no heartbeat for 3.0 s" : ""; });
  std::thread killer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    dead = true;
  });
  std::vector<float> v = {1.0f};
  EXPECT_THROW(t.c[0]->all_reduce_sum(v.data(), 1), RankLost);  // ranks 1, 2 never call
  killer.join();
}

TEST(SplitRange, CoversEverythingOnceWithAlignedStarts) {
  for (int64_t total : {0, 1, 31, 32, 33, 100, 4096, 7168})
    for (int world : {1, 2, 3, 8})
      for (int64_t align : {1, 32}) {
        int64_t next = 0;
        for (int r = 0; r < world; ++r) {
          const Range x = split_range(total, r, world, align);
          EXPECT_EQ(x.begin, next);
          EXPECT_TRUE(x.begin % align == 0 || x.begin == total);
          next = x.end;
        }
        EXPECT_EQ(next, total);
      }
  EXPECT_THROW(split_range(10, 2, 2), Error);
}

TEST(ControlProtocol, PlansRoundTripAndHelloMismatchesAreNamed) {
  Plan p;
  p.step = 7;
  PlanOp f;
  f.kind = OpKind::forward;
  f.seq = 3;
  f.n_past = 12;
  f.prompt_len = 40;
  f.all_logits = true;
  f.want_logits = true;
  f.tokens = {1, 2, 3};
  p.ops = {PlanOp{OpKind::new_seq, 3}, f, PlanOp{OpKind::clone, 3, 4}};
  const Plan q = decode_plan(encode(p));
  ASSERT_EQ(q.ops.size(), 3u);
  EXPECT_EQ(q.step, 7u);
  EXPECT_EQ(q.ops[1].tokens, f.tokens);
  EXPECT_EQ(q.ops[1].prompt_len, 40);
  EXPECT_EQ(q.ops[2].seq2, 4u);
  std::vector<uint8_t> bad = encode(p);
  bad.resize(bad.size() - 2);
  EXPECT_THROW(decode_plan(bad), Error);

  Identity mine{"1.0", 1, 2, 3};
  Hello h;
  h.rank = 1;
  h.world_size = 2;
  h.id = mine;
  EXPECT_EQ(check_hello(h, 2, mine), "");
  h.id.config_hash = 9;
  EXPECT_NE(check_hello(h, 2, mine).find("config hash"), std::string::npos);
  h.id = mine;
  h.id.checkpoint_hash = 9;
  EXPECT_NE(check_hello(h, 2, mine).find("checkpoint hash"), std::string::npos);
  h.id = mine;
  h.world_size = 3;
  EXPECT_NE(check_hello(h, 2, mine).find("world size 3"), std::string::npos);
  h.world_size = 2;
  h.rank = 2;
  EXPECT_NE(check_hello(h, 2, mine).find("rank 2"), std::string::npos);
}
