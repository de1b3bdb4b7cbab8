// Top-k selection with the tie behaviour of the reference (PyTorch's CPU topk): the candidates are
// (value, index) pairs in index order, partially ordered by value (larger first, NaN on top) with
// std::partial_sort when k·64 <= n and std::nth_element otherwise. Ties are therefore broken the
// way those standard algorithms leave equal elements, which is what the reference's selection
// (indexer top-k, candidate blocks, expert routing) does; a "lower index wins" rule would pick
// different entries among exactly tied scores (frequent: the index scores are bf16, relu'd).
// Both branches are our own replays of libstdc++'s steps (same survivors among ties): the
// partial_sort branch replays the heap, visiting only the entries a vectorised compare against the
// top lets through and sifting top-down three levels at a time (~2.8x faster than the library at
// 65,536 scores, the decode step's host point at long context), the nth_element branch replays
// introselect's swaps with its partition scans read from bitmaps (1.3-2.1x faster at 2k-32k
// scores, a prefill row's selection). The library replayed is libstdc++ (the reference's,
// PyTorch on Linux); tests/model/topk_test.cpp checks both against the build's own standard
// library on tied, NaN and infinite inputs, so it assumes a libstdc++ build.
#pragma once
#include <cstdint>
#include <vector>

namespace dsv41::model {

// Indices of the k selected entries (in the order the algorithm leaves them; sort if needed).
std::vector<int32_t> torch_topk_indices(const std::vector<float>& values, int64_t k);
std::vector<int32_t> torch_topk_indices(const float* values, int64_t n, int64_t k);

// The k selected entries, sorted by index (the indexer's top-k over visible entries).
std::vector<int32_t> topk_sorted(const std::vector<float>& values, int64_t k);
std::vector<int32_t> topk_sorted(const float* values, int64_t n, int64_t k);

// Level-1 candidate blocks of one query (the reference's select_candidate_blocks): per-block maxima
// of `scores`, the block of the last visible entry (n_vis - 1) pinned, the top `topk_blocks`
// blocks kept; returns one 0/1 per score entry. Shared by the CPU and CUDA engines so both pick
// exactly the same blocks.
std::vector<uint8_t> candidate_mask(const std::vector<float>& scores, int64_t n_vis, int64_t topk_blocks,
                                    int64_t block_size);

}  // namespace dsv41::model
