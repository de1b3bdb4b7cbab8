// safetensors reader/writer: every dtype, the writer round trip, sharded checkpoints, and one
// clear error per kind of damage.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "dsv41/common/error.h"
#include "dsv41/common/numeric.h"
#include "dsv41/loader/checkpoint.h"
#include "dsv41/loader/safetensors.h"
#include "loader_test_util.h"

namespace dsv41 {
namespace {

using test::RawFile;
using test::TempDir;
using json = nlohmann::json;

// Expects `fn` to throw dsv41::Error whose message contains every fragment.
template <class Fn>
void expect_error(Fn fn, std::initializer_list<const char*> fragments) {
  try {
    fn();
    ADD_FAILURE() << "no error thrown";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const char* f : fragments) EXPECT_NE(msg.find(f), std::string::npos) << "message: " << msg << "\nmissing: " << f;
  }
}

std::vector<uint8_t> image_of(const std::string& header, const std::vector<uint8_t>& data) {
  RawFile r;
  r.header = header;
  r.data = data;
  return r.bytes();
}

void open_image(const std::vector<uint8_t>& b) { SafetensorsFile::from_memory(b.data(), b.size(), "img.safetensors"); }

TEST(Safetensors, WriterRoundTripEveryDtype) {
  TempDir dir;
  SafetensorsWriter w;
  const std::vector<DType> all = {DType::BF16, DType::F16,  DType::F32,     DType::F64,     DType::I8,
                                  DType::I16,  DType::I32,  DType::I64,     DType::U8,      DType::BOOL,
                                  DType::F8_E4M3, DType::F8_E5M2, DType::F8_E8M0};
  std::vector<std::vector<uint8_t>> payloads;
  for (size_t i = 0; i < all.size(); ++i) {
    const size_t n = 6 * dtype_size(all[i]);
    std::vector<uint8_t> p(n);
    for (size_t j = 0; j < n; ++j) p[j] = static_cast<uint8_t>(j * 7 + i);
    if (all[i] == DType::BOOL)
      for (auto& x : p) x &= 1;
    w.add("t." + std::string(dtype_name(all[i])), all[i], {2, 3}, p.data(), p.size());
    payloads.push_back(p);
  }
  w.set_metadata("format", "pt");
  const auto path = dir.path() / "x.safetensors";
  w.write(path.string());
  auto f = SafetensorsFile::open(path.string());
  ASSERT_EQ(f->tensors().size(), all.size());
  EXPECT_EQ(f->metadata().at("format"), "pt");
  for (size_t i = 0; i < all.size(); ++i) {
    const TensorInfo* t = f->find("t." + std::string(dtype_name(all[i])));
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->dtype, all[i]);
    EXPECT_EQ(t->shape, (std::vector<int64_t>{2, 3}));
    ASSERT_EQ(t->nbytes, payloads[i].size());
    EXPECT_EQ(std::memcmp(t->data, payloads[i].data(), t->nbytes), 0);
    EXPECT_EQ(t->file, path.string());
  }
  // the header is padded to 8 bytes so the data section starts aligned
  EXPECT_EQ(f->tensors().front().file_offset % 8, 0u);
}

TEST(Safetensors, TensorToF32Conversions) {
  TempDir dir;
  SafetensorsWriter w;
  const std::vector<uint16_t> bf = {0x3F80, 0xC000, 0x3FC0};          // 1, -2, 1.5
  const std::vector<uint16_t> h = {0x3C00, 0xC000, 0x3E00};           // 1, -2, 1.5
  const std::vector<uint8_t> e4 = {0x38, 0xC0, 0x3C};                 // 1, -2, 1.5 in e4m3fn
  const std::vector<uint8_t> e8 = {127, 128, 126};                    // 1, 2, 0.5
  const std::vector<int8_t> i8 = {1, -2, 127};
  const std::vector<double> f64 = {1.0, -2.0, 1.5};
  w.add("bf", DType::BF16, {3}, bf);
  w.add("h", DType::F16, {3}, h);
  w.add("e4", DType::F8_E4M3, {3}, e4);
  w.add("e8", DType::F8_E8M0, {3}, e8);
  w.add("i8", DType::I8, {3}, i8);
  w.add("f64", DType::F64, {3}, f64);
  const auto path = (dir.path() / "c.safetensors").string();
  w.write(path);
  auto f = SafetensorsFile::open(path);
  EXPECT_EQ(tensor_to_f32(*f->find("bf")), (std::vector<float>{1, -2, 1.5}));
  EXPECT_EQ(tensor_to_f32(*f->find("h")), (std::vector<float>{1, -2, 1.5}));
  EXPECT_EQ(tensor_to_f32(*f->find("e4")), (std::vector<float>{1, -2, 1.5}));
  EXPECT_EQ(tensor_to_f32(*f->find("e8")), (std::vector<float>{1, 2, 0.5}));
  EXPECT_EQ(tensor_to_f32(*f->find("i8")), (std::vector<float>{1, -2, 127}));
  EXPECT_EQ(tensor_to_f32(*f->find("f64")), (std::vector<float>{1, -2, 1.5}));
}

