// Tensor element types as safetensors names them.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace dsv41 {

enum class DType : uint8_t {
  BF16, F16, F32, F64, I8, I16, I32, I64, U8, BOOL, F8_E4M3, F8_E5M2, F8_E8M0,
};

size_t dtype_size(DType t);                                 // bytes per element
std::string_view dtype_name(DType t);                       // safetensors spelling, e.g. "F8_E4M3"
std::optional<DType> dtype_from_name(std::string_view s);   // nullopt for unknown names

}  // namespace dsv41
