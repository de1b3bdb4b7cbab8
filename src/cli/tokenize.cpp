// `dsv41-serve tokenize --tokenizer FILE`: stdin = JSON array of strings; stdout = JSON array of
// id arrays (add_special_tokens=false: no BOS/EOS added; added-token strings in the text match).
// `--bench FILE` instead encodes a UTF-8 text file repeatedly and prints throughput as JSON.
#include <chrono>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "dsv41/common/error.h"
#include "dsv41/text/tokenizer.h"

namespace dsv41::cli {

namespace {

struct TokenizeOptions {
  std::string tokenizer;
  std::string bench_file;
  int bench_repeats = 5;
};

int run_bench(const text::Tokenizer& tok, const TokenizeOptions& o) {
  std::ifstream f(o.bench_file, std::ios::binary);
  if (!f) fail("cannot open {}", o.bench_file);
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string textv = ss.str();
  double best = 1e30;
  size_t ntok = 0;
  for (int r = 0; r < o.bench_repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    ntok = tok.encode(textv).size();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::min(best, s);
  }
  nlohmann::ordered_json j = {{"bytes", textv.size()},
                              {"tokens", ntok},
                              {"best_seconds", best},
                              {"mb_per_s", static_cast<double>(textv.size()) / 1e6 / best},
                              {"tokens_per_s", static_cast<double>(ntok) / best}};
  std::cout << j.dump() << "\n";
  return 0;
}

}  // namespace

Command add_tokenize(CLI::App& root) {
  auto* app = root.add_subcommand("tokenize", "Tokenize a JSON array of strings read from stdin");
  auto o = std::make_shared<TokenizeOptions>();
  app->add_option("--tokenizer", o->tokenizer, "tokenizer.json (Hugging Face format)")->required();
  app->add_option("--bench", o->bench_file, "Encode this UTF-8 text file and print throughput instead");
  app->add_option("--bench-repeats", o->bench_repeats, "Timed repetitions for --bench (best is reported)")
      ->check(CLI::PositiveNumber);
  return {app, [o] {
            const text::Tokenizer tok = text::Tokenizer::from_file(o->tokenizer);
            if (!o->bench_file.empty()) return run_bench(tok, *o);
            const std::string input((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
            auto texts = nlohmann::json::parse(input, nullptr, /*allow_exceptions=*/false);
            if (texts.is_discarded() || !texts.is_array()) fail("tokenize: stdin must be a JSON array of strings");
            std::string out = "[";
            for (size_t i = 0; i < texts.size(); ++i) {
              if (!texts[i].is_string()) fail("tokenize: element {} of the input is not a string", i);
              if (i) out += ",";
              out += nlohmann::json(tok.encode(texts[i].get_ref<const std::string&>())).dump();
            }
            std::cout << out << "]\n";
            return 0;
          }};
}

}  // namespace dsv41::cli
