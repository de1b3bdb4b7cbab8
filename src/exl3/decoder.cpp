// Bit-exact EXL3 trellis decoding (EXL3.md §2.2–2.6) and the fp32 Hadamard-formulated linear (§3.1).
#include "dsv41/exl3/decoder.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#include "dsv41/common/error.h"
#include "dsv41/common/numeric.h"
#include "dsv41/common/parallel.h"

namespace dsv41::exl3 {

namespace {

constexpr float kHadScale = 0.08838834764831845f;  // 1/sqrt(128)

std::array<TilePos, kTileValues> make_positions() {
  std::array<TilePos, kTileValues> p{};
  for (int t = 0; t < 32; ++t) {
    const int r0 = 2 * (t % 4);
    const int rows[4] = {r0, r0 + 1, r0 + 8, r0 + 9};
    const int c = t / 4;
    for (int i = 0; i < 8; ++i) {
      p[8 * t + i] = TilePos{static_cast<uint8_t>(rows[i & 3]), static_cast<uint8_t>(i < 4 ? c : c + 8)};
    }
  }
  return p;
}

const std::array<TilePos, kTileValues>& positions() {
  static const std::array<TilePos, kTileValues> p = make_positions();
  return p;
}

// Eight floats (GCC vector extension): one AVX register, or two SSE registers in the baseline build.
typedef float V8 __attribute__((vector_size(32)));

// acc[i][c] += sum_r x[i*x_stride + r] * tile[r][c] for i < m. Built twice (AVX2 and baseline,
// picked at run time); both do the same separate multiplies and adds in the same order, so the
// result is identical on every machine.
__attribute__((target_clones("avx2", "default"))) void accumulate_tile(const float* tile, const float* x,
                                                                     int64_t x_stride, int64_t m, float* acc) {
  for (int64_t i = 0; i < m; ++i) {
    const float* xr = x + i * x_stride;
    V8 a0, a1, w0, w1;
    std::memcpy(&a0, acc + i * kTile, sizeof(V8));
    std::memcpy(&a1, acc + i * kTile + 8, sizeof(V8));
    for (int r = 0; r < kTile; ++r) {
      const float xv = xr[r];
      std::memcpy(&w0, tile + r * kTile, sizeof(V8));
      std::memcpy(&w1, tile + r * kTile + 8, sizeof(V8));
      a0 += xv * w0;
      a1 += xv * w1;
    }
    std::memcpy(acc + i * kTile, &a0, sizeof(V8));
    std::memcpy(acc + i * kTile + 8, &a1, sizeof(V8));
  }
}

}  // namespace

TilePos tile_position(int j) {
  DSV_ASSERT(j >= 0 && j < kTileValues, "tile position {} out of range", j);
  return positions()[static_cast<size_t>(j)];
}

namespace {

// Row-major index (row*16 + col) of stream position j (EXL3.md §2.4), as a constant expression so
// that fully unrolled loops address the output directly.
constexpr int position_of(int j) {
  const int t = j / 8, i = j % 8;
  const int r0 = 2 * (t % 4);
  const int row = r0 + (i & 1) + ((i & 2) ? 8 : 0);
  const int col = t / 4 + (i < 4 ? 0 : 8);
  return row * kTile + col;
}

// The tile's stream as uint32 words (low half = even uint16), each read MSB first, plus one extra
// word repeating word 0 so that a window crossing the end wraps around (tail-biting).
template <int K>
inline void load_words(const uint16_t* tile, uint32_t u[8 * K + 1]) {
  for (int w = 0; w < 8 * K; ++w) {
    u[w] = static_cast<uint32_t>(tile[2 * w]) | (static_cast<uint32_t>(tile[2 * w + 1]) << 16);
  }
  u[8 * K] = u[0];
}

// The 16-bit window ending after symbol j. With K and j compile-time constants (the loops below
// are fully unrolled) the word index and shift are constants.
template <int K>
inline uint32_t state_at(const uint32_t* u, int j) {
  int start = (j + 1) * K - 16;
  if (start < 0) start += kTileValues * K;
  const int w = start >> 5, off = start & 31;
  const uint64_t v = (static_cast<uint64_t>(u[w]) << 32) | u[w + 1];
  return static_cast<uint32_t>((v >> (48 - off)) & 0xFFFFu);
}

template <int K>
void tile_states_k(const uint16_t* tile, uint16_t states[kTileValues]) {
  uint32_t u[8 * K + 1];
  load_words<K>(tile, u);
#pragma GCC unroll 256
  for (int j = 0; j < kTileValues; ++j) states[j] = static_cast<uint16_t>(state_at<K>(u, j));
}

template <int K, class T>
void decode_tile_k(const uint16_t* tile, const T* lut, T out[kTileValues]) {
  uint32_t u[8 * K + 1];
  load_words<K>(tile, u);
#pragma GCC unroll 256
  for (int j = 0; j < kTileValues; ++j) out[position_of(j)] = lut[state_at<K>(u, j)];
}

template <class T>
void decode_tile_lut(const uint16_t* tile, int K, const T* lut, T out[kTileValues]) {
  switch (K) {
    case 1: return decode_tile_k<1>(tile, lut, out);
    case 2: return decode_tile_k<2>(tile, lut, out);
    case 3: return decode_tile_k<3>(tile, lut, out);
    case 4: return decode_tile_k<4>(tile, lut, out);
    case 5: return decode_tile_k<5>(tile, lut, out);
    case 6: return decode_tile_k<6>(tile, lut, out);
    case 7: return decode_tile_k<7>(tile, lut, out);
    case 8: return decode_tile_k<8>(tile, lut, out);
  }
  DSV_ASSERT(false, "K={} out of range", K);
}

}  // namespace

void tile_states(const uint16_t* tile, int K, uint16_t states[kTileValues]) {
  switch (K) {
    case 1: return tile_states_k<1>(tile, states);
    case 2: return tile_states_k<2>(tile, states);
    case 3: return tile_states_k<3>(tile, states);
    case 4: return tile_states_k<4>(tile, states);
    case 5: return tile_states_k<5>(tile, states);
    case 6: return tile_states_k<6>(tile, states);
    case 7: return tile_states_k<7>(tile, states);
    case 8: return tile_states_k<8>(tile, states);
  }
  DSV_ASSERT(false, "K={} out of range", K);
}

void decode_tile_f16(const uint16_t* tile, int K, Codebook cb, uint16_t out[kTileValues]) {
  decode_tile_lut(tile, K, codebook_lut_f16(cb), out);
}

void decode_tile_f32(const uint16_t* tile, int K, Codebook cb, float out[kTileValues]) {
  decode_tile_lut(tile, K, codebook_lut_f32(cb), out);
}

void reconstruct_f16(const uint16_t* trellis, int64_t k, int64_t n, int K, Codebook cb, uint16_t* w_hat) {
  DSV_ASSERT(k % kTile == 0 && n % kTile == 0, "reconstruct: k={} n={} not multiples of 16", k, n);
  const int64_t tiles_k = k / kTile, tiles_n = n / kTile;
  const int64_t tile_words = static_cast<int64_t>(kTile) * K;
  const uint16_t* lut = codebook_lut_f16(cb);
  parallel_for(tiles_k, [&](int64_t b, int64_t e) {
    uint16_t block[kTileValues];
    for (int64_t tk = b; tk < e; ++tk) {
      for (int64_t tn = 0; tn < tiles_n; ++tn) {
        decode_tile_lut(trellis + (tk * tiles_n + tn) * tile_words, K, lut, block);
        for (int r = 0; r < kTile; ++r) {
          std::memcpy(w_hat + (tk * kTile + r) * n + tn * kTile, block + r * kTile, kTile * sizeof(uint16_t));
        }
      }
    }
  });
}

void hadamard128(float* v, int64_t len) {
  DSV_ASSERT(len % kHadamardSize == 0, "hadamard128: length {} not a multiple of 128", len);
  for (int64_t base = 0; base < len; base += kHadamardSize) {
    float* b = v + base;
    for (int h = 1; h < kHadamardSize; h <<= 1) {
      for (int i = 0; i < kHadamardSize; i += 2 * h) {
        for (int j = i; j < i + h; ++j) {
          const float a = b[j], c = b[j + h];
          b[j] = a + c;
          b[j + h] = a - c;
        }
      }
    }
    for (int i = 0; i < kHadamardSize; ++i) b[i] *= kHadScale;
  }
}

std::vector<float> full_weight_f32(const Exl3View& w) {
  const int64_t k = w.k, n = w.n;
  std::vector<uint16_t> hat(static_cast<size_t>(k * n));
  reconstruct_f16(w.trellis, k, n, w.K, w.codebook, hat.data());
  std::vector<float> full(static_cast<size_t>(k * n));
  // B_k from the left: butterflies between whole rows of each 128-row block.
  parallel_for(k / kHadamardSize, [&](int64_t b, int64_t e) {
    for (int64_t blk = b; blk < e; ++blk) {
      float* rows = full.data() + blk * kHadamardSize * n;
      const uint16_t* src = hat.data() + blk * kHadamardSize * n;
      for (int64_t i = 0; i < kHadamardSize * n; ++i) rows[i] = f16_bits_to_f32(src[i]);
      for (int h = 1; h < kHadamardSize; h <<= 1) {
        for (int i = 0; i < kHadamardSize; i += 2 * h) {
          for (int j = i; j < i + h; ++j) {
            float* ra = rows + j * n;
            float* rb = rows + (j + h) * n;
            for (int64_t c = 0; c < n; ++c) {
              const float a = ra[c], d = rb[c];
              ra[c] = a + d;
              rb[c] = a - d;
            }
          }
        }
      }
      for (int64_t i = 0; i < kHadamardSize * n; ++i) rows[i] *= kHadScale;
    }
  });
  // B_n from the right, then the two diagonal scales.
  parallel_for(k, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      float* row = full.data() + r * n;
      hadamard128(row, n);
      const float su = w.suh[r];
      for (int64_t c = 0; c < n; ++c) row[c] *= su * w.svh[c];
    }
  });
  return full;
}

