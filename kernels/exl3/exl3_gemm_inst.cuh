// Instance table of the linear kernels for one K (included by inst/exl3_gemm_k{K}.cu, one compile
// unit per K so that nvcc and ccache work per bit width).
#pragma once
#include "exl3/exl3_gemm_kernel.cuh"
#include "exl3/exl3_stream.cuh"

namespace dsv41::exl3::dev {

using GemmKernelFn = void (*)(GemmArgs);
using StreamKernelFn = void (*)(StreamArgs);

// Per codebook: the large-m kernel and the f16 stream kernel; the int8 stream kernel is MUL1 only.
struct KernelTable {
  GemmKernelFn large[3];
  StreamKernelFn f16[3];
  StreamKernelFn int8;
};

template <int K>
void fill_gemm_table(KernelTable& t) {
  t.large[0] = gemm_kernel<K, 0>;
  t.large[1] = gemm_kernel<K, 1>;
  t.large[2] = gemm_kernel<K, 2>;
  t.f16[0] = stream_kernel<K, 0, false>;
  t.f16[1] = stream_kernel<K, 1, false>;
  t.f16[2] = stream_kernel<K, 2, false>;
  t.int8 = stream_kernel<K, 2, true>;
}

void gemm_table_k1(KernelTable& table);
void gemm_table_k2(KernelTable& table);
void gemm_table_k3(KernelTable& table);
void gemm_table_k4(KernelTable& table);
void gemm_table_k5(KernelTable& table);
void gemm_table_k6(KernelTable& table);
void gemm_table_k7(KernelTable& table);
void gemm_table_k8(KernelTable& table);

}  // namespace dsv41::exl3::dev
