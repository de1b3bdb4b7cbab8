// CUPTI-based launch counting and kernel time breakdown (kernel_profiler.h). CUPTI is loaded with
// dlopen: builds and machines without it still run every benchmark, only without these counts.
#include "bench/kernel_profiler.h"

#if DSV41_HAS_CUDA
#include <cuda_runtime.h>
#include <cupti.h>
#include <cxxabi.h>
#include <dlfcn.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <utility>

#include "dsv41/common/error.h"
#endif

namespace dsv41::bench {

#if DSV41_HAS_CUDA
namespace {

// CUPTI delivers callbacks and activity buffers to plain C functions: the collected numbers live
// here (one profiler per process; CUPTI allows one subscriber).
struct Collected {
  std::atomic<bool> on{false};
  std::atomic<int64_t> launches{0}, graph_launches{0}, copies{0}, syncs{0};
  std::mutex mu;
  std::map<std::string, KernelStat> kernels;
  struct Interval {
    uint64_t start, end;
    int32_t name;  // index into names
  };
  // One row of the kernel timeline (DSV41_KERNEL_TIMELINE): the launch shape of every kernel and
  // the size of every copy, kept only while a timeline file is asked for.
  struct Launch {
    uint64_t start, end;
    int32_t name;     // index into names
    int32_t detail;   // index into names: demangled signature with template arguments, or copy kind
    int32_t grid[3] = {0, 0, 0}, block[3] = {0, 0, 0};
    int32_t registers = 0, dynamic_smem = 0, static_smem = 0;
    uint64_t bytes = 0;  // copies only
  };
  std::vector<Launch> launches_seen;
  std::string timeline_path;  // empty: no timeline
  int64_t timeline_window = 0;
  std::vector<Interval> intervals;
  std::vector<std::string> names;
  std::map<std::string, int32_t> name_ids;
  int32_t name_id(const std::string& n) {
    auto [it, fresh] = name_ids.emplace(n, static_cast<int32_t>(names.size()));
    if (fresh) names.push_back(n);
    return it->second;
  }
  int64_t kernels_executed = 0, graph_kernels = 0;
  double kernel_ns = 0, copy_ns = 0;
};
Collected g;

std::string demangled(const char* mangled) {
  if (!mangled) return "?";
  int status = 0;
  char* d = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string s = (status == 0 && d) ? d : mangled;
  std::free(d);
  return s;
}

// "void ns::(anonymous namespace)::lin4_kernel<float, true>(Args, long)" ->
// "lin4_kernel<float, true>": tells apart the instantiations that share one short name.
std::string kernel_signature(const char* mangled) {
  std::string s = demangled(mangled);
  int depth = 0;
  size_t begin = 0, cut = s.size();
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '<') ++depth;
    else if (s[i] == '>') --depth;
    else if (s[i] == '(' && depth == 0 && s.compare(i, 20, "(anonymous namespace") != 0) {
      cut = i;
      break;
    } else if (depth == 0 && (s[i] == ' ' || (s[i] == ':' && i + 1 < s.size() && s[i + 1] == ':'))) {
      begin = s[i] == ' ' ? i + 1 : i + 2;  // drop the return type and the namespaces
    }
  }
  return s.substr(begin, cut - begin);
}

// "void ns::(anonymous namespace)::lin4_kernel<float, true>(Args, long)" -> "lin4_kernel".
std::string short_kernel_name(const char* mangled) {
  std::string plain;  // the signature without its template arguments
  int depth = 0;
  for (char ch : kernel_signature(mangled)) {
    if (ch == '<') ++depth;
    else if (ch == '>') --depth;
    else if (depth == 0) plain += ch;
  }
  return plain;
}

