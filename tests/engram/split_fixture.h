// Test fixtures for the Engram storage tests: a temporary folder, and the tiny-s0 model with its
// Engram tables moved out of the main checkpoint into shards of their own (the layout of the
// released checkpoint, where shards 47/48 hold the two tables).
#pragma once
#include <unistd.h>

#include <filesystem>
#include <fmt/format.h>

#include <fstream>
#include <functional>
#include <set>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "dsv41/common/error.h"
#include "dsv41/config/model_config.h"
#include "dsv41/engram/geometry.h"
#include "dsv41/loader/checkpoint.h"
#include "dsv41/loader/safetensors.h"

namespace dsv41::engram::test {

namespace fs = std::filesystem;

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "dsv41-engram-XXXXXX").string();
    if (!mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }
  std::string str() const { return path_.string(); }
  std::string sub(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

inline std::string fixture_model(const std::string& name) {
  return std::string(DSV41_FIXTURES_DIR) + "/" + name + "/model";
}

// Writes DIR/main (config + every tensor but the Engram tables) and DIR/engram (config, an index
// naming all shards, and only the Engram shards: one per table layer, each with a small tensor
// in front so row 0 does not start at a block boundary).
struct SplitModel {
  std::string main_dir, engram_dir;
  ModelConfig cfg;
  EngramGeometry geo;
  std::vector<std::string> engram_shards;  // file names, one per Engram layer
};

inline SplitModel make_split_model(const fs::path& root, const std::string& fixture = "tiny-s0") {
  SplitModel s;
  const std::string src = fixture_model(fixture);
  s.main_dir = (root / "main").string();
  s.engram_dir = (root / "engram").string();
  fs::create_directories(s.main_dir);
  fs::create_directories(s.engram_dir);
  fs::copy_file(src + "/config.json", s.main_dir + "/config.json");
  fs::copy_file(src + "/config.json", s.engram_dir + "/config.json");
  s.cfg = load_model_config(src + "/config.json");
  s.geo = EngramGeometry::from_config(s.cfg);
  auto ck = Checkpoint::open(src);
  const size_t n_eng = s.cfg.engram_layer_ids.size();
  const std::string main_shard = "model-00001-of-" + fmt::format("{:05d}", n_eng + 1) + ".safetensors";
  nlohmann::json weight_map = nlohmann::json::object();
  SafetensorsWriter main;
  std::vector<SafetensorsWriter> eng(n_eng);
  for (size_t l = 0; l < n_eng; ++l) {
    s.engram_shards.push_back(fmt::format("model-{:05d}-of-{:05d}.safetensors", l + 2, n_eng + 1));
    const std::vector<uint8_t> pad(static_cast<size_t>(37 + 11 * l), 0x5a);
    const std::string pad_name = fmt::format("layers.{}.engram.pad_for_test", s.cfg.engram_layer_ids[l]);
    eng[l].add(pad_name, DType::U8, {static_cast<int64_t>(pad.size())}, pad);
    weight_map[pad_name] = s.engram_shards[l];
  }
  for (const TensorInfo* t : ck->tensors()) {
    size_t owner = n_eng;
    for (size_t l = 0; l < n_eng; ++l) {
      const std::string p = fmt::format("layers.{}.engram.embed.", s.cfg.engram_layer_ids[l]);
      if (t->name.rfind(p, 0) == 0) owner = l;
    }
    if (owner == n_eng) {
      main.add(t->name, t->dtype, t->shape, t->data, t->nbytes);
      weight_map[t->name] = main_shard;
    } else {
      eng[owner].add(t->name, t->dtype, t->shape, t->data, t->nbytes);
      weight_map[t->name] = s.engram_shards[owner];
    }
  }
  main.write(s.main_dir + "/model.safetensors");
  for (size_t l = 0; l < n_eng; ++l) eng[l].write(s.engram_dir + "/" + s.engram_shards[l]);
  std::ofstream(s.engram_dir + "/model.safetensors.index.json")
      << nlohmann::json{{"metadata", {{"total_size", 0}}}, {"weight_map", weight_map}}.dump(1);
  return s;
}

// Row `row` of Engram layer `layer` straight from the original checkpoint's tensors.
inline std::vector<uint8_t> original_row(const Checkpoint& ck, const EngramGeometry& g, int64_t layer, int64_t row) {
  const int64_t id = g.layer_ids[static_cast<size_t>(layer)];
  const TensorInfo& w = ck.get(fmt::format("layers.{}.engram.embed.weight", id));
  const TensorInfo& s = ck.get(fmt::format("layers.{}.engram.embed.scale", id));
  std::vector<uint8_t> out(w.data + row * g.head_dim, w.data + (row + 1) * g.head_dim);
  out.insert(out.end(), s.data + row * g.scale_bytes, s.data + (row + 1) * g.scale_bytes);
  return out;
}

}  // namespace dsv41::engram::test
