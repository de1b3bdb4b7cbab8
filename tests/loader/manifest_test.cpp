// The checkpoint manifest: the released config reproduces the released index's totals, the tiny
// fixtures match it tensor for tensor, and every kind of damage gives its own message.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <set>

#include "dsv41/common/error.h"
#include "dsv41/config/model_config.h"
#include "dsv41/loader/checkpoint.h"
#include "dsv41/loader/manifest.h"
#include "dsv41/loader/safetensors.h"
#include "loader_test_util.h"

namespace dsv41 {
namespace {

using test::RawFile;
using test::TempDir;
using json = nlohmann::json;
namespace fs = std::filesystem;

const std::string kRealConfig = std::string(DSV41_SOURCE_DIR) + "/configs/deepseek-v4.1-flash.json";

uint64_t total_bytes(const std::vector<TensorSpec>& v) {
  uint64_t n = 0;
  for (const auto& t : v) n += t.nbytes();
  return n;
}

bool contains_line(const std::vector<std::string>& lines, const std::string& needle) {
  return std::any_of(lines.begin(), lines.end(), [&](const std::string& l) { return l.find(needle) != std::string::npos; });
}

std::string joined(const std::vector<std::string>& lines) {
  std::string s;
  for (const auto& l : lines) s += l + "\n";
  return s;
}

TEST(Manifest, ReleasedConfigReproducesTheReleasedIndex) {
  const ModelConfig cfg = load_model_config(kRealConfig);
  ASSERT_TRUE(validate_config(cfg).empty()) << joined(validate_config(cfg));
  const auto specs = expected_tensors(cfg, CheckpointFormat::kFp8);
  // MODEL.md §0: the released model.safetensors.index.json
  EXPECT_EQ(specs.size(), 96085u);
  EXPECT_EQ(total_bytes(specs), 510286023000u);
  std::set<std::string> names;
  for (const auto& t : specs) EXPECT_TRUE(names.insert(t.name).second) << "duplicate " << t.name;
}

TEST(Manifest, ReleasedTensorShapesFromTheSpecTable) {
  const ModelConfig cfg = load_model_config(kRealConfig);
  std::map<std::string, const TensorSpec*> by;
  const auto specs = expected_tensors(cfg, CheckpointFormat::kFp8);
  for (const auto& t : specs) by[t.name] = &t;
  auto expect = [&](const std::string& n, DType dt, std::vector<int64_t> shape) {
    auto it = by.find(n);
    ASSERT_NE(it, by.end()) << n;
    EXPECT_EQ(it->second->dtype, dt) << n;
    EXPECT_EQ(it->second->shape, shape) << n;
  };
  // spot checks against MODEL.md §3.2
  expect("embed.weight", DType::BF16, {129280, 5120});
  expect("layers.7.hc_ffn_fn", DType::F32, {24, 20480});
  expect("layers.0.attn.wq_b.scale", DType::F8_E8M0, {1024, 40});
  expect("layers.0.attn.wo_a.weight", DType::F8_E4M3, {8192, 4096});
  expect("layers.0.attn.wo_a.scale", DType::F8_E8M0, {256, 128});
  expect("layers.14.attn.compressor.wgate.weight", DType::BF16, {512, 5120});
  expect("layers.36.attn.indexer.wq_b.scale", DType::F8_E8M0, {128, 40});
  expect("layers.1.engram.embed.weight", DType::F8_E4M3, {384006168, 256});
  expect("layers.14.engram.embed.scale", DType::F8_E8M0, {384016682, 8});
  expect("layers.1.engram.wkv.scale", DType::F8_E8M0, {800, 192});
  expect("layers.5.ffn.experts.383.w2.weight", DType::I8, {5120, 1152});
  expect("layers.5.ffn.experts.0.w1.scale", DType::F8_E8M0, {2304, 160});
  expect("layers.5.ffn.shared_experts.w2.scale", DType::F8_E8M0, {160, 72});
  expect("mtp.0.main_proj.scale", DType::F8_E8M0, {160, 480});
  expect("mtp.1.ffn.gate.weight", DType::BF16, {128, 5120});
  expect("mtp.2.markov_head.head.weight", DType::BF16, {129280, 256});
  expect("mtp.2.confidence_head.proj.weight", DType::BF16, {1, 5376});
  expect("vision.blocks.31.attn.wqkv.bias", DType::BF16, {3072});
  expect("aligner.w1.weight", DType::BF16, {5120, 9216});
  // absent in the release
  EXPECT_EQ(by.count("layers.20.attn.compressor.wgate.weight"), 0u);  // ratio 1: no gate
  EXPECT_EQ(by.count("layers.24.attn.indexer.wk.weight"), 0u);        // index source, not KV source
  EXPECT_EQ(by.count("layers.3.attn.indexer.wq_b.weight"), 0u);
  EXPECT_EQ(by.count("mtp.0.attn.compressor.wkv.weight"), 0u);
  EXPECT_EQ(by.count("mtp.0.ffn.experts.128.w1.weight"), 0u);
  EXPECT_EQ(by.count("layers.0.hc_head_fn"), 0u);
}

TEST(Manifest, TextOnlyConfigDropsVisionAndBiasVl) {
  json j = json::parse(std::ifstream(kRealConfig));
  j.erase("vision_config");
  const ModelConfig cfg = parse_model_config(j.dump(), "text-only");
  const auto specs = expected_tensors(cfg, CheckpointFormat::kFp8);
  // 96,085 minus 263 vision tensors, 3 image embeddings and 43 bias_vl (one per router)
  EXPECT_EQ(specs.size(), 96085u - 266u - 43u);
  EXPECT_EQ(total_bytes(specs), 510286023000u - 970536960u - (40u * 384u + 3u * 128u) * 4u);
}

TEST(Manifest, ComponentTotals) {
  const ModelConfig cfg = load_model_config(kRealConfig);
  std::map<Component, uint64_t> bytes;
  for (const auto& t : expected_tensors(cfg, CheckpointFormat::kFp8)) bytes[t.component] += t.nbytes();
  // MODEL.md §3.3: routed experts 288.78 GB (18,800,640 B per expert), Engram tables 202.76 GB,
  // mtp.* 7.93 GB. Exact values from an independent script over the §3.2 table.
  EXPECT_EQ(bytes[Component::kRoutedExperts], 40ull * 384 * 18800640);
  EXPECT_EQ(bytes[Component::kEngram], 203073076240ull);  // tables 202,758,032,400 + wkv and q/k weights
  EXPECT_EQ(bytes[Component::kDSpark], 7932874632ull);
  EXPECT_EQ(bytes[Component::kVision], 970536960ull);
}

// ---- the tiny fixtures against their manifest ----

class TinyFixture : public ::testing::TestWithParam<const char*> {};

TEST_P(TinyFixture, ValidatesClean) {
  TempDir dir;
  test::copy_fixture_model(GetParam(), dir.path());
  const ModelConfig cfg = load_model_config((dir.path() / "config.json").string());
  EXPECT_TRUE(validate_config(cfg).empty()) << joined(validate_config(cfg));
  auto ckpt = Checkpoint::open(dir.str());
  const auto problems = check_checkpoint(cfg, checkpoint_format(cfg), *ckpt);
  EXPECT_TRUE(problems.empty()) << joined(problems);
  EXPECT_EQ(expected_tensors(cfg, CheckpointFormat::kFp8).size(), ckpt->tensors().size());
  EXPECT_EQ(total_bytes(expected_tensors(cfg, CheckpointFormat::kFp8)), ckpt->total_bytes());
}

INSTANTIATE_TEST_SUITE_P(Fixtures, TinyFixture, ::testing::Values("tiny-s0", "tiny-long"));

// A copy of tiny-s0 whose single shard the test may damage.
struct DamagedCopy {
  TempDir dir;
  fs::path shard;
  ModelConfig cfg;
  DamagedCopy() {
    test::copy_fixture_model("tiny-s0", dir.path());
    shard = dir.path() / "model.safetensors";
    cfg = load_model_config((dir.path() / "config.json").string());
  }
  std::vector<std::string> check() {
    auto ckpt = Checkpoint::open(dir.str());
    return check_checkpoint(cfg, CheckpointFormat::kFp8, *ckpt);
  }
  std::string open_error() {
    try {
      Checkpoint::open(dir.str());
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }
};

TEST(ManifestDamage, Truncated) {
  DamagedCopy d;
  auto b = test::read_bytes(d.shard);
  b.resize(b.size() - 1000);
  test::write_bytes(d.shard, b);
  const std::string e = d.open_error();
  EXPECT_NE(e.find("model.safetensors"), std::string::npos) << e;
  EXPECT_NE(e.find("truncated"), std::string::npos) << e;
}

TEST(ManifestDamage, FlippedDtype) {
  DamagedCopy d;
  RawFile r = RawFile::read(d.shard);
  json h = r.json();
  h["layers.0.attn.wq_a.weight"]["dtype"] = "U8";  // same size, wrong type
  r.set_json(h);
  r.write(d.shard);
  const auto p = d.check();
  ASSERT_EQ(p.size(), 1u) << joined(p);
  EXPECT_EQ(p[0], "tensor 'layers.0.attn.wq_a.weight': dtype U8, expected F8_E4M3");
}

TEST(ManifestDamage, DroppedTensor) {
  DamagedCopy d;
  RawFile r = RawFile::read(d.shard);
  json h = r.json();
  h.erase("layers.3.attn.indexer.k_norm.weight");  // its bytes stay as an unreferenced hole
  r.set_json(h);
  r.write(d.shard);
  const auto p = d.check();
  ASSERT_EQ(p.size(), 1u) << joined(p);
  EXPECT_EQ(p[0], "missing tensor 'layers.3.attn.indexer.k_norm.weight' (expected BF16 [64])");
}

TEST(ManifestDamage, WrongShape) {
  DamagedCopy d;
  RawFile r = RawFile::read(d.shard);
  json h = r.json();
  h["layers.2.ffn.shared_experts.w1.weight"]["shape"] = {256, 128};  // same element count
  r.set_json(h);
  r.write(d.shard);
  const auto p = d.check();
  ASSERT_EQ(p.size(), 1u) << joined(p);
  EXPECT_EQ(p[0], "tensor 'layers.2.ffn.shared_experts.w1.weight': shape [256, 128], expected [128, 256]");
}

TEST(ManifestDamage, UnexpectedTensor) {
  DamagedCopy d;
  RawFile r = RawFile::read(d.shard);
  json h = r.json();
  h["layers.0.hc_head_fn"] = h["layers.0.hc_attn_base"];  // aliases bytes: allowed only once
  r.set_json(h);
  r.write(d.shard);
  EXPECT_NE(d.open_error().find("overlap"), std::string::npos);
  // a genuinely new tensor after the data
  RawFile r2 = RawFile::read(d.shard);
  json h2 = r2.json();
  h2.erase("layers.0.hc_head_fn");
  const uint64_t end = r2.data.size();
  h2["layers.0.hc_head_fn"] = {{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {end, end + 8}}};
  r2.data.resize(end + 8);
  r2.set_json(h2);
  r2.write(d.shard);
  const auto p = d.check();
  ASSERT_EQ(p.size(), 1u) << joined(p);
  EXPECT_NE(p[0].find("unexpected tensor 'layers.0.hc_head_fn'"), std::string::npos) << p[0];
}

TEST(ManifestDamage, HeaderLyingAboutSizes) {
  DamagedCopy d;
  RawFile r = RawFile::read(d.shard);
  json h = r.json();
  h["norm.weight"]["shape"] = {512};  // 1024 bytes claimed by a shape whose span is 512
  r.set_json(h);
  r.write(d.shard);
  const std::string e = d.open_error();
  EXPECT_NE(e.find("tensor 'norm.weight'"), std::string::npos) << e;
  EXPECT_NE(e.find("data_offsets span 512 bytes"), std::string::npos) << e;
}

TEST(ManifestDamage, OverlappingOffsets) {
  DamagedCopy d;
  RawFile r = RawFile::read(d.shard);
  json h = r.json();
  h["norm.weight"]["data_offsets"] = h["embed.weight"]["data_offsets"];
  h["norm.weight"]["shape"] = h["embed.weight"]["shape"];
  r.set_json(h);
  r.write(d.shard);
  EXPECT_NE(d.open_error().find("overlap in the data section"), std::string::npos) << d.open_error();
}

TEST(ManifestDamage, UnknownDtypeAndNonUtf8Name) {
  {
    DamagedCopy d;
    RawFile r = RawFile::read(d.shard);
    json h = r.json();
    h["norm.weight"]["dtype"] = "F4";
    r.set_json(h);
    r.write(d.shard);
    const std::string e = d.open_error();
    EXPECT_NE(e.find("tensor 'norm.weight': unknown dtype 'F4'"), std::string::npos) << e;
  }
  {
    DamagedCopy d;
    RawFile r = RawFile::read(d.shard);
    const size_t at = r.header.find("\"norm.weight\"");
    ASSERT_NE(at, std::string::npos);
    r.header[at + 1] = '\xc3';  // a lead byte followed by ASCII: invalid UTF-8
    r.write(d.shard);
    const std::string e = d.open_error();
    EXPECT_NE(e.find("not valid UTF-8"), std::string::npos) << e;
    EXPECT_NE(e.find("\\xc3orm.weight"), std::string::npos) << e;
  }
}

// ---- EXL3 ----

ModelConfig tiny_exl3_config() {
  json j = json::parse(std::ifstream(test::fixture("tiny-s0/model/config.json")));
  j["quantization_config"] = {{"quant_method", "exl3"}, {"bits", 3.0}, {"head_bits", 6}, {"codebook", "mul1"}};
  return parse_model_config(j.dump(), "tiny-exl3");
}

// Writes every manifest tensor; markers get their constant, everything else zeros.
void write_exl3(const ModelConfig& cfg, const Exl3Plan& plan, const fs::path& dir) {
  SafetensorsWriter w;
  for (const auto& t : expected_tensors(cfg, CheckpointFormat::kExl3, plan)) {
    if (t.optional) continue;
    std::vector<uint8_t> bytes(t.nbytes());
    if (t.dtype == DType::I32 && t.shape.empty()) {
      const int32_t v = t.name.size() > 5 && t.name.substr(t.name.size() - 5) == ".mul1" ? kExl3Mul1Marker : kExl3McgMarker;
      std::memcpy(bytes.data(), &v, 4);
    }
    w.add(t.name, t.dtype, t.shape, bytes.data(), bytes.size());
  }
  w.write((dir / "model.safetensors").string());
}

TEST(ManifestExl3, LayoutFollowsTheSpec) {
  const ModelConfig cfg = tiny_exl3_config();
  Exl3Plan plan;
  plan.default_bits = 2;
  plan.per_linear["layers.1.attn.wq_b"] = 7;
  std::map<std::string, const TensorSpec*> by;
  const auto specs = expected_tensors(cfg, CheckpointFormat::kExl3, plan);
  for (const auto& t : specs) by[t.name] = &t;
  // wo_a is split into o_groups = 2 linears of (group_width = 4*64/2 = 128) -> o_lora_rank = 64
  ASSERT_TRUE(by.count("layers.0.attn.wo_a.slice.1.trellis"));
  EXPECT_EQ(by["layers.0.attn.wo_a.slice.1.trellis"]->shape, (std::vector<int64_t>{8, 8, 32}));
  EXPECT_EQ(by.count("layers.0.attn.wo_a.weight"), 0u);
  // padding to 128: wq_a 256 -> 64 becomes k=256, n=128
  EXPECT_EQ(by["layers.0.attn.wq_a.trellis"]->shape, (std::vector<int64_t>{16, 8, 32}));
  EXPECT_EQ(by["layers.0.attn.wq_a.svh"]->shape, (std::vector<int64_t>{128}));
  EXPECT_EQ(by["layers.1.attn.wq_b.trellis"]->shape[2], 16 * 7);
  EXPECT_EQ(by["head.trellis"]->shape[2], 16 * 6);
  EXPECT_TRUE(by["layers.0.attn.wq_a.trellis"]->exl3_trellis);
  EXPECT_EQ(by["layers.0.attn.wq_a.mul1"]->exl3_linear, "layers.0.attn.wq_a");
  // unquantized per EXL3.md §1.8
  EXPECT_EQ(by["layers.0.ffn.gate.weight"]->dtype, DType::F16);
  EXPECT_EQ(by["layers.0.engram.wkv.weight"]->dtype, DType::F16);
  EXPECT_EQ(by["layers.1.attn.indexer.weights_proj.weight"]->dtype, DType::F16);
  EXPECT_TRUE(by["layers.0.engram.embed.weight"]->optional);
  EXPECT_TRUE(by.count("layers.3.attn.compressor.wkv.trellis"));
  EXPECT_TRUE(by.count("layers.5.ffn.experts.3.w2.trellis"));
}

TEST(ManifestExl3, PlanFromConfig) {
  json j = json::parse(std::ifstream(test::fixture("tiny-s0/model/config.json")));
  j["quantization_config"] = {{"quant_method", "exl3"}, {"bits", 2.9}, {"head_bits", 16}, {"mtp_bits", 5},
                              {"codebook", "mcg"}};
  const ModelConfig cfg = parse_model_config(j.dump(), "plan");
  const Exl3Plan plan = exl3_plan_from_config(cfg);
  EXPECT_EQ(plan.default_bits, 3);
  EXPECT_EQ(plan.bits_for("mtp.0.attn.wq_a"), 5);
  std::map<std::string, const TensorSpec*> by;
  const auto specs = expected_tensors(cfg, CheckpointFormat::kExl3, plan);
  for (const auto& t : specs) by[t.name] = &t;
  EXPECT_TRUE(by.count("head.weight"));  // head_bits 16: left unquantized
  EXPECT_EQ(by.count("head.trellis"), 0u);
  EXPECT_EQ(by["mtp.0.attn.wq_a.trellis"]->shape[2], 16 * 5);
  EXPECT_EQ(by["layers.0.attn.wq_a.trellis"]->shape[2], 16 * 3);
  EXPECT_TRUE(by.count("layers.0.attn.wq_a.mcg"));
  EXPECT_EQ(by.count("layers.0.attn.wq_a.mul1"), 0u);
}

TEST(ManifestExl3, WrittenCheckpointValidatesAndDamageIsNamed) {
  const ModelConfig cfg = tiny_exl3_config();
  Exl3Plan plan;
  plan.per_linear["layers.2.ffn.experts.1.w3"] = 8;
  plan.per_linear["layers.0.attn.wkv"] = 1;
  TempDir dir;
  write_exl3(cfg, plan, dir.path());
  {
    auto ckpt = Checkpoint::open(dir.str());
    const auto p = check_checkpoint(cfg, CheckpointFormat::kExl3, *ckpt);
    EXPECT_TRUE(p.empty()) << joined(p);
  }
  const fs::path shard = dir.path() / "model.safetensors";
  const RawFile clean = RawFile::read(shard);
  auto damaged = [&](auto edit) {
    RawFile r = clean;
    json h = r.json();
    edit(h, r);
    r.set_json(h);
    r.write(shard);
    auto ckpt = Checkpoint::open(dir.str());
    return check_checkpoint(cfg, CheckpointFormat::kExl3, *ckpt);
  };
  // a marker holding the wrong constant
  {
    auto p = damaged([](json& h, RawFile& r) {
      const uint64_t off = h["layers.0.attn.wq_a.mul1"]["data_offsets"][0].get<uint64_t>();
      r.data[off] ^= 1;
    });
    ASSERT_EQ(p.size(), 1u) << joined(p);
    EXPECT_NE(p[0].find("layers.0.attn.wq_a.mul1 holds -2082680532, expected -2082680531"), std::string::npos) << p[0];
  }
  // a trellis whose k/n do not match the linear (same byte count)
  {
    auto p = damaged([](json& h, RawFile&) { h["layers.2.ffn.experts.1.w3.trellis"]["shape"] = {8, 16, 128}; });
    ASSERT_EQ(p.size(), 1u) << joined(p);
    EXPECT_NE(p[0].find("EXL3 linear 'layers.2.ffn.experts.1.w3': trellis shape [8, 16, 128], expected [16, 8, 16*K]"),
              std::string::npos)
        << p[0];
  }
  // suh not matching the trellis
  {
    auto p = damaged([](json& h, RawFile&) {
      h["layers.0.attn.wq_b.svh"]["shape"] = {128, 2};  // 256 F16 values either way
    });
    ASSERT_EQ(p.size(), 1u) << joined(p);
    EXPECT_NE(p[0].find("EXL3 linear 'layers.0.attn.wq_b': svh shape [128, 2], expected [256]"), std::string::npos) << p[0];
  }
  // both markers
  {
    auto p = damaged([](json& h, RawFile&) {
      h["layers.0.attn.wo_b.mcg"] = h["layers.0.attn.wo_b.mul1"];
      h.erase("layers.0.attn.wo_b.mul1");
    });
    ASSERT_EQ(p.size(), 1u) << joined(p);
    EXPECT_NE(p[0].find("layers.0.attn.wo_b.mcg holds -2082680531, expected -877912083"), std::string::npos) << p[0];
  }
  // a linear missing altogether, and one without its scale vectors
  {
    auto p = damaged([](json& h, RawFile&) {
      for (const char* s : {"trellis", "suh", "svh", "mul1"}) h.erase(std::string("layers.4.attn.wq_a.") + s);
      h.erase("layers.4.attn.wo_b.suh");
    });
    EXPECT_EQ(p.size(), 2u) << joined(p);
    EXPECT_TRUE(contains_line(p, "missing tensor 'layers.4.attn.wq_a.trellis'")) << joined(p);
    EXPECT_TRUE(contains_line(p, "missing tensor 'layers.4.attn.wo_b.suh'")) << joined(p);
  }
}

TEST(ManifestExl3, KOutOfRangeAndUnquantizedAlternative) {
  const ModelConfig cfg = tiny_exl3_config();
  TempDir dir;
  // Build by hand: the manifest's tensors, but one trellis with last dim 144 (K = 9) and one
  // linear stored unquantized as F16 (allowed: exllamav3 decides per module).
  SafetensorsWriter w;
  for (const auto& t : expected_tensors(cfg, CheckpointFormat::kExl3)) {
    if (t.optional) continue;
    std::vector<int64_t> shape = t.shape;
    if (t.name == "layers.1.attn.wkv.trellis") shape[2] = 144;
    if (t.exl3_linear == "layers.3.ffn.shared_experts.w2") continue;
    int64_t n = 1;
    for (auto x : shape) n *= x;
    std::vector<uint8_t> bytes(static_cast<size_t>(n) * dtype_size(t.dtype));
    if (t.dtype == DType::I32 && t.shape.empty()) std::memcpy(bytes.data(), &kExl3Mul1Marker, 4);
    w.add(t.name, t.dtype, shape, bytes.data(), bytes.size());
  }
  std::vector<uint16_t> f16(256 * 128, 0x3C00);
  w.add("layers.3.ffn.shared_experts.w2.weight", DType::F16, {256, 128}, f16);
  w.write((dir.path() / "model.safetensors").string());
  auto ckpt = Checkpoint::open(dir.str());
  const auto p = check_checkpoint(cfg, CheckpointFormat::kExl3, *ckpt);
  ASSERT_EQ(p.size(), 1u) << joined(p);
  EXPECT_EQ(p[0], "EXL3 linear 'layers.1.attn.wkv': trellis last dim 144 is not 16*K with K in 1..8");
}

TEST(ManifestChecks, ExternalEngramTablesMayBeAbsent) {
  DamagedCopy d;
  RawFile r = RawFile::read(d.shard);
  json h = r.json();
  for (const char* n : {"layers.0.engram.embed.weight", "layers.0.engram.embed.scale", "layers.1.engram.embed.weight",
                        "layers.1.engram.embed.scale"})
    h.erase(n);
  r.set_json(h);
  r.write(d.shard);
  EXPECT_EQ(d.check().size(), 4u);
  auto ckpt = Checkpoint::open(d.dir.str());
  CheckOptions opt;
  opt.engram_tables_external = true;
  EXPECT_TRUE(check_checkpoint(d.cfg, CheckpointFormat::kFp8, *ckpt, opt).empty());
}

TEST(ManifestChecks, InvalidConfigIsRefused) {
  ModelConfig cfg = load_model_config(kRealConfig);
  cfg.o_groups = 7;
  try {
    expected_tensors(cfg, CheckpointFormat::kFp8);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("o_groups"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace dsv41
