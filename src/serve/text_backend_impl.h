// The production TextBackend: the project's tokenizer (dsv41::text::Tokenizer), chat encoder and
// output parsers.
#pragma once
#include <memory>
#include <string>

#include "dsv41/serve/text_backend.h"
#include "dsv41/text/tokenizer.h"

namespace dsv41::serve {

class TokenizerTextBackend : public TextBackend {
 public:
  explicit TokenizerTextBackend(text::Tokenizer tok) : tok_(std::move(tok)) {}
  std::vector<int32_t> encode(std::string_view text) const override;
  std::string token_bytes(int32_t id) const override;
  ChatPrompt render_chat(const nlohmann::ordered_json& request) const override;
  std::unique_ptr<ChoiceOutput> new_output(const OutputOptions& options) const override;
  size_t vocab_size() const { return tok_.vocab_size(); }
  const text::Tokenizer& tokenizer() const { return tok_; }

 private:
  text::Tokenizer tok_;
};

std::unique_ptr<TokenizerTextBackend> make_text_backend(const std::string& tokenizer_json);

}  // namespace dsv41::serve
