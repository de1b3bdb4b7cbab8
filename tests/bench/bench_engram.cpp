// Engram storage benchmark (docs/ENGRAM.md "Benchmark"): random 264-byte row reads from a
// generated table on local disk, at several queue depths, with O_DIRECT and buffered I/O, from
// the original safetensors layout (two reads per row) and from the packed layout (one read per
// row); then the Engram reads of a 32k-token prefill whose hash ids come from real text.
//
//   bench_engram --dir DIR [--gib 20] [--rows-per-point 200000] --config CONFIG.json
//                --tokenizer tokenizer.json --token-map engram_token_map.json TEXT_FILE...
//
// Writes ~2×gib GiB under DIR at its peak (the table, then its pack) and deletes both at the end.
// Page cache: every buffered measurement starts after POSIX_FADV_DONTNEED on the file (and a
// drop_caches attempt is reported).
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "dsv41/common/error.h"
#include "dsv41/config/model_config.h"
#include "dsv41/engram/geometry.h"
#include "dsv41/engram/pack.h"
#include "dsv41/engram/row_source.h"
#include "dsv41/engram/row_store.h"
#include "dsv41/text/tokenizer.h"
#include "model/engram_hash.h"

namespace fs = std::filesystem;
using namespace dsv41;
using namespace dsv41::engram;
using Clock = std::chrono::steady_clock;

namespace {

double secs_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// A safetensors shard holding one Engram table of `rows` rows (random bytes; valid e8m0 scales).
void write_table(const std::string& path, int64_t layer_id, int64_t rows) {
  const std::string w = fmt::format("layers.{}.engram.embed.weight", layer_id);
  const std::string s = fmt::format("layers.{}.engram.embed.scale", layer_id);
  const uint64_t wb = static_cast<uint64_t>(rows) * 256, sb = static_cast<uint64_t>(rows) * 8;
  nlohmann::json h;
  h[w] = {{"dtype", "F8_E4M3"}, {"shape", {rows, 256}}, {"data_offsets", {0, wb}}};
  h[s] = {{"dtype", "F8_E8M0"}, {"shape", {rows, 8}}, {"data_offsets", {wb, wb + sb}}};
  std::string text = h.dump();
  text.resize((text.size() + 8 + 7) / 8 * 8 - 8, ' ');
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) fail("{}: cannot create", path);
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(static_cast<uint64_t>(text.size()) >> (8 * i));
  if (::write(fd, len, 8) != 8 || ::write(fd, text.data(), text.size()) != static_cast<ssize_t>(text.size()))
    fail("{}: write failed", path);
  std::vector<uint64_t> buf((64u << 20) / 8);
  std::mt19937_64 rng(1);
  const auto t0 = Clock::now();
  for (uint64_t done = 0, total = wb + sb; done < total;) {
    for (auto& v : buf) v = rng();
    const size_t n = static_cast<size_t>(std::min<uint64_t>(buf.size() * 8, total - done));
    if (done + n > wb) {  // scale region: keep exponents in a sane range (not NaN)
      auto* b = reinterpret_cast<uint8_t*>(buf.data());
      for (size_t i = 0; i < n; ++i)
        if (done + i >= wb) b[i] = static_cast<uint8_t>(110 + b[i] % 30);
    }
    if (::write(fd, buf.data(), n) != static_cast<ssize_t>(n)) fail("{}: write failed (disk full?)", path);
    done += n;
  }
  ::fsync(fd);
  posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
  std::fprintf(stderr, "wrote %s: %.1f GB in %.1f s\n", path.c_str(), static_cast<double>(wb + sb) / 1e9, secs_since(t0));
}

