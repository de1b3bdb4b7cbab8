#include "engram/table_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "dsv41/common/error.h"

namespace dsv41::engram {

namespace fs = std::filesystem;
using nlohmann::json;

std::string engram_weight_name(int64_t layer_id) { return fmt::format("layers.{}.engram.embed.weight", layer_id); }
std::string engram_scale_name(int64_t layer_id) { return fmt::format("layers.{}.engram.embed.scale", layer_id); }

namespace {

constexpr uint64_t kMaxHeader = 100ull << 20;

struct ShardHeader {
  json header;
  uint64_t data_start = 0;
  uint64_t file_size = 0;
};

// Reads only the 8-byte length and the JSON header of a shard.
ShardHeader read_header(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("{}: cannot open: {}", path, std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (fstat(fd, &st) != 0) fail("{}: cannot stat: {}", path, std::strerror(errno));
  ShardHeader h;
  h.file_size = static_cast<uint64_t>(st.st_size);
  uint8_t len_bytes[8];
  if (h.file_size < 8 || ::pread(fd, len_bytes, 8, 0) != 8)
    fail("{}: truncated: not even a safetensors header length", path);
  uint64_t len = 0;
  for (int i = 7; i >= 0; --i) len = (len << 8) | len_bytes[i];
  if (len > kMaxHeader) fail("{}: header length {} is implausible (corrupt file?)", path, len);
  if (len > h.file_size - 8) fail("{}: truncated: header claims {} bytes, the file has {}", path, len, h.file_size);
  std::string text(len, '\0');
  size_t got = 0;
  while (got < len) {
    const ssize_t r = ::pread(fd, text.data() + got, len - got, static_cast<off_t>(8 + got));
    if (r <= 0) fail("{}: cannot read the header: {}", path, r < 0 ? std::strerror(errno) : "short read");
    got += static_cast<size_t>(r);
  }
  try {
    h.header = json::parse(text);
  } catch (const json::exception& e) {
    fail("{}: header is not valid JSON: {}", path, e.what());
  }
  if (!h.header.is_object()) fail("{}: header is not a JSON object", path);
  h.data_start = 8 + len;
  return h;
}

// Absolute offset of the tensor's first byte after checking dtype, shape and file size.
uint64_t tensor_offset(const ShardHeader& h, const std::string& path, const std::string& name,
                       const std::string& dtype, int64_t rows, int64_t cols) {
  auto it = h.header.find(name);
  if (it == h.header.end()) fail("{}: has no tensor '{}'", path, name);
  const json& t = *it;
  if (!t.is_object() || !t.contains("dtype") || !t.contains("shape") || !t.contains("data_offsets"))
    fail("{}: tensor '{}': malformed header entry", path, name);
  const json& sh = t["shape"];
  const json& off = t["data_offsets"];
  const bool shape_ok = sh.is_array() && sh.size() == 2 && sh[0].is_number_integer() && sh[1].is_number_integer() &&
                        sh[0].get<int64_t>() == rows && sh[1].get<int64_t>() == cols;
  if (!t["dtype"].is_string() || t["dtype"].get<std::string>() != dtype || !shape_ok)
    fail("{}: tensor '{}' is {} {} but the config needs {} [{}, {}] (wrong table for this config?)", path, name,
         t["dtype"].dump(), sh.dump(), dtype, rows, cols);
  if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
    fail("{}: tensor '{}': data_offsets must be two non-negative integers", path, name);
  const uint64_t b = off[0].get<uint64_t>(), e = off[1].get<uint64_t>();
  const uint64_t want = static_cast<uint64_t>(rows) * static_cast<uint64_t>(cols);
  if (e < b || e - b != want)
    fail("{}: tensor '{}': data_offsets [{}, {}] do not span the {} bytes of its shape", path, name, b, e, want);
  if (h.data_start + e > h.file_size)
    fail("{}: truncated: tensor '{}' ends at byte {} but the file has {} bytes", path, name, h.data_start + e,
         h.file_size);
  return h.data_start + b;
}

}  // namespace

std::vector<TableLocation> locate_engram_tables(const std::string& dir, const EngramGeometry& g) {
  if (!fs::is_directory(dir)) fail("engram dir {}: not a directory", dir);
  // tensor name -> shard file name
  std::map<std::string, std::string> where;
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  if (fs::exists(index)) {
    std::ifstream in(index);
    json j;
    try {
      j = json::parse(in);
    } catch (const json::exception& e) {
      fail("{}: not valid JSON: {}", index.string(), e.what());
    }
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
      fail("{}: missing object 'weight_map'", index.string());
    for (int64_t l = 0; l < g.n_layers(); ++l) {
      const int64_t id = g.layer_ids[static_cast<size_t>(l)];
      for (const std::string& name : {engram_weight_name(id), engram_scale_name(id)}) {
        auto it = j["weight_map"].find(name);
        if (it == j["weight_map"].end() || !it->is_string())
          fail("{}: weight_map has no entry for '{}'", index.string(), name);
        const std::string f = it->get<std::string>();
        if (f.empty() || f.find('/') != std::string::npos || f == "." || f == "..")
          fail("{}: weight_map['{}'] = '{}' is not a file name in the folder", index.string(), name, f);
        where[name] = f;
      }
    }
  } else {
    std::vector<std::string> files;
    for (const auto& e : fs::directory_iterator(dir))
      if (e.is_regular_file() && e.path().extension() == ".safetensors") files.push_back(e.path().filename().string());
    std::sort(files.begin(), files.end());
    for (const auto& f : files) {
      const ShardHeader h = read_header((fs::path(dir) / f).string());
      for (auto it = h.header.begin(); it != h.header.end(); ++it)
        if (it.key().find(".engram.embed.") != std::string::npos) where.emplace(it.key(), f);
    }
    for (int64_t l = 0; l < g.n_layers(); ++l) {
      const int64_t id = g.layer_ids[static_cast<size_t>(l)];
      for (const std::string& name : {engram_weight_name(id), engram_scale_name(id)})
        if (!where.count(name))
          fail("engram dir {}: no model.safetensors.index.json and no *.safetensors file holds '{}'", dir, name);
    }
  }
  std::map<std::string, ShardHeader> headers;
  auto header_of = [&](const std::string& f, const std::string& tensor) -> const ShardHeader& {
    auto it = headers.find(f);
    if (it != headers.end()) return it->second;
    const fs::path p = fs::path(dir) / f;
    if (!fs::exists(p)) fail("engram dir {}: shard {} (holding '{}') is missing", dir, f, tensor);
    return headers.emplace(f, read_header(p.string())).first->second;
  };
  std::vector<TableLocation> out;
  for (int64_t l = 0; l < g.n_layers(); ++l) {
    const int64_t id = g.layer_ids[static_cast<size_t>(l)];
    const int64_t rows = g.rows[static_cast<size_t>(l)];
    const std::string wn = engram_weight_name(id), sn = engram_scale_name(id);
    TableLocation loc;
    loc.weight_file = (fs::path(dir) / where[wn]).string();
    loc.scale_file = (fs::path(dir) / where[sn]).string();
    loc.weight_offset = tensor_offset(header_of(where[wn], wn), loc.weight_file, wn, "F8_E4M3", rows, g.head_dim);
    loc.scale_offset = tensor_offset(header_of(where[sn], sn), loc.scale_file, sn, "F8_E8M0", rows, g.scale_bytes);
    out.push_back(std::move(loc));
  }
  return out;
}

}  // namespace dsv41::engram
