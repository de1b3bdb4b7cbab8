// Kernel launches, copies and host synchronisations of a stretch of GPU work, counted by CUPTI
// (NVIDIA's profiling interface, loaded at run time with dlopen so the binary has no link-time
// dependency on it; libcupti.so from the CUDA toolkit must be findable by the dynamic loader).
//
// Two independent counts, both exact:
//  - callbacks on the runtime API (cudaLaunchKernel*, cudaMemcpy*Async, cudaStreamSynchronize,
//    cudaDeviceSynchronize): what the host code issued;
//  - activity records (every kernel and copy the GPU executed, with start/end time stamps): the
//    per-kernel time breakdown and the GPU-busy time of the stretch.
// Kernel timeline: with the environment variable DSV41_KERNEL_TIMELINE=<file>, every stop() also
// writes each kernel/copy/memset of the profiled window, in start order, as CSV rows (window, name,
// launch shape, start and duration, gap to the previous record's end, registers, shared memory,
// copy bytes); windows are numbered from 1 and appended to the one file. Run with DSV41_NO_PDL=1
// for each kernel's own duration (with PDL it includes the wait for its predecessor).
// Used by `dsv41-serve bench` in a separate pass after the timed steps, so the small per-call
// overhead of the callbacks does not enter the timings.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace dsv41::bench {

struct KernelStat {
  std::string name;  // demangled function name without arguments
  int64_t count = 0;
  double total_ns = 0;
};

// Idle gaps of the GPU: the stretches between consecutive busy intervals (kernels and copies,
// overlaps merged), grouped by the work that ended before the gap and the work that started after
// it, so the host work that holds the GPU up can be located in the step.
struct IdleGap {
  std::string after;   // kernel or copy that ended last before the gap
  std::string before;  // kernel or copy that started the next busy interval
  int64_t count = 0;
  double total_ns = 0;
  double max_ns = 0;
};

struct ProfileCounts {
  int64_t launches = 0;         // runtime API kernel launches (with CUDA graphs: also those captured into a graph)
  int64_t graph_launches = 0;   // cudaGraphLaunch calls (each runs a captured segment of kernels)
  int64_t copies = 0;           // runtime API async copies and memsets
  int64_t syncs = 0;            // cudaStreamSynchronize + cudaDeviceSynchronize
  bool has_activity = false;    // activity records were collected
  int64_t kernels_executed = 0; // kernel activity records
  int64_t graph_kernels = 0;    // of them, kernels executed as nodes of a CUDA graph
  double kernel_ns = 0;         // sum of kernel durations
  double copy_ns = 0;           // sum of copy durations
  double busy_ns = 0;           // union of kernel and copy intervals (GPU busy time)
  std::vector<KernelStat> kernels;  // by total time, largest first
  double idle_ns = 0;               // sum of the gaps between the first and the last busy interval
  int64_t idle_gaps = 0;            // number of those gaps
  std::vector<IdleGap> gaps;        // grouped by (after, before), by total time, largest first
};

class KernelProfiler {
 public:
  // Null when CUPTI cannot be loaded or initialised; `why` then says what failed.
  static std::unique_ptr<KernelProfiler> create(std::string* why);
  ~KernelProfiler();
  void start();
  // Synchronises the device, flushes the activity buffers and returns the counts since start().
  ProfileCounts stop();

  struct Api;

 private:
  explicit KernelProfiler(std::unique_ptr<Api> api);
  std::unique_ptr<Api> api_;
};

}  // namespace dsv41::bench