void CUPTIAPI on_api(void*, CUpti_CallbackDomain domain, CUpti_CallbackId id, const void* data) {
  if (!g.on.load(std::memory_order_relaxed) || domain != CUPTI_CB_DOMAIN_RUNTIME_API) return;
  const auto* cb = static_cast<const CUpti_CallbackData*>(data);
  if (cb->callbackSite != CUPTI_API_ENTER) return;
  switch (id) {
    case CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000:
    case CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_ptsz_v7000:
    case CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernelExC_v11060:
    case CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernelExC_ptsz_v11060:
    case CUPTI_RUNTIME_TRACE_CBID_cudaLaunchCooperativeKernel_v9000:
    case CUPTI_RUNTIME_TRACE_CBID_cudaLaunchCooperativeKernel_ptsz_v9000:
      g.launches.fetch_add(1, std::memory_order_relaxed);
      break;
    case CUPTI_RUNTIME_TRACE_CBID_cudaGraphLaunch_v10000:
    case CUPTI_RUNTIME_TRACE_CBID_cudaGraphLaunch_ptsz_v10000:
      g.graph_launches.fetch_add(1, std::memory_order_relaxed);
      break;
    case CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyAsync_v3020:
    case CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyAsync_ptsz_v7000:
    case CUPTI_RUNTIME_TRACE_CBID_cudaMemcpy2DAsync_v3020:
    case CUPTI_RUNTIME_TRACE_CBID_cudaMemcpy2DAsync_ptsz_v7000:
    case CUPTI_RUNTIME_TRACE_CBID_cudaMemsetAsync_v3020:
    case CUPTI_RUNTIME_TRACE_CBID_cudaMemsetAsync_ptsz_v7000:
    case CUPTI_RUNTIME_TRACE_CBID_cudaMemcpy_v3020:
      g.copies.fetch_add(1, std::memory_order_relaxed);
      break;
    case CUPTI_RUNTIME_TRACE_CBID_cudaStreamSynchronize_v3020:
    case CUPTI_RUNTIME_TRACE_CBID_cudaStreamSynchronize_ptsz_v7000:
    case CUPTI_RUNTIME_TRACE_CBID_cudaDeviceSynchronize_v3020:
      g.syncs.fetch_add(1, std::memory_order_relaxed);
      break;
    default:
      break;
  }
}

constexpr size_t kBufferBytes = 8u << 20;

void CUPTIAPI on_buffer_request(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer ? kBufferBytes : 0;
  *max_records = 0;
}

using NextRecordFn = CUptiResult (*)(uint8_t*, size_t, CUpti_Activity**);
NextRecordFn g_next_record = nullptr;

void CUPTIAPI on_buffer_complete(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  if (g_next_record && valid > 0) {
    std::lock_guard<std::mutex> lock(g.mu);
    CUpti_Activity* rec = nullptr;
    while (g_next_record(buffer, valid, &rec) == CUPTI_SUCCESS) {
      if (rec->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || rec->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
        const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
        const std::string name = short_kernel_name(k->name);
        KernelStat& st = g.kernels[name];
        st.name = name;
        ++st.count;
        st.total_ns += static_cast<double>(k->end - k->start);
        g.kernel_ns += static_cast<double>(k->end - k->start);
        ++g.kernels_executed;
        if (k->graphId != 0) ++g.graph_kernels;  // a node of a launched graph
        g.intervals.push_back({k->start, k->end, g.name_id(name)});
        if (!g.timeline_path.empty()) {
          Collected::Launch l{k->start, k->end, g.name_id(name), g.name_id(kernel_signature(k->name))};
          l.grid[0] = k->gridX, l.grid[1] = k->gridY, l.grid[2] = k->gridZ;
          l.block[0] = k->blockX, l.block[1] = k->blockY, l.block[2] = k->blockZ;
          l.registers = k->registersPerThread;
          l.dynamic_smem = k->dynamicSharedMemory;
          l.static_smem = k->staticSharedMemory;
          g.launches_seen.push_back(l);
        }
      } else if (rec->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(rec);
        g.copy_ns += static_cast<double>(m->end - m->start);
        const char* kind = m->copyKind == CUPTI_ACTIVITY_MEMCPY_KIND_HTOD   ? "copy HtoD"
                           : m->copyKind == CUPTI_ACTIVITY_MEMCPY_KIND_DTOH ? "copy DtoH"
                           : m->copyKind == CUPTI_ACTIVITY_MEMCPY_KIND_DTOD ? "copy DtoD"
                                                                             : "copy";
        g.intervals.push_back({m->start, m->end, g.name_id(kind)});
        if (!g.timeline_path.empty()) {
          Collected::Launch l{m->start, m->end, g.name_id(kind), g.name_id(kind)};
          l.bytes = m->bytes;
          g.launches_seen.push_back(l);
        }
      } else if (rec->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(rec);
        g.copy_ns += static_cast<double>(m->end - m->start);
        g.intervals.push_back({m->start, m->end, g.name_id("memset")});
        if (!g.timeline_path.empty()) {
          Collected::Launch l{m->start, m->end, g.name_id("memset"), g.name_id("memset")};
          l.bytes = m->bytes;
          g.launches_seen.push_back(l);
        }
      }
    }
  }
  std::free(buffer);
}

