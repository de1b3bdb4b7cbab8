#include "engram/positioned_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "dsv41/common/error.h"

namespace dsv41::engram {

namespace {
// One aligned bounce buffer per thread, grown on demand.
struct Bounce {
  uint8_t* p = nullptr;
  size_t cap = 0;
  ~Bounce() { std::free(p); }
  uint8_t* get(size_t n) {
    if (n > cap) {
      std::free(p);
      p = static_cast<uint8_t*>(std::aligned_alloc(PositionedFile::kAlign, n));
      if (!p) fail("engram: cannot allocate a {}-byte I/O buffer", n);
      cap = n;
    }
    return p;
  }
};
thread_local Bounce t_bounce;
}  // namespace

std::unique_ptr<PositionedFile> PositionedFile::open(const std::string& path, bool direct_io) {
  std::unique_ptr<PositionedFile> f(new PositionedFile());
  f->path_ = path;
  f->fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f->fd_ < 0) fail("{}: cannot open: {}", path, std::strerror(errno));
  struct stat st {};
  if (fstat(f->fd_, &st) != 0) fail("{}: cannot stat: {}", path, std::strerror(errno));
  if (!S_ISREG(st.st_mode)) fail("{}: not a regular file", path);
  f->size_ = static_cast<uint64_t>(st.st_size);
  if (direct_io) f->direct_fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);  // -1: not supported
  // Random row reads: no read-ahead on the buffered descriptor.
  posix_fadvise(f->fd_, 0, 0, POSIX_FADV_RANDOM);
  return f;
}

PositionedFile::~PositionedFile() {
  if (fd_ >= 0) ::close(fd_);
  if (direct_fd_ >= 0) ::close(direct_fd_);
}

void PositionedFile::read(uint64_t offset, size_t n, uint8_t* out) const {
  if (n == 0) return;
  if (direct() && read_direct(offset, n, out)) return;
  read_buffered(offset, n, out);
}

void PositionedFile::read_buffered(uint64_t offset, size_t n, uint8_t* out) const {
  size_t done = 0;
  while (done < n) {
    const ssize_t r = ::pread(fd_, out + done, n - done, static_cast<off_t>(offset + done));
    if (r < 0) {
      if (errno == EINTR) continue;
      fail("{}: read of {} bytes at offset {} failed: {}", path_, n, offset, std::strerror(errno));
    }
    if (r == 0)
      fail("{}: short read: wanted {} bytes at offset {}, the file ends at {} (truncated?)", path_, n, offset,
           offset + done);
    done += static_cast<size_t>(r);
  }
}

bool PositionedFile::read_direct(uint64_t offset, size_t n, uint8_t* out) const {
  const uint64_t begin = offset & ~static_cast<uint64_t>(kAlign - 1);
  const uint64_t end = (offset + n + kAlign - 1) & ~static_cast<uint64_t>(kAlign - 1);
  const size_t span = static_cast<size_t>(end - begin);
  uint8_t* buf = t_bounce.get(span);
  size_t got = 0;
  const size_t need = static_cast<size_t>(offset + n - begin);
  while (got < need) {
    // Every chunk stays aligned: `got` only advances by whole blocks until end of file.
    const ssize_t r = ::pread(direct_fd_, buf + got, span - got, static_cast<off_t>(begin + got));
    if (r < 0) {
      if (errno == EINTR) continue;
      if (errno == EINVAL && got == 0) {  // the file system refuses O_DIRECT: buffered from now on
        direct_ok_.store(false, std::memory_order_relaxed);
        return false;
      }
      fail("{}: read of {} bytes at offset {} failed: {}", path_, n, offset, std::strerror(errno));
    }
    if (r == 0) break;
    got += static_cast<size_t>(r);
    if (got % kAlign != 0) break;  // end of file inside a block
  }
  if (got < need)
    fail("{}: short read: wanted {} bytes at offset {}, the file ends at {} (truncated?)", path_, n, offset,
         begin + got);
  std::memcpy(out, buf + (offset - begin), n);
  return true;
}

}  // namespace dsv41::engram
