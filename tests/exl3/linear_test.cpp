// load_exl3_linear / Exl3Linear: loading from a checkpoint folder, padding, legacy signs, bias,
// and one clear error for every malformed tensor.
#include <gtest/gtest.h>

#include <filesystem>
#include <random>

#include "dsv41/common/error.h"
#include "dsv41/common/numeric.h"
#include "dsv41/exl3/exl3_linear.h"
#include "dsv41/loader/checkpoint.h"
#include "exl3_test_util.h"

namespace dsv41::exl3 {
namespace {

namespace fs = std::filesystem;

class Exl3LinearLoad : public test::TempDirTest {
 protected:
  std::string fresh_dir(const std::string& name) {
    const std::string p = temp_path("exl3_linear_" + name);
    fs::create_directories(p);
    return p;
  }
};

std::vector<uint16_t> f16_vec(const std::vector<float>& v) {
  std::vector<uint16_t> o(v.size());
  for (size_t i = 0; i < v.size(); ++i) o[i] = f32_to_f16_bits(v[i]);
  return o;
}

// A random EXL3 linear's tensors, written into a SafetensorsWriter.
struct RandomLinear {
  int64_t k, n;
  int K;
  std::vector<uint16_t> trellis;
  std::vector<float> suh, svh;  // exact fp16 values

  RandomLinear(int64_t k_, int64_t n_, int K_, uint32_t seed) : k(k_), n(n_), K(K_) {
    std::mt19937 rng(seed);
    trellis.resize(static_cast<size_t>(k / 16 * n / 16 * 16 * K));
    for (auto& w : trellis) w = static_cast<uint16_t>(rng());
    std::uniform_real_distribution<float> mag(0.5f, 1.5f);
    for (int64_t i = 0; i < k; ++i) suh.push_back(f16_round((rng() & 1 ? -1 : 1) * mag(rng) / std::sqrt(float(k))));
    for (int64_t i = 0; i < n; ++i) svh.push_back(f16_round((rng() & 1 ? -1 : 1) * mag(rng)));
  }
  void add_to(SafetensorsWriter& w, const std::string& p, const char* marker = "mul1") const {
    w.add(p + ".trellis", DType::I16, {k / 16, n / 16, 16 * K}, trellis);
    w.add(p + ".suh", DType::F16, {k}, f16_vec(suh));
    w.add(p + ".svh", DType::F16, {n}, f16_vec(svh));
    add_marker(w, p, marker);
  }
  static void add_marker(SafetensorsWriter& w, const std::string& p, const char* marker) {
    if (std::string(marker) == "mul1") w.add(p + ".mul1", DType::I32, {}, std::vector<uint32_t>{kMul1Multiplier});
    if (std::string(marker) == "mcg") w.add(p + ".mcg", DType::I32, {}, std::vector<uint32_t>{kMcgMultiplier});
  }
};

// Dense fp64 reference y[m][out] = x[m][:in] . W[:in][:out] (+ bias) from a full weight [k][n].
std::vector<float> dense_ref(const std::vector<float>& w_full, int64_t n, const std::vector<float>& x, int64_t m,
                             int64_t in, int64_t out, const std::vector<float>& bias = {}) {
  std::vector<float> y(static_cast<size_t>(m * out));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t o = 0; o < out; ++o) {
      double s = bias.empty() ? 0.0 : bias[o];
      for (int64_t c = 0; c < in; ++c) s += double(x[i * in + c]) * w_full[c * n + o];
      y[i * out + o] = static_cast<float>(s);
    }
  return y;
}

std::vector<float> random_x(int64_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(count));
  for (auto& v : x) v = nd(rng);
  return x;
}

