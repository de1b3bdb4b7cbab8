// The sequence-state pool is where the engine's per-sequence buffers really live: the CPU engine's
// pooled state takes exactly the bytes its layout needs (computed here independently from the
// config), allocates nothing while tokens fit, grows in the pool and returns everything.
#include <gtest/gtest.h>

#include <memory_resource>

#include "dsv41/common/error.h"
#include "dsv41/model/cpu_model.h"
#include "sched/state_budget.h"

using namespace dsv41;

namespace {

const std::string kFix = DSV41_FIXTURES_DIR;

// fp32 window rings of every layer and DSpark stage, compressor carries, compressed KV and index
// keys (one entry per `ratio` tokens of room), int64 Engram history, DSpark taps.
int64_t expected_cpu_state_bytes(const ModelConfig& c, int64_t room) {
  int64_t floats = (c.num_hidden_layers + c.num_nextn_predict_layers) * c.sliding_window * c.head_dim;
  for (int64_t L : c.kv_source_layer_ids) {
    const int64_t r = c.ratio(L);
    if (r > 1) floats += 2 * r * c.head_dim;
    floats += (room / r) * (c.head_dim + c.index_head_dim);
  }
  floats += static_cast<int64_t>(c.dspark_target_layer_ids.size()) * c.hidden_size;
  const int64_t history = c.engram_layer_ids.empty() ? 0 : (c.engram_max_ngram_size - 1) * 8;
  return floats * 4 + history;
}

std::unique_ptr<model::CpuModel> tiny() {
  model::CpuModelOptions mo;
  mo.engram_token_map = kFix + "/tiny-s0/engram_token_map.safetensors";
  return model::CpuModel::load(kFix + "/tiny-s0/model", mo);
}

}  // namespace

TEST(StatePool, CountsRealBytesAndRoundsRoomToBlocks) {
  sched::StatePool pool(1 << 20, 16);
  EXPECT_EQ(pool.room_for(1, 128), 16);
  EXPECT_EQ(pool.room_for(16, 128), 16);
  EXPECT_EQ(pool.room_for(17, 128), 32);
  EXPECT_EQ(pool.room_for(120, 128), 128);  // never past the context limit
  {
    std::pmr::vector<float> a(1000, 0.0f, &pool);
    std::pmr::vector<int64_t> b(&pool);
    b.reserve(3);
    EXPECT_EQ(pool.used_bytes(), 4000 + 24);
    EXPECT_EQ(pool.live_allocations(), 2);
    EXPECT_TRUE(pool.fits((1 << 20) - 4024));
    EXPECT_FALSE(pool.fits((1 << 20) - 4023));
    a.reserve(2000);  // the old buffer is freed after the copy: the peak saw both
    EXPECT_EQ(pool.used_bytes(), 8000 + 24);
    EXPECT_EQ(pool.peak_bytes(), 12000 + 24);
  }
  EXPECT_EQ(pool.used_bytes(), 0);
  EXPECT_EQ(pool.live_allocations(), 0);
  EXPECT_THROW(sched::StatePool(0, 16), Error);
}

TEST(StatePool, CpuEngineStateComesFromThePoolWithExactBytes) {
  auto m = tiny();
  const ModelConfig& c = m->config();
  sched::StatePool pool(int64_t{1} << 30, 16);
  const int64_t n = 40, room = pool.room_for(n, c.max_position_embeddings);
  ASSERT_EQ(room, 48);
  EXPECT_EQ(m->state_bytes(room), expected_cpu_state_bytes(c, room));
  std::vector<int32_t> prompt(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) prompt[static_cast<size_t>(i)] = static_cast<int32_t>((i * 37 + 11) % c.vocab_size);

  std::vector<float> pooled_logits, heap_logits;
  {
    auto st = m->new_sequence(pool, room);
    EXPECT_EQ(pool.used_bytes(), expected_cpu_state_bytes(c, room));
    const int64_t allocations = pool.live_allocations();
    // Prefill in two chunks, then decode: no allocation while the tokens fit the room.
    m->forward_sequence(*st, std::span(prompt).first(25), false, nullptr);
    m->forward_sequence(*st, std::span(prompt).subspan(25), false, &pooled_logits);
    EXPECT_EQ(pool.used_bytes(), expected_cpu_state_bytes(c, room));
    EXPECT_EQ(pool.live_allocations(), allocations);
    EXPECT_EQ(pool.peak_bytes(), pool.used_bytes());
    // The same tokens through a heap state give the same logits: pooling changes no numbers.
    auto heap = m->new_sequence();
    m->forward_sequence(*heap, std::span(prompt).first(25), false, nullptr);
    m->forward_sequence(*heap, std::span(prompt).subspan(25), false, &heap_logits);
    EXPECT_EQ(pooled_logits, heap_logits);
    EXPECT_EQ(pool.used_bytes(), expected_cpu_state_bytes(c, room));  // the heap state is not pooled

    // Tokens past the room are refused, not silently allocated.
    std::vector<int32_t> more(static_cast<size_t>(room - n + 1), 5);
    std::vector<ForwardItem> batch(1);
    batch[0].state = st.get();
    batch[0].tokens = more;
    batch[0].logits = &pooled_logits;
    EXPECT_THROW(m->forward(batch), Error);
    // Growing the room grows the pooled buffers to exactly the new size, contents kept.
    m->reserve_sequence(*st, 96);
    EXPECT_EQ(pool.used_bytes(), expected_cpu_state_bytes(c, 96));
    m->forward(batch);
    std::vector<float> heap_more;
    batch[0].state = heap.get();
    batch[0].logits = &heap_more;
    m->forward(batch);
    EXPECT_EQ(pooled_logits, heap_more);
    EXPECT_EQ(pool.used_bytes(), expected_cpu_state_bytes(c, 96));
    // A snapshot (speculative decoding) is pooled too.
    auto snap = m->clone_state(*st);
    EXPECT_EQ(pool.used_bytes(), 2 * expected_cpu_state_bytes(c, 96));
  }
  EXPECT_EQ(pool.used_bytes(), 0);
  EXPECT_EQ(pool.live_allocations(), 0);
}
