// End to end: the CPU engine with its Engram rows read from separate shards (--engram-dir) and
// from packed files (--engram-packed, world size 1 and both ranks of world size 2) gives logits
// identical to the engine with the tables inside the checkpoint.
#include <gtest/gtest.h>

#include "dsv41/engram/pack.h"
#include "dsv41/model/cpu_model.h"
#include "split_fixture.h"

namespace dsv41::engram {
namespace {

std::vector<float> run_logits(const std::string& dir, model::CpuModelOptions mo) {
  mo.engram_token_map = std::string(DSV41_FIXTURES_DIR) + "/tiny-s0/engram_token_map.safetensors";
  mo.dspark = false;
  auto m = model::CpuModel::load(dir, mo);
  auto st = m->new_sequence();
  std::vector<int32_t> prompt;
  for (int i = 0; i < 40; ++i) prompt.push_back(static_cast<int32_t>((i * 37 + 11) % m->config().vocab_size));
  std::vector<float> logits, step;
  m->forward_sequence(*st, std::span<const int32_t>(prompt.data(), 30), true, &logits);
  for (int i = 30; i < 40; ++i) {  // decode steps carry the n-gram history across calls
    m->forward_sequence(*st, std::span<const int32_t>(&prompt[i], 1), false, &step);
    logits.insert(logits.end(), step.begin(), step.end());
  }
  return logits;
}

TEST(EngramLogits, DiskAndPackedRowsGiveIdenticalLogits) {
  test::TempDir tmp;
  const auto m = test::make_split_model(tmp.path());
  const auto ref = run_logits(test::fixture_model("tiny-s0"), {});
  ASSERT_FALSE(ref.empty());

  model::CpuModelOptions from_dir;
  from_dir.engram_storage.engram_dir = m.engram_dir;
  from_dir.engram_storage.cache_gib = 0.001;
  EXPECT_EQ(run_logits(m.main_dir, from_dir), ref);

  for (int world : {1, 2}) {
    const std::string out = tmp.sub("pack" + std::to_string(world));
    for (int rank = 0; rank < world; ++rank) {
      PackOptions o;
      o.engram_dir = m.engram_dir;
      o.out_dir = out;
      o.rank = rank;
      o.world_size = world;
      o.progress = false;
      ASSERT_TRUE(pack_engram(m.geo, o).complete);
    }
    model::CpuModelOptions packed;
    packed.engram_storage.engram_packed = out;  // world 2: both ranks' packs = the whole table
    EXPECT_EQ(run_logits(m.main_dir, packed), ref) << "world size " << world;
  }
  // Without the tables and without --engram-dir: one clear error.
  try {
    run_logits(m.main_dir, {});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--engram-dir"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace dsv41::engram
