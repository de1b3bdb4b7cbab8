// Transcendentals as PyTorch's CPU kernels evaluate them in the reference (float32 on x86 with AVX2).
// Elementwise kernels run a vector body over the first floor(n/16)·16 elements of a contiguous
// tensor of n elements (two 8-lane vectors per step) and a scalar loop over the rest, and the two
// paths use different exp implementations:
//  - vector body: Vectorized<float>::exp, the SLEEF expf (1-ulp) algorithm — round(x/ln2) range
//    reduction with a two-part ln2, a degree-6 polynomial evaluated with fused multiply-adds, and
//    a two-step power-of-two scaling; torch.sigmoid's vector body is 1 / (1 + exp(-x)) with it;
//  - scalar tail: std::exp (glibc), which is what torch.exp (MKL VML) agrees with as well.
// torch.sigmoid on the mHC pre/post coefficients goes through the vector body whenever the
// coefficient tensor has 16 or more elements, so the choice matters at the last ulp.
#pragma once
#include <cstdint>

namespace dsv41::model {

// PyTorch's vectorised float exp (SLEEF expf, u10) for one lane.
float torch_vec_exp_f32(float x);

// torch.sigmoid on one element: vector body (true) or scalar tail (false).
float torch_sigmoid_f32(float x, bool vector_path);

// Number of elements of a contiguous n-element tensor that PyTorch's elementwise kernels run
// through the vector body (the rest take the scalar path).
inline int64_t torch_vector_body_elements(int64_t n) { return n / 16 * 16; }

}  // namespace dsv41::model