template <class F>
F sym(void* lib, const char* name, std::string* why) {
  void* p = dlsym(lib, name);
  if (!p && why->empty()) *why = fmt::format("libcupti has no symbol {}", name);
  return reinterpret_cast<F>(p);
}

// Appends the launches of one profiled window to the DSV41_KERNEL_TIMELINE file (the first window
// of the process truncates it and writes the header), in start order. With PDL a kernel may start
// before its predecessor ends and its duration then includes that wait: gap_us is negative there.
// Called with g.mu held.
void write_timeline() {
  auto rows = g.launches_seen;
  std::sort(rows.begin(), rows.end(), [](const Collected::Launch& a, const Collected::Launch& b) {
    return a.start != b.start ? a.start < b.start : a.end < b.end;
  });
  const bool first = g.timeline_window == 0;
  ++g.timeline_window;
  std::FILE* f = std::fopen(g.timeline_path.c_str(), first ? "w" : "a");
  if (!f) {
    spdlog::warn("DSV41_KERNEL_TIMELINE: cannot open {} for writing", g.timeline_path);
    return;
  }
  if (first)
    std::fputs(
        "window,index,name,signature,grid,block,start_us,duration_us,gap_us,registers,dynamic_smem,static_smem,"
        "bytes\n",
        f);
  const uint64_t t0 = rows.empty() ? 0 : rows.front().start;
  uint64_t prev_end = t0;
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& l = rows[i];
    std::string sig = g.names[static_cast<size_t>(l.detail)];
    std::replace(sig.begin(), sig.end(), '"', '\'');
    const double gap = (static_cast<double>(l.start) - static_cast<double>(prev_end)) / 1e3;
    std::fputs(fmt::format("{},{},{},\"{}\",{}x{}x{},{}x{}x{},{:.3f},{:.3f},{:.3f},{},{},{},{}\n", g.timeline_window, i,
                           g.names[static_cast<size_t>(l.name)], sig, l.grid[0], l.grid[1], l.grid[2], l.block[0],
                           l.block[1], l.block[2], static_cast<double>(l.start - t0) / 1e3,
                           static_cast<double>(l.end - l.start) / 1e3, i == 0 ? 0.0 : gap, l.registers,
                           l.dynamic_smem, l.static_smem, l.bytes)
                   .c_str(),
               f);
    prev_end = l.end;
  }
  std::fclose(f);
  spdlog::info("DSV41_KERNEL_TIMELINE: window {} ({} records) written to {}", g.timeline_window, rows.size(),
               g.timeline_path);
}

}  // namespace

