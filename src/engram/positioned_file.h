// A read-only file read with positioned reads from many threads. With direct I/O the file is
// also opened O_DIRECT and each read goes through a thread-local, block-aligned bounce buffer
// covering the aligned span around the requested bytes; a file system that refuses O_DIRECT
// (tmpfs, some overlays) falls back to buffered pread.
#pragma once
#include <cstddef>
#include <cstdint>
#include <atomic>
#include <memory>
#include <string>

namespace dsv41::engram {

class PositionedFile {
 public:
  // Throws dsv41::Error "PATH: cannot open: ..." (the caller adds context).
  static std::unique_ptr<PositionedFile> open(const std::string& path, bool direct_io);
  ~PositionedFile();
  PositionedFile(const PositionedFile&) = delete;
  PositionedFile& operator=(const PositionedFile&) = delete;

  // Reads exactly n bytes at offset into out. Throws dsv41::Error naming the file on an I/O
  // error or a short read (file shorter than offset + n).
  void read(uint64_t offset, size_t n, uint8_t* out) const;
  uint64_t size() const { return size_; }  // at open
  bool direct() const { return direct_fd_ >= 0 && direct_ok_.load(std::memory_order_relaxed); }
  const std::string& path() const { return path_; }

  static constexpr size_t kAlign = 4096;  // covers 512-byte and 4 KiB logical blocks

 private:
  PositionedFile() = default;
  void read_buffered(uint64_t offset, size_t n, uint8_t* out) const;
  bool read_direct(uint64_t offset, size_t n, uint8_t* out) const;  // false: O_DIRECT refused

  std::string path_;
  int fd_ = -1;
  int direct_fd_ = -1;
  uint64_t size_ = 0;
  mutable std::atomic<bool> direct_ok_{true};  // cleared when the kernel refuses an O_DIRECT read
};

}  // namespace dsv41::engram