TEST_F(Exl3LinearLoad, FixtureThroughCheckpoint) {
  auto f = SafetensorsFile::open(test::fixture_path());
  const std::string dir = fresh_dir("fixture");
  SafetensorsWriter w;
  for (const char* name : {"k3.trellis", "k3.suh", "k3.svh", "k3.mul1"}) {
    const TensorInfo* t = f->find(name);
    ASSERT_NE(t, nullptr);
    w.add(name, t->dtype, t->shape, t->data, t->nbytes);
  }
  w.write(dir + "/model.safetensors");
  auto ckpt = Checkpoint::open(dir);
  EXPECT_TRUE(is_exl3_linear(*ckpt, "k3"));
  EXPECT_FALSE(is_exl3_linear(*ckpt, "k2"));
  auto lin = load_exl3_linear(*ckpt, "k3", 256, 384);
  EXPECT_EQ(lin->in_features(), 256);
  EXPECT_EQ(lin->out_features(), 384);
  EXPECT_EQ(lin->weight_bytes(), 256u * 384u * 3u / 8u + 2u * (256u + 384u));
  const std::vector<float> x = tensor_to_f32(*f->find("k3.ref_x_f32"));
  const std::vector<float> ref = tensor_to_f32(*f->find("k3.ref_y_f32"));
  std::vector<float> y(ref.size());
  lin->forward(x.data(), 4, y.data());
  EXPECT_LT(test::max_rel(y, ref), 1e-3);
  // Wrong logical shape: one clear error.
  EXPECT_THROW(load_exl3_linear(*ckpt, "k3", 384, 256), Error);
  EXPECT_THROW(load_exl3_linear(*ckpt, "k3", 128, 384), Error);
  EXPECT_THROW(load_exl3_linear(*ckpt, "nothere", 256, 384), Error);
}

TEST_F(Exl3LinearLoad, PaddedShapesAllCodebooksAndBias) {
  const int64_t k = 256, n = 256, in = 200, out = 130, m = 3;
  int seed = 0;
  for (const char* marker : {"mul1", "mcg", "3inst"}) {
    for (int K : {1, 5, 8}) {
      RandomLinear rl(k, n, K, 100 + seed++);
      const std::string dir = fresh_dir(std::string("pad_") + marker + std::to_string(K));
      SafetensorsWriter w;
      rl.add_to(w, "layers.0.attn.wq_a", marker);
      std::vector<float> bias(static_cast<size_t>(n), 0.0f);
      for (int64_t i = 0; i < out; ++i) bias[i] = f16_round(0.01f * static_cast<float>(i % 7) - 0.03f);
      w.add("layers.0.attn.wq_a.bias", DType::F16, {n}, f16_vec(bias));
      w.write(dir + "/model.safetensors");
      auto ckpt = Checkpoint::open(dir);
      auto lin = load_exl3_linear(*ckpt, "layers.0.attn.wq_a", in, out);
      const auto* el = dynamic_cast<const Exl3Linear*>(lin.get());
      ASSERT_NE(el, nullptr);
      EXPECT_EQ(el->storage().K, K);
      EXPECT_EQ(codebook_name(el->storage().codebook), std::string(marker));
      const std::vector<float> x = random_x(m * in, 7);
      std::vector<float> y(static_cast<size_t>(m * out), -999.0f);
      lin->forward(x.data(), m, y.data());
      const std::vector<float> full = full_weight_f32(el->storage().view());
      const std::vector<float> ref = dense_ref(full, n, x, m, in, out, bias);
      EXPECT_LT(test::max_rel(y, ref), 1e-4) << marker << " K=" << K;
    }
  }
}

TEST_F(Exl3LinearLoad, LegacyPackedSignsMatchPlusMinusOneScales) {
  const int64_t k = 128, n = 256, m = 2;
  RandomLinear rl(k, n, 3, 5);
  std::mt19937 rng(77);
  std::vector<float> su(k), sv(n);
  for (auto& s : su) s = (rng() & 1) ? -1.0f : 1.0f;
  for (auto& s : sv) s = (rng() & 1) ? -1.0f : 1.0f;
  auto pack = [](const std::vector<float>& s) {
    std::vector<uint16_t> words(s.size() / 16, 0);
    for (size_t i = 0; i < s.size(); ++i)
      if (s[i] < 0) words[i / 16] = static_cast<uint16_t>(words[i / 16] | (1u << (i % 16)));
    return words;
  };
  const std::string dir_legacy = fresh_dir("legacy"), dir_new = fresh_dir("legacy_twin");
  {
    SafetensorsWriter w;
    w.add("lin.trellis", DType::I16, {k / 16, n / 16, 48}, rl.trellis);
    w.add("lin.su", DType::I16, {k / 16}, pack(su));
    w.add("lin.sv", DType::I16, {n / 16}, pack(sv));
    w.add("lin.mcg", DType::I32, {}, std::vector<uint32_t>{kMcgMultiplier});
    w.write(dir_legacy + "/model.safetensors");
  }
  {
    SafetensorsWriter w;
    w.add("lin.trellis", DType::I16, {k / 16, n / 16, 48}, rl.trellis);
    w.add("lin.suh", DType::F16, {k}, f16_vec(su));
    w.add("lin.svh", DType::F16, {n}, f16_vec(sv));
    w.add("lin.mcg", DType::I32, {}, std::vector<uint32_t>{kMcgMultiplier});
    w.write(dir_new + "/model.safetensors");
  }
  auto a = Checkpoint::open(dir_legacy);
  auto b = Checkpoint::open(dir_new);
  auto la = load_exl3_linear(*a, "lin", k, n);
  auto lb = load_exl3_linear(*b, "lin", k, n);
  EXPECT_TRUE(dynamic_cast<const Exl3Linear*>(la.get())->storage().legacy_signs);
  EXPECT_EQ(dynamic_cast<const Exl3Linear*>(la.get())->storage().suh, su);
  EXPECT_EQ(dynamic_cast<const Exl3Linear*>(la.get())->storage().svh, sv);
  const std::vector<float> x = random_x(m * k, 3);
  std::vector<float> ya(static_cast<size_t>(m * n)), yb(ya.size());
  la->forward(x.data(), m, ya.data());
  lb->forward(x.data(), m, yb.data());
  EXPECT_EQ(ya, yb);
  const std::vector<float> full = full_weight_f32(dynamic_cast<const Exl3Linear*>(lb.get())->storage().view());
  EXPECT_LT(test::max_rel(ya, dense_ref(full, n, x, m, k, n)), 1e-4);
}

