// Test entry into the code decoders of the Lin8/Lin4 kernels (kernels/ops/lin_fp8.cu): every
// e4m3 and e2m1 code goes through exactly the instructions the hot loops use, so a unit test can
// compare them with the reference conversions (dsv41/common/numeric.h).
#pragma once
#include <cuda_runtime.h>

namespace dsv41::ops::gpu::raw {

// e4m3_out[pos*256 + c]: value of code c decoded from byte position pos (0..3) of a word;
// e2m1_out[pos*16 + c]: value of code c decoded from nibble position pos (0..7), scale undone.
// Both device pointers (1024 and 128 floats).
cudaError_t lin_decode_all(float* e4m3_out, float* e2m1_out, cudaStream_t s);

}  // namespace dsv41::ops::gpu::raw
