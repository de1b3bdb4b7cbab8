// The CUDA engine's sequence state in the server's pool: a pooled state takes exactly the device
// bytes of its layout (computed here independently from the config) from the model's device
// memory through the StatePool, grows in pool blocks with its contents kept (same logits as a heap
// state), refuses tokens beyond its room and gives every byte back.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "dsv41/common/error.h"
#include "dsv41/model/cuda_model.h"
#include "sched/state_budget.h"

using namespace dsv41;

namespace {

const std::string kFix = DSV41_FIXTURES_DIR;

int64_t align256(int64_t b) { return (b + 255) / 256 * 256; }

// bf16 window ring per layer and loaded DSpark stage; fp32 (kv, score) carries of ratio > 1
// compressors; bf16 compressed entries and index keys, one per `ratio` tokens of room; every buffer
// on a 256-byte boundary.
int64_t expected_cuda_state_bytes(const ModelConfig& c, int64_t room, int64_t dspark_stages) {
  int64_t b = (c.num_hidden_layers + dspark_stages) * align256(c.sliding_window * c.head_dim * 2);
  for (int64_t L : c.kv_source_layer_ids) {
    const int64_t r = c.ratio(L);
    if (r > 1) b += 2 * align256(r * c.head_dim * 4);
    b += align256(room / r * c.head_dim * 2) + align256(room / r * c.index_head_dim * 2);
  }
  return b;
}

std::unique_ptr<model::CudaModel> tiny() {
  model::CudaModelOptions mo;
  mo.engram_token_map = kFix + "/tiny-s0/engram_token_map.safetensors";
  return model::CudaModel::load(kFix + "/tiny-s0/model", mo);
}

std::vector<int32_t> golden_prompt() {
  std::ifstream f(kFix + "/tiny-s0/golden.json");
  return nlohmann::json::parse(f)["prompt_ids"].get<std::vector<int32_t>>();
}

}  // namespace

TEST(CudaStatePool, PooledStatesTakeExactDeviceBytesGrowAndReturnThem) {
  auto m = tiny();
  const ModelConfig& c = m->config();
  const int64_t stages = m->has_dspark() ? c.num_nextn_predict_layers : 0;
  const auto expected = [&](int64_t room) { return expected_cuda_state_bytes(c, room, stages); };
  sched::StatePool pool(int64_t{1} << 26, 16, &m->state_memory());
  EXPECT_NE(&m->state_memory(), std::pmr::new_delete_resource());
  for (int64_t room : {int64_t{0}, int64_t{16}, int64_t{48}, int64_t{96}, c.max_position_embeddings})
    EXPECT_EQ(m->state_bytes(room), expected(room)) << room;

  const std::vector<int32_t> prompt = golden_prompt();
  const int64_t n = 40;
  const std::span<const int32_t> head(prompt.data(), n);
  std::vector<float> pooled, heap;
  {
    auto st = m->new_sequence(pool, 48);
    EXPECT_EQ(pool.used_bytes(), expected(48));
    const int64_t blocks = pool.live_allocations();
    // Two prefill chunks inside the room: no allocation.
    m->forward_sequence(*st, head.first(25), false, nullptr);
    m->forward_sequence(*st, head.subspan(25), false, &pooled);
    EXPECT_EQ(pool.live_allocations(), blocks);
    EXPECT_EQ(pool.used_bytes(), expected(48));

    auto ref = m->new_sequence();  // heap state sized for the model's context: not pooled
    m->forward_sequence(*ref, head.first(25), false, nullptr);
    m->forward_sequence(*ref, head.subspan(25), false, &heap);
    EXPECT_EQ(pooled, heap);
    EXPECT_EQ(pool.used_bytes(), expected(48));

    // Tokens past the room are refused through the Model interface.
    const std::vector<int32_t> more(prompt.begin() + n, prompt.begin() + 60);
    std::vector<ForwardItem> batch(1);
    batch[0].state = st.get();
    batch[0].tokens = more;
    batch[0].logits = &pooled;
    EXPECT_THROW(m->forward(batch), Error);
    // A failed forward leaves the state unspecified: start over, grow block by block while decoding.
    st.reset();
    EXPECT_EQ(pool.used_bytes(), 0);
    st = m->new_sequence(pool, 16);
    st->prompt_len = 10;
    ref = m->new_sequence();
    ref->prompt_len = 10;
    m->forward_sequence(*st, std::span(prompt).first(10), false, &pooled);
    m->forward_sequence(*ref, std::span(prompt).first(10), false, &heap);
    std::vector<int32_t> ids_pooled, ids_heap;
    int64_t room = 16;
    for (int64_t t = 10; t < 90; ++t) {
      if (st->n_past + 1 > room) {  // the scheduler's rule: whole blocks, grown when the next token needs it
        room += 16;
        m->reserve_sequence(*st, room);
        EXPECT_EQ(pool.used_bytes(), expected(room)) << "room " << room;
      }
      const int32_t a = static_cast<int32_t>(std::max_element(pooled.begin(), pooled.end()) - pooled.begin());
      const int32_t b = static_cast<int32_t>(std::max_element(heap.begin(), heap.end()) - heap.begin());
      ids_pooled.push_back(a);
      ids_heap.push_back(b);
      m->forward_sequence(*st, std::span(&a, 1), false, &pooled);
      m->forward_sequence(*ref, std::span(&b, 1), false, &heap);
      ASSERT_EQ(pooled, heap) << "position " << t;  // the copies on growth kept every entry
    }
    EXPECT_EQ(ids_pooled, ids_heap);
    EXPECT_EQ(room, 96);
    EXPECT_GT(pool.peak_bytes(), pool.used_bytes());  // old and new entries coexisted while copied
    // A room beyond the model's context is refused with a clear error.
    EXPECT_THROW(m->reserve_sequence(*st, c.max_position_embeddings + 16), Error);
  }
  EXPECT_EQ(pool.used_bytes(), 0);
  EXPECT_EQ(pool.live_allocations(), 0);
}
