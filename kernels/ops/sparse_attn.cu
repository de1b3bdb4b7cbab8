// Sparse attention with a sink (MODEL.md §4 SparseAttn). One KV row is key and value, shared by all
// heads (MQA), so a block stages each 64-entry chunk of its query's list in shared memory once and
// runs `heads_per_block` heads over it. Per head and chunk, exactly the reference's steps: scores as
// dot.h fma chains (one thread per 256-wide half), online max, fp32 probabilities summed in the
// reference's torch_sum order, bf16 probabilities in PV summed in list order, acc·c + pv, sink in
// the denominator after the loop. Decode uses 1 head per block (more blocks for one query),
// prefill several (fewer re-reads of the staged rows).
#include <cmath>

#include "ops/ops_common.cuh"
#include "ops/ops_launch.h"

namespace dsv41::ops::gpu {
namespace {

constexpr int kThreads = 128;
constexpr int kChunk = 64;

struct Smem {
  uint16_t* rows;  // [kChunk][d]
  float* q;        // [hpb][d]
  float* acc;      // [hpb][d]
  float* part;     // [kChunk][2]
  float* pb;       // [kChunk] bf16-rounded probabilities
  float* p;        // [kChunk] fp32 probabilities
  float* ml;       // [hpb][2]: running max, denominator
  float* c;        // [1]
  const uint16_t** rowptr;  // [kChunk]
};

__host__ __device__ size_t smem_bytes(int64_t d, int hpb) {
  return static_cast<size_t>(kChunk * d * 2 + 2 * hpb * d * 4 + kChunk * 4 * 4 + hpb * 8 + 16) + kChunk * sizeof(void*);
}

__global__ void sparse_attn_kernel(SparseAttnArgs a, int hpb) {
  extern __shared__ __align__(16) unsigned char raw_smem[];
  const int64_t d = a.d;
  Smem sm;
  unsigned char* p = raw_smem;
  sm.rows = reinterpret_cast<uint16_t*>(p);
  p += kChunk * d * 2;
  sm.rowptr = reinterpret_cast<const uint16_t**>(p);
  p += kChunk * sizeof(void*);
  sm.q = reinterpret_cast<float*>(p);
  p += hpb * d * 4;
  sm.acc = reinterpret_cast<float*>(p);
  p += hpb * d * 4;
  sm.part = reinterpret_cast<float*>(p);
  p += kChunk * 2 * 4;
  sm.pb = reinterpret_cast<float*>(p);
  p += kChunk * 4;
  sm.p = reinterpret_cast<float*>(p);
  p += kChunk * 4;
  sm.ml = reinterpret_cast<float*>(p);
  p += hpb * 8;
  sm.c = reinterpret_cast<float*>(p);

  const int64_t t = blockIdx.x, h0 = static_cast<int64_t>(blockIdx.y) * hpb;
  const int nh = static_cast<int>(a.heads - h0 < hpb ? a.heads - h0 : hpb);
  const int tid = threadIdx.x, lane = tid & 31;
  for (int64_t i = tid; i < nh * d; i += kThreads) {
    sm.q[i] = a.q[(t * a.heads + h0) * d + i];
    sm.acc[i] = 0.0f;
  }
  if (tid < nh) {
    sm.ml[2 * tid] = -1e30f;
    sm.ml[2 * tid + 1] = 0.0f;
  }
  const int32_t* list = a.list + t * a.list_len;
  const uint16_t* pool_a = a.pool_a[t];
  const uint16_t* pool_b = a.pool_b ? a.pool_b[t] : nullptr;
  const int nblk = static_cast<int>((d + dev::kGemmKBlock - 1) / dev::kGemmKBlock);  // 1 or 2
  for (int64_t c0 = 0; c0 < a.list_len; c0 += kChunk) {
    const int cn = static_cast<int>(a.list_len - c0 < kChunk ? a.list_len - c0 : kChunk);
    __syncthreads();
    if (tid < kChunk) {
      const uint16_t* r = nullptr;
      if (tid < cn) {
        const int32_t e = list[c0 + tid];
        if (e >= 0 && e < a.split) r = pool_a ? pool_a + static_cast<int64_t>(e) * d : nullptr;
        else if (e >= a.split) r = pool_b ? pool_b + static_cast<int64_t>(e - a.split) * d : nullptr;
      }
      sm.rowptr[tid] = r;
    }
    __syncthreads();
    const int64_t vecs = d / 8;
    for (int64_t i = tid; i < cn * vecs; i += kThreads) {
      const int64_t j = i / vecs, v = i % vecs;
      if (sm.rowptr[j]) reinterpret_cast<uint4*>(sm.rows + j * d)[v] = reinterpret_cast<const uint4*>(sm.rowptr[j])[v];
    }
    __syncthreads();
    for (int hh = 0; hh < nh; ++hh) {
      const float* q = sm.q + hh * d;
      {
        const int j = tid >> 1, half = tid & 1;
        float part = 0.0f;
        if (j < cn && sm.rowptr[j] && half < nblk) {
          const uint16_t* row = sm.rows + j * d;
          const int64_t k0 = half * dev::kGemmKBlock;
          const int64_t k1 = k0 + dev::kGemmKBlock < d ? k0 + dev::kGemmKBlock : d;
          part = dev::dot_block([&](int64_t k) { return q[k]; }, [&](int64_t k) { return dev::bf16_bits_to_f32(row[k]); },
                                k0, k1);
        }
        sm.part[j * 2 + half] = part;
      }
      __syncthreads();
      if (tid < 32) {
        float s[2];
        float mx = -INFINITY;
        for (int r = 0; r < 2; ++r) {
          const int j = lane + 32 * r;
          s[r] = -INFINITY;
          if (j < cn && sm.rowptr[j]) {
            float tot = __fadd_rn(0.0f, sm.part[j * 2]);
            if (nblk > 1) tot = __fadd_rn(tot, sm.part[j * 2 + 1]);
            s[r] = __fmul_rn(tot, a.scale);
            mx = mx < s[r] ? s[r] : mx;
          }
        }
        mx = dev::warp_max(mx);
        const float m = sm.ml[2 * hh];
        const float m_new = m < mx ? mx : m;
        const float c = dev::exp_ref(__fsub_rn(m, m_new));
        for (int r = 0; r < 2; ++r) {
          const int j = lane + 32 * r;
          if (j < cn) {
            const float pj = dev::exp_ref(__fsub_rn(s[r], m_new));
            sm.p[j] = pj;
            sm.pb[j] = dev::bf16_round(pj);
          }
        }
        __syncwarp();
        const float psum = dev::warp_torch_sum([&](int64_t i) { return sm.p[i]; }, cn);
        if (lane == 0) {
          sm.ml[2 * hh + 1] = __fadd_rn(__fmul_rn(sm.ml[2 * hh + 1], c), psum);
          sm.ml[2 * hh] = m_new;
          sm.c[0] = c;
        }
      }
      __syncthreads();
      const float c = sm.c[0];
      float* acc = sm.acc + hh * d;
      for (int64_t k = tid; k < d; k += kThreads) {
        float pv = 0.0f;
        for (int j = 0; j < cn; ++j)
          if (sm.rowptr[j]) pv = __fadd_rn(pv, __fmul_rn(sm.pb[j], dev::bf16_bits_to_f32(sm.rows[j * d + k])));
        acc[k] = __fadd_rn(__fmul_rn(acc[k], c), pv);
      }
      __syncthreads();
    }
  }
  __syncthreads();
  for (int hh = 0; hh < nh; ++hh) {
    const float l = __fadd_rn(sm.ml[2 * hh + 1], dev::exp_ref(__fsub_rn(a.sink[h0 + hh], sm.ml[2 * hh])));
    float* out = a.out + (t * a.heads + h0 + hh) * d;
    for (int64_t k = tid; k < d; k += kThreads) out[k] = dev::bf16_round(__fdiv_rn(sm.acc[hh * d + k], l));
  }
}

}  // namespace

namespace raw {
cudaError_t sparse_attention(const SparseAttnArgs& a, int heads_per_block, cudaStream_t s) {
  if (a.n_q == 0) return cudaSuccess;
  // The shared-memory opt-in is a function attribute, not a stream operation: raise it once to the
  // largest layout the validated callers use (d <= 512, 4 heads per block), so launches inside a
  // graph capture never need it; a larger request raises it again.
  static int configured[64] = {};  // per device
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  const size_t smem = smem_bytes(a.d, heads_per_block);
  const int want = static_cast<int>(smem > smem_bytes(512, 4) ? smem : smem_bytes(512, 4));
  if (dev < 0 || dev >= 64 || configured[dev] < want) {
    e = cudaFuncSetAttribute(sparse_attn_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, want);
    if (e != cudaSuccess) return e;
    if (dev >= 0 && dev < 64) configured[dev] = want;
  }
  const dim3 grid(static_cast<unsigned>(a.n_q), static_cast<unsigned>((a.heads + heads_per_block - 1) / heads_per_block));
  sparse_attn_kernel<<<grid, kThreads, smem, s>>>(a, heads_per_block);
  return cudaGetLastError();
}
}  // namespace raw

}  // namespace dsv41::ops::gpu