struct KernelProfiler::Api {
  void* lib = nullptr;
  CUpti_SubscriberHandle sub = nullptr;
  CUptiResult (*unsubscribe)(CUpti_SubscriberHandle) = nullptr;
  CUptiResult (*act_enable)(CUpti_ActivityKind) = nullptr;
  CUptiResult (*act_disable)(CUpti_ActivityKind) = nullptr;
  CUptiResult (*act_flush)(uint32_t) = nullptr;
  bool activity = false;
  bool memset_activity = false;
};

std::unique_ptr<KernelProfiler> KernelProfiler::create(std::string* why) {
  std::string err;
  void* lib = nullptr;
  for (const char* name : {"libcupti.so", "libcupti.so.13", "libcupti.so.12"})
    if ((lib = dlopen(name, RTLD_NOW | RTLD_LOCAL)) != nullptr) break;
  if (!lib) {
    if (why) *why = "libcupti.so not found by the dynamic loader (set LD_LIBRARY_PATH to the CUDA toolkit's lib)";
    return nullptr;
  }
  auto api = std::make_unique<Api>();
  api->lib = lib;
  auto subscribe = sym<CUptiResult (*)(CUpti_SubscriberHandle*, CUpti_CallbackFunc, void*)>(lib, "cuptiSubscribe", &err);
  auto enable_domain =
      sym<CUptiResult (*)(uint32_t, CUpti_SubscriberHandle, CUpti_CallbackDomain)>(lib, "cuptiEnableDomain", &err);
  api->unsubscribe = sym<CUptiResult (*)(CUpti_SubscriberHandle)>(lib, "cuptiUnsubscribe", &err);
  auto reg = sym<CUptiResult (*)(CUpti_BuffersCallbackRequestFunc, CUpti_BuffersCallbackCompleteFunc)>(
      lib, "cuptiActivityRegisterCallbacks", &err);
  api->act_enable = sym<CUptiResult (*)(CUpti_ActivityKind)>(lib, "cuptiActivityEnable", &err);
  api->act_disable = sym<CUptiResult (*)(CUpti_ActivityKind)>(lib, "cuptiActivityDisable", &err);
  api->act_flush = sym<CUptiResult (*)(uint32_t)>(lib, "cuptiActivityFlushAll", &err);
  g_next_record = sym<NextRecordFn>(lib, "cuptiActivityGetNextRecord", &err);
  if (!err.empty()) {
    if (why) *why = err;
    return nullptr;
  }
  if (subscribe(&api->sub, reinterpret_cast<CUpti_CallbackFunc>(&on_api), nullptr) != CUPTI_SUCCESS ||
      enable_domain(1, api->sub, CUPTI_CB_DOMAIN_RUNTIME_API) != CUPTI_SUCCESS) {
    if (why) *why = "cuptiSubscribe / cuptiEnableDomain failed (another profiler attached?)";
    return nullptr;
  }
  api->activity = reg(on_buffer_request, on_buffer_complete) == CUPTI_SUCCESS;
  return std::unique_ptr<KernelProfiler>(new KernelProfiler(std::move(api)));
}

KernelProfiler::KernelProfiler(std::unique_ptr<Api> api) : api_(std::move(api)) {}

KernelProfiler::~KernelProfiler() {
  g.on = false;
  if (api_ && api_->sub) api_->unsubscribe(api_->sub);
}

void KernelProfiler::start() {
  cudaDeviceSynchronize();
  {
    std::lock_guard<std::mutex> lock(g.mu);
    g.kernels.clear();
    g.intervals.clear();
    g.names.clear();
    g.name_ids.clear();
    g.kernels_executed = 0;
    g.graph_kernels = 0;
    g.kernel_ns = g.copy_ns = 0;
    g.launches_seen.clear();
    const char* tl = std::getenv("DSV41_KERNEL_TIMELINE");
    g.timeline_path = tl ? tl : "";
  }
  g.launches = 0;
  g.graph_launches = 0;
  g.copies = 0;
  g.syncs = 0;
  if (api_->activity)
    api_->activity = api_->act_enable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) == CUPTI_SUCCESS &&
                     api_->act_enable(CUPTI_ACTIVITY_KIND_MEMCPY) == CUPTI_SUCCESS;
  // Memsets are GPU work too (busy time, timeline); a CUPTI without them still gives the rest.
  if (api_->activity) api_->memset_activity = api_->act_enable(CUPTI_ACTIVITY_KIND_MEMSET) == CUPTI_SUCCESS;
  g.on = true;
}

