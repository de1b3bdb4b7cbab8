// A checkpoint whose index lists the Engram table shards while the tables live elsewhere
// (--engram-dir / --engram-packed), the released layout when the ~101 GB tables are kept on
// another disk: the absent shards are skipped only when an external Engram source is configured,
// and the model then computes the same logits as with the tables in the folder.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "dsv41/common/error.h"
#include "dsv41/loader/checkpoint.h"
#include "dsv41/loader/safetensors.h"
#include "dsv41/model/cpu_model.h"
#include "loader_test_util.h"

using namespace dsv41;
using dsv41::test::TempDir;
namespace fs = std::filesystem;

namespace {

const std::string kShardMain = "model-00001-of-00002.safetensors";
const std::string kShardTables = "model-00002-of-00002.safetensors";

// root/main: config, the full index, only the non-table shard. root/engram: config, the same
// index, only the table shard (what --engram-dir needs). `extra_in_tables`: one more tensor that
// is not an Engram table goes into the table shard (then skipping it would lose a weight).
void write_split(const fs::path& root, bool extra_in_tables = false) {
  const fs::path src = test::fixture("tiny-s0") / "model";
  auto ck = Checkpoint::open(src.string());
  nlohmann::json wm = nlohmann::json::object();
  SafetensorsWriter main, tables;
  bool moved_extra = false;
  for (const TensorInfo* t : ck->tensors()) {
    const bool table = is_engram_table_tensor(t->name);
    const bool extra = extra_in_tables && !table && !moved_extra && t->name.find("engram") != std::string::npos;
    moved_extra = moved_extra || extra;
    (table || extra ? tables : main).add(t->name, t->dtype, t->shape, t->data, t->nbytes);
    wm[t->name] = table || extra ? kShardTables : kShardMain;
  }
  ASSERT_TRUE(!extra_in_tables || moved_extra);
  const std::string index = nlohmann::json{{"metadata", {{"total_size", 0}}}, {"weight_map", wm}}.dump(1);
  for (const char* d : {"main", "engram"}) {
    fs::create_directories(root / d);
    fs::copy_file(src / "config.json", root / d / "config.json");
    std::ofstream(root / d / "model.safetensors.index.json") << index;
  }
  main.write((root / "main" / kShardMain).string());
  tables.write((root / "engram" / kShardTables).string());
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(CheckpointEngram, RecognisesTheTableTensorsOnly) {
  EXPECT_TRUE(is_engram_table_tensor("layers.0.engram.embed.weight"));
  EXPECT_TRUE(is_engram_table_tensor("layers.17.engram.embed.scale"));
  EXPECT_FALSE(is_engram_table_tensor("layers.0.engram.wkv.weight"));
  EXPECT_FALSE(is_engram_table_tensor("layers.x.engram.embed.weight"));
  EXPECT_FALSE(is_engram_table_tensor("layers..engram.embed.weight"));
  EXPECT_FALSE(is_engram_table_tensor("mtp.0.engram.embed.weight"));
  EXPECT_FALSE(is_engram_table_tensor("layers.0.engram.embed.weight.extra"));
}

TEST(CheckpointEngram, AbsentTableShardFailsNamedWithoutAnExternalSource) {
  TempDir d;
  write_split(d.path());
  const std::string main = (d.path() / "main").string();
  const std::string msg = error_of([&] { Checkpoint::open(main); });
  EXPECT_NE(msg.find(kShardTables), std::string::npos) << msg;
  EXPECT_NE(msg.find("--engram-dir"), std::string::npos) << msg;
  EXPECT_NE(msg.find("engram.embed"), std::string::npos) << msg;
}

TEST(CheckpointEngram, AbsentTableShardIsSkippedWhenTablesAreElsewhere) {
  TempDir d;
  write_split(d.path());
  CheckpointOpenOptions o;
  o.engram_elsewhere = "--engram-dir " + (d.path() / "engram").string();
  auto ck = Checkpoint::open((d.path() / "main").string(), o);
  ASSERT_EQ(ck->skipped_shards(), std::vector<std::string>{kShardTables});
  EXPECT_FALSE(ck->has("layers.0.engram.embed.weight"));
  EXPECT_TRUE(ck->has("embed.weight"));
  for (const TensorInfo* t : ck->tensors()) EXPECT_FALSE(is_engram_table_tensor(t->name)) << t->name;
}

TEST(CheckpointEngram, AbsentShardWithOtherTensorsStillFails) {
  TempDir d;
  write_split(d.path(), /*extra_in_tables=*/true);
  CheckpointOpenOptions o;
  o.engram_elsewhere = "--engram-dir elsewhere";
  const std::string msg = error_of([&] { Checkpoint::open((d.path() / "main").string(), o); });
  EXPECT_NE(msg.find(kShardTables), std::string::npos) << msg;
  EXPECT_NE(msg.find("missing"), std::string::npos) << msg;
}

TEST(CheckpointEngram, ModelWithTablesElsewhereGivesIdenticalLogits) {
  TempDir d;
  write_split(d.path());
  const std::string map = test::fixture("tiny-s0/engram_token_map.safetensors").string();
  model::CpuModelOptions in_folder;
  in_folder.engram_token_map = map;
  auto ref = model::CpuModel::load((test::fixture("tiny-s0") / "model").string(), in_folder);
  model::CpuModelOptions split = in_folder;
  split.engram_storage.engram_dir = (d.path() / "engram").string();
  auto m = model::CpuModel::load((d.path() / "main").string(), split);
  const std::vector<int32_t> prompt = {5, 17, 300, 42, 42, 7, 99, 250, 3, 11, 64, 128};
  auto a = ref->new_sequence(), b = m->new_sequence();
  std::vector<float> la, lb;
  ref->forward_sequence(*a, prompt, true, &la);
  m->forward_sequence(*b, prompt, true, &lb);
  ASSERT_EQ(la.size(), prompt.size() * static_cast<size_t>(ref->config().vocab_size));
  EXPECT_EQ(la, lb);
  // Without the external source the same folder is refused at load, by name.
  EXPECT_NE(error_of([&] { model::CpuModel::load((d.path() / "main").string(), in_folder); }).find("--engram-dir"),
            std::string::npos);
}
