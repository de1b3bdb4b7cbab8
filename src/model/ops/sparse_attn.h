// Sparse attention with a sink (MODEL.md §4 SparseAttn): one KV row serves as key and value;
// the index list is walked in chunks of 64 with an online softmax whose probabilities are rounded
// to bf16 for the PV product; the sink joins the denominator after the loop.
#pragma once
#include <cstdint>
#include <vector>

namespace dsv41::model {

// q: [heads][d]; rows: the list in order, nullptr for an entry of -1; sink: [heads];
// out: [heads][d] bf16 values.
void sparse_attention(const float* q, const std::vector<const float*>& rows, const float* sink, float scale,
                      int64_t heads, int64_t d, float* out);

}  // namespace dsv41::model
