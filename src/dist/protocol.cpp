#include "dist/protocol.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "dsv41/engram/xxhash64.h"
#include "dsv41/loader/checkpoint.h"

namespace dsv41::dist {
namespace {

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  DSV_CHECK(f.good(), "cannot read {}", path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

constexpr uint64_t kFullHashLimit = uint64_t{256} << 20;
constexpr uint64_t kSampleBytes = uint64_t{64} << 10;

}  // namespace

Identity compute_identity(const std::string& model_dir, const std::string& token_map) {
  Identity id;
  id.version = DSV41_VERSION;
  const std::string cfg_text = read_file(model_dir + "/config.json");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(cfg_text);
  } catch (const std::exception& e) {
    fail("{}/config.json: not valid JSON ({})", model_dir, e.what());
  }
  const std::string canon = j.dump();  // sorted keys, no whitespace: formatting does not matter
  id.config_hash = engram::Xxh64::of(canon.data(), canon.size());

  auto ck = Checkpoint::open(model_dir);
  const auto tensors = ck->tensors();
  uint64_t total = 0;
  for (const TensorInfo* t : tensors) total += t->nbytes;
  engram::Xxh64 h;
  for (const TensorInfo* t : tensors) {
    h.update(t->name.data(), t->name.size());
    const auto dt = static_cast<uint32_t>(t->dtype);
    h.update(&dt, sizeof(dt));
    h.update(t->shape.data(), t->shape.size() * sizeof(int64_t));
    h.update(&t->nbytes, sizeof(t->nbytes));
    if (total <= kFullHashLimit || t->nbytes <= 2 * kSampleBytes) {
      h.update(t->data, t->nbytes);
    } else {
      h.update(t->data, kSampleBytes);
      h.update(t->data + t->nbytes - kSampleBytes, kSampleBytes);
    }
  }
  id.checkpoint_hash = h.digest();
  if (!token_map.empty()) {
    const std::string tm = read_file(token_map);
    id.token_map_hash = engram::Xxh64::of(tm.data(), tm.size());
  }
  return id;
}

std::vector<uint8_t> encode(const Hello& h) {
  WireWriter w;
  w.u32(h.protocol);
  w.u32(static_cast<uint32_t>(h.rank));
  w.u32(static_cast<uint32_t>(h.world_size));
  w.str(h.device);
  w.str(h.id.version);
  w.u64(h.id.config_hash);
  w.u64(h.id.checkpoint_hash);
  w.u64(h.id.token_map_hash);
  return w.bytes();
}

Hello decode_hello(const std::vector<uint8_t>& b) {
  WireReader r(b, "HELLO");
  Hello h;
  h.protocol = r.u32();
  if (h.protocol != kProtocolVersion) return h;  // the rest may have another layout
  h.rank = static_cast<int32_t>(r.u32());
  h.world_size = static_cast<int32_t>(r.u32());
  h.device = r.str();
  h.id.version = r.str();
  h.id.config_hash = r.u64();
  h.id.checkpoint_hash = r.u64();
  h.id.token_map_hash = r.u64();
  r.done();
  return h;
}

std::string check_hello(const Hello& h, int world_size, const Identity& mine) {
  if (h.protocol != kProtocolVersion)
    return fmt::format("protocol version {} (rank 0 speaks {})", h.protocol, kProtocolVersion);
  if (h.world_size != world_size)
    return fmt::format("world size {} (rank 0 runs --world-size {})", h.world_size, world_size);
  if (h.rank < 1 || h.rank >= world_size)
    return fmt::format("rank {} is not a worker rank of world size {} (1..{})", h.rank, world_size, world_size - 1);
  if (h.id.version != mine.version)
    return fmt::format("dsv41-serve version {} (rank 0 runs {})", h.id.version, mine.version);
  if (h.id.config_hash != mine.config_hash)
    return fmt::format("config hash {} differs from rank 0's {} (config.json of --model is not the same)",
                       engram::hex64(h.id.config_hash), engram::hex64(mine.config_hash));
  if (h.id.checkpoint_hash != mine.checkpoint_hash)
    return fmt::format("checkpoint hash {} differs from rank 0's {} (the weights of --model are not the same)",
                       engram::hex64(h.id.checkpoint_hash), engram::hex64(mine.checkpoint_hash));
  if (h.id.token_map_hash != mine.token_map_hash)
    return fmt::format("Engram token map hash {} differs from rank 0's {} (--engram-token-map is not the same file)",
                       engram::hex64(h.id.token_map_hash), engram::hex64(mine.token_map_hash));
  return {};
}

std::vector<uint8_t> encode_welcome(uint64_t session, const TpRunOptions& o) {
  WireWriter w;
  w.u64(session);
  w.u8(o.dspark);
  w.u8(o.corrected_index_keys);
  w.vec(o.nccl_id);
  return w.bytes();
}

void decode_welcome(const std::vector<uint8_t>& b, uint64_t& session, TpRunOptions& o) {
  WireReader r(b, "WELCOME");
  session = r.u64();
  o.dspark = r.u8() != 0;
  o.corrected_index_keys = r.u8() != 0;
  o.nccl_id = r.vec<uint8_t>();
  r.done();
}

std::vector<uint8_t> encode(const Plan& p) {
  WireWriter w;
  w.u64(p.step);
  w.u64(p.ops.size());
  for (const PlanOp& op : p.ops) {
    w.u8(static_cast<uint8_t>(op.kind));
    w.u64(op.seq);
    w.u64(op.seq2);
    w.i64(op.n_past);
    w.i64(op.prompt_len);
    w.u8(op.all_logits);
    w.u8(op.want_logits);
    w.u32(static_cast<uint32_t>(op.anchor));
    w.vec(op.tokens);
  }
  return w.bytes();
}

Plan decode_plan(const std::vector<uint8_t>& b) {
  WireReader r(b, "PLAN");
  Plan p;
  p.step = r.u64();
  const uint64_t n = r.u64();
  DSV_CHECK(n <= b.size(), "PLAN: {} ops in {} bytes", n, b.size());
  p.ops.resize(n);
  for (PlanOp& op : p.ops) {
    const uint8_t k = r.u8();
    DSV_CHECK(k >= 1 && k <= 6, "PLAN: unknown op kind {}", k);
    op.kind = static_cast<OpKind>(k);
    op.seq = r.u64();
    op.seq2 = r.u64();
    op.n_past = r.i64();
    op.prompt_len = r.i64();
    op.all_logits = r.u8() != 0;
    op.want_logits = r.u8() != 0;
    op.anchor = static_cast<int32_t>(r.u32());
    op.tokens = r.vec<int32_t>();
  }
  r.done();
  return p;
}

}  // namespace dsv41::dist