TEST_F(Exl3LinearLoad, MisalignedTrellisIsCopiedAndDecodesTheSame) {
  // A 1-byte tensor first puts the trellis at an odd file offset.
  RandomLinear rl(128, 128, 4, 21);
  const std::string dir = fresh_dir("misaligned");
  SafetensorsWriter w;
  w.add("odd", DType::I8, {1}, std::vector<int8_t>{7});
  rl.add_to(w, "lin", "mcg");
  w.write(dir + "/model.safetensors");
  auto f = SafetensorsFile::open(dir + "/model.safetensors");
  ASSERT_NE(reinterpret_cast<uintptr_t>(f->find("lin.trellis")->data) % 2, 0u);
  Exl3Tensors t = read_exl3_tensors(test::lookup_in(*f), "lin", dir);
  EXPECT_FALSE(t.owned_trellis.empty());
  Exl3Tensors moved = std::move(t);  // the owned copy must follow the move
  EXPECT_EQ(moved.trellis, moved.owned_trellis.data());
  std::vector<uint16_t> a(128 * 128), b(128 * 128);
  reconstruct_f16(moved.trellis, 128, 128, 4, Codebook::kMcg, a.data());
  reconstruct_f16(rl.trellis.data(), 128, 128, 4, Codebook::kMcg, b.data());
  EXPECT_EQ(a, b);
}

// Writes a checkpoint with one linear "lin" built by `edit` and expects loading to fail with a
// message containing `needle`.
void expect_load_error(const std::string& dir, const std::string& tag,
                       const std::function<void(SafetensorsWriter&)>& edit, const std::string& needle,
                       int64_t in = 128, int64_t out = 128) {
  SafetensorsWriter w;
  edit(w);
  w.write(dir + "/model.safetensors");
  auto ckpt = Checkpoint::open(dir);
  try {
    load_exl3_linear(*ckpt, "lin", in, out);
    ADD_FAILURE() << tag << ": no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << tag << ": " << e.what();
  }
}

