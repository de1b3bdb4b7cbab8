// Tokenizer components on small hand-made tokenizer.json files (HF semantics of added-token
// flags and Split behaviors), the regex dialect, error reporting, and the two BPE merge loops.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <random>
#include <thread>

#include "dsv41/common/error.h"
#include "text/bpe.h"
#include "text/regex.h"
#include "text_test_util.h"

namespace dsv41::text {
namespace {

using J = nlohmann::json;

// A byte-level tokenizer: ids 0..255 are the byte characters in byte order, then merges.
J tiny_tokenizer(const std::vector<std::pair<std::string, std::string>>& merges, J pre_tokenizer, J added = J::array()) {
  J vocab = J::object();
  const auto& a = byte_level_alphabet();
  for (int b = 0; b < 256; ++b) vocab[a.byte_to_utf8[b]] = b;
  J m = J::array();
  int next = 256;
  for (const auto& [x, y] : merges) {
    m.push_back(J::array({x, y}));  // the array form of merges
    if (!vocab.contains(x + y)) vocab[x + y] = next++;
  }
  return J{{"version", "1.0"}, {"added_tokens", added}, {"normalizer", nullptr}, {"pre_tokenizer", pre_tokenizer},
           {"post_processor", nullptr}, {"decoder", {{"type", "ByteLevel"}}},
           {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", m}}}};
}

J byte_level(bool use_regex) { return {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", use_regex}}; }

J added_token(int id, const std::string& content, bool lstrip, bool rstrip, bool single_word, bool normalized) {
  return {{"id", id}, {"content", content}, {"single_word", single_word}, {"lstrip", lstrip},
          {"rstrip", rstrip}, {"normalized", normalized}, {"special", true}};
}

std::vector<TokenId> bytes_of(const std::string& s) {
  std::vector<TokenId> v;
  for (char c : s) v.push_back(static_cast<uint8_t>(c));
  return v;
}

TEST(TokenizerUnit, AddedTokenFlags) {
  J added = J::array({added_token(1000, "<sp>", true, true, false, false), added_token(1001, "[W]", false, false, true, false),
                      added_token(1002, "<n>", false, false, false, true)});
  const auto tok = Tokenizer::from_json_text(tiny_tokenizer({}, byte_level(true), added).dump());
  // lstrip/rstrip swallow the surrounding spaces into the token
  const auto e = tok.encode_with_offsets("a  <sp>  b");
  EXPECT_EQ(e.ids, (std::vector<TokenId>{'a', 1000, 'b'}));
  EXPECT_EQ(e.offsets[1], (std::pair<size_t, size_t>{1, 9}));
  // single_word: only when no word character touches it
  EXPECT_EQ(tok.encode("x[W]y"), bytes_of("x[W]y"));
  const auto sw = tok.encode("x [W] y");
  EXPECT_NE(std::find(sw.begin(), sw.end(), 1001), sw.end());
  // normalized tokens match too (second pass), and matching can be switched off
  EXPECT_EQ(tok.encode("<n>"), (std::vector<TokenId>{1002}));
  EXPECT_EQ(tok.encode("<sp>", /*match_added_tokens=*/false), bytes_of("<sp>"));
  EXPECT_EQ(tok.decode(std::vector<TokenId>{'a', 1000, 'b'}), "a<sp>b");
  EXPECT_TRUE(tok.is_special(1000));
  EXPECT_EQ(tok.require_token("[W]"), 1001);
  EXPECT_THROW(tok.require_token("<missing>"), Error);
}

TEST(TokenizerUnit, MergesByRank) {
  const auto tok = Tokenizer::from_json_text(
      tiny_tokenizer({{"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}, {"Ġ", "w"}}, byte_level(true)).dump());
  const auto hello = tok.token_to_id("hello");
  ASSERT_TRUE(hello.has_value());
  EXPECT_EQ(tok.encode("hello"), (std::vector<TokenId>{*hello}));
  // " hello" is one GPT-2 pre-token; Ġ+h has no merge, so the space stays alone
  const auto ids = tok.encode(" hello");
  ASSERT_EQ(ids.size(), 2u);
  EXPECT_EQ(tok.id_to_token(ids[0]), "Ġ");
  EXPECT_EQ(ids[1], *hello);
  EXPECT_EQ(tok.decode(tok.encode(" hello wow")), " hello wow");
}

TEST(TokenizerUnit, SplitBehaviors) {
  const std::vector<std::pair<std::string, std::string>> merges = {{"a", "-"}, {"-", "b"}, {"-", "-"}};
  auto run = [&](const char* behavior, const std::string& text) {
    J pre = {{"type", "Sequence"},
             {"pretokenizers",
              J::array({{{"type", "Split"}, {"pattern", {{"String", "-"}}}, {"behavior", behavior}, {"invert", false}},
                        byte_level(false)})}};
    const auto tok = Tokenizer::from_json_text(tiny_tokenizer(merges, pre).dump());
    std::vector<std::string> out;
    for (TokenId id : tok.encode(text)) out.push_back(tok.id_to_token(id));
    return out;
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(run("Isolated", "a-b"), (V{"a", "-", "b"}));
  EXPECT_EQ(run("MergedWithPrevious", "a-b"), (V{"a-", "b"}));
  EXPECT_EQ(run("MergedWithNext", "a-b"), (V{"a", "-b"}));
  EXPECT_EQ(run("Removed", "a-b"), (V{"a", "b"}));
  EXPECT_EQ(run("Isolated", "a--b"), (V{"a", "-", "-", "b"}));
  EXPECT_EQ(run("Contiguous", "a--b"), (V{"a", "--", "b"}));
}

TEST(TokenizerUnit, RegexDialectUsesUnicodeWhiteSpace) {
  Regex ws("\\s+");
  size_t b = 0, e = 0;
  EXPECT_TRUE(ws.find("a\xC2\xA0" "b", 0, b, e));           // U+00A0 is White_Space
  EXPECT_EQ(b, 1u);
  EXPECT_EQ(e, 3u);
  EXPECT_FALSE(ws.find("a\xE1\xA0\x8E" "b", 0, b, e));       // U+180E is not (PCRE2 alone says it is)
  Regex lookahead("\\s+(?!\\S)");
  EXPECT_TRUE(lookahead.find("a   b", 0, b, e));             // backs off one character before "b"
  EXPECT_EQ(e - b, 2u);
  EXPECT_EQ(rewrite_whitespace_classes("[^\\s]"), "[^\\t-\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}]");
  EXPECT_THROW(Regex("(unclosed"), Error);
}

TEST(TokenizerUnit, ClearErrors) {
  auto error_of = [](const std::string& json) {
    try {
      Tokenizer::from_json_text(json, "t.json");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  J t = tiny_tokenizer({}, byte_level(true));
  t["normalizer"] = {{"type", "BertNormalizer"}};
  EXPECT_NE(error_of(t.dump()).find("unsupported normalizer type \"BertNormalizer\""), std::string::npos);
  t = tiny_tokenizer({}, {{"type", "Whitespace"}});
  EXPECT_NE(error_of(t.dump()).find("unsupported pre_tokenizer type \"Whitespace\""), std::string::npos);
  t = tiny_tokenizer({}, nullptr);
  EXPECT_NE(error_of(t.dump()).find("no ByteLevel step"), std::string::npos);
  t = tiny_tokenizer({}, byte_level(true));
  t["model"]["merges"] = J::array({"x y z"});
  EXPECT_NE(error_of(t.dump()).find("merge #0"), std::string::npos);
  t = tiny_tokenizer({}, byte_level(true));
  t["model"]["vocab"].erase("Ġ");
  EXPECT_NE(error_of(t.dump()).find("byte 0x20"), std::string::npos);
  EXPECT_NE(error_of("{not json").find("not valid JSON"), std::string::npos);
  EXPECT_THROW(testing::v3_tokenizer().encode("bad \xFF utf8"), Error);
  EXPECT_THROW(testing::v3_tokenizer().decode(std::vector<TokenId>{999999}), Error);
}

TEST(TokenizerUnit, ScanAndHeapMergeLoopsAgree) {
  BpeModel bpe;
  const auto j = J::parse(testing::read_file(testing::fixture_path("tokenizer/deepseek_v3_tokenizer.json")));
  bpe.load(j["model"], "v3");
  std::mt19937 rng(7);
  const std::vector<std::string> alphabets = {"abcdefghijklmnopqrstuvwxyz", "etaoinshrdlu", "  \n\t", "0123456789",
                                              "\xE4\xBD\xA0\xE5\xA5\xBD\xE4\xB8\x96\xE7\x95\x8C"};
  for (int trial = 0; trial < 400; ++trial) {
    const std::string& al = alphabets[trial % alphabets.size()];
    const size_t n = 1 + rng() % 64;
    std::string w;
    while (w.size() < n) {
      const size_t k = (rng() % al.size());
      w += al[k];
    }
    std::vector<int32_t> a, b;
    std::vector<uint32_t> ea, eb;
    const auto* p = reinterpret_cast<const uint8_t*>(w.data());
    bpe.encode_word(p, w.size(), a, &ea, BpeModel::MergeLoop::Scan);
    bpe.encode_word(p, w.size(), b, &eb, BpeModel::MergeLoop::Heap);
    EXPECT_EQ(a, b) << w;
    EXPECT_EQ(ea, eb) << w;
  }
}

TEST(TokenizerUnit, LongInputIsFast) {
  // ~600k tokens of mixed prose must tokenize in seconds (the bound), here well under.
  std::string text;
  const auto golden = testing::read_json("tokenizer/tokenizer_golden.json");
  const auto& cases = golden["cases"];
  ASSERT_FALSE(cases.empty());
  while (text.size() < 2'400'000)
    for (const auto& c : cases) text += c["text"].get<std::string>() + "\n";
  const auto t0 = std::chrono::steady_clock::now();
  const auto ids = testing::v3_tokenizer().encode(text);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GT(ids.size(), 500'000u);
  EXPECT_LT(s, 10.0);
  EXPECT_EQ(testing::v3_tokenizer().decode(ids), text);
}

}  // namespace
}  // namespace dsv41::text

namespace dsv41::text {
namespace {

TEST(TokenizerUnit, StreamDecoderHoldsSplitCharacters) {
  const Tokenizer& tok = testing::v3_tokenizer();
  const auto& a = byte_level_alphabet();
  auto byte_token = [&](uint8_t b) { return tok.require_token(a.byte_to_utf8[b]); };
  StreamDecoder sd(tok);
  EXPECT_EQ(sd.push(byte_token('a')), "a");
  EXPECT_EQ(sd.push(byte_token(0xF0)), "");
  EXPECT_EQ(sd.push(byte_token(0x9F)), "");
  EXPECT_EQ(sd.push(byte_token(0x98)), "");
  EXPECT_EQ(sd.pending_bytes(), 3u);
  EXPECT_EQ(sd.push(byte_token(0x80)), "\xF0\x9F\x98\x80");
  // an ill-formed byte comes out as U+FFFD at once; a cut sequence at the end as one U+FFFD
  EXPECT_EQ(sd.push(byte_token(0xFF)), "\xEF\xBF\xBD");
  EXPECT_EQ(sd.push(byte_token(0xE4)), "");
  EXPECT_EQ(sd.push(byte_token('b')), "\xEF\xBF\xBD" "b");
  EXPECT_EQ(sd.push(byte_token(0xE4)), "");
  EXPECT_EQ(sd.finish(), "\xEF\xBF\xBD");
  const std::vector<TokenId> ids = {byte_token('a'), byte_token(0xF0), byte_token(0x9F), byte_token(0x98), byte_token(0x80),
                                    byte_token(0xFF), byte_token(0xE4), byte_token('b'), byte_token(0xE4)};
  EXPECT_EQ(tok.decode(ids), "a\xF0\x9F\x98\x80\xEF\xBF\xBD\xEF\xBF\xBD" "b\xEF\xBF\xBD");
}

TEST(TokenizerUnit, ConcurrentEncodingIsConsistent) {
  const Tokenizer& tok = testing::v3_tokenizer();
  const auto golden = testing::read_json("tokenizer/tokenizer_golden.json");
  std::vector<std::string> texts;
  std::vector<std::vector<TokenId>> want;
  for (const auto& c : golden["cases"]) {
    texts.push_back(c["text"].get<std::string>());
    want.push_back(c["ids"].get<std::vector<TokenId>>());
  }
  std::atomic<int> mismatches{0};
  auto work = [&] {
    for (int rep = 0; rep < 20; ++rep)
      for (size_t i = 0; i < texts.size(); ++i)
        if (tok.encode(texts[i]) != want[i]) ++mismatches;
  };
  std::thread t1(work), t2(work);
  t1.join();
  t2.join();
  EXPECT_EQ(mismatches.load(), 0);
}

}  // namespace
}  // namespace dsv41::text
