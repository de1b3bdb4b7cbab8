// Linear-kernel instances for K = 7 (see exl3_gemm_inst.cuh).
#include "exl3/exl3_gemm_inst.cuh"

namespace dsv41::exl3::dev {
void gemm_table_k7(KernelTable& table) { fill_gemm_table<7>(table); }
}  // namespace dsv41::exl3::dev