void exl3_matmul_f32(const Exl3View& w, const float* x, int64_t m, float* y) {
  const int64_t k = w.k, n = w.n;
  if (m <= 0) return;
  // Input side: (x * suh) . B_k.
  std::vector<float> xh(static_cast<size_t>(m * k));
  parallel_for(m, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      float* row = xh.data() + i * k;
      for (int64_t c = 0; c < k; ++c) row[c] = x[i * k + c] * w.suh[c];
      hadamard128(row, k);
    }
  });
  // Rotated product: yh = xh . W_hat, one task per range of 16-column tile strips.
  const int64_t tiles_k = k / kTile, tiles_n = n / kTile;
  const int64_t tile_words = static_cast<int64_t>(kTile) * w.K;
  std::vector<float> yh(static_cast<size_t>(m * n));
  const float* lut = codebook_lut_f32(w.codebook);
  parallel_for(tiles_n, [&](int64_t b, int64_t e) {
    std::vector<float> acc(static_cast<size_t>(m * kTile));
    alignas(64) float tile[kTileValues];
    for (int64_t tn = b; tn < e; ++tn) {
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t tk = 0; tk < tiles_k; ++tk) {
        decode_tile_lut(w.trellis + (tk * tiles_n + tn) * tile_words, w.K, lut, tile);
        accumulate_tile(tile, xh.data() + tk * kTile, k, m, acc.data());
      }
      for (int64_t i = 0; i < m; ++i) {
        std::memcpy(yh.data() + i * n + tn * kTile, acc.data() + i * kTile, kTile * sizeof(float));
      }
    }
  });
  // Output side: B_n, then svh and bias.
  parallel_for(m, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      float* row = yh.data() + i * n;
      hadamard128(row, n);
      for (int64_t c = 0; c < n; ++c) {
        y[i * n + c] = row[c] * w.svh[c] + (w.bias ? w.bias[c] : 0.0f);
      }
    }
  });
}

}  // namespace dsv41::exl3
