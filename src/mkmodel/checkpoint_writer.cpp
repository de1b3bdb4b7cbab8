#include "mkmodel/checkpoint_writer.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>

#include "dsv41/common/error.h"
#include "dsv41/common/parallel.h"
#include "dsv41/loader/safetensors.h"
#include "mkmodel/random_fill.h"
#include "mkmodel/value_rules.h"

namespace dsv41::mkmodel {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

struct Item {
  const TensorSpec* spec;
  FillRule rule;
  uint64_t tseed;
  uint64_t nbytes;
  int64_t numel;
};

// Tensors that must share a shard: an EXL3 linear's tensors, or a weight with its scale/bias.
std::string group_key(const TensorSpec& t) {
  if (!t.exl3_linear.empty()) return t.exl3_linear;
  for (const char* suf : {".weight", ".scale", ".bias"}) {
    const std::string s(suf);
    if (t.name.size() > s.size() && t.name.compare(t.name.size() - s.size(), s.size(), s) == 0)
      return t.name.substr(0, t.name.size() - s.size());
  }
  return t.name;
}

struct FileCloser {
  void operator()(FILE* f) const {
    if (f) std::fclose(f);
  }
};

void write_shard(const std::string& path, std::vector<Item*> items, const WriteOptions& opt) {
  // Widest elements first: with the 8-byte padded header every tensor is aligned to its element
  // size, so readers can use the mapping in place.
  std::stable_sort(items.begin(), items.end(), [](const Item* a, const Item* b) {
    return dtype_size(a->spec->dtype) > dtype_size(b->spec->dtype);
  });
  std::vector<HeaderEntry> header;
  header.reserve(items.size());
  for (const Item* it : items) header.push_back(HeaderEntry{it->spec->name, it->spec->dtype, it->spec->shape, it->nbytes});
  const std::string preamble =
      safetensors_preamble(header, {{"format", "pt"}, {"generator", "dsv41-serve mkmodel"}});
  const std::string tmp = path + ".tmp";
  std::unique_ptr<FILE, FileCloser> f(std::fopen(tmp.c_str(), "wb"));
  if (!f) fail("{}: cannot create {}: {}", path, tmp, std::strerror(errno));
  // A failed write leaves no partial shard behind.
  auto give_up = [&](const std::string& why) {
    f.reset();
    std::remove(tmp.c_str());
    fail("{}: {}", path, why);
  };
  auto put = [&](const void* p, size_t n) {
    if (n && std::fwrite(p, 1, n, f.get()) != n) give_up(fmt::format("write failed: {}", std::strerror(errno)));
  };
  put(preamble.data(), preamble.size());

  // Jobs = (tensor, chunk) in file order; batches of jobs are generated in parallel.
  struct Job {
    const Item* item;
    int64_t chunk;
    uint64_t bytes;
  };
  std::vector<Job> jobs;
  for (const Item* it : items) {
    const uint64_t esz = dtype_size(it->spec->dtype);
    for (int64_t c = 0; c * kFillChunk < it->numel; ++c) {
      const int64_t n = std::min<int64_t>(kFillChunk, it->numel - c * kFillChunk);
      jobs.push_back(Job{it, c, static_cast<uint64_t>(n) * esz});
    }
  }
  std::vector<uint8_t> buf;
  size_t j0 = 0;
  while (j0 < jobs.size()) {
    size_t j1 = j0;
    uint64_t total = 0;
    std::vector<uint64_t> at;
    while (j1 < jobs.size() && (j1 == j0 || total + jobs[j1].bytes <= opt.batch_bytes)) {
      at.push_back(total);
      total += jobs[j1].bytes;
      ++j1;
    }
    buf.resize(total);
    parallel_for(static_cast<int64_t>(j1 - j0), [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        const Job& jb = jobs[j0 + i];
        fill_chunk(jb.item->rule, jb.item->tseed, jb.item->numel, jb.chunk, buf.data() + at[i]);
      }
    });
    put(buf.data(), total);
    j0 = j1;
  }
  if (std::fclose(f.release()) != 0) give_up(fmt::format("write failed: {}", std::strerror(errno)));
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) give_up(fmt::format("cannot rename into place: {}", ec.message()));
}

}  // namespace

void require_free_space(const std::string& dir, uint64_t bytes) {
  std::error_code ec;
  const fs::space_info space = fs::space(dir, ec);
  if (!ec && space.available < bytes + (64ull << 20))
    fail("{}: the checkpoint needs {:.2f} GB but only {:.2f} GB are free (use --layers, --engram-vocab-size or "
         "--skip-optional for a smaller model)",
         dir, static_cast<double>(bytes) / 1e9, static_cast<double>(space.available) / 1e9);
}

WriteStats write_random_checkpoint(const std::vector<TensorSpec>& specs, const ModelConfig& cfg,
                                   const WriteOptions& opt) {
  SpecIndex index;
  for (const auto& s : specs) index[s.name] = &s;
  // Every rule is decided before anything is written, so a bad tensor fails fast.
  std::vector<Item> items;
  items.reserve(specs.size());
  for (const auto& s : specs) {
    Item it{&s, rule_for(s, index, cfg), tensor_seed(s.name, opt.seed), s.nbytes(), s.numel()};
    items.push_back(it);
  }
  uint64_t total = 0;
  for (const Item& it : items) total += it.nbytes;
  require_free_space(opt.out_dir, total);
  // Shard assignment in manifest order, whole groups at a time.
  std::vector<std::vector<Item*>> shards(1);
  uint64_t cur = 0;
  for (size_t i = 0; i < items.size();) {
    const std::string key = group_key(*items[i].spec);
    size_t j = i;
    uint64_t gbytes = 0;
    while (j < items.size() && group_key(*items[j].spec) == key) gbytes += items[j++].nbytes;
    if (cur > 0 && cur + gbytes > opt.shard_bytes) {
      shards.emplace_back();
      cur = 0;
    }
    for (size_t k = i; k < j; ++k) shards.back().push_back(&items[k]);
    cur += gbytes;
    i = j;
  }
  const int n = static_cast<int>(shards.size());
  WriteStats st;
  st.shards = n;
  json weight_map = json::object();
  for (int s = 0; s < n; ++s) {
    const std::string name =
        n == 1 ? "model.safetensors" : fmt::format("model-{:05d}-of-{:05d}.safetensors", s + 1, n);
    write_shard((fs::path(opt.out_dir) / name).string(), shards[s], opt);
    for (const Item* it : shards[s]) {
      weight_map[it->spec->name] = name;
      st.bytes += it->nbytes;
      ++st.tensors;
    }
  }
  if (n > 1) {
    const json idx = {{"metadata", {{"total_size", st.bytes}}}, {"weight_map", weight_map}};
    const std::string path = (fs::path(opt.out_dir) / "model.safetensors.index.json").string();
    std::ofstream out(path);
    out << idx.dump(2) << "\n";
    if (!out) fail("{}: write failed", path);
  }
  return st;
}

}  // namespace dsv41::mkmodel
