// Instance table of the linear kernels for one K (included by inst/exl3_gemm_k{K}.cu, one compile
// unit per K so that nvcc and ccache work per bit width).
#pragma once
#include "exl3/exl3_gemm_kernel.cuh"
#include "exl3/exl3_grouped_kernel.cuh"
#include "exl3/exl3_stream.cuh"

namespace dsv41::exl3::dev {

using GemmKernelFn = void (*)(GemmArgs);
using StreamKernelFn = void (*)(StreamArgs);
using MoeStreamKernelFn = void (*)(MoeStreamArgs);
using GroupedKernelFn = void (*)(cuda::GroupedGemmParams);

// Per codebook: the large-m kernel, the grouped kernel and the f16 stream kernels (linear and MoE);
// the int8 stream kernels are MUL1 only.
struct KernelTable {
  GemmKernelFn large[3];
  GroupedKernelFn grouped[3][4];  // [codebook][row class H - 1]: tiles of up to 16H rows
  StreamKernelFn f16[3];
  StreamKernelFn int8;
  MoeStreamKernelFn moe_f16[3];
  MoeStreamKernelFn moe_int8;
};

template <int K, int CB>
void fill_grouped(GroupedKernelFn (&g)[4]) {
  g[0] = grouped_kernel<K, CB, 1>;
  g[1] = grouped_kernel<K, CB, 2>;
  g[2] = grouped_kernel<K, CB, 3>;
  g[3] = grouped_kernel<K, CB, 4>;
}

template <int K>
void fill_gemm_table(KernelTable& t) {
  t.large[0] = gemm_kernel<K, 0>;
  t.large[1] = gemm_kernel<K, 1>;
  t.large[2] = gemm_kernel<K, 2>;
  fill_grouped<K, 0>(t.grouped[0]);
  fill_grouped<K, 1>(t.grouped[1]);
  fill_grouped<K, 2>(t.grouped[2]);
  t.f16[0] = stream_kernel<K, 0, false>;
  t.f16[1] = stream_kernel<K, 1, false>;
  t.f16[2] = stream_kernel<K, 2, false>;
  t.int8 = stream_kernel<K, 2, true>;
  t.moe_f16[0] = moe_stream_kernel<K, 0, false>;
  t.moe_f16[1] = moe_stream_kernel<K, 1, false>;
  t.moe_f16[2] = moe_stream_kernel<K, 2, false>;
  t.moe_int8 = moe_stream_kernel<K, 2, true>;
}

void gemm_table_k1(KernelTable& table);
void gemm_table_k2(KernelTable& table);
void gemm_table_k3(KernelTable& table);
void gemm_table_k4(KernelTable& table);
void gemm_table_k5(KernelTable& table);
void gemm_table_k6(KernelTable& table);
void gemm_table_k7(KernelTable& table);
void gemm_table_k8(KernelTable& table);

// The filled table of K = bits (1..8), built once (exl3_gemm.cu).
const KernelTable& kernel_table(int bits);

}  // namespace dsv41::exl3::dev