void drop_file_cache(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd >= 0) {
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

bool try_drop_caches() {
  ::sync();
  std::ofstream f("/proc/sys/vm/drop_caches");
  if (!f) return false;
  f << "3\n";
  f.flush();
  return static_cast<bool>(f);
}

struct Point {
  double rows_per_s, mb_per_s, p50_us, p99_us;
};

// n distinct random rows through a store with `qd` I/O threads; latency percentiles from the
// store's histogram (bucket upper bounds).
Point measure(const std::shared_ptr<const EngramRowSource>& src, const std::vector<std::string>& files, int qd,
              int64_t n, uint64_t seed) {
  for (const auto& f : files) drop_file_cache(f);
  EngramStore store(src, {.cache_gib = 0, .io_threads = qd});
  std::mt19937_64 rng(seed);
  std::set<int64_t> ids;
  while (static_cast<int64_t>(ids.size()) < n) ids.insert(static_cast<int64_t>(rng() % static_cast<uint64_t>(src->geometry().rows[0])));
  std::vector<int64_t> v(ids.begin(), ids.end());
  std::shuffle(v.begin(), v.end(), rng);
  const auto t0 = Clock::now();
  store.prefetch(0, v)->wait();
  const double dt = secs_since(t0);
  const auto m = store.metrics();
  auto pct = [&](double q) {
    uint64_t total = 0, cum = 0;
    for (auto b : m.latency_buckets) total += b;
    for (size_t b = 0; b < m.latency_buckets.size(); ++b) {
      cum += m.latency_buckets[b];
      if (cum >= q * total) return b < kEngramLatencyBounds.size() ? kEngramLatencyBounds[b] * 1e6 : 1e9;
    }
    return 1e9;
  };
  return {static_cast<double>(n) / dt, static_cast<double>(n) * 264 / dt / 1e6, pct(0.5), pct(0.99)};
}

std::vector<int32_t> load_token_map(const std::string& path) {
  std::ifstream in(path);
  const auto j = nlohmann::json::parse(in);
  return j.at("token_map").get<std::vector<int32_t>>();
}

}  // namespace

