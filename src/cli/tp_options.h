// Tensor-parallel options of the tools that run the engine (`logits`, `generate`): with
// --world-size N > 1 the tool is rank 0: it listens on --master-addr:--master-port, waits for
// ranks 1..N-1 (`dsv41-serve --rank R --world-size N --model DIR --master-addr IP --master-port P`),
// runs, and tells them to exit when done.
#pragma once
#include <CLI/CLI.hpp>

#include <memory>
#include <string>

#include "cli/prompt_tools.h"
#include "cli/serve_options.h"
#include "dsv41/dist/tp_runtime.h"

namespace dsv41::cli {

struct TpArgs {
  int world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
};

// --world-size, --master-addr, --master-port.
void add_tp_options(CLI::App* app, TpArgs& a);

// Seconds a tool waits for its workers to connect and load (then one clear error).
inline constexpr double kToolWorkerWaitS = 1800.0;

// Rank 0 of a tool run (a.world_size > 1): listens, loads rank 0's share with `mo` (dspark and
// corrected_index_keys are passed on to the workers), waits for every worker. Destroying the model
// tells the workers to exit.
std::unique_ptr<dist::TpModel> start_tool_tp_model(const TpArgs& a, const ModelLoadArgs& load,
                                                   const model::CpuModelOptions& mo);

// The same with the CUDA backend on every rank (dist::TpModel::start_cuda): rank 0 runs on
// co.device, the workers must be started with --device cuda.
std::unique_ptr<dist::TpModel> start_tool_tp_model_cuda(const TpArgs& a, const ModelLoadArgs& load,
                                                        const model::CudaModelOptions& co);

// The bare form with --rank > 0: the headless worker (no HTTP server), until rank 0 says exit.
int run_worker_rank(const ServeOptions& o);

// The server's model on rank 0 of a tensor-parallel run: listens, loads rank 0's share, and waits
// (while the HTTP port answers "loading") for the workers; if they do not come within
// kToolWorkerWaitS it serves anyway and requests get 503 naming the missing rank until they do.
std::unique_ptr<dist::TpModel> start_serve_tp_model(const ServeOptions& o, const model::CpuModelOptions& mo);
// The same with the CUDA backend on every rank (workers started with --device cuda).
std::unique_ptr<dist::TpModel> start_serve_tp_model_cuda(const ServeOptions& o, const model::CudaModelOptions& co);

}  // namespace dsv41::cli
