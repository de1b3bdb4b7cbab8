// Linear-kernel instances for K = 3 (see exl3_gemm_inst.cuh).
#include "exl3/exl3_gemm_inst.cuh"

namespace dsv41::exl3::dev {
void gemm_table_k3(KernelTable& table) { fill_gemm_table<3>(table); }
}  // namespace dsv41::exl3::dev
