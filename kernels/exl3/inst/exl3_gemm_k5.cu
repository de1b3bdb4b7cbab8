// Linear-kernel instances for K = 5 (see exl3_gemm_inst.cuh).
#include "exl3/exl3_gemm_inst.cuh"

namespace dsv41::exl3::dev {
void gemm_table_k5(KernelTable& table) { fill_gemm_table<5>(table); }
}  // namespace dsv41::exl3::dev
