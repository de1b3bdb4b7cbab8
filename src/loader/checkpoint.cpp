#include "dsv41/loader/checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "dsv41/common/error.h"

namespace dsv41 {

namespace fs = std::filesystem;

std::unique_ptr<Checkpoint> Checkpoint::open(const std::string& dir) {
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
  for (const auto& name : files) {
    const fs::path p = fs::path(dir) / name;
    if (!fs::exists(p)) fail("checkpoint {}: shard {} is listed in the index but missing", dir, name);
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
