// Engram n-gram hashing (MODEL.md §3.5, §5.3): per-layer prime bucket sizes, row offsets and hash
// multipliers, all derived from the config, and the hash ids of a position from the compressed ids
// of the tokens ending there.
//
// The multipliers come from numpy's `default_rng(10007·layer).integers(0, bound, size, int64)`;
// this file re-implements the pieces of numpy that produce them bit-exactly: SeedSequence (entropy
// pool hashing), PCG64 (128-bit LCG with the XSL-RR output) and Lemire's bounded integers.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "dsv41/config/model_config.h"

namespace dsv41::model {

// numpy.random.SeedSequence(entropy).generate_state(n_words, uint32).
std::vector<uint32_t> seed_sequence_state(uint64_t entropy, int n_words);

// numpy.random.PCG64 seeded from a SeedSequence of `entropy`.
class Pcg64 {
 public:
  explicit Pcg64(uint64_t entropy);
  uint64_t next_u64();
  // Generator.integers(0, high, dtype=int64) for one value (high > 0).
  int64_t integers(int64_t high);

 private:
  unsigned __int128 state_ = 0, inc_ = 0;
  bool has_u32_ = false;  // numpy buffers the upper half of a 64-bit draw for 32-bit requests
  uint32_t u32_ = 0;
  uint32_t next_u32();
};

struct EngramLayerHash {
  std::vector<int64_t> primes;       // per column, column = (n-2)·n_heads + head
  std::vector<int64_t> offsets;      // per column: sum of the primes before it
  std::vector<int64_t> multipliers;  // per look-back k = 0 .. max_ngram-1 (odd)
  int64_t total_rows = 0;
};

// Layouts for every Engram layer in config order. Throws dsv41::Error when the prime sums do not
// reproduce engram_num_embeddings.
std::vector<EngramLayerHash> build_engram_hashes(const ModelConfig& c);

// Hash ids of one position for one layer. `history` holds the compressed ids ending at the
// position: history[k] = compressed id of the token k places back, or -1 when that position does
// not exist (before the sequence start) or is dead; `pad` is the compressed id of the pad token.
void engram_hash_ids(const EngramLayerHash& h, const ModelConfig& c, const int64_t* history, int64_t pad,
                     int64_t* out_rows);

// The Engram token map (`--engram-token-map`: a safetensors file with an I32 [vocab_size]
// `token_map`), every value checked against the config. *pad receives the compressed id of
// engram_pad_token_id (the id hashed in place of tokens before the sequence start).
std::vector<int32_t> load_engram_token_map(const std::string& path, const ModelConfig& c, int64_t* pad);

}  // namespace dsv41::model
