#include "dist/tp_linear.h"

#include <cstring>

#include "dsv41/common/numeric.h"

namespace dsv41::dist {

std::vector<int64_t> split_widths(int64_t total, int world, int64_t align) {
  std::vector<int64_t> w(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) w[static_cast<size_t>(r)] = split_range(total, r, world, align).size();
  return w;
}

void gather_columns(Collective& comm, const float* local, int64_t rows, std::span<const int64_t> widths, float* out,
                    bool bf16_wire) {
  const int world = comm.world_size(), me = comm.rank();
  DSV_CHECK(widths.size() == static_cast<size_t>(world), "gather_columns: {} widths for world size {}", widths.size(),
            world);
  const size_t elem = bf16_wire ? 2 : 4;
  int64_t total = 0;
  std::vector<size_t> counts(static_cast<size_t>(world));
  std::vector<int64_t> col0(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    col0[r] = total;
    total += widths[r];
    counts[r] = static_cast<size_t>(rows * widths[r]) * elem;
  }
  size_t all_bytes = 0;
  for (size_t c : counts) all_bytes += c;
  std::vector<uint8_t> buf(all_bytes);
  size_t my_off = 0;
  for (int r = 0; r < me; ++r) my_off += counts[r];
  const int64_t mine = rows * widths[me];
  if (bf16_wire) {
    auto* p = reinterpret_cast<uint16_t*>(buf.data() + my_off);
    for (int64_t i = 0; i < mine; ++i) {
      uint32_t bits;
      std::memcpy(&bits, &local[i], 4);
      p[i] = static_cast<uint16_t>(bits >> 16);
    }
  } else {
    std::memcpy(buf.data() + my_off, local, static_cast<size_t>(mine) * 4);
  }
  comm.all_gather(buf.data() + my_off, counts, buf.data());
  size_t off = 0;
  for (int r = 0; r < world; ++r) {
    const int64_t w = widths[r];
    for (int64_t i = 0; i < rows; ++i) {
      float* dst = out + i * total + col0[r];
      if (bf16_wire) {
        const auto* p = reinterpret_cast<const uint16_t*>(buf.data() + off) + i * w;
        for (int64_t j = 0; j < w; ++j) {
          const uint32_t bits = static_cast<uint32_t>(p[j]) << 16;
          std::memcpy(&dst[j], &bits, 4);
        }
      } else {
        std::memcpy(dst, buf.data() + off + static_cast<size_t>(i * w) * 4, static_cast<size_t>(w) * 4);
      }
    }
    off += counts[r];
  }
}

ColumnParallelLinear::ColumnParallelLinear(std::unique_ptr<Linear> local, int64_t out_features, int64_t align,
                                           Collective* comm, bool bf16_wire)
    : local_(std::move(local)), out_(out_features), comm_(comm), bf16_wire_(bf16_wire) {
  DSV_CHECK(comm_ != nullptr, "column-parallel linear without a communicator");
  widths_ = split_widths(out_features, comm_->world_size(), align);
  DSV_CHECK(local_->out_features() == widths_[static_cast<size_t>(comm_->rank())],
            "column-parallel linear: local part has {} outputs, the split gives {}", local_->out_features(),
            widths_[static_cast<size_t>(comm_->rank())]);
}

void ColumnParallelLinear::forward(const float* x, int64_t m, float* y) const {
  const int64_t k = local_->out_features();
  std::vector<float> part(static_cast<size_t>(m * k));
  if (k > 0) local_->forward(x, m, part.data());
  if (bf16_wire_)
    for (float& v : part) v = bf16_round(v);
  gather_columns(*comm_, part.data(), m, widths_, y, bf16_wire_);
}

}  // namespace dsv41::dist
