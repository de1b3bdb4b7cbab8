// The DSpark drafter on the GPU (MODEL.md §6; the CPU engine's src/model/cpu_model.cpp dspark_draft
// and update_dspark_rings are the truth): weights of the mtp.* stages and heads, the taps captured
// during a target forward, the rings fed from them, and the batched draft pass.
#pragma once
#if DSV41_HAS_CUDA
#include <cstdint>
#include <span>
#include <vector>

#include "cuda_model/cuda_impl.h"
#include "dsv41/model/cpu_model.h"

namespace dsv41::model::cuda {

struct DsparkModel {
  std::vector<GpuBlock> stages;  // mtp.0 .. mtp.{S-1}: full blocks with ratio 0, plain RoPE
  GpuLinear main_proj;           // mtp.0.main_proj [dim][nt*dim]
  DeviceBuffer main_norm, norm;  // mtp.0.main_norm, mtp.{S-1}.norm [dim]
  // Markov head: embedding rows [vocab][rank] and the head transposed to [rank][vocab] (coalesced
  // reads per vocabulary entry), each BF16 when its values are bf16, else F32.
  DeviceBuffer markov_embed, markov_head_t;
  DenseType markov_embed_type = DenseType::BF16, markov_head_type = DenseType::BF16;
  const TensorInfo* markov_embed_host = nullptr;  // the checkpoint's rows (confidence input, host)
  std::vector<float> confidence;                  // [dim + rank] (computed on the host)
  std::vector<int64_t> tap_slot;  // [layer] -> index into dspark_target_layer_ids, -1 if not tapped
  int64_t n_taps = 0, block = 0, rank = 0;

  // Scratch: taps of one pass [m][nt][dim], main_x [m][dim], ring rows [m][hd] (fp32); draft:
  // collapsed block rows [m][dim], ids [(block+1)][m], positions [m], lists [m][win+block].
  DeviceBuffer taps, main_x, ring_kv, hpre, ids, positions, lists;
  std::vector<float> logits_host, hpre_host;
  std::vector<int32_t> ids_host, lists_host;
  std::vector<int64_t> positions_host;
};

// Loads the drafter when the config has DSpark stages (sets m.dspark and m.dspark_stages).
void load_dspark(Impl& m);
// During a target pass: before block L, the tap of layer L (when it is a target layer) for the
// pass's n rows.
void dspark_capture_tap(Impl& m, int64_t layer, int64_t n);
// After a target pass over positions p.start .. p.start+p.n-1: the DSpark ring rows of its last
// min(n, window) positions, from the captured taps.
void dspark_feed_rings(Impl& m, CudaSeqState& st, const Pass& p);
// After a batched decode pass (DecodeBatch, positions in m.sc.positions): each row's ring slot.
void dspark_feed_rings_batch(Impl& m, const DecodeBatch& db);
// The draft block for each (state, anchor) (MODEL.md §6.3), batched over the sequences.
std::vector<DsparkDraft> dspark_draft(Impl& m, std::span<CudaSeqState* const> states, std::span<const int32_t> anchors);

}  // namespace dsv41::model::cuda
#endif