TEST(Safetensors, ReadsTheTinyFixture) {
  auto f = SafetensorsFile::open(test::fixture("tiny-s0/model/model.safetensors").string());
  EXPECT_EQ(f->tensors().size(), 411u);
  const TensorInfo* t = f->find("layers.0.engram.embed.scale");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->dtype, DType::F8_E8M0);
  EXPECT_EQ(t->shape, (std::vector<int64_t>{660, 1}));
}

TEST(SafetensorsErrors, TooShortForTheLength) {
  std::vector<uint8_t> b = {1, 2, 3};
  expect_error([&] { open_image(b); }, {"img.safetensors", "truncated", "3 bytes"});
}

TEST(SafetensorsErrors, HeaderLongerThanTheFile) {
  auto b = image_of(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", {0, 0, 0, 0});
  b.resize(20);  // cut inside the header
  expect_error([&] { open_image(b); }, {"img.safetensors", "truncated", "header claims"});
}

TEST(SafetensorsErrors, TruncatedData) {
  auto b = image_of(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", std::vector<uint8_t>(16));
  b.resize(b.size() - 3);
  expect_error([&] { open_image(b); }, {"img.safetensors", "tensor 'w'", "truncated"});
}

TEST(SafetensorsErrors, HeaderLiesAboutTheSize) {
  // 2x2 F32 is 16 bytes but the offsets span 12
  auto b = image_of(R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,12]}})", std::vector<uint8_t>(16));
  expect_error([&] { open_image(b); }, {"img.safetensors", "tensor 'w'", "16 bytes", "span 12"});
}

TEST(SafetensorsErrors, OverlappingOffsets) {
  auto b = image_of(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                    R"("b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
                    std::vector<uint8_t>(16));
  expect_error([&] { open_image(b); }, {"img.safetensors", "'a'", "'b'", "overlap"});
}

TEST(SafetensorsErrors, OverlapHiddenBehindAnEmptyTensor) {
  // a zero-size tensor sorted between two overlapping ones must not hide the overlap
  auto b = image_of(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                    R"("z":{"dtype":"F32","shape":[0],"data_offsets":[4,4]},)"
                    R"("c":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                    std::vector<uint8_t>(16));
  expect_error([&] { open_image(b); }, {"img.safetensors", "'a'", "'c'", "overlap"});
}

TEST(SafetensorsErrors, OffsetsOutOfRange) {
  auto b = image_of(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[100,104]}})", std::vector<uint8_t>(8));
  expect_error([&] { open_image(b); }, {"img.safetensors", "tensor 'a'", "data ends at 104", "8 bytes"});
  auto c = image_of(R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[8,4]}})", std::vector<uint8_t>(8));
  expect_error([&] { open_image(c); }, {"img.safetensors", "tensor 'a'", "begin 8 > end 4"});
}

TEST(SafetensorsErrors, UnknownDtype) {
  auto b = image_of(R"({"q":{"dtype":"F4_E2M1","shape":[2],"data_offsets":[0,1]}})", std::vector<uint8_t>(1));
  expect_error([&] { open_image(b); }, {"img.safetensors", "tensor 'q'", "unknown dtype 'F4_E2M1'"});
}

TEST(SafetensorsErrors, NonUtf8Name) {
  std::string h = R"({"ok":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"bad)";
  h += '\xff';
  h += R"(name":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})";
  auto b = image_of(h, std::vector<uint8_t>(2));
  expect_error([&] { open_image(b); }, {"img.safetensors", "not valid UTF-8", "bad\\xffname"});
}

TEST(SafetensorsErrors, DuplicateName) {
  auto b = image_of(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                    R"("a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
                    std::vector<uint8_t>(2));
  expect_error([&] { open_image(b); }, {"img.safetensors", "tensor 'a'", "more than once"});
}

TEST(SafetensorsErrors, MalformedEntries) {
  expect_error([&] { open_image(image_of("[1,2]", {})); }, {"img.safetensors", "not a JSON object"});
  expect_error([&] { open_image(image_of("{not json", {})); }, {"img.safetensors", "not valid JSON"});
  expect_error([&] { open_image(image_of(R"({"a":{"dtype":"U8","shape":[-1],"data_offsets":[0,0]}})", {})); },
               {"tensor 'a'", "non-negative"});
  expect_error([&] { open_image(image_of(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0]}})", {})); },
               {"tensor 'a'", "data_offsets"});
  expect_error([&] { open_image(image_of(R"({"a":{"shape":[1],"data_offsets":[0,1]}})", {0})); }, {"tensor 'a'", "dtype"});
}

TEST(SafetensorsErrors, NotARegularFile) {
  TempDir dir;
  expect_error([&] { SafetensorsFile::open(dir.str()); }, {"not a regular file"});
  expect_error([&] { SafetensorsFile::open((dir.path() / "none.safetensors").string()); },
               {"none.safetensors", "cannot open"});
}

