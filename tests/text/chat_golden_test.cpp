// Prompt rendering against chat_golden.json (the V4.1 encoder with the official effort table).
#include <gtest/gtest.h>

#include "dsv41/text/chat_template.h"
#include "text_test_util.h"

namespace dsv41::text {
namespace {

using J = nlohmann::ordered_json;

const J& golden() {
  static const J g = testing::read_json("chat/chat_golden.json");
  return g;
}

std::string render_case(const J& c) {
  ChatRenderOptions opt;
  if (c.contains("thinking")) opt.thinking = c["thinking"].get<bool>();
  if (c.contains("reasoning_effort")) opt.reasoning_effort = c["reasoning_effort"];
  return render_chat_prompt(c["messages"], c.contains("tools") ? c["tools"] : J(),
                            c.contains("response_format") ? c["response_format"] : J(), opt);
}

TEST(ChatGolden, EveryCase) {
  ASSERT_GE(golden().size(), 14u);
  size_t errors = 0;
  for (const auto& c : golden()) {
    const std::string name = c["name"];
    if (c.contains("error") && !c["error"].is_null()) {
      ++errors;
      try {
        const std::string p = render_case(c);
        ADD_FAILURE() << name << ": expected an error, got prompt " << p;
      } catch (const ChatError& e) {
        EXPECT_EQ(std::string(e.what()), c["error"].get<std::string>()) << name;
      }
    } else {
      EXPECT_EQ(render_case(c), c["prompt"].get<std::string>()) << name;
    }
  }
  EXPECT_GE(errors, 1u);
}

// The V4.1 vectors of CHAT.md §1.7, through a tokenizer with V4.1's marker ids.
TEST(ChatGolden, RenderedPromptTokenizesToV41Ids) {
  const Tokenizer& tok = testing::v41_layout_tokenizer();
  ChatRenderOptions chat;
  chat.thinking = false;
  const std::string p = render_chat_prompt(J::parse(R"([{"role":"user","content":"What is 2+2?"}])"), J(), J(), chat);
  EXPECT_EQ(tok.encode(p), (std::vector<TokenId>{0, 128803, 3085, 344, 223, 20, 13, 20, 33, 128804, 128822}));
  const std::string t = render_chat_prompt(J::parse(R"([{"role":"user","content":"What is 2+2?"}])"), J(), J(), {});
  const auto ids = tok.encode(t);
  ASSERT_GE(ids.size(), 3u);
  EXPECT_EQ(ids[0], 0);
  EXPECT_EQ(ids[1], 128799);
  EXPECT_EQ(ids[ids.size() - 2], 128804);
  EXPECT_EQ(ids.back(), 128821);
  EXPECT_EQ(tok.encode("<｜User｜>你好<｜Assistant｜><think>推理</think>答案<｜end▁of▁sentence｜>"),
            (std::vector<TokenId>{128803, 30594, 128804, 128821, 36101, 128822, 7624, 1}));
}

}  // namespace
}  // namespace dsv41::text
