#include "engram/pack_format.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "dsv41/common/error.h"
#include "dsv41/engram/xxhash64.h"

namespace dsv41::engram {

using nlohmann::json;

std::string pack_index_name(int rank, int world) { return fmt::format("engram-pack-rank{}-of-{}.json", rank, world); }
std::string pack_rows_name(int64_t layer_id, int rank, int world) {
  return fmt::format("engram-layer{}-rank{}-of-{}.rows", layer_id, rank, world);
}

PackIndex read_pack_index(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail("{}: cannot open", path);
  PackIndex idx;
  try {
    const json j = json::parse(in);
    if (j.at("format").get<std::string>() != kPackFormat) fail("{}: not an Engram pack index", path);
    if (j.at("version").get<int>() != kPackVersion)
      fail("{}: pack version {} is not supported (expected {})", path, j.at("version").get<int>(), kPackVersion);
    idx.rank = j.at("rank").get<int>();
    idx.world = j.at("world_size").get<int>();
    idx.geometry = j.at("geometry").get<std::string>();
    idx.row_bytes = j.at("row_bytes").get<int64_t>();
    idx.complete = j.at("complete").get<bool>();
    for (const json& l : j.at("layers")) {
      PackLayerEntry e;
      e.layer_id = l.at("layer").get<int64_t>();
      e.share.col_begin = l.at("col_begin").get<int64_t>();
      e.share.col_end = l.at("col_end").get<int64_t>();
      e.share.row_begin = l.at("row_begin").get<int64_t>();
      e.share.row_end = l.at("row_end").get<int64_t>();
      e.file = l.at("file").get<std::string>();
      e.rows_done = l.at("rows_done").get<int64_t>();
      const std::string h = l.at("xxh64").get<std::string>();
      char* end = nullptr;
      e.xxh64 = std::strtoull(h.c_str(), &end, 16);
      if (h.size() != 16 || *end != '\0') fail("{}: layer {}: xxh64 '{}' is not 16 hex digits", path, e.layer_id, h);
      if (e.file.empty() || e.file.find('/') != std::string::npos)
        fail("{}: layer {}: file '{}' is not a file name in the folder", path, e.layer_id, e.file);
      if (e.rows_done < 0 || e.rows_done > e.share.n_rows())
        fail("{}: layer {}: rows_done {} outside [0, {}]", path, e.layer_id, e.rows_done, e.share.n_rows());
      idx.layers.push_back(std::move(e));
    }
  } catch (const json::exception& e) {
    fail("{}: malformed Engram pack index: {}", path, e.what());
  }
  return idx;
}

void write_pack_index(const std::string& path, const PackIndex& idx) {
  json j;
  j["format"] = kPackFormat;
  j["version"] = kPackVersion;
  j["rank"] = idx.rank;
  j["world_size"] = idx.world;
  j["geometry"] = idx.geometry;
  j["row_bytes"] = idx.row_bytes;
  j["checksum"] = "xxh64";
  j["complete"] = idx.complete;
  j["layers"] = json::array();
  for (const auto& e : idx.layers)
    j["layers"].push_back({{"layer", e.layer_id},
                           {"col_begin", e.share.col_begin},
                           {"col_end", e.share.col_end},
                           {"row_begin", e.share.row_begin},
                           {"row_end", e.share.row_end},
                           {"file", e.file},
                           {"rows_done", e.rows_done},
                           {"xxh64", hex64(e.xxh64)}});
  const std::string tmp = path + ".tmp";
  const std::string text = j.dump(2) + "\n";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail("{}: cannot create: {}", tmp, std::strerror(errno));
  const bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) && ::fsync(fd) == 0;
  const int err = errno;
  ::close(fd);
  if (!ok) fail("{}: cannot write: {}", tmp, std::strerror(err));
  if (std::rename(tmp.c_str(), path.c_str()) != 0) fail("{}: cannot rename to {}: {}", tmp, path, std::strerror(errno));
}

Xxh64 hash_file_prefix(const std::string& path, uint64_t nbytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("{}: cannot open: {}", path, std::strerror(errno));
  posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  std::vector<uint8_t> buf(8u << 20);
  Xxh64 h;
  uint64_t done = 0;
  while (done < nbytes) {
    const size_t want = static_cast<size_t>(std::min<uint64_t>(buf.size(), nbytes - done));
    const ssize_t r = ::pread(fd, buf.data(), want, static_cast<off_t>(done));
    if (r <= 0) {
      const int err = errno;
      ::close(fd);
      if (r < 0) fail("{}: read at offset {} failed: {}", path, done, std::strerror(err));
      fail("{}: short read: expected {} bytes, the file ends at {} (truncated?)", path, nbytes, done);
    }
    h.update(buf.data(), static_cast<size_t>(r));
    // The pack is read once here; keep it from evicting the model weights from the page cache.
    posix_fadvise(fd, static_cast<off_t>(done), r, POSIX_FADV_DONTNEED);
    done += static_cast<uint64_t>(r);
  }
  ::close(fd);
  return h;
}

}  // namespace dsv41::engram