TEST(SafetensorsWriter, FailedWriteLeavesNoPartialFile) {
  TempDir dir;
  SafetensorsWriter w;
  const std::vector<float> v = {1.0f, 2.0f};
  w.add("a", DType::F32, {2}, v);
  // The target is an existing folder: the rename fails after the data was written to PATH.tmp.
  const auto target = dir.path() / "taken";
  std::filesystem::create_directories(target / "inside");
  expect_error([&] { w.write(target.string()); }, {"taken", "cannot rename into place"});
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "taken.tmp"));
  expect_error([&] { w.write((dir.path() / "missing" / "x.safetensors").string()); }, {"x.safetensors", "cannot create"});
}

TEST(Safetensors, PreambleIsAlignedAndDescribesTheEntries) {
  const std::string p = safetensors_preamble({{"w", DType::F16, {3}, 6}, {"b", DType::I32, {}, 4}}, {{"k", "v"}});
  ASSERT_GE(p.size(), 8u);
  EXPECT_EQ(p.size() % 8, 0u);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(p[static_cast<size_t>(i)]);
  EXPECT_EQ(n, p.size() - 8);
  const json h = json::parse(p.substr(8));
  EXPECT_EQ(h["w"]["data_offsets"], json({0, 6}));
  EXPECT_EQ(h["b"]["data_offsets"], json({6, 10}));
  EXPECT_EQ(h["b"]["shape"], json::array());
  EXPECT_EQ(h["__metadata__"]["k"], "v");
}

// ---- sharded checkpoints ----

void write_shard(const std::filesystem::path& p, const std::vector<std::string>& names) {
  SafetensorsWriter w;
  for (const auto& n : names) {
    std::vector<float> v = {1.0f, 2.0f};
    w.add(n, DType::F32, {2}, v);
  }
  w.write(p.string());
}

TEST(CheckpointOpen, ShardedThroughTheIndex) {
  TempDir dir;
  write_shard(dir.path() / "model-00001-of-00002.safetensors", {"a", "b"});
  write_shard(dir.path() / "model-00002-of-00002.safetensors", {"c"});
  write_shard(dir.path() / "stray.safetensors", {"zzz"});  // not in the index: ignored
  json idx = {{"metadata", {{"total_size", 24}}},
              {"weight_map",
               {{"a", "model-00001-of-00002.safetensors"},
                {"b", "model-00001-of-00002.safetensors"},
                {"c", "model-00002-of-00002.safetensors"}}}};
  std::ofstream(dir.path() / "model.safetensors.index.json") << idx.dump();
  auto c = Checkpoint::open(dir.str());
  EXPECT_EQ(c->files().size(), 2u);
  EXPECT_EQ(c->tensors().size(), 3u);
  EXPECT_EQ(c->total_bytes(), 24u);
  EXPECT_TRUE(c->has("c"));
  EXPECT_FALSE(c->has("zzz"));
  expect_error([&] { c->get("nope"); }, {"missing tensor 'nope'"});
}

TEST(CheckpointOpen, ShardedByGlobWithoutIndex) {
  TempDir dir;
  write_shard(dir.path() / "model-00002-of-00002.safetensors", {"c"});
  write_shard(dir.path() / "model-00001-of-00002.safetensors", {"a", "b"});
  auto c = Checkpoint::open(dir.str());
  ASSERT_EQ(c->tensors().size(), 3u);
  EXPECT_EQ(c->tensors()[0]->name, "a");  // shard order = sorted file names
  EXPECT_EQ(c->tensors()[2]->name, "c");
}

TEST(CheckpointOpen, IndexErrors) {
  {
    TempDir dir;
    write_shard(dir.path() / "s1.safetensors", {"a"});
    std::ofstream(dir.path() / "model.safetensors.index.json")
        << json{{"weight_map", {{"a", "s1.safetensors"}, {"b", "s2.safetensors"}}}}.dump();
    expect_error([&] { Checkpoint::open(dir.str()); }, {"s2.safetensors", "listed in the index but missing"});
  }
  {
    TempDir dir;
    write_shard(dir.path() / "s1.safetensors", {"a"});
    std::ofstream(dir.path() / "model.safetensors.index.json")
        << json{{"weight_map", {{"a", "s1.safetensors"}, {"b", "s1.safetensors"}}}}.dump();
    expect_error([&] { Checkpoint::open(dir.str()); }, {"tensor 'b'", "listed in the index", "absent"});
  }
  {
    TempDir dir;
    write_shard(dir.path() / "s1.safetensors", {"a"});
    std::ofstream(dir.path() / "model.safetensors.index.json") << json{{"weight_map", {{"a", "../s1.safetensors"}}}}.dump();
    expect_error([&] { Checkpoint::open(dir.str()); }, {"../s1.safetensors", "not a file name"});
  }
  {
    TempDir dir;
    write_shard(dir.path() / "s1.safetensors", {"a"});
    write_shard(dir.path() / "s2.safetensors", {"a"});
    expect_error([&] { Checkpoint::open(dir.str()); }, {"tensor 'a'", "appears in both"});
  }
  {
    TempDir dir;
    expect_error([&] { Checkpoint::open(dir.str()); }, {"no *.safetensors files"});
    expect_error([&] { Checkpoint::open((dir.path() / "nothere").string()); }, {"not a directory"});
  }
}

}  // namespace
}  // namespace dsv41
