#include "dsv41/loader/checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include <spdlog/spdlog.h>

#include "dsv41/common/error.h"

namespace dsv41 {

namespace fs = std::filesystem;

bool is_engram_table_tensor(std::string_view name) {
  // layers.{L}.engram.embed.weight / .scale with L a decimal layer number
  constexpr std::string_view head = "layers.", mid = ".engram.embed.";
  if (!name.starts_with(head)) return false;
  size_t i = head.size();
  const size_t digits = i;
  while (i < name.size() && name[i] >= '0' && name[i] <= '9') ++i;
  if (i == digits || name.substr(i, mid.size()) != mid) return false;
  const std::string_view leaf = name.substr(i + mid.size());
  return leaf == "weight" || leaf == "scale";
}

std::unique_ptr<Checkpoint> Checkpoint::open(const std::string& dir) { return open(dir, CheckpointOpenOptions{}); }

std::unique_ptr<Checkpoint> Checkpoint::open(const std::string& dir, const CheckpointOpenOptions& options) {
  auto c = std::make_unique<Checkpoint>();
  c->dir_ = dir;
  if (!fs::is_directory(dir)) fail("checkpoint {}: not a directory", dir);
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  std::vector<std::string> files;
  nlohmann::json weight_map;
  if (fs::exists(index)) {
    std::ifstream in(index);
    if (!in) fail("{}: cannot open", index.string());
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {
      fail("{}: not valid JSON: {}", index.string(), e.what());
    }
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
      fail("{}: missing object 'weight_map'", index.string());
    weight_map = j["weight_map"];
    std::set<std::string> uniq;
    for (auto it = weight_map.begin(); it != weight_map.end(); ++it) {
      if (!it.value().is_string()) fail("{}: weight_map['{}'] is not a file name", index.string(), it.key());
      const std::string& f = it.value().get_ref<const std::string&>();
      // shards live in the folder itself: no paths, so an index cannot point outside it
      if (f.empty() || f.find('/') != std::string::npos || f == "." || f == "..")
        fail("{}: weight_map['{}'] = '{}' is not a file name in the folder", index.string(), it.key(), f);
      uniq.insert(f);
    }
    files.assign(uniq.begin(), uniq.end());
  } else {
    for (const auto& e : fs::directory_iterator(dir))
      if (e.is_regular_file() && e.path().extension() == ".safetensors") files.push_back(e.path().filename().string());
    std::sort(files.begin(), files.end());
  }
  if (files.empty()) fail("checkpoint {}: no *.safetensors files", dir);
  std::set<std::string> skipped;
  for (const auto& name : files) {
    const fs::path p = fs::path(dir) / name;
    if (!fs::exists(p)) {
      // What the index puts in this shard: only Engram tables, some, or none.
      std::vector<std::string> listed;
      bool only_tables = true;
      for (auto it = weight_map.begin(); it != weight_map.end(); ++it)
        if (it.value().get_ref<const std::string&>() == name) {
          listed.push_back(it.key());
          only_tables = only_tables && is_engram_table_tensor(it.key());
        }
      std::sort(listed.begin(), listed.end());
      if (only_tables && !options.engram_elsewhere.empty()) {
        spdlog::info("checkpoint {}: shard {} is absent; its {} Engram table tensors ({}{}) are read from {}", dir, name,
                     listed.size(), listed.front(), listed.size() > 1 ? ", ..." : "", options.engram_elsewhere);
        skipped.insert(name);
        c->skipped_.push_back(name);
        continue;
      }
      if (only_tables)
        fail("checkpoint {}: shard {} is listed in the index but missing; it holds the Engram tables ({}{}): copy it "
             "there, or pass --engram-dir DIR (the folder with the original Engram shards) or --engram-packed DIR",
             dir, name, listed.front(), listed.size() > 1 ? ", ..." : "");
      const auto other = std::find_if(listed.begin(), listed.end(), [](const std::string& t) { return !is_engram_table_tensor(t); });
      fail("checkpoint {}: shard {} is listed in the index but missing (it holds '{}')", dir, name, *other);
    }
    c->files_.push_back(SafetensorsFile::open(p.string()));
  }
  for (const auto& f : c->files_) {
    for (const auto& t : f->tensors()) {
      auto [it, inserted] = c->by_name_.emplace(t.name, &t);
      if (!inserted) fail("checkpoint {}: tensor '{}' appears in both {} and {}", dir, t.name, it->second->file, t.file);
    }
  }
  if (!weight_map.is_null()) {
    for (auto it = weight_map.begin(); it != weight_map.end(); ++it) {
      if (skipped.count(it.value().get<std::string>())) continue;
      const TensorInfo* t = c->find(it.key());
      if (!t) fail("checkpoint {}: tensor '{}' is listed in the index (shard {}) but absent", dir, it.key(),
                   it.value().get<std::string>());
      if (fs::path(t->file).filename() != it.value().get<std::string>())
        fail("checkpoint {}: tensor '{}' is in {} but the index says {}", dir, it.key(), t->file,
             it.value().get<std::string>());
    }
  }
  return c;
}

const TensorInfo* Checkpoint::find(std::string_view name) const {
  auto it = by_name_.find(std::string(name));
  return it == by_name_.end() ? nullptr : it->second;
}

const TensorInfo& Checkpoint::get(std::string_view name) const {
  const TensorInfo* t = find(name);
  if (!t) fail("checkpoint {}: missing tensor '{}'", dir_, name);
  return *t;
}

std::vector<const TensorInfo*> Checkpoint::tensors() const {
  std::vector<const TensorInfo*> out;
  for (const auto& f : files_)
    for (const auto& t : f->tensors()) out.push_back(&t);
  return out;
}

uint64_t Checkpoint::total_bytes() const {
  uint64_t n = 0;
  for (const auto& f : files_)
    for (const auto& t : f->tensors()) n += t.nbytes;
  return n;
}

}  // namespace dsv41
