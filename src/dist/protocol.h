// Control-plane protocol of the tensor-parallel runtime (include/dsv41/dist/tp_runtime.h): message
// types, the handshake, step plans, and the identity hashes both sides compare.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "dist/wire.h"
#include "dsv41/dist/tp_runtime.h"

namespace dsv41::dist {

inline constexpr uint32_t kProtocolVersion = 1;
// Each side sends kHeartbeat this often, and checks the other's silence against its timeout as often.
inline constexpr int kHeartbeatMs = 500;

enum MsgType : uint32_t {
  kHello = 1,      // worker -> head: Hello
  kWelcome = 2,    // head -> worker: session id + TpRunOptions
  kReject = 3,     // head -> worker: reason
  kDataJoin = 4,   // worker -> head, first frame of the data connection: rank + session
  kReady = 5,      // worker -> head: weights loaded, data link open
  kHeartbeat = 6,  // both ways
  kPlan = 7,       // head -> worker: one step's ops
  kWorkerError = 8,  // worker -> head: a plan failed (the worker then drops the session)
  kGoodbye = 9,    // head -> worker: session over, wait for the next head
  kExit = 10,      // head -> worker: exit the process
  kLoadFailed = 11,  // worker -> head: it cannot load its share (reason); the worker then exits
};

struct Identity {
  std::string version;          // build version (DSV41_VERSION)
  uint64_t config_hash = 0;     // canonical config.json
  uint64_t checkpoint_hash = 0; // tensor names, dtypes, shapes, bytes
  uint64_t token_map_hash = 0;  // Engram token map file (0: none)
};

// Hashes of the checkpoint folder (config.json canonicalised; every tensor's name, dtype, shape
// and bytes: full contents up to 256 MiB of tensors, else the first and last 64 KiB of each).
Identity compute_identity(const std::string& model_dir, const std::string& token_map);

struct Hello {
  uint32_t protocol = kProtocolVersion;
  int32_t rank = 0, world_size = 0;
  std::string device;
  Identity id;
};
std::vector<uint8_t> encode(const Hello& h);
Hello decode_hello(const std::vector<uint8_t>& b);
// Empty when the worker may join, else the precise refusal.
std::string check_hello(const Hello& h, int world_size, const Identity& mine);

std::vector<uint8_t> encode_welcome(uint64_t session, const TpRunOptions& o);
void decode_welcome(const std::vector<uint8_t>& b, uint64_t& session, TpRunOptions& o);

enum class OpKind : uint8_t { new_seq = 1, free_seq = 2, forward = 3, clone = 4, restore = 5, draft = 6 };
struct PlanOp {
  OpKind kind = OpKind::forward;
  uint64_t seq = 0, seq2 = 0;      // clone: seq2 = seq's copy; restore: seq <- seq2
  int64_t n_past = 0;              // forward: the sequence's position before it (consistency check)
  int64_t prompt_len = 0;          // forward: SeqState::prompt_len (chunk layout)
  bool all_logits = false, want_logits = false;
  int32_t anchor = 0;              // draft
  std::vector<int32_t> tokens;     // forward
};
struct Plan {
  uint64_t step = 0;
  std::vector<PlanOp> ops;
};
std::vector<uint8_t> encode(const Plan& p);
Plan decode_plan(const std::vector<uint8_t>& b);

}  // namespace dsv41::dist
