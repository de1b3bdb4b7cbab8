// The CPU backend's verify forward and rollback against plain one-token decoding: verify rows are
// bit-identical to decode rows, and after keeping n positions every piece of state (rings,
// compressor carries, compressed KV and index keys, Engram history, DSpark rings and taps) is
// that of a sequence that decoded only those n tokens: its next logits and its next draft match
// bit for bit. Run on both fixtures, for every keep.
#include <gtest/gtest.h>

#include "dsv41/common/error.h"
#include "spec_fixture.h"

using namespace dsv41;

namespace {

void check(const std::string& fixture) {
  auto m = test_support::load_tiny(fixture);
  auto backend = spec::make_cpu_spec_backend(*m);
  const auto prompt = test_support::golden_ids(fixture, "prompt_ids");
  const int64_t V = m->config().vocab_size;
  // Tokens to verify: arbitrary ids (rollback must not depend on them being likely).
  const std::vector<int32_t> tokens = {7, 300, 41, 128, 9};
  // One prefill; every run starts from a copy of it.
  auto base = m->new_sequence();
  base->prompt_len = static_cast<int64_t>(prompt.size());
  {
    std::vector<float> lg;
    m->forward_sequence(*base, prompt, false, &lg);
  }
  auto prefilled = [&] { return m->clone_state(*base); };
  // Plain decoding of all tokens: the reference rows.
  std::vector<std::vector<float>> decode_rows;
  {
    auto st = prefilled();
    for (int32_t t : tokens) {
      std::vector<float> lg;
      m->forward_sequence(*st, std::span<const int32_t>(&t, 1), false, &lg);
      decode_rows.push_back(lg);
    }
  }
  const int32_t next = 55;
  for (int64_t keep = 1; keep <= static_cast<int64_t>(tokens.size()); ++keep) {
    auto st = prefilled();
    std::vector<float> rows;
    ForwardItem it;
    it.state = st.get();
    it.tokens = tokens;
    it.all_logits = true;
    it.logits = &rows;
    const uint8_t verify = 1;
    backend->forward(std::span<ForwardItem>(&it, 1), std::span<const uint8_t>(&verify, 1));
    ASSERT_EQ(rows.size(), tokens.size() * static_cast<size_t>(V));
    for (size_t p = 0; p < tokens.size(); ++p)
      ASSERT_EQ(0, std::memcmp(&rows[p * V], decode_rows[p].data(), V * sizeof(float))) << "verify row " << p;
    backend->rollback(*st, keep);
    EXPECT_EQ(st->n_past, static_cast<int64_t>(prompt.size()) + keep);

    auto ref = prefilled();
    for (int64_t i = 0; i < keep; ++i) {
      std::vector<float> lg;
      m->forward_sequence(*ref, std::span<const int32_t>(&tokens[static_cast<size_t>(i)], 1), false, &lg);
    }
    // The drafter reads the DSpark rings and the last taps.
    const auto d_ref = m->dspark_draft(*ref, next), d_got = m->dspark_draft(*st, next);
    EXPECT_EQ(d_got.ids, d_ref.ids) << "keep " << keep;
    EXPECT_EQ(0, std::memcmp(d_got.logits.data(), d_ref.logits.data(), d_ref.logits.size() * sizeof(float))) << "keep " << keep;
    EXPECT_EQ(d_got.confidence, d_ref.confidence) << "keep " << keep;
    // Two more decode steps read the window rings, the compressed KV / index keys (compressor
    // carries complete a group on one of them) and the Engram history.
    for (int32_t t : {next, int32_t{200}}) {
      std::vector<float> a, b;
      m->forward_sequence(*ref, std::span<const int32_t>(&t, 1), false, &a);
      m->forward_sequence(*st, std::span<const int32_t>(&t, 1), false, &b);
      ASSERT_EQ(a.size(), b.size());
      EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float))) << "keep " << keep << ", token " << t;
    }
  }
  // A rollback without a verify forward, or keeping more than was verified, is refused.
  auto st = prefilled();
  EXPECT_THROW(backend->rollback(*st, 1), Error);
}

}  // namespace

TEST(SpecRollback, TinyS0VerifyRowsAndRollbackAreExact) { check("tiny-s0"); }
TEST(SpecRollback, TinyLongVerifyRowsAndRollbackAreExact) { check("tiny-long"); }
