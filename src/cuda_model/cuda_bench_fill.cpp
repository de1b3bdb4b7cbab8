// Benchmark-only state fill of the CUDA backend (CudaModel::bench_fill_state): a sequence state
// that looks as if it had processed n_past tokens, without running them. Prefilling 128k tokens
// would take far longer than the decode steps a benchmark wants to time.
//
// Every buffer a decode step reads gets random values of its stored type: the window rings (bf16),
// the compressed KV rows and index keys of every KV source up to n_past / ratio entries (bf16), the
// pending slots of the ratio > 1 compressor carries (fp32; unused slots keep score -inf as the
// engine starts them), the last index-key publisher, and the Engram n-gram history (compressed
// ids of random tokens). The time of a decode step does not depend on these values: the attention
// reads the same rows, the indexer scores every visible key and the top-k over random scores is
// still a full top-k over all of them. The DSpark rings are left as they are (read only by drafts).
#include "dsv41/model/cuda_model.h"

#include "dsv41/common/error.h"

#if DSV41_HAS_CUDA
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "cuda_model/cuda_impl.h"
#include "dsv41/common/parallel.h"

namespace dsv41::model {
namespace {

uint64_t mix64(uint64_t x) {  // splitmix64 finaliser: a counter-based generator, parallel-safe
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Uniform in [-1, 1).
float uniform(uint64_t seed, uint64_t i) {
  return static_cast<float>(static_cast<double>(mix64(seed ^ mix64(i)) >> 11) * 0x1.0p-52 - 1.0);
}

// n random bf16 values (round to nearest even of a uniform float) uploaded to dst.
void fill_bf16(void* dst, int64_t n, uint64_t seed, cudaStream_t stream) {
  if (n <= 0) return;
  std::vector<uint16_t> host(static_cast<size_t>(n));
  parallel_for(n, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const float f = uniform(seed, static_cast<uint64_t>(i));
      uint32_t u;
      std::memcpy(&u, &f, 4);
      host[static_cast<size_t>(i)] = static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
    }
  });
  ops::gpu::check_cuda(cudaMemcpyAsync(dst, host.data(), host.size() * 2, cudaMemcpyHostToDevice, stream),
                       "bench fill upload");
  ops::gpu::check_cuda(cudaStreamSynchronize(stream), "bench fill");
}

void upload_f32(void* dst, const std::vector<float>& v, cudaStream_t stream) {
  ops::gpu::check_cuda(cudaMemcpyAsync(dst, v.data(), v.size() * 4, cudaMemcpyHostToDevice, stream),
                       "bench fill carries");
  ops::gpu::check_cuda(cudaStreamSynchronize(stream), "bench fill carries");
}

}  // namespace

void CudaModel::bench_fill_state(SeqState& state, int64_t n_past, uint64_t seed) const {
  const cuda::Impl* m = &engine();
  cuda::CudaSeqState* st = &m->state_of(state);  // checks the type and the owner
  const ModelConfig& c = m->cfg;
  DSV_CHECK(n_past >= 0 && n_past <= st->capacity_tokens && n_past <= c.max_position_embeddings,
            "bench fill: {} tokens exceed the sequence capacity of {} tokens", n_past, st->capacity_tokens);
  ops::gpu::check_cuda(cudaSetDevice(m->opts.device), "cudaSetDevice");
  const cudaStream_t stream = m->stream;
  const int64_t hd = c.head_dim, ihd = c.index_head_dim;
  uint64_t stream_id = 0;
  auto next_seed = [&] { return mix64(seed * 0x100000001B3ull + ++stream_id); };

  for (auto& ring : st->ring) fill_bf16(ring.get(), static_cast<int64_t>(ring.bytes() / 2), next_seed(), stream);

  st->last_key_publisher = -1;
  for (const cuda::GpuBlock& b : m->blocks) {
    if (!b.has_compressor || b.ratio <= 0) continue;
    cuda::GpuKvSource& k = st->kv[static_cast<size_t>(b.layer)];
    const int64_t entries = n_past / b.ratio;
    DSV_CHECK(entries <= k.capacity, "bench fill: layer {} holds {} compressed entries, {} needed", b.layer,
              k.capacity, entries);
    fill_bf16(k.compressed.get(), entries * hd, next_seed(), stream);
    if (b.has_index_keys) {
      fill_bf16(k.index_keys.get(), entries * ihd, next_seed(), stream);
      if (entries > 0) st->last_key_publisher = b.layer;  // the last layer whose keys a prefill published
    }
    k.n_entries = entries;
    if (b.ratio > 1) {
      // Slot s of the carry holds position (group start + s); slots of the pending group's tokens
      // are filled, the rest stay unused (kv 0, score -inf).
      const int64_t pending = n_past % b.ratio, cnt = b.ratio * hd;
      std::vector<float> kv(static_cast<size_t>(cnt), 0.0f), score(static_cast<size_t>(cnt), -INFINITY);
      const uint64_t s = next_seed();
      for (int64_t i = 0; i < pending * hd; ++i) {
        kv[static_cast<size_t>(i)] = uniform(s, static_cast<uint64_t>(2 * i));
        score[static_cast<size_t>(i)] = uniform(s, static_cast<uint64_t>(2 * i + 1));
      }
      upload_f32(k.carry_kv.get(), kv, stream);
      upload_f32(k.carry_score.get(), score, stream);
    }
  }

  st->engram_history.clear();
  const int64_t keep = c.engram_max_ngram_size - 1;
  if (!c.engram_layer_ids.empty() && !m->token_map.empty() && keep > 0) {
    const uint64_t s = next_seed();
    for (int64_t i = 0; i < std::min(keep, n_past); ++i) {
      const auto tok = static_cast<size_t>(mix64(s + static_cast<uint64_t>(i)) % m->token_map.size());
      st->engram_history.push_back(m->token_map[tok]);
    }
  }
  st->n_past = n_past;
  st->prompt_len = 0;  // the next one-token step is a decode step
}

}  // namespace dsv41::model

#else

namespace dsv41::model {
void CudaModel::bench_fill_state(SeqState&, int64_t, uint64_t) const { fail("CUDA model: built without CUDA"); }
}  // namespace dsv41::model

#endif