ProfileCounts KernelProfiler::stop() {
  g.on = false;
  cudaDeviceSynchronize();
  ProfileCounts out;
  if (api_->activity) {
    api_->act_flush(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    api_->act_disable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
    api_->act_disable(CUPTI_ACTIVITY_KIND_MEMCPY);
    if (api_->memset_activity) api_->act_disable(CUPTI_ACTIVITY_KIND_MEMSET);
  }
  out.launches = g.launches;
  out.graph_launches = g.graph_launches;
  out.copies = g.copies;
  out.syncs = g.syncs;
  std::lock_guard<std::mutex> lock(g.mu);
  out.has_activity = api_->activity && g.kernels_executed > 0;
  out.kernels_executed = g.kernels_executed;
  out.graph_kernels = g.graph_kernels;
  out.kernel_ns = g.kernel_ns;
  out.copy_ns = g.copy_ns;
  auto iv = g.intervals;
  std::sort(iv.begin(), iv.end(), [](const Collected::Interval& a, const Collected::Interval& b) {
    return a.start != b.start ? a.start < b.start : a.end < b.end;
  });
  // Merge overlapping intervals (PDL lets a kernel start before its predecessor ends); every
  // stretch between two merged intervals is an idle gap, named by the work that ended last before
  // it and the work that starts after it.
  std::map<std::pair<int32_t, int32_t>, IdleGap> gaps;
  uint64_t cur_s = 0, cur_e = 0;
  int32_t cur_last = -1;  // name of the interval that ends the current merged stretch
  bool open = false;
  for (const auto& v : iv) {
    if (open && v.start <= cur_e) {
      if (v.end >= cur_e) cur_last = v.name;
      cur_e = std::max(cur_e, v.end);
      continue;
    }
    if (open) {
      out.busy_ns += static_cast<double>(cur_e - cur_s);
      const double gap = static_cast<double>(v.start - cur_e);
      IdleGap& gp = gaps[{cur_last, v.name}];
      ++gp.count;
      gp.total_ns += gap;
      gp.max_ns = std::max(gp.max_ns, gap);
      out.idle_ns += gap;
      ++out.idle_gaps;
    }
    cur_s = v.start;
    cur_e = v.end;
    cur_last = v.name;
    open = true;
  }
  if (open) out.busy_ns += static_cast<double>(cur_e - cur_s);
  for (auto& [key, gp] : gaps) {
    gp.after = g.names[static_cast<size_t>(key.first)];
    gp.before = g.names[static_cast<size_t>(key.second)];
    out.gaps.push_back(std::move(gp));
  }
  std::sort(out.gaps.begin(), out.gaps.end(),
            [](const IdleGap& a, const IdleGap& b) { return a.total_ns > b.total_ns; });
  for (const auto& [name, st] : g.kernels) out.kernels.push_back(st);
  if (!g.timeline_path.empty()) write_timeline();
  std::sort(out.kernels.begin(), out.kernels.end(),
            [](const KernelStat& a, const KernelStat& b) { return a.total_ns > b.total_ns; });
  return out;
}

#else

struct KernelProfiler::Api {};
std::unique_ptr<KernelProfiler> KernelProfiler::create(std::string* why) {
  if (why) *why = "this dsv41-serve was built without CUDA";
  return nullptr;
}
KernelProfiler::KernelProfiler(std::unique_ptr<Api> api) : api_(std::move(api)) {}
KernelProfiler::~KernelProfiler() = default;
void KernelProfiler::start() {}
ProfileCounts KernelProfiler::stop() { return {}; }

#endif

}  // namespace dsv41::bench