TEST_F(Exl3LinearLoad, MalformedTensorsGiveOneClearError) {
  RandomLinear rl(128, 128, 2, 9);
  const std::vector<uint16_t> suh = f16_vec(rl.suh), svh = f16_vec(rl.svh);
  auto base = [&](SafetensorsWriter& w, bool marker) {
    w.add("lin.trellis", DType::I16, {8, 8, 32}, rl.trellis);
    w.add("lin.suh", DType::F16, {128}, suh);
    w.add("lin.svh", DType::F16, {128}, svh);
    if (marker) w.add("lin.mul1", DType::I32, {}, std::vector<uint32_t>{kMul1Multiplier});
  };
  expect_load_error(fresh_dir("err_mul1_value"), "mul1_value", [&](SafetensorsWriter& w) {
    base(w, false);
    w.add("lin.mul1", DType::I32, {}, std::vector<uint32_t>{kMcgMultiplier});
  }, "codebook marker lin.mul1");
  expect_load_error(fresh_dir("err_mcg_value"), "mcg_value", [&](SafetensorsWriter& w) {
    base(w, false);
    w.add("lin.mcg", DType::I32, {}, std::vector<int32_t>{12345});
  }, "codebook marker lin.mcg");
  expect_load_error(fresh_dir("err_both_markers"), "both_markers", [&](SafetensorsWriter& w) {
    base(w, true);
    w.add("lin.mcg", DType::I32, {}, std::vector<uint32_t>{kMcgMultiplier});
  }, "both mul1 and mcg");
  expect_load_error(fresh_dir("err_marker_dtype"), "marker_dtype", [&](SafetensorsWriter& w) {
    base(w, false);
    w.add("lin.mul1", DType::F32, {}, std::vector<float>{1.0f});
  }, "I32 scalar");
  expect_load_error(fresh_dir("err_marker_shape"), "marker_shape", [&](SafetensorsWriter& w) {
    base(w, false);
    w.add("lin.mul1", DType::I32, {2}, std::vector<uint32_t>{kMul1Multiplier, kMul1Multiplier});
  }, "I32 scalar");
  expect_load_error(fresh_dir("err_k_too_big"), "k_too_big", [&](SafetensorsWriter& w) {
    std::vector<uint16_t> t(8 * 8 * 144, 0);
    w.add("lin.trellis", DType::I16, {8, 8, 144}, t);
    w.add("lin.suh", DType::F16, {128}, suh);
    w.add("lin.svh", DType::F16, {128}, svh);
  }, "K in 1..8");
  expect_load_error(fresh_dir("err_last_dim"), "last_dim", [&](SafetensorsWriter& w) {
    std::vector<uint16_t> t(8 * 8 * 40, 0);
    w.add("lin.trellis", DType::I16, {8, 8, 40}, t);
  }, "16*K");
  expect_load_error(fresh_dir("err_trellis_dtype"), "trellis_dtype", [&](SafetensorsWriter& w) {
    w.add("lin.trellis", DType::F16, {8, 8, 32}, rl.trellis);
  }, "expected I16");
  expect_load_error(fresh_dir("err_trellis_rank"), "trellis_rank", [&](SafetensorsWriter& w) {
    w.add("lin.trellis", DType::I16, {64, 32}, rl.trellis);
  }, "[k/16, n/16, 16*K]");
  expect_load_error(fresh_dir("err_not_128"), "not_128", [&](SafetensorsWriter& w) {
    std::vector<uint16_t> t(4 * 8 * 32, 0);
    w.add("lin.trellis", DType::I16, {4, 8, 32}, t);
  }, "multiples of 128", 64, 128);
  expect_load_error(fresh_dir("err_suh_shape"), "suh_shape", [&](SafetensorsWriter& w) {
    w.add("lin.trellis", DType::I16, {8, 8, 32}, rl.trellis);
    w.add("lin.suh", DType::F16, {127}, std::vector<uint16_t>(suh.begin(), suh.end() - 1));
    w.add("lin.svh", DType::F16, {128}, svh);
  }, "lin.suh has shape [127]");
  expect_load_error(fresh_dir("err_missing_svh"), "missing_svh", [&](SafetensorsWriter& w) {
    w.add("lin.trellis", DType::I16, {8, 8, 32}, rl.trellis);
    w.add("lin.suh", DType::F16, {128}, suh);
  }, "only one of suh/svh");
  expect_load_error(fresh_dir("err_no_scales"), "no_scales", [&](SafetensorsWriter& w) {
    w.add("lin.trellis", DType::I16, {8, 8, 32}, rl.trellis);
  }, "neither suh/svh");
  expect_load_error(fresh_dir("err_legacy_scale"), "legacy_scale", [&](SafetensorsWriter& w) {
    w.add("lin.trellis", DType::I16, {8, 8, 32}, rl.trellis);
    w.add("lin.su", DType::I16, {8}, std::vector<uint16_t>(8, 0));
    w.add("lin.sv", DType::I16, {8}, std::vector<uint16_t>(8, 0));
    w.add("lin.scale", DType::F16, {1}, std::vector<uint16_t>{0x3C00});
  }, "legacy lin.scale");
  expect_load_error(fresh_dir("err_nonfinite_svh"), "nonfinite_svh", [&](SafetensorsWriter& w) {
    std::vector<uint16_t> bad = svh;
    bad[5] = 0x7C00;  // +inf
    w.add("lin.trellis", DType::I16, {8, 8, 32}, rl.trellis);
    w.add("lin.suh", DType::F16, {128}, suh);
    w.add("lin.svh", DType::F16, {128}, bad);
  }, "non-finite");
  expect_load_error(fresh_dir("err_bias_shape"), "bias_shape", [&](SafetensorsWriter& w) {
    base(w, true);
    w.add("lin.bias", DType::F16, {256}, std::vector<uint16_t>(256, 0));
  }, "lin.bias has shape [256]");
}

}  // namespace
}  // namespace dsv41::exl3
