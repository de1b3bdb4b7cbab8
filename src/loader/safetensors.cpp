#include "dsv41/loader/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <unordered_set>

#include "dsv41/common/error.h"
#include "dsv41/common/numeric.h"
#include "dsv41/common/parallel.h"

namespace dsv41 {

// Tensor bytes are used in place (memcpy into host integers and floats): a big-endian host would
// read every multi-byte value wrongly, so it is refused at build time rather than misread.
static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian; big-endian hosts are not supported");

using json = nlohmann::json;

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

namespace {
// Header sizes above this are rejected before parsing: real headers are ~10 MB at most.
constexpr uint64_t kMaxHeaderBytes = 256ull << 20;

// Offset of the first byte that breaks UTF-8 (overlong forms, surrogates and code points above
// U+10FFFF included), or npos when the text is valid.
size_t first_invalid_utf8(const uint8_t* s, size_t n) {
  size_t i = 0;
  while (i < n) {
    const uint8_t c = s[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len = 0;
    uint32_t cp = 0, min = 0;
    if ((c & 0xE0) == 0xC0) len = 2, cp = c & 0x1F, min = 0x80;
    else if ((c & 0xF0) == 0xE0) len = 3, cp = c & 0x0F, min = 0x800;
    else if ((c & 0xF8) == 0xF0) len = 4, cp = c & 0x07, min = 0x10000;
    else return i;
    if (i + len > n) return i;
    for (size_t k = 1; k < len; ++k) {
      if ((s[i + k] & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (s[i + k] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
    i += len;
  }
  return std::string::npos;
}

// The JSON string literal around header offset `at`, printable (other bytes as \xNN), so an
// error can name the tensor whose name is broken.
std::string string_around(const uint8_t* s, size_t n, size_t at) {
  size_t b = at, e = at;
  while (b > 0 && !(s[b - 1] == '"' && (b < 2 || s[b - 2] != '\\')) && at - b < 200) --b;
  while (e < n && s[e] != '"' && e - at < 200) ++e;
  std::string out;
  for (size_t i = b; i < e; ++i) {
    if (s[i] >= 0x20 && s[i] < 0x7F) out.push_back(static_cast<char>(s[i]));
    else out += fmt::format("\\x{:02x}", s[i]);
  }
  return out;
}
}  // namespace

std::unique_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("{}: cannot open: {}", path, std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    ::close(fd);
    fail("{}: cannot stat: {}", path, std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail("{}: not a regular file (a safetensors file was expected)", path);
  }
  f->size_ = static_cast<size_t>(st.st_size);
  if (f->size_ > 0) {
    void* m = mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
      ::close(fd);
      fail("{}: cannot mmap: {}", path, std::strerror(errno));
    }
    f->map_ = m;
  }
  ::close(fd);
  f->parse(static_cast<const uint8_t*>(f->map_), f->size_);
  return f;
}

std::unique_ptr<SafetensorsFile> SafetensorsFile::from_memory(const uint8_t* bytes, size_t size,
                                                              const std::string& label) {
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = label;
  f->size_ = size;
  f->parse(bytes, size);
  return f;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) munmap(map_, size_);
}

const TensorInfo* SafetensorsFile::find(std::string_view name) const {
  auto it = by_name_.find(std::string(name));
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

void SafetensorsFile::parse(const uint8_t* bytes, size_t size) {
  const std::string& p = path_;
  if (size < 8) fail("{}: truncated: {} bytes, a safetensors file needs at least 8", p, size);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | bytes[i];
  if (header_len > kMaxHeaderBytes) fail("{}: header length {} is implausible (corrupt file?)", p, header_len);
  if (header_len > size - 8)
    fail("{}: truncated: header claims {} bytes but the file has {} after the length", p, header_len, size - 8);
  const uint64_t data_start = 8 + header_len;
  const uint64_t data_size = size - data_start;

  if (size_t bad = first_invalid_utf8(bytes + 8, header_len); bad != std::string::npos)
    fail("{}: header is not valid UTF-8 at byte {}, in \"{}\" (a tensor name or value)", p, 8 + bad,
         string_around(bytes + 8, header_len, bad));
  json h;
  // Duplicate top-level keys would silently shadow each other in the parsed object.
  std::unordered_set<std::string> seen;
  auto no_duplicates = [&](int depth, json::parse_event_t event, json& parsed) {
    if (depth == 1 && event == json::parse_event_t::key && !seen.insert(parsed.get<std::string>()).second)
      fail("{}: tensor '{}' appears more than once in the header", p, parsed.get<std::string>());
    return true;
  };
  try {
    h = json::parse(reinterpret_cast<const char*>(bytes + 8), reinterpret_cast<const char*>(bytes + data_start),
                    no_duplicates);
  } catch (const json::exception& e) {
    fail("{}: header is not valid JSON: {}", p, e.what());
  }
  if (!h.is_object()) fail("{}: header is not a JSON object", p);

  std::vector<std::pair<uint64_t, uint64_t>> ranges;  // (begin, index) for the overlap check
  for (auto it = h.begin(); it != h.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) fail("{}: __metadata__ is not an object", p);
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) fail("{}: __metadata__ value of '{}' is not a string", p, m.key());
        metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    if (name.empty()) fail("{}: tensor with an empty name", p);
    if (!v.is_object()) fail("{}: tensor '{}': entry is not an object", p, name);
    auto dt = v.find("dtype");
    auto sh = v.find("shape");
    auto off = v.find("data_offsets");
    if (dt == v.end() || !dt->is_string()) fail("{}: tensor '{}': missing or non-string dtype", p, name);
    if (sh == v.end() || !sh->is_array()) fail("{}: tensor '{}': missing or non-array shape", p, name);
    if (off == v.end() || !off->is_array() || off->size() != 2)
      fail("{}: tensor '{}': data_offsets must be [begin, end]", p, name);
    auto dtype = dtype_from_name(dt->get<std::string>());
    if (!dtype) fail("{}: tensor '{}': unknown dtype '{}'", p, name, dt->get<std::string>());

    TensorInfo t;
    t.name = name;
    t.dtype = *dtype;
    t.file = p;
    // numel * size with overflow checks
    unsigned __int128 numel = 1;
    for (const auto& d : *sh) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0)
        fail("{}: tensor '{}': shape entries must be non-negative integers", p, name);
      t.shape.push_back(d.get<int64_t>());
      numel *= static_cast<uint64_t>(t.shape.back());
      if (numel > (static_cast<unsigned __int128>(1) << 62)) fail("{}: tensor '{}': shape too large", p, name);
    }
    for (const auto& o : *off)
      if (!o.is_number_unsigned() && !(o.is_number_integer() && o.get<int64_t>() >= 0))
        fail("{}: tensor '{}': data_offsets must be non-negative integers", p, name);
    const uint64_t b = (*off)[0].get<uint64_t>(), e = (*off)[1].get<uint64_t>();
    if (b > e) fail("{}: tensor '{}': data_offsets begin {} > end {}", p, name, b, e);
    const unsigned __int128 expect = numel * dtype_size(t.dtype);
    if (expect != e - b)
      fail("{}: tensor '{}': header says {} {} ({} bytes) but data_offsets span {} bytes", p, name,
           dtype_name(t.dtype), t.shape_str(), static_cast<uint64_t>(expect), e - b);
    if (e > data_size)
      fail("{}: tensor '{}': data ends at {} but the data section has only {} bytes (truncated file?)", p, name, e,
           data_size);
    t.file_offset = data_start + b;
    t.nbytes = e - b;
    t.data = bytes + t.file_offset;
    ranges.emplace_back(b, tensors_.size());
    by_name_[name] = tensors_.size();
    tensors_.push_back(std::move(t));
  }
  // Sorted by start, a tensor overlaps an earlier one exactly when it starts before the furthest
  // end seen so far (empty tensors occupy nothing and are skipped).
  std::sort(ranges.begin(), ranges.end());
  uint64_t reach = 0;
  size_t reach_owner = 0;
  bool any = false;
  for (const auto& [begin, idx] : ranges) {
    const TensorInfo& cur = tensors_[idx];
    if (cur.nbytes == 0) continue;
    if (any && begin < reach)
      fail("{}: tensors '{}' and '{}' overlap in the data section", p, tensors_[reach_owner].name, cur.name);
    const uint64_t end = begin + cur.nbytes;
    if (!any || end > reach) reach = end, reach_owner = idx;
    any = true;
  }
}

void SafetensorsWriter::add(const std::string& name, DType dtype, std::vector<int64_t> shape, const void* data,
                            size_t nbytes) {
  int64_t numel = 1;
  for (auto d : shape) numel *= d;
  DSV_ASSERT(static_cast<uint64_t>(numel) * dtype_size(dtype) == nbytes, "tensor {}: {} bytes for {} elements", name,
             nbytes, numel);
  for (const auto& e : entries_) DSV_ASSERT(e.name != name, "duplicate tensor {}", name);
  Entry e{name, dtype, std::move(shape), {}};
  e.bytes.assign(static_cast<const uint8_t*>(data), static_cast<const uint8_t*>(data) + nbytes);
  data_size_ += nbytes;
  entries_.push_back(std::move(e));
}

std::string safetensors_preamble(const std::vector<HeaderEntry>& entries,
                                 const std::map<std::string, std::string>& metadata) {
  json h = json::object();
  if (!metadata.empty()) h["__metadata__"] = metadata;
  uint64_t off = 0;
  for (const auto& e : entries) {
    h[e.name] = {{"dtype", std::string(dtype_name(e.dtype))}, {"shape", e.shape}, {"data_offsets", {off, off + e.nbytes}}};
    off += e.nbytes;
  }
  std::string hs = h.dump();
  while (hs.size() % 8) hs.push_back(' ');
  std::string out(8, '\0');
  const uint64_t n = hs.size();
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>(static_cast<uint8_t>(n >> (8 * i)));
  return out + hs;
}

void SafetensorsWriter::write(const std::string& path) const {
  std::vector<HeaderEntry> header;
  header.reserve(entries_.size());
  for (const auto& e : entries_) header.push_back(HeaderEntry{e.name, e.dtype, e.shape, e.bytes.size()});
  const std::string preamble = safetensors_preamble(header, metadata_);
  const std::string tmp = path + ".tmp";
  // On any failure the partial file goes away: a later reader must never find a half-written one.
  auto give_up = [&](const std::string& why) {
    std::remove(tmp.c_str());
    fail("{}: {}", path, why);
  };
  std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
  if (!out) fail("{}: cannot create {}: {}", path, tmp, std::strerror(errno));
  out.write(preamble.data(), static_cast<std::streamsize>(preamble.size()));
  for (const auto& e : entries_) out.write(reinterpret_cast<const char*>(e.bytes.data()), static_cast<std::streamsize>(e.bytes.size()));
  out.close();
  if (!out) give_up("write failed (disk full?)");
  if (std::rename(tmp.c_str(), path.c_str()) != 0) give_up(fmt::format("cannot rename into place: {}", std::strerror(errno)));
}

std::vector<float> tensor_to_f32(const TensorInfo& t) {
  const int64_t n = t.numel();
  std::vector<float> out(static_cast<size_t>(n));
  const uint8_t* d = t.data;
  DSV_ASSERT(d != nullptr, "tensor {} has no data", t.name);
  // Element-wise, so any split gives the same values; in parallel because load-time widening of
  // large dense tensors is on the start-up path.
  parallel_for(n, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      float v = 0;
      switch (t.dtype) {
        case DType::BF16: { uint16_t x; std::memcpy(&x, d + 2 * i, 2); v = bf16_bits_to_f32(x); break; }
        case DType::F16: { uint16_t x; std::memcpy(&x, d + 2 * i, 2); v = f16_bits_to_f32(x); break; }
        case DType::F32: std::memcpy(&v, d + 4 * i, 4); break;
        case DType::F64: { double x; std::memcpy(&x, d + 8 * i, 8); v = static_cast<float>(x); break; }
        case DType::I8: v = static_cast<int8_t>(d[i]); break;
        case DType::U8: case DType::BOOL: v = d[i]; break;
        case DType::I16: { int16_t x; std::memcpy(&x, d + 2 * i, 2); v = x; break; }
        case DType::I32: { int32_t x; std::memcpy(&x, d + 4 * i, 4); v = static_cast<float>(x); break; }
        case DType::I64: { int64_t x; std::memcpy(&x, d + 8 * i, 8); v = static_cast<float>(x); break; }
        case DType::F8_E4M3: v = e4m3_to_f32(d[i]); break;
        case DType::F8_E5M2: v = e5m2_to_f32(d[i]); break;
        case DType::F8_E8M0: v = e8m0_to_f32(d[i]); break;
      }
      out[static_cast<size_t>(i)] = v;
    }
  }, int64_t{1} << 16);
  return out;
}

}  // namespace dsv41
