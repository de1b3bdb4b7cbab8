// The tensor-parallel routed-expert id mapping on the device (gpu::local_expert_ids) against the
// rule every rank's bank follows (ops::local_expert_id): for each rank's share of the real and tiny
// expert counts under 2 and 3 ranks, router ids of every expert (and ids just outside the share),
// at decode and prefill pair counts; guard bytes around the output.
#include <gtest/gtest.h>

#include "dsv41/dist/collective.h"
#include "dsv41/ops/gpu_expert_ids.h"
#include "harness.h"

namespace dsv41::test {
namespace {

TEST(GpuExpertIds, LocalIdsFollowTheBankRuleForEveryRankShare) {
  Rng rng(41);
  for (const Shapes& s : shape_sets()) {
    const int64_t experts = s.cfg.n_routed_experts;
    for (int world : {2, 3}) {
      for (int rank = 0; rank < world; ++rank) {
        const dist::Range share = dist::split_range(experts, rank, world);
        for (int64_t pairs : {int64_t{1}, int64_t{6}, int64_t{6 * 4}, int64_t{6 * 1024 + 5}}) {
          std::vector<int32_t> global(static_cast<size_t>(pairs));
          for (auto& e : global) e = static_cast<int32_t>(rng.below(experts));
          // Both edges of the share, wherever the random ids fell.
          global[0] = static_cast<int32_t>(share.begin);
          if (pairs > 2) {
            global[1] = static_cast<int32_t>(share.end - 1);
            global[2] = static_cast<int32_t>(share.end < experts ? share.end : share.begin - 1);
          }
          std::vector<int32_t> want(global.size());
          for (size_t i = 0; i < global.size(); ++i)
            want[i] = ops::local_expert_id(global[i], static_cast<int32_t>(share.begin), static_cast<int32_t>(share.end));
          const Guarded dg = Guarded::from(global);
          Guarded dl(global.size() * 4);
          ops::gpu::local_expert_ids(dg.as<int32_t>(), dl.as<int32_t>(), pairs, static_cast<int32_t>(share.begin),
                                     static_cast<int32_t>(share.end), nullptr);
          ops::gpu::check_cuda(cudaDeviceSynchronize(), "local_expert_ids");
          const std::string what = s.name + " rank " + std::to_string(rank) + "/" + std::to_string(world) + " pairs " +
                                   std::to_string(pairs);
          expect_equal(what, dl.host<int32_t>(), want);
          expect_guards(what, dl);
        }
      }
    }
  }
}

TEST(GpuExpertIds, RuleAndArgumentChecks) {
  EXPECT_EQ(ops::local_expert_id(5, 4, 8), 1);
  EXPECT_EQ(ops::local_expert_id(3, 4, 8), -1);
  EXPECT_EQ(ops::local_expert_id(8, 4, 8), -1);
  EXPECT_THROW(ops::gpu::local_expert_ids(nullptr, nullptr, 4, 0, 8, nullptr), Error);
  EXPECT_THROW(ops::gpu::local_expert_ids(nullptr, nullptr, 0, 8, 4, nullptr), Error);
}

}  // namespace
}  // namespace dsv41::test
