// safetensors files: a little-endian u64 header length, a JSON header, then the data section.
// Files are memory-mapped read-only; every offset in the header is bounds-checked at open, so a
// TensorInfo's `data` always points at exactly `nbytes` readable bytes.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "dsv41/common/dtype.h"

namespace dsv41 {

struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  uint64_t file_offset = 0;      // absolute byte offset of the first element in the file
  uint64_t nbytes = 0;
  const uint8_t* data = nullptr;  // mapped bytes (nullptr only for header-only parses)
  std::string file;               // path of the file holding it

  int64_t numel() const;
  std::string shape_str() const;  // "[2304, 5120]"
};

class SafetensorsFile {
 public:
  // Maps and validates a file. Throws dsv41::Error naming the file (and tensor) on any defect.
  static std::unique_ptr<SafetensorsFile> open(const std::string& path);
  // Validates an in-memory image (used by the fuzzer and by tests); `bytes` must outlive the object.
  static std::unique_ptr<SafetensorsFile> from_memory(const uint8_t* bytes, size_t size,
                                                      const std::string& label);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find(std::string_view name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  uint64_t file_size() const { return size_; }

 private:
  SafetensorsFile() = default;
  void parse(const uint8_t* bytes, size_t size);

  std::string path_;
  void* map_ = nullptr;
  size_t size_ = 0;
  std::vector<TensorInfo> tensors_;
  std::unordered_map<std::string, size_t> by_name_;
  std::map<std::string, std::string> metadata_;
};

// Collects tensors and writes one safetensors file (header padded to 8 bytes).
class SafetensorsWriter {
 public:
  void add(const std::string& name, DType dtype, std::vector<int64_t> shape, const void* data,
           size_t nbytes);
  template <class T>
  void add(const std::string& name, DType dtype, std::vector<int64_t> shape, const std::vector<T>& v) {
    add(name, dtype, std::move(shape), v.data(), v.size() * sizeof(T));
  }
  void set_metadata(const std::string& key, const std::string& value) { metadata_[key] = value; }
  void write(const std::string& path) const;  // throws dsv41::Error on I/O failure
  uint64_t data_bytes() const { return data_size_; }

 private:
  struct Entry {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    std::vector<uint8_t> bytes;
  };
  std::vector<Entry> entries_;
  std::map<std::string, std::string> metadata_;
  uint64_t data_size_ = 0;
};

// Converts a tensor of any floating dtype (BF16, F16, F32, F64, F8_*) or integer dtype to fp32.
std::vector<float> tensor_to_f32(const TensorInfo& t);

}  // namespace dsv41
