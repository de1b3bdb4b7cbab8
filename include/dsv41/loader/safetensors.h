// safetensors files: a little-endian u64 header length, a JSON header, then the data section.
// Files are memory-mapped read-only; every offset in the header is bounds-checked at open, so a
// TensorInfo's `data` always points at exactly `nbytes` readable bytes, valid as long as the
// SafetensorsFile (or the Checkpoint owning it) lives.
// Byte order: tensor data is little-endian on disk and is read in place (tensor_to_f32, the EXL3
// trellis, the CPU model), so the project supports little-endian hosts only (see safetensors.cpp).
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

// "[2304, 5120]"
std::string shape_str(const std::vector<int64_t>& shape);

struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  uint64_t file_offset = 0;      // absolute byte offset of the first element in the file
  uint64_t nbytes = 0;
  const uint8_t* data = nullptr;  // mapped bytes (nullptr only for header-only parses)
  std::string file;               // path of the file holding it

  int64_t numel() const;
  std::string shape_str() const { return dsv41::shape_str(shape); }
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

// One tensor of a header to write; data offsets follow from the order of the entries.
struct HeaderEntry {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  uint64_t nbytes;
};

// The start of a safetensors file: the u64 little-endian header length, then the JSON header with
// the entries' data back to back in the given order, padded with spaces to a multiple of 8 so that
// the data section (and every tensor of a size-sorted file) is aligned.
std::string safetensors_preamble(const std::vector<HeaderEntry>& entries,
                                 const std::map<std::string, std::string>& metadata);

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
  // Writes PATH.tmp, then renames it into place; throws dsv41::Error on I/O failure (the .tmp file
  // is removed then).
  void write(const std::string& path) const;
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
