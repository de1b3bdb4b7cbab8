// `dsv41-serve logits`: runs the CPU reference engine on a prompt and writes the tensors of the
// golden files (tests/fixtures/*/golden.safetensors) following the fixtures' stepping rule:
// prefill the prompt, greedy_ids[0] = argmax after it, decode step i feeds greedy_ids[i] and gives
// decode_logits[i]; with --dspark the draft block runs after every decode step with the step's
// argmax as anchor.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>

#include "cli/commands.h"
#include "cli/prompt_tools.h"
#include "cli/tp_options.h"
#include "dsv41/common/error.h"
#include "dsv41/loader/safetensors.h"
#include "dsv41/model/cpu_model.h"
#include "dsv41/model/cuda_model.h"

namespace dsv41::cli {
namespace {

struct LogitsOptions {
  ModelLoadArgs load;  // --model, --engram-*, --device, --corrected-index-keys (shared with generate)
  std::string prompt_ids, out, compare;
  int64_t decode = 0, prefill_chunk = 0;
  bool dspark = false, dump_blocks = false;
  TpArgs tp;  // --world-size/--master-addr/--master-port: this tool as rank 0 of a TP run
};

int32_t argmax(const float* v, int64_t n) { return static_cast<int32_t>(std::max_element(v, v + n) - v); }

// Prints, per block, the max |h - golden| relative to the golden range, and the first block whose
// streams differ by more than a few bf16 ulps of the stream scale.
void compare_blocks(const std::string& golden_path, const model::BlockDump& dump, int64_t S) {
  auto g = SafetensorsFile::open(golden_path);
  int64_t first_bad = -1;
  for (size_t L = 0; L < dump.h.size(); ++L) {
    const TensorInfo* t = g->find("prefill_block" + std::to_string(L) + "_h");
    if (!t) break;
    const std::vector<float> ref = tensor_to_f32(*t);
    DSV_CHECK(ref.size() == dump.h[L].size(), "{}: prefill_block{}_h has {} values, the run produced {}",
              golden_path, L, ref.size(), dump.h[L].size());
    float max_err = 0, max_abs = 0;
    int64_t worst = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      const float e = std::fabs(ref[i] - dump.h[L][i]);
      if (e > max_err) {
        max_err = e;
        worst = static_cast<int64_t>(i);
      }
      max_abs = std::max(max_abs, std::fabs(ref[i]));
    }
    const int64_t per_tok = static_cast<int64_t>(ref.size()) / S;
    const float rel = max_abs > 0 ? max_err / max_abs : max_err;
    fmt::print("block {}: max |h - golden| = {:.6g} (golden max |h| {:.6g}, rel {:.3g}) worst at position {}\n", L,
               max_err, max_abs, rel, worst / per_tok);
    if (first_bad < 0 && rel > 3e-2) first_bad = static_cast<int64_t>(L);
  }
  if (first_bad >= 0) fmt::print("first diverging block: {}\n", first_bad);
  else fmt::print("no block diverges\n");
}

template <class M>
int write_logits(M& model, const LogitsOptions& o, const std::vector<int32_t>& prompt);

int run_logits(const LogitsOptions& o) {
  if (o.load.device != "cuda") require_cpu_device(o.load, "the logits tool");
  DSV_CHECK(o.decode >= 0, "--decode must be >= 0");
  const std::vector<int32_t> prompt = read_prompt_ids(o.prompt_ids);
  model::CpuModelOptions mo = cpu_model_options(o.load);
  mo.dspark = o.dspark;
  if (o.load.device == "cuda") {  // the CUDA backend (include/dsv41/model/cuda_model.h)
    model::CudaModelOptions co;
    co.dspark = o.dspark;
    co.engram_token_map = mo.engram_token_map;
    co.engram_storage = mo.engram_storage;
    co.corrected_index_keys = mo.corrected_index_keys;
    co.max_context = static_cast<int64_t>(prompt.size()) + o.decode;  // sequence room for exactly this run
    if (o.tp.world_size > 1) {  // rank 0 of a CUDA tensor-parallel run (NCCL), on GPU 0
      auto tp = start_tool_tp_model_cuda(o.tp, o.load, co);
      return write_logits(*tp, o, prompt);
    }
    auto cuda = model::CudaModel::load(o.load.model_dir, co);
    return write_logits(*cuda, o, prompt);
  }
  if (o.tp.world_size > 1) {
    auto tp = start_tool_tp_model(o.tp, o.load, mo);
    return write_logits(*tp, o, prompt);
  }
  auto cpu = model::CpuModel::load(o.load.model_dir, mo);
  return write_logits(*cpu, o, prompt);
}

// The fixtures' stepping rule on `model`: a CpuModel, a CudaModel, or rank 0 of a tensor-parallel run.
template <class M>
int write_logits(M& model, const LogitsOptions& o, const std::vector<int32_t>& prompt) {
  M* m = &model;
  const ModelConfig& c = m->config();
  const int64_t S = static_cast<int64_t>(prompt.size()), V = c.vocab_size, N = o.decode;
  check_prompt_ids(prompt, V, o.prompt_ids);
  DSV_CHECK(S + N <= c.max_position_embeddings,
            "prompt ({} tokens) + --decode {} exceeds the configured context max_position_embeddings = {}", S, N,
            c.max_position_embeddings);
  if (o.dspark) DSV_CHECK(m->has_dspark(), "--dspark: the checkpoint config has no DSpark stages");

  auto st = m->new_sequence();
  st->prompt_len = S;  // chunks use the one-shot layout of the whole prompt
  std::vector<float> prefill(static_cast<size_t>(S * V));
  const bool dump = o.dump_blocks || !o.compare.empty();
  model::BlockDump all;
  const int64_t chunk = o.prefill_chunk > 0 ? o.prefill_chunk : S;
  for (int64_t s0 = 0; s0 < S; s0 += chunk) {
    const int64_t n = std::min(chunk, S - s0);
    std::vector<float> lg;
    model::BlockDump d;
    m->forward_sequence(*st, std::span<const int32_t>(prompt.data() + s0, static_cast<size_t>(n)), true, &lg,
                        dump ? &d : nullptr);
    std::copy(lg.begin(), lg.end(), prefill.begin() + s0 * V);
    if (dump) {
      if (all.h.empty()) {
        all.h.resize(d.h.size());
        all.pre.resize(d.pre.size());
      }
      for (size_t L = 0; L < d.h.size(); ++L) {
        all.h[L].insert(all.h[L].end(), d.h[L].begin(), d.h[L].end());
        all.pre[L].insert(all.pre[L].end(), d.pre[L].begin(), d.pre[L].end());
      }
      all.engram_hash_ids.insert(all.engram_hash_ids.end(), d.engram_hash_ids.begin(), d.engram_hash_ids.end());
    }
  }

  std::vector<int32_t> greedy(static_cast<size_t>(N + 1));
  greedy[0] = argmax(&prefill[(S - 1) * V], V);
  std::vector<float> decode(static_cast<size_t>(N * V));
  const int64_t B = c.dspark_block_size;
  std::vector<int32_t> draft_ids;
  std::vector<float> draft_logits, draft_conf;
  for (int64_t i = 0; i < N; ++i) {
    std::vector<float> lg;
    m->forward_sequence(*st, std::span<const int32_t>(&greedy[i], 1), false, &lg);
    std::copy(lg.begin(), lg.end(), decode.begin() + i * V);
    greedy[i + 1] = argmax(lg.data(), V);
    if constexpr (requires { m->dspark_draft(*st, 0); }) {  // backends with DSpark drafting
      if (o.dspark) {
        const model::DsparkDraft d = m->dspark_draft(*st, greedy[i + 1]);
        draft_ids.insert(draft_ids.end(), d.ids.begin(), d.ids.end());
        draft_logits.insert(draft_logits.end(), d.logits.begin(), d.logits.end());
        draft_conf.insert(draft_conf.end(), d.confidence.begin(), d.confidence.end());
      }
    }
  }

  SafetensorsWriter w;
  w.add("prefill_logits", DType::F32, {S, V}, prefill);
  w.add("greedy_ids", DType::I32, {N + 1}, greedy);
  w.add("decode_logits", DType::F32, {N, V}, decode);
  if (o.dspark) {
    w.add("dspark_draft_ids", DType::I32, {N, B + 1}, draft_ids);
    w.add("dspark_draft_logits", DType::F32, {N, B, V}, draft_logits);
    w.add("dspark_confidence", DType::F32, {N, B}, draft_conf);
  }
  if (o.dump_blocks) {
    for (size_t L = 0; L < all.h.size(); ++L) {
      w.add("prefill_block" + std::to_string(L) + "_h", DType::F32, {S, c.hc_mult, c.hidden_size}, all.h[L]);
      w.add("prefill_block" + std::to_string(L) + "_pre", DType::F32, {S, c.hc_mult}, all.pre[L]);
    }
    if (!c.engram_layer_ids.empty())
      w.add("prefill_engram_hash_ids", DType::I64,
            {S, static_cast<int64_t>(c.engram_layer_ids.size()), c.n_engram_columns()}, all.engram_hash_ids);
  }
  w.write(o.out);
  spdlog::info("wrote {}: {} prompt tokens, {} decode steps{}", o.out, S, N, o.dspark ? " with DSpark drafts" : "");
  if (!o.compare.empty()) compare_blocks(o.compare, all, S);
  return 0;
}

}  // namespace

Command add_logits(CLI::App& root) {
  auto o = std::make_shared<LogitsOptions>();
  CLI::App* app = root.add_subcommand("logits", "Run the forward pass (CPU reference, CUDA, or tensor-parallel) and write logits (golden format)");
  add_model_load_options(app, o->load);
  add_tp_options(app, o->tp);
  app->add_option("--prompt-ids", o->prompt_ids, "JSON file with an array of token ids")->required();
  app->add_option("--decode", o->decode, "Greedy decode steps after the prompt")->required();
  app->add_flag("--dspark", o->dspark, "Run the DSpark draft block after every decode step");
  app->add_option("--prefill-chunk", o->prefill_chunk, "Prefill the prompt in chunks of this many tokens");
  app->add_option("--out", o->out, "Output safetensors file")->required();
  app->add_flag("--dump-blocks", o->dump_blocks, "Also write prefill_block{i}_h/_pre and prefill_engram_hash_ids");
  app->add_option("--compare", o->compare,
                  "Golden safetensors with prefill_block{i}_h: print per-block errors and the first diverging block");
  return Command{app, [o] { return run_logits(*o); }};
}

}  // namespace dsv41::cli
