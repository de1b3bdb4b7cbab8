// Helpers for the loader tests: temporary folders, fixture copies, and raw safetensors surgery
// (rewrite a header without touching the data, so a test can make exactly one thing wrong).
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

namespace dsv41::test {

namespace fs = std::filesystem;

// A fresh folder under the system temp dir, removed when the object dies.
class TempDir {
 public:
  TempDir() {
    std::random_device rd;
    path_ = fs::temp_directory_path() / ("dsv41_test_" + std::to_string(rd()) + std::to_string(rd()));
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }
  std::string str() const { return path_.string(); }

 private:
  fs::path path_;
};

inline fs::path fixture(const std::string& rel) { return fs::path(DSV41_FIXTURES_DIR) / rel; }

// Copies tests/fixtures/<name>/model into dst (a checkpoint folder of its own).
inline void copy_fixture_model(const std::string& name, const fs::path& dst) {
  fs::create_directories(dst);
  fs::copy(fixture(name) / "model", dst, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
}

inline std::vector<uint8_t> read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

inline void write_bytes(const fs::path& p, const std::vector<uint8_t>& b) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

// A safetensors image split into its header text and its data section.
struct RawFile {
  std::string header;
  std::vector<uint8_t> data;

  static RawFile read(const fs::path& p) {
    auto b = read_bytes(p);
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | b[static_cast<size_t>(i)];
    RawFile r;
    r.header.assign(reinterpret_cast<const char*>(b.data() + 8), n);
    r.data.assign(b.begin() + 8 + static_cast<std::ptrdiff_t>(n), b.end());
    return r;
  }
  nlohmann::json json() const { return nlohmann::json::parse(header); }
  void set_json(const nlohmann::json& j) { header = j.dump(); }
  std::vector<uint8_t> bytes() const {
    std::vector<uint8_t> b(8);
    const uint64_t n = header.size();
    for (int i = 0; i < 8; ++i) b[static_cast<size_t>(i)] = static_cast<uint8_t>(n >> (8 * i));
    b.insert(b.end(), header.begin(), header.end());
    b.insert(b.end(), data.begin(), data.end());
    return b;
  }
  void write(const fs::path& p) const { write_bytes(p, bytes()); }
};

}  // namespace dsv41::test
