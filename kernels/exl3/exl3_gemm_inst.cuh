// Instance table of the linear kernels for one K (included by inst/exl3_gemm_k{K}.cu, one compile
// unit per K so that nvcc and ccache work per bit width).
#pragma once
#include "exl3/exl3_gemm_kernel.cuh"

namespace dsv41::exl3::dev {

using GemmKernelFn = void (*)(GemmArgs);

// table[path][codebook]; the int8 path exists for MUL1 only.
template <int K>
void fill_gemm_table(GemmKernelFn (&table)[3][3]) {
  table[kPathF16][0] = gemm_kernel<K, 0, kPathF16>;
  table[kPathF16][1] = gemm_kernel<K, 1, kPathF16>;
  table[kPathF16][2] = gemm_kernel<K, 2, kPathF16>;
  table[kPathInt8][0] = nullptr;
  table[kPathInt8][1] = nullptr;
  table[kPathInt8][2] = gemm_kernel<K, 2, kPathInt8>;
  table[kPathLarge][0] = gemm_kernel<K, 0, kPathLarge>;
  table[kPathLarge][1] = gemm_kernel<K, 1, kPathLarge>;
  table[kPathLarge][2] = gemm_kernel<K, 2, kPathLarge>;
}

void gemm_table_k1(GemmKernelFn (&table)[3][3]);
void gemm_table_k2(GemmKernelFn (&table)[3][3]);
void gemm_table_k3(GemmKernelFn (&table)[3][3]);
void gemm_table_k4(GemmKernelFn (&table)[3][3]);
void gemm_table_k5(GemmKernelFn (&table)[3][3]);
void gemm_table_k6(GemmKernelFn (&table)[3][3]);
void gemm_table_k7(GemmKernelFn (&table)[3][3]);
void gemm_table_k8(GemmKernelFn (&table)[3][3]);

}  // namespace dsv41::exl3::dev
