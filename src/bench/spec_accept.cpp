// DSpark acceptance of golden files and the simulated accepts of the speculation benchmark.
#include "bench/spec_accept.h"

#include <cstring>

#include "dsv41/common/error.h"
#include "dsv41/loader/safetensors.h"

namespace dsv41::bench {
namespace {

std::vector<int32_t> ids_of(const SafetensorsFile& f, const std::string& path, const char* name, size_t rank) {
  const TensorInfo* t = f.find(name);
  DSV_CHECK(t != nullptr, "{}: no tensor {} (a golden file written by `dsv41-serve logits --dspark`)", path, name);
  DSV_CHECK(t->dtype == DType::I32 && t->shape.size() == rank, "{}: {} must be I32 of rank {}", path, name, rank);
  std::vector<int32_t> v(static_cast<size_t>(t->numel()));
  std::memcpy(v.data(), t->data, v.size() * 4);
  return v;
}

}  // namespace

Acceptance measure_acceptance(const std::vector<std::string>& golden_files) {
  Acceptance a;
  for (const std::string& path : golden_files) {
    auto f = SafetensorsFile::open(path);
    const std::vector<int32_t> greedy = ids_of(*f, path, "greedy_ids", 1);
    const std::vector<int32_t> drafts = ids_of(*f, path, "dspark_draft_ids", 2);
    const TensorInfo& dt = *f->find("dspark_draft_ids");
    const int64_t rows = dt.shape[0], width = dt.shape[1], G = static_cast<int64_t>(greedy.size());
    DSV_CHECK(width >= 2, "{}: dspark_draft_ids has {} columns (anchor + at least one draft)", path, width);
    for (int64_t i = 0; i < rows && i + 1 < G; ++i) {
      const int32_t* row = &drafts[static_cast<size_t>(i * width)];
      DSV_CHECK(row[0] == greedy[static_cast<size_t>(i + 1)],
                "{}: draft row {} has anchor {}, greedy_ids[{}] is {}", path, i, row[0], i + 1, greedy[static_cast<size_t>(i + 1)]);
      ++a.rows;
      for (int64_t j = 1; j < width && i + 1 + j < G; ++j) {
        ++a.tried;
        if (row[j] != greedy[static_cast<size_t>(i + 1 + j)]) break;
        ++a.accepted;
      }
    }
  }
  return a;
}

int64_t simulate_accepted(double rate, int64_t k, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> u(0.0, 1.0);
  int64_t n = 0;
  while (n < k && u(rng) < rate) ++n;
  return n;
}

}  // namespace dsv41::bench
