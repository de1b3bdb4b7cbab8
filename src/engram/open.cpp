#include "dsv41/engram/open.h"

#include <filesystem>

#include "dsv41/common/error.h"
#include "dsv41/common/log.h"
#include "dsv41/loader/checkpoint.h"
#include "engram/pack_format.h"

namespace dsv41::engram {

namespace fs = std::filesystem;

std::shared_ptr<EngramStore> open_engram_store(const ModelConfig& cfg, const Checkpoint* ckpt,
                                               const EngramStorageOptions& o) {
  if (cfg.engram_layer_ids.empty()) return nullptr;
  const EngramGeometry g = EngramGeometry::from_config(cfg);
  const EngramIoOptions io{.direct_io = o.direct_io, .verify_checksums = o.verify_checksums};
  std::shared_ptr<const EngramRowSource> src;
  if (!o.engram_packed.empty()) {
    const bool own = fs::exists(fs::path(o.engram_packed) / pack_index_name(o.rank, o.world_size));
    src = open_packed_source(o.engram_packed, g, o.rank, own || o.world_size > 1 ? o.world_size : 0, io);
  } else if (!o.engram_dir.empty()) {
    src = open_safetensors_dir_source(o.engram_dir, g, io);
  } else {
    DSV_CHECK(ckpt != nullptr, "engram: no checkpoint to read the Engram tables from");
    const std::string w = fmt::format("layers.{}.engram.embed.weight", g.layer_ids.front());
    if (!ckpt->has(w))
      fail("checkpoint {} has no '{}': pass --engram-dir DIR (the folder with the Engram shards) or --engram-packed DIR",
           ckpt->dir(), w);
    src = open_checkpoint_source(*ckpt, g);
  }
  auto store = std::make_shared<EngramStore>(src, EngramStoreOptions{.cache_gib = o.cache_gib, .io_threads = o.io_threads});
  spdlog::info("engram: rows from {}; cache {:.2f} GiB; {} I/O threads", src->describe(), o.cache_gib,
               store->io_threads());
  return store;
}

}  // namespace dsv41::engram
