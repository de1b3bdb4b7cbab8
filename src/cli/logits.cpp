// `dsv41-serve logits`: runs the CPU reference engine on a prompt and writes the tensors of the
// golden files (tests/fixtures/*/golden.safetensors) following the fixtures' stepping rule:
// prefill the prompt, greedy_ids[0] = argmax after it, decode step i feeds greedy_ids[i] and gives
// decode_logits[i]; with --dspark the draft block runs after every decode step with the step's
// argmax as anchor.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/commands.h"
#include "dsv41/common/error.h"
#include "dsv41/loader/safetensors.h"
#include "dsv41/model/cpu_model.h"

namespace dsv41::cli {
namespace {

struct LogitsOptions {
  std::string model_dir, prompt_ids, engram_token_map, out, device = "cpu", compare;
  int64_t decode = 0, prefill_chunk = 0;
  bool dspark = false, dump_blocks = false, corrected_index_keys = false;
  std::string engram_dir, engram_packed;  // Engram row storage (docs/ENGRAM.md)
  double engram_cache_gib = 0.0;
};

std::vector<int32_t> read_prompt_ids(const std::string& path) {
  std::ifstream f(path);
  DSV_CHECK(f.good(), "cannot read prompt ids file {}", path);
  std::stringstream ss;
  ss << f.rdbuf();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(ss.str());
  } catch (const std::exception& e) {
    fail("{}: not valid JSON ({})", path, e.what());
  }
  DSV_CHECK(j.is_array() && !j.empty(), "{}: expected a non-empty JSON array of token ids", path);
  std::vector<int32_t> ids;
  for (const auto& v : j) {
    DSV_CHECK(v.is_number_integer(), "{}: every entry must be an integer token id", path);
    const int64_t x = v.get<int64_t>();
    DSV_CHECK(x >= 0 && x <= INT32_MAX, "{}: token id {} is out of range", path, x);
    ids.push_back(static_cast<int32_t>(x));
  }
  return ids;
}

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

int run_logits(const LogitsOptions& o) {
  DSV_CHECK(o.device == "cpu", "--device {}: the logits tool runs the CPU reference engine only (use cpu)", o.device);
  DSV_CHECK(o.decode >= 0, "--decode must be >= 0");
  const std::vector<int32_t> prompt = read_prompt_ids(o.prompt_ids);
  model::CpuModelOptions mo;
  mo.engram_token_map = o.engram_token_map;
  mo.engram_storage.engram_dir = o.engram_dir;
  mo.engram_storage.engram_packed = o.engram_packed;
  mo.engram_storage.cache_gib = o.engram_cache_gib;
  mo.dspark = o.dspark;
  mo.corrected_index_keys = o.corrected_index_keys;
  auto m = model::CpuModel::load(o.model_dir, mo);
  const ModelConfig& c = m->config();
  const int64_t S = static_cast<int64_t>(prompt.size()), V = c.vocab_size, N = o.decode;
  for (int64_t i = 0; i < S; ++i)
    DSV_CHECK(prompt[i] < V, "{}: token id {} at index {} is outside the vocabulary [0, {})", o.prompt_ids, prompt[i],
              i, V);
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
    if (o.dspark) {
      const model::DsparkDraft d = m->dspark_draft(*st, greedy[i + 1]);
      draft_ids.insert(draft_ids.end(), d.ids.begin(), d.ids.end());
      draft_logits.insert(draft_logits.end(), d.logits.begin(), d.logits.end());
      draft_conf.insert(draft_conf.end(), d.confidence.begin(), d.confidence.end());
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
  CLI::App* app = root.add_subcommand("logits", "Run the CPU reference forward pass and write logits (golden format)");
  app->add_option("--model", o->model_dir, "Checkpoint folder")->required();
  app->add_option("--prompt-ids", o->prompt_ids, "JSON file with an array of token ids")->required();
  app->add_option("--decode", o->decode, "Greedy decode steps after the prompt")->required();
  app->add_flag("--dspark", o->dspark, "Run the DSpark draft block after every decode step");
  app->add_option("--engram-token-map", o->engram_token_map, "safetensors file with an int32 token_map");
  app->add_option("--engram-dir", o->engram_dir, "Folder with the index and the shards holding the Engram tables");
  app->add_option("--engram-packed", o->engram_packed, "Folder with Engram rows packed by pack-engram");
  app->add_option("--engram-cache-gib", o->engram_cache_gib, "Engram row cache size in GiB");
  app->add_option("--device", o->device, "Device (cpu)")->capture_default_str();
  app->add_option("--prefill-chunk", o->prefill_chunk, "Prefill the prompt in chunks of this many tokens");
  app->add_option("--out", o->out, "Output safetensors file")->required();
  app->add_flag("--dump-blocks", o->dump_blocks, "Also write prefill_block{i}_h/_pre and prefill_engram_hash_ids");
  app->add_option("--compare", o->compare,
                  "Golden safetensors with prefill_block{i}_h: print per-block errors and the first diverging block");
  app->add_flag("--corrected-index-keys", o->corrected_index_keys,
                "Decode indexers score their own KV source's keys (default: the reference's decode alias)");
  return Command{app, [o] { return run_logits(*o); }};
}

}  // namespace dsv41::cli
