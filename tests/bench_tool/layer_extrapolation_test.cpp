// The per-layer-kind extrapolation of `dsv41-serve bench`: the release config's 40 layers from a
// 3-layer model cut from it (layers 0, 1 and 2), with per-layer times chosen here and the sums
// worked out by hand from the config's layer lists.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "bench/layer_extrapolation.h"
#include "dsv41/common/error.h"
#include "mkmodel/config_edit.h"

namespace dsv41::bench {
namespace {

std::string release_config_text() {
  std::ifstream f(std::string(DSV41_SOURCE_DIR) + "/configs/deepseek-v4.1-flash.json");
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

ModelConfig cut(int64_t layers) {
  nlohmann::json root = nlohmann::json::parse(release_config_text());
  mkmodel::truncate_layers(root, layers, "test");
  return parse_model_config(root.dump(), "test");
}

TEST(LayerExtrapolation, ReleaseLayersByKind) {
  const ModelConfig full = parse_model_config(release_config_text(), "release");
  const ModelConfig small = cut(3);
  // Layer 0: ratio 0; layer 1: ratio 0 + Engram; layer 2: ratio 2, KV and index source.
  const LayerExtrapolation ex = extrapolate_layers(small, {1.0, 1.5, 2.0}, full);
  EXPECT_TRUE(ex.engram_measured);
  EXPECT_DOUBLE_EQ(ex.engram_ms, 0.5);
  // By hand from the release lists (compress_ratios' last 3 entries are the DSpark stages'): ratio
  // 0 at 0 and 1 (Engram at 1); ratio 2 at 2-19 with KV + index sources 2, 8, 14 (Engram at 14);
  // ratio 1 at 20-39, KV + index source 20, index sources 24, 28, 32, 36. Exact kinds: 1.0 (0),
  // 1.5 (1), 2 x 2.0 (2, 8); layer 14 is layer 2's kind + the Engram branch, 2.5; the other 35
  // compressed layers have no measured kind of their own and take layer 2's 2.0.
  EXPECT_DOUBLE_EQ(ex.total_ms, 1.0 + 1.5 + 2 * 2.0 + 2.5 + 35 * 2.0);
  int64_t layers = 0, exact = 0;
  for (const KindEstimate& k : ex.kinds) {
    layers += k.count;
    if (k.exact) exact += k.count;
  }
  EXPECT_EQ(layers, 40);
  EXPECT_EQ(exact, 4);  // 0, 1, 2, 8
  ASSERT_GE(ex.kinds.size(), 3u);
  EXPECT_EQ(describe(ex.kinds[2].kind), "ratio 2, KV + index source");
  for (const KindEstimate& k : ex.kinds)
    if (k.kind.engram && k.kind.ratio == 2) EXPECT_TRUE(k.plus_engram);
}

TEST(LayerExtrapolation, WithoutAnEngramPairTheBranchIsNotGuessed) {
  const ModelConfig full = parse_model_config(release_config_text(), "release");
  // The 3-layer cut without its Engram layer: nothing measures the Engram branch.
  nlohmann::json root = nlohmann::json::parse(release_config_text());
  mkmodel::truncate_layers(root, 3, "test");
  root["text_config"]["engram_layer_ids"] = nlohmann::json::array();
  root["text_config"]["engram_num_embeddings"] = nlohmann::json::array();
  const ModelConfig small = parse_model_config(root.dump(), "test");
  const LayerExtrapolation ex = extrapolate_layers(small, {1.0, 1.25, 2.0}, full);
  EXPECT_FALSE(ex.engram_measured);
  EXPECT_DOUBLE_EQ(ex.engram_ms, 0.0);
  // Layers 0 and 1 (Engram) take the two ratio-0 layers' mean, 1.125; the 38 compressed, 2.0.
  EXPECT_DOUBLE_EQ(ex.total_ms, 2 * 1.125 + 38 * 2.0);
  EXPECT_THROW(extrapolate_layers(small, {1.0, 2.0}, full), Error);
}

}  // namespace
}  // namespace dsv41::bench
