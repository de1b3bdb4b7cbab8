// config.json parsing (errors name file and key) and structural validation (one message per
// problem, naming the key).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "dsv41/common/error.h"
#include "dsv41/config/model_config.h"

namespace dsv41 {
namespace {

using json = nlohmann::json;

const std::string kRealConfig = std::string(DSV41_SOURCE_DIR) + "/configs/deepseek-v4.1-flash.json";

json real_json() { return json::parse(std::ifstream(kRealConfig)); }
json tiny_json() { return json::parse(std::ifstream(std::string(DSV41_FIXTURES_DIR) + "/tiny-s0/model/config.json")); }

std::string joined(const std::vector<std::string>& lines) {
  std::string s;
  for (const auto& l : lines) s += l + "\n";
  return s;
}

std::string parse_error(const std::string& text) {
  try {
    parse_model_config(text, "cfg.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ConfigParse, ReleasedConfigValues) {
  const ModelConfig c = load_model_config(kRealConfig);
  EXPECT_EQ(c.architecture, "DeepseekV41ForCausalLM");
  EXPECT_EQ(c.quant.method, "fp8");
  EXPECT_EQ(c.quant.weight_block_size, (std::vector<int64_t>{32, 32}));
  EXPECT_EQ(c.vocab_size, 129280);
  EXPECT_EQ(c.hidden_size, 5120);
  EXPECT_EQ(c.compress_ratios.size(), 43u);
  EXPECT_EQ(c.ratio(2), 2);
  EXPECT_EQ(c.ratio(20), 1);
  EXPECT_EQ(c.ratio(40), 0);
  EXPECT_EQ(c.rms_norm_eps, 1e-20);
  EXPECT_EQ(c.rope_scaling.type, "yarn");
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 65536);
  EXPECT_EQ(c.kv_source_for(19), 14);
  EXPECT_EQ(c.index_source_for(27), 24);
  EXPECT_EQ(c.engram_num_embeddings, (std::vector<int64_t>{384006168, 384016682}));
  EXPECT_EQ(c.dspark_experts(), 128);
  EXPECT_EQ(c.vision.num_hidden_layers, 32);
  EXPECT_EQ(c.vision.downsample_ratio, 3);
  EXPECT_TRUE(validate_config(c).empty()) << joined(validate_config(c));
}

TEST(ConfigParse, TinyFixturesValidateClean) {
  for (const char* name : {"tiny-s0", "tiny-long"}) {
    const ModelConfig c = load_model_config(std::string(DSV41_FIXTURES_DIR) + "/" + name + "/model/config.json");
    EXPECT_TRUE(validate_config(c).empty()) << name << ":\n" << joined(validate_config(c));
    EXPECT_FALSE(c.vision.enabled());
    EXPECT_EQ(c.dspark_experts(), 4);
  }
}

TEST(ConfigParse, FlatFileWithoutTextConfig) {
  json j = tiny_json();
  json flat = j["text_config"];
  for (auto& [k, v] : j.items())
    if (k != "text_config") flat[k] = v;
  const ModelConfig c = parse_model_config(flat.dump(), "flat");
  EXPECT_EQ(c.hidden_size, 256);
  EXPECT_TRUE(validate_config(c).empty()) << joined(validate_config(c));
}

TEST(ConfigParse, Errors) {
  EXPECT_NE(parse_error("{").find("cfg.json: not valid JSON"), std::string::npos);
  EXPECT_NE(parse_error("[1]").find("cfg.json: top level is not a JSON object"), std::string::npos);
  json j = tiny_json();
  j["text_config"].erase("hidden_size");
  EXPECT_EQ(parse_error(j.dump()), "cfg.json: text_config: missing key 'hidden_size'");
  j = tiny_json();
  j["text_config"]["head_dim"] = "64";
  EXPECT_EQ(parse_error(j.dump()), "cfg.json: text_config: key 'head_dim' must be an integer");
  j["text_config"]["head_dim"] = 64.5;
  EXPECT_EQ(parse_error(j.dump()), "cfg.json: text_config: key 'head_dim' must be an integer");
  j["text_config"]["head_dim"] = 64.0;  // an integral float is accepted
  EXPECT_EQ(parse_error(j.dump()), "");
  j["text_config"]["head_dim"] = 18446744073709551615ull;  // does not fit int64
  EXPECT_EQ(parse_error(j.dump()), "cfg.json: text_config: key 'head_dim' must be an integer");
  j = tiny_json();
  j["text_config"]["compress_ratios"] = {0, 1, "x"};
  EXPECT_EQ(parse_error(j.dump()), "cfg.json: text_config: key 'compress_ratios' must be an array of integers");
  j = tiny_json();
  j["text_config"]["rms_norm_eps"] = "tiny";
  EXPECT_EQ(parse_error(j.dump()), "cfg.json: text_config: key 'rms_norm_eps' must be a number");
  j = tiny_json();
  j["text_config"]["norm_topk_prob"] = 1;
  EXPECT_EQ(parse_error(j.dump()), "cfg.json: text_config: key 'norm_topk_prob' must be true or false");
  j = tiny_json();
  j["text_config"] = 3;
  EXPECT_EQ(parse_error(j.dump()), "cfg.json: 'text_config' must be an object");
  j = tiny_json();
  j["quantization_config"].erase("quant_method");
  EXPECT_EQ(parse_error(j.dump()), "cfg.json: quantization_config: missing key 'quant_method'");
  j = real_json();
  j["vision_config"].erase("patch_size");
  EXPECT_EQ(parse_error(j.dump()), "cfg.json: vision_config: missing key 'patch_size'");
  try {
    load_model_config("/nonexistent/config.json");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "/nonexistent/config.json: cannot open");
  }
}

// Applies `edit` to the released config's JSON and returns the validation problems.
std::vector<std::string> problems_after(const std::function<void(json&)>& edit, bool tiny = false) {
  json j = tiny ? tiny_json() : real_json();
  edit(j);
  return validate_config(parse_model_config(j.dump(), "edited"));
}

struct Case {
  const char* what;
  std::function<void(json&)> edit;
  const char* expected;  // one of the problem messages (substring)
  size_t count = 1;      // how many problems the edit causes
};

TEST(ConfigValidate, EachProblemNamesItsKey) {
  const std::vector<Case> cases = {
      {"architecture", [](json& j) { j["architectures"] = {"Other"}; }, "architectures[0] = 'Other'"},
      {"model_type", [](json& j) { j["model_type"] = "deepseek_v4"; }, "model_type = 'deepseek_v4'"},
      {"quant method", [](json& j) { j["quantization_config"]["quant_method"] = "gptq"; },
       "quantization_config.quant_method = 'gptq'"},
      {"block size", [](json& j) { j["quantization_config"]["weight_block_size"] = {128, 128}; },
       "quantization_config.weight_block_size must be [32, 32]"},
      {"rope dims", [](json& j) { j["text_config"]["head_dim"] = 64; },
       "qk_rope_head_dim = 64 must be smaller than head_dim = 64"},
      {"odd rope", [](json& j) { j["text_config"]["qk_rope_head_dim"] = 63; }, "qk_rope_head_dim = 63 must be even"},
      {"o_groups", [](json& j) { j["text_config"]["o_groups"] = 7; },
       "num_attention_heads = 64 must be a multiple of o_groups = 7"},
      {"hidden % 32", [](json& j) { j["text_config"]["hidden_size"] = 5136; }, "hidden_size = 5136 must be a multiple of 32"},
      {"inter % 32", [](json& j) { j["text_config"]["moe_intermediate_size"] = 2300; },
       "moe_intermediate_size = 2300 must be a multiple of 32"},
      {"positive", [](json& j) { j["text_config"]["vocab_size"] = 0; }, "vocab_size must be positive (got 0)"},
      {"kv heads", [](json& j) { j["text_config"]["num_key_value_heads"] = 8; }, "num_key_value_heads = 8"},
      {"ratios length", [](json& j) { j["text_config"]["compress_ratios"].erase(0); },
       "compress_ratios has 42 entries, expected num_hidden_layers + num_nextn_predict_layers = 43"},
      {"ratio value", [](json& j) { j["text_config"]["compress_ratios"][0] = 4; }, "compress_ratios[0] = 4, expected 0, 1 or 2"},
      {"dspark ratio", [](json& j) { j["text_config"]["compress_ratios"][41] = 1; },
       "compress_ratios[41] = 1: DSpark stage 1 must be window-only"},
      {"kv sorted", [](json& j) { j["text_config"]["kv_source_layer_ids"] = {2, 14, 8, 20}; },
       "kv_source_layer_ids must be strictly increasing (8 follows 14)"},
      {"kv range", [](json& j) { j["text_config"]["kv_source_layer_ids"] = {2, 8, 14, 20, 40}; },
       "kv_source_layer_ids[4] = 40 is not a backbone layer"},
      {"superset", [](json& j) { j["text_config"]["index_source_layer_ids"] = {2, 8, 20, 24, 28, 32, 36}; },
       "kv_source_layer_ids contains 14 but index_source_layer_ids does not"},
      {"kv source ratio 0", [](json& j) { j["text_config"]["compress_ratios"][2] = 0; },
       "kv_source_layer_ids contains 2 but compress_ratios[2] = 0", 2},  // and index_source_layer_ids
      {"no kv source yet", [](json& j) { j["text_config"]["compress_ratios"][1] = 2; },
       "compress_ratios[1] = 2 but no kv_source_layer_ids entry is <= 1", 2},  // nor index source
      {"ratio mismatch", [](json& j) { j["text_config"]["compress_ratios"][21] = 2; },
       "layer 21 (compress_ratios 2) reads the compressed KV of layer 20 whose ratio is 1"},
      {"candidate ratio", [](json& j) { j["text_config"]["candidate_source_layer_id"] = 14; },
       "candidate_source_layer_id = 14 has compress_ratios 2"},
      {"candidate not index", [](json& j) { j["text_config"]["candidate_source_layer_id"] = 21; },
       "candidate_source_layer_id = 21 is not in index_source_layer_ids"},
      {"engram count", [](json& j) { j["text_config"]["engram_num_embeddings"] = {384006168}; },
       "engram_num_embeddings has 1 entries, expected one per engram_layer_ids entry (2)"},
      {"engram sum", [](json& j) { j["text_config"]["engram_num_embeddings"][1] = 384016683; },
       "engram_num_embeddings[1] = 384016683 but the 24 column primes of layer 14 sum to 384016682"},
      {"engram ids", [](json& j) { j["text_config"]["engram_layer_ids"] = {14, 1}; },
       "engram_layer_ids must be strictly increasing (1 follows 14)"},
      {"engram head dim", [](json& j) { j["text_config"]["engram_head_dim"] = 250; },
       "engram_head_dim = 250 must be a multiple of 32"},
      {"dspark targets", [](json& j) { j["text_config"]["dspark_target_layer_ids"] = {37, 38, 40}; },
       "dspark_target_layer_ids[2] = 40 is not a backbone layer"},
      {"dspark block", [](json& j) { j["text_config"]["dspark_block_size"] = 1; }, "dspark_block_size = 1 must be in 2..64"},
      {"dspark topk", [](json& j) { j["text_config"]["dspark_num_experts_per_tok"] = 200; },
       "dspark_num_experts_per_tok = 200 exceeds the DSpark expert count 128"},
      {"topk", [](json& j) { j["text_config"]["num_experts_per_tok"] = 385; },
       "num_experts_per_tok = 385 exceeds n_routed_experts = 384"},
      {"hc_mult", [](json& j) { j["text_config"]["hc_mult"] = 0; }, "hc_mult must be positive (got 0)"},
      {"eps", [](json& j) { j["text_config"]["rms_norm_eps"] = 0.0; }, "rms_norm_eps must be a positive finite number"},
      {"noise token", [](json& j) { j["text_config"]["dspark_noise_token_id"] = 129280; },
       "dspark_noise_token_id = 129280 is outside the vocabulary"},
      {"scoring", [](json& j) { j["text_config"]["scoring_func"] = "relu"; }, "scoring_func = 'relu'"},
      {"yarn", [](json& j) { j["text_config"]["rope_scaling"]["rope_type"] = "linear"; },
       "rope_scaling.rope_type = 'linear', expected 'yarn'"},
      {"exl3 head bits", [](json& j) { j["quantization_config"] = {{"quant_method", "exl3"}, {"head_bits", 9}}; },
       "quantization_config.head_bits = 9"},
      {"vision heads", [](json& j) { j["vision_config"]["num_attention_heads"] = 24; },
       "vision_config.hidden_size = 1024 must split into num_attention_heads = 24"},
      {"too large", [](json& j) { j["text_config"]["n_routed_experts"] = 100000; },
       "n_routed_experts = 100000 is larger than the supported maximum 4096"},
      {"too many expert matrices",
       [](json& j) {
         j["text_config"]["n_routed_experts"] = 4096;
         j["text_config"]["dspark_n_routed_experts"] = 4096;
       },
       "528384 routed expert matrices"},
  };
  for (const auto& c : cases) {
    const auto p = problems_after(c.edit);
    bool found = false;
    for (const auto& line : p) found |= line.find(c.expected) != std::string::npos;
    EXPECT_TRUE(found) << c.what << ": expected \"" << c.expected << "\" in:\n" << joined(p);
    EXPECT_EQ(p.size(), c.count) << c.what << ": unexpected number of problems:\n" << joined(p);
  }
}

TEST(ConfigValidate, SeveralProblemsAreAllListed) {
  const auto p = problems_after([](json& j) {
    j["text_config"]["o_groups"] = 7;
    j["text_config"]["dspark_block_size"] = 0;
    j["text_config"]["vocab_size"] = -5;
  });
  EXPECT_GE(p.size(), 3u) << joined(p);
}

TEST(ConfigValidate, TinyScheduleRules) {
  // layer 5 is an index source that is not a KV source; dropping it leaves layer 5 with layer 3's
  // selection, which is fine; dropping KV source 3 makes layer 3 read layer 1's ratio-2 pool.
  EXPECT_TRUE(problems_after([](json& j) { j["text_config"]["index_source_layer_ids"] = {1, 3}; }, true).empty());
  const auto p = problems_after([](json& j) { j["text_config"]["kv_source_layer_ids"] = {1}; }, true);
  bool found = false;
  for (const auto& l : p) found |= l.find("layer 3 (compress_ratios 1) reads the compressed KV of layer 1") != std::string::npos;
  EXPECT_TRUE(found) << joined(p);
}

TEST(EngramPrimes, MatchTheSpecList) {
  const ModelConfig c = load_model_config(kRealConfig);
  const auto primes = engram_column_primes(c);
  ASSERT_EQ(primes.size(), 2u);
  ASSERT_EQ(primes[0].size(), 24u);
  // MODEL.md §3.5
  EXPECT_EQ(primes[0].front(), 16000057);
  EXPECT_EQ(primes[0][8], 16000189);
  EXPECT_EQ(primes[0].back(), 16000463);
  EXPECT_EQ(primes[1].front(), 16000477);
  EXPECT_EQ(primes[1][16], 16000781);
  EXPECT_EQ(primes[1].back(), 16000889);
  const ModelConfig t = load_model_config(std::string(DSV41_FIXTURES_DIR) + "/tiny-s0/model/config.json");
  EXPECT_EQ(engram_column_primes(t)[0], (std::vector<int64_t>{101, 103, 107, 109, 113, 127}));
}

TEST(EngramPrimes, PrimalityAgainstTrialDivision) {
  for (uint64_t n = 0; n < 20000; ++n) {
    bool prime = n >= 2;
    for (uint64_t d = 2; d * d <= n && prime; ++d) prime = n % d != 0;
    ASSERT_EQ(is_prime_u64(n), prime) << n;
  }
  EXPECT_TRUE(is_prime_u64(18446744073709551557ull));  // largest 64-bit prime
  EXPECT_FALSE(is_prime_u64(3215031751ull));           // strong pseudoprime to bases 2, 3, 5, 7
}

}  // namespace
}  // namespace dsv41
