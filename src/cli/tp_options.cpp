#include "cli/tp_options.h"

#include <spdlog/spdlog.h>

#include "dsv41/common/error.h"

namespace dsv41::cli {

void add_tp_options(CLI::App* app, TpArgs& a) {
  app->add_option("--world-size", a.world_size, "Tensor-parallel ranks (this tool is rank 0)")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  app->add_option("--master-addr", a.master_addr, "Address rank 0 listens on for its workers")->capture_default_str();
  app->add_option("--master-port", a.master_port, "Port rank 0 listens on for its workers (0: any free port)")
      ->capture_default_str()
      ->check(CLI::Range(0, 65535));
}

std::unique_ptr<dist::TpModel> start_tool_tp_model(const TpArgs& a, const ModelLoadArgs& load,
                                                   const model::CpuModelOptions& mo) {
  DSV_CHECK(a.world_size > 1, "start_tool_tp_model needs --world-size > 1");
  dist::TpHeadOptions ho;
  ho.world_size = a.world_size;
  ho.master_addr = a.master_addr;
  ho.master_port = a.master_port;
  ho.model_dir = load.model_dir;
  ho.run.dspark = mo.dspark;
  ho.run.corrected_index_keys = mo.corrected_index_keys;
  ho.exit_workers_on_close = true;
  auto m = dist::TpModel::start(ho, mo);
  spdlog::info("waiting for {} worker rank(s) on {}:{}", a.world_size - 1, a.master_addr, a.master_port);
  m->wait_for_workers(kToolWorkerWaitS);
  return m;
}

std::unique_ptr<dist::TpModel> start_tool_tp_model_cuda(const TpArgs& a, const ModelLoadArgs& load,
                                                        const model::CudaModelOptions& co) {
  DSV_CHECK(a.world_size > 1, "start_tool_tp_model_cuda needs --world-size > 1");
  dist::TpHeadOptions ho;
  ho.world_size = a.world_size;
  ho.master_addr = a.master_addr;
  ho.master_port = a.master_port;
  ho.model_dir = load.model_dir;
  ho.run.dspark = co.dspark;
  ho.run.corrected_index_keys = co.corrected_index_keys;
  ho.exit_workers_on_close = true;
  spdlog::info("waiting for {} worker rank(s) (--device cuda) on {}:{}", a.world_size - 1, a.master_addr,
               a.master_port);
  auto m = dist::TpModel::start_cuda(ho, co);
  m->wait_for_workers(kToolWorkerWaitS);
  return m;
}

int run_worker_rank(const ServeOptions& o) {
  dist::TpWorkerOptions w;
  w.rank = o.rank;
  w.world_size = o.world_size;
  w.master_addr = o.master_addr;
  w.master_port = o.master_port;
  w.model_dir = o.model_dir;
  w.device = o.device;
  w.engram_token_map = o.engram_token_map;
  w.engram_dir = o.engram_dir;
  w.engram_packed = o.engram_packed;
  w.engram_cache_gib = o.engram_cache_gib;
  return dist::run_worker(w);
}

std::unique_ptr<dist::TpModel> start_serve_tp_model(const ServeOptions& o, const model::CpuModelOptions& mo) {
  dist::TpHeadOptions ho;
  ho.world_size = o.world_size;
  ho.master_addr = o.master_addr;
  ho.master_port = o.master_port;
  ho.model_dir = o.model_dir;
  ho.run.dspark = mo.dspark;
  ho.run.corrected_index_keys = mo.corrected_index_keys;
  ho.exit_workers_on_close = false;  // a restarted server finds its workers waiting
  auto m = dist::TpModel::start(ho, mo);
  try {
    m->wait_for_workers(kToolWorkerWaitS);
  } catch (const Error& e) {
    spdlog::warn("{}; serving anyway (requests fail with 503 until every rank is ready)", e.what());
  }
  return m;
}

std::unique_ptr<dist::TpModel> start_serve_tp_model_cuda(const ServeOptions& o, const model::CudaModelOptions& co) {
  dist::TpHeadOptions ho;
  ho.world_size = o.world_size;
  ho.master_addr = o.master_addr;
  ho.master_port = o.master_port;
  ho.model_dir = o.model_dir;
  ho.run.dspark = co.dspark;
  ho.run.corrected_index_keys = co.corrected_index_keys;
  ho.exit_workers_on_close = false;
  // start_cuda returns once every worker has joined the NCCL communicator (the HTTP port answers
  // "loading" meanwhile); a worker that restarts later cannot rejoin it (restart the server too).
  auto m = dist::TpModel::start_cuda(ho, co);
  try {
    m->wait_for_workers(kToolWorkerWaitS);
  } catch (const Error& e) {
    spdlog::warn("{}; serving anyway (requests fail with 503 until every rank is ready)", e.what());
  }
  return m;
}

}  // namespace dsv41::cli
