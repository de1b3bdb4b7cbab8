// Integer bits per EXL3 linear for a fractional target (EXL3.md §1.5, simplified): every budgeted
// linear (all quantized linears except the head and the mtp.* stages) starts at floor(bits); then
// whole groups get +1 bit in priority order while the budget (bits x budgeted weights) allows.
// A group is one module kind of one layer (attention, shared expert, routed experts: all experts
// of a layer share K as upstream's block_gud group does), so gate/up/down of an expert stay tied.
// Priority: layers nearest either end of the stack first (lower index on ties), and within a
// layer attention, then the shared expert, then the routed experts. Budget left over because the
// remaining groups are too big (few-layer models) goes to single experts / single linears of those
// groups in the same order, so the achieved mean stays close to the target.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "dsv41/loader/manifest.h"

namespace dsv41::mkmodel {

struct BitsPlanResult {
  Exl3Plan plan;
  double achieved_bits = 0.0;  // weighted mean K over budgeted linears
  uint64_t budgeted_weights = 0;
};

// `bits` in [1, 8]; head_bits 1..8 or 16 (unquantized); mtp_bits 1..8. Throws dsv41::Error on a
// value out of range.
BitsPlanResult plan_bits(const ModelConfig& cfg, double bits, int head_bits, int mtp_bits, const std::string& codebook);

}  // namespace dsv41::mkmodel