int main(int argc, char** argv) try {
  std::string dir, config, tokenizer, token_map;
  double gib = 20;
  int64_t n_rows = 200000;
  std::vector<std::string> texts;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&] {
      if (i + 1 >= argc) fail("{} needs a value", a);
      return std::string(argv[++i]);
    };
    if (a == "--dir") dir = next();
    else if (a == "--gib") gib = std::stod(next());
    else if (a == "--rows-per-point") n_rows = std::stoll(next());
    else if (a == "--config") config = next();
    else if (a == "--tokenizer") tokenizer = next();
    else if (a == "--token-map") token_map = next();
    else texts.push_back(a);
  }
  if (dir.empty() || config.empty() || tokenizer.empty() || token_map.empty() || texts.empty())
    fail("usage: bench_engram --dir DIR [--gib 20] --config CONFIG --tokenizer FILE --token-map FILE TEXT...");

  // ---- realistic hash stream: 32k tokens of real text through the released hash layout ----
  const ModelConfig cfg = load_model_config(config);
  const auto hashes = model::build_engram_hashes(cfg);
  const auto tok = text::Tokenizer::from_file(tokenizer);
  const auto tmap = load_token_map(token_map);
  std::vector<int32_t> ids;
  constexpr int64_t kPrefill = 32768;
  for (const auto& t : texts) {
    std::ifstream in(t);
    const std::string s((std::istreambuf_iterator<char>(in)), {});
    for (auto id : tok.encode(s, false)) ids.push_back(static_cast<int32_t>(id));
    if (static_cast<int64_t>(ids.size()) >= kPrefill) break;
  }
  if (static_cast<int64_t>(ids.size()) < kPrefill) fail("the text files give only {} tokens, need {}", ids.size(), kPrefill);
  ids.resize(kPrefill);
  const int64_t cols = cfg.n_engram_columns(), N = cfg.engram_max_ngram_size;
  const int64_t pad = tmap.at(static_cast<size_t>(cfg.engram_pad_token_id));
  std::vector<std::vector<int64_t>> rows(hashes.size());
  std::vector<int64_t> hist(static_cast<size_t>(N));
  for (int64_t p = 0; p < kPrefill; ++p) {
    for (int64_t k = 0; k < N; ++k) hist[k] = p - k >= 0 ? tmap.at(static_cast<size_t>(ids[p - k])) : -1;
    for (size_t l = 0; l < hashes.size(); ++l) {
      std::vector<int64_t> r(static_cast<size_t>(cols));
      model::engram_hash_ids(hashes[l], cfg, hist.data(), pad, r.data());
      rows[l].insert(rows[l].end(), r.begin(), r.end());
    }
  }
  nlohmann::ordered_json out;
  out["prefill_tokens"] = kPrefill;
  for (size_t l = 0; l < rows.size(); ++l) {
    const size_t uniq = std::set<int64_t>(rows[l].begin(), rows[l].end()).size();
    out["unique_rows"].push_back(uniq);
    out["dedup_fraction"].push_back(1.0 - static_cast<double>(uniq) / static_cast<double>(rows[l].size()));
  }

  // ---- the table ----
  fs::create_directories(dir);
  const int64_t table_rows = static_cast<int64_t>(gib * 1073741824.0 / 264.0);
  EngramGeometry g;
  g.layer_ids = {1};
  g.rows = {table_rows};
  g.column_offsets = {{0, table_rows}};
  g.head_dim = 256;
  g.scale_bytes = 8;
  g.row_bytes = 264;
  const std::string shard = dir + "/bench-engram-table.safetensors";
  write_table(shard, 1, table_rows);
  out["table_rows"] = table_rows;
  out["table_bytes"] = table_rows * 264;
  out["drop_caches_works"] = try_drop_caches();

  auto run_layout = [&](const char* name, const std::function<std::shared_ptr<const EngramRowSource>(bool)>& open,
                        const std::vector<std::string>& files) {
    for (bool direct : {true, false}) {
      auto src = open(direct);
      for (int qd : {1, 32, 128}) {
        const int64_t n = qd == 1 ? n_rows / 20 : n_rows;
        const Point pt = measure(src, files, qd, n, 1000 + static_cast<uint64_t>(qd));
        out["random_reads"].push_back({{"layout", name}, {"io", direct ? "O_DIRECT" : "buffered"}, {"queue_depth", qd},
                                       {"rows", n}, {"rows_per_s", pt.rows_per_s}, {"MB_per_s", pt.mb_per_s},
                                       {"latency_p50_us_le", pt.p50_us}, {"latency_p99_us_le", pt.p99_us}});
        std::fprintf(stderr, "%-12s %-8s qd %3d: %10.0f rows/s %8.1f MB/s p50<=%.0fus p99<=%.0fus\n", name,
                     direct ? "O_DIRECT" : "buffered", qd, pt.rows_per_s, pt.mb_per_s, pt.p50_us, pt.p99_us);
      }
    }
  };
  run_layout("safetensors", [&](bool d) { return std::shared_ptr<const EngramRowSource>(open_safetensors_dir_source(dir, g, {.direct_io = d})); },
             {shard});

  // ---- pack it (also measures the packer), then drop the original ----
  const std::string pack_dir = dir + "/pack";
  const auto tp = Clock::now();
  PackOptions po;
  po.engram_dir = dir;
  po.out_dir = pack_dir;
  pack_engram(g, po);
  out["pack_MB_per_s"] = static_cast<double>(table_rows) * 264 / secs_since(tp) / 1e6;
  fs::remove(shard);
  const std::string packed = pack_dir + "/engram-layer1-rank0-of-1.rows";
  run_layout("packed", [&](bool d) {
    return std::shared_ptr<const EngramRowSource>(open_packed_source(pack_dir, g, 0, 1, {.direct_io = d, .verify_checksums = false}));
  }, {packed});

  // ---- a 32k prefill's Engram reads (both layers' real hash ids folded into this table) ----
  for (bool direct : {true, false}) {
    drop_file_cache(packed);
    auto src = std::shared_ptr<const EngramRowSource>(open_packed_source(pack_dir, g, 0, 1, {.direct_io = direct, .verify_checksums = false}));
    EngramStore store(src, {.cache_gib = 0, .io_threads = 128});
    std::vector<std::vector<int64_t>> folded(rows.size());
    for (size_t l = 0; l < rows.size(); ++l)
      for (int64_t r : rows[l]) folded[l].push_back((r + static_cast<int64_t>(l) * (table_rows / 2)) % table_rows);
    const auto t0 = Clock::now();
    std::vector<std::shared_ptr<EngramFetch>> f;
    for (auto& v : folded) f.push_back(store.prefetch(0, v));
    for (auto& x : f) x->wait();
    const double dt = secs_since(t0);
    out["prefill_32k"].push_back({{"io", direct ? "O_DIRECT" : "buffered"}, {"queue_depth", 128},
                                  {"rows_read", store.metrics().rows_read}, {"seconds", dt},
                                  {"us_per_token", dt / kPrefill * 1e6}});
    std::fprintf(stderr, "32k prefill (%s): %llu rows in %.3f s = %.1f us/token\n", direct ? "O_DIRECT" : "buffered",
                 static_cast<unsigned long long>(store.metrics().rows_read), dt, dt / kPrefill * 1e6);
  }
  fs::remove_all(pack_dir);
  std::printf("%s\n", out.dump(2).c_str());
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_engram: error: %s\n", e.what());
  return 1;
}
