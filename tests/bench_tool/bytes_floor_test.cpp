// The bytes-floor arithmetic of `dsv41-serve bench` against counts made here independently on the
// tiny fixture: tensor bytes from numel × dtype size with their own name parsing, state reads from
// MODEL.md §5.4 worked by hand for the tiny config, the expected distinct experts in closed form.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <regex>

#include "bench/bytes_floor.h"
#include "dsv41/common/dtype.h"
#include "dsv41/config/model_config.h"
#include "dsv41/loader/checkpoint.h"

namespace dsv41::bench {
namespace {

const std::string kTiny = std::string(DSV41_FIXTURES_DIR) + "/tiny-s0/model";

struct IndependentCount {
  std::map<int64_t, int64_t> dense, experts;  // layer -> bytes
  std::map<int64_t, std::set<int64_t>> expert_ids;
  int64_t head = 0, embed = 0, norm = 0;
};

IndependentCount count_tiny(const Checkpoint& ck) {
  IndependentCount c;
  const std::regex layer_re(R"(layers\.(\d+)\.(.*))"), expert_re(R"(ffn\.experts\.(\d+)\..*)");
  for (const TensorInfo* t : ck.tensors()) {
    int64_t numel = 1;
    for (int64_t d : t->shape) numel *= d;
    const auto bytes = static_cast<int64_t>(static_cast<size_t>(numel) * dtype_size(t->dtype));
    std::smatch m;
    if (std::regex_match(t->name, m, layer_re)) {
      const int64_t L = std::stoll(m[1]);
      const std::string rest = m[2];
      std::smatch e;
      if (rest.rfind("engram.embed.", 0) == 0 || rest.find("bias_vl") != std::string::npos) continue;
      if (std::regex_match(rest, e, expert_re)) {
        c.experts[L] += bytes;
        c.expert_ids[L].insert(std::stoll(e[1]));
      } else {
        c.dense[L] += bytes;
      }
    } else if (t->name == "head.weight" || t->name == "head.scale") {
      c.head += bytes;
    } else if (t->name == "embed.weight") {
      c.embed += bytes;
    } else if (t->name == "norm.weight") {
      c.norm += bytes;
    }
  }
  return c;
}

TEST(BytesFloor, TinyWeightsMatchIndependentCount) {
  const ModelConfig cfg = load_model_config(kTiny + "/config.json");
  auto ck = Checkpoint::open(kTiny);
  const IndependentCount ref = count_tiny(*ck);
  const ModelWeights w = classify_weights(cfg, checkpoint_tensor_sizes(*ck));
  ASSERT_EQ(static_cast<int64_t>(w.layers.size()), cfg.num_hidden_layers);
  for (const LayerWeights& lw : w.layers) {
    SCOPED_TRACE(lw.layer);
    EXPECT_GT(ref.dense.at(lw.layer), 0);
    EXPECT_EQ(lw.dense, ref.dense.at(lw.layer));
    EXPECT_EQ(lw.experts, ref.experts.at(lw.layer));
    EXPECT_EQ(lw.n_experts, cfg.n_routed_experts);
    EXPECT_EQ(static_cast<int64_t>(ref.expert_ids.at(lw.layer).size()), cfg.n_routed_experts);
    EXPECT_EQ(lw.expert_each() * cfg.n_routed_experts, lw.experts);
  }
  EXPECT_EQ(w.head, ref.head);
  EXPECT_EQ(w.embed, ref.embed);
  EXPECT_EQ(w.final_norm, ref.norm);
  // The manifest of the same config (what --full-config uses) gives the same per-layer bytes.
  const ModelWeights m = classify_weights(cfg, manifest_tensor_sizes(cfg));
  for (size_t l = 0; l < w.layers.size(); ++l) {
    EXPECT_EQ(m.layers[l].dense, w.layers[l].dense) << "layer " << l;
    EXPECT_EQ(m.layers[l].experts, w.layers[l].experts) << "layer " << l;
  }
  EXPECT_EQ(m.head, w.head);
}

// tiny-s0: window 16, head_dim 64, index_head_dim 64, index_topk 8, ratios [0,2,2,1,1,1], KV
// sources 1 and 3, index sources 1, 3, 5, candidate source 3 keeping 3 blocks of 4.
TEST(BytesFloor, TinyStateReadsByHand) {
  const ModelConfig cfg = load_model_config(kTiny + "/config.json");
  ASSERT_EQ(cfg.sliding_window, 16);
  ASSERT_EQ(cfg.head_dim, 64);
  const int64_t pos = 40;  // 41 tokens after this one is added
  // layer 0: window only
  EXPECT_EQ(decode_state_read(cfg, 0, pos).total(), 16 * 64 * 2);
  // layer 1: ratio 2, KV + index source before the candidate source: 20 visible entries
  const StateRead l1 = decode_state_read(cfg, 1, pos);
  EXPECT_EQ(l1.window, 16 * 64 * 2);
  EXPECT_EQ(l1.compressed, 8 * 64 * 2);
  EXPECT_EQ(l1.index_keys, 20 * 64 * 2);
  EXPECT_EQ(l1.carries, 2 * 2 * 64 * 4);
  // layer 2: ratio 2, reuses layer 1: window + selected rows only
  EXPECT_EQ(decode_state_read(cfg, 2, pos).total(), 16 * 64 * 2 + 8 * 64 * 2);
  // layer 5: ratio 1 index source after the candidate source: only 3 blocks x 4 keys scanned
  const StateRead l5 = decode_state_read(cfg, 5, pos);
  EXPECT_EQ(l5.index_keys, 12 * 64 * 2);
  EXPECT_EQ(l5.compressed, 8 * 64 * 2);
  EXPECT_EQ(l5.carries, 0);
  // early in the sequence fewer rows exist: position 3 -> 4 window rows, 2 entries at ratio 2
  const StateRead early = decode_state_read(cfg, 1, 3);
  EXPECT_EQ(early.window, 4 * 64 * 2);
  EXPECT_EQ(early.compressed, 2 * 64 * 2);
  EXPECT_EQ(early.index_keys, 2 * 64 * 2);
}

TEST(BytesFloor, DistinctExpertsClosedForm) {
  EXPECT_DOUBLE_EQ(expected_distinct_experts(4, 2, 1), 2.0);
  EXPECT_DOUBLE_EQ(expected_distinct_experts(4, 2, 2), 3.0);      // 4 · (1 − 0.5²)
  EXPECT_DOUBLE_EQ(expected_distinct_experts(384, 6, 1), 6.0);
  EXPECT_NEAR(expected_distinct_experts(384, 6, 4), 23.4433, 1e-3);  // 384 · (1 − (378/384)^4)
  EXPECT_DOUBLE_EQ(expected_distinct_experts(4, 2, 0), 0.0);
}

TEST(BytesFloor, TinyStepTotalIsTheSumOfItsParts) {
  const ModelConfig cfg = load_model_config(kTiny + "/config.json");
  auto ck = Checkpoint::open(kTiny);
  const IndependentCount ref = count_tiny(*ck);
  const ModelWeights w = classify_weights(cfg, checkpoint_tensor_sizes(*ck));
  const int64_t batch = 2, ctx = 40;
  const StepBytes s = decode_step_bytes(cfg, w, batch, ctx);
  // By hand: every layer's dense bytes, 3 distinct experts of 4 for two tokens picking 2, the state
  // of both sequences, 6 Engram rows of 32 + 1 bytes per token at layers 0 and 1, head, 2 embedding
  // rows (bf16, 256 wide), the final norm.
  const int64_t window = 16 * 64 * 2, sel = 8 * 64 * 2;
  const int64_t state_one = window                                         // layer 0
                            + window + sel + 20 * 64 * 2 + 2 * 2 * 64 * 4  // layer 1: keys, carries
                            + window + sel                                 // layer 2
                            + window + sel + 41 * 64 * 2                   // layer 3: candidate source
                            + window + sel                                 // layer 4
                            + window + sel + 12 * 64 * 2;                  // layer 5: 3 blocks of 4
  double dense = 0, experts = 0;
  for (const auto& [L, b] : ref.dense) dense += static_cast<double>(b);
  for (const auto& [L, b] : ref.experts) experts += static_cast<double>(b) / 4.0 * 3.0;
  const double engram = 2.0 * batch * 6 * 33;
  const double expected = dense + experts + static_cast<double>(batch * state_one) + engram +
                          static_cast<double>(ref.head) + batch * 256 * 2 + static_cast<double>(ref.norm);
  EXPECT_DOUBLE_EQ(s.total(), expected);
  EXPECT_DOUBLE_EQ(s.state, static_cast<double>(batch * state_one));
  EXPECT_DOUBLE_EQ(s.engram_rows, engram);
  double per_layer = 0;
  for (double v : s.per_layer) per_layer += v;
  EXPECT_DOUBLE_EQ(per_layer, s.layers_total());
}

TEST(BytesFloor, TensorParallelProjectionHalvesSplitParts) {
  const ModelConfig cfg = load_model_config(kTiny + "/config.json");
  auto ck = Checkpoint::open(kTiny);
  const TensorSizes sizes = checkpoint_tensor_sizes(*ck);
  const ModelWeights w = classify_weights(cfg, sizes);
  TpLink link;
  link.node_bandwidth = 100e9;
  link.link_bandwidth = 10e9;
  link.latency_s = 10e-6;
  const TpProjection p = project_tp2(cfg, sizes, w, 1, 40, link);
  const StepBytes s = decode_step_bytes(cfg, w, 1, 40);
  // Between half and all of the single-node bytes; the state and replicated weights stay whole.
  EXPECT_LT(p.node_bytes, s.total());
  EXPECT_GT(p.node_bytes, s.total() / 2);
  EXPECT_DOUBLE_EQ(p.memory_s, p.node_bytes / 100e9);
  // The CUDA path's collectives (cuda_tp.cpp): per layer z, wo_b rows, shared gate/up and the MoE
  // rows (this FP8 fixture: routed pairs + shared rows), fp32; then the logits.
  const int64_t L = cfg.num_hidden_layers, D = cfg.hidden_size;
  EXPECT_EQ(p.allreduces, 4 * L + 1);
  const double layer = 4.0 * static_cast<double>(cfg.o_groups * cfg.o_lora_rank + D + 2 * cfg.moe_intermediate_size +
                                                 (cfg.num_experts_per_tok + 1) * D);
  const double all = static_cast<double>(L) * layer + 4.0 * static_cast<double>(cfg.vocab_size);
  EXPECT_DOUBLE_EQ(p.allreduce_bytes * static_cast<double>(p.allreduces), all);
  EXPECT_DOUBLE_EQ(p.allreduce_s, static_cast<double>(4 * L + 1) * 10e-6 + all / 10e9);
  // Scaling the layers (a short model projected to the full count) leaves the logits' share alone.
  TpProjection twice = p;
  twice.scale_layers(2.0, link);
  EXPECT_EQ(twice.allreduces, 8 * L + 1);
  EXPECT_DOUBLE_EQ(twice.allreduce_bytes * static_cast<double>(twice.allreduces),
                   2.0 * static_cast<double>(L) * layer + 4.0 * static_cast<double>(cfg.vocab_size));
}

// Which parts one node reads whole: bytes added to a split part (wq_b) cost a node half of them,
// bytes added to a replicated one (the Engram wkv, replicated on the CUDA path) all of them.
TEST(BytesFloor, TensorParallelProjectionKeepsEngramWhole) {
  const ModelConfig cfg = load_model_config(kTiny + "/config.json");
  ASSERT_FALSE(cfg.engram_layer_ids.empty());
  auto ck = Checkpoint::open(kTiny);
  const TensorSizes sizes = checkpoint_tensor_sizes(*ck);
  TpLink link;
  auto node_bytes = [&](const std::string& grown, int64_t extra) {
    TensorSizes t = sizes;
    bool found = false;
    for (auto& [name, bytes] : t)
      if (name == grown) bytes += extra, found = true;
    EXPECT_TRUE(found) << grown;
    return project_tp2(cfg, t, classify_weights(cfg, t), 1, 40, link).node_bytes;
  };
  const double base = node_bytes("layers.0.attn.wq_b.weight", 0);
  const std::string engram = "layers." + std::to_string(cfg.engram_layer_ids.front()) + ".engram.wkv.weight";
  EXPECT_DOUBLE_EQ(node_bytes("layers.0.attn.wq_b.weight", 1000) - base, 500.0);
  EXPECT_DOUBLE_EQ(node_bytes(engram, 1000) - base, 1000.0);
}

}  // namespace
}  // namespace dsv41::bench
