// Prometheus text of the tensor-parallel collective counters (include/dsv41/dist/collective.h).
#include <fmt/format.h>

#include "dsv41/dist/collective.h"

namespace dsv41::dist {

std::string format_collective_metrics(const CollectiveStats& s) {
  std::string o;
  auto counter = [&](const char* name, const char* help, auto v) {
    o += fmt::format("# HELP {} {}\n# TYPE {} counter\n{} {}\n", name, help, name, name, v);
  };
  counter("dsv41_tp_all_reduce_calls_total", "Tensor-parallel all-reduces run by this rank.", s.all_reduce_calls);
  counter("dsv41_tp_all_reduce_bytes_total", "Bytes all-reduced by this rank (its buffer sizes).", s.all_reduce_bytes);
  counter("dsv41_tp_all_gather_calls_total", "Tensor-parallel all-gathers run by this rank.", s.all_gather_calls);
  counter("dsv41_tp_all_gather_bytes_total", "Bytes all-gathered by this rank (every rank's part).",
          s.all_gather_bytes);
  counter("dsv41_tp_collective_timed_calls_total",
          "Collectives whose time is in dsv41_tp_collective_seconds_total (NCCL: only with DSV41_TP_TIMING=1).",
          s.timed_calls);
  counter("dsv41_tp_collective_seconds_total",
          "Time inside the timed collectives (NCCL: device time on the stream, waits for a late peer included).",
          fmt::format("{:.9f}", s.seconds));
  return o;
}

}  // namespace dsv41::dist
