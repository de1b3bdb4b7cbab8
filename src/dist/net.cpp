#include "dist/net.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "dsv41/common/error.h"

namespace dsv41::dist {
namespace {

constexpr int kSliceMs = 100;  // poll slice: how often a blocked transfer asks its abort check

void set_nodelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

sockaddr_in resolve(const std::string& host, int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (host.empty() || host == "0.0.0.0") {
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    return a;
  }
  if (::inet_pton(AF_INET, host.c_str(), &a.sin_addr) == 1) return a;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0 || !res) fail("cannot resolve host '{}': {}", host, ::gai_strerror(rc));
  a.sin_addr = reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr;
  ::freeaddrinfo(res);
  return a;
}

}  // namespace

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

Socket& Socket::operator=(Socket&& o) noexcept {
  if (this != &o) {
    close();
    fd_ = o.fd_;
    o.fd_ = -1;
  }
  return *this;
}

void Socket::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void Socket::shutdown() {
  if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
}

Socket listen_tcp(const std::string& addr, int port, int backlog) {
  Socket s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  DSV_CHECK(s.valid(), "socket(): {}", std::strerror(errno));
  int one = 1;
  ::setsockopt(s.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  const sockaddr_in a = resolve(addr, port);
  if (::bind(s.fd(), reinterpret_cast<const sockaddr*>(&a), sizeof(a)) != 0)
    fail("cannot listen on {}:{}: {}", addr.empty() ? "0.0.0.0" : addr, port, std::strerror(errno));
  if (::listen(s.fd(), backlog) != 0) fail("listen on {}:{}: {}", addr, port, std::strerror(errno));
  return s;
}

int bound_port(const Socket& s) {
  sockaddr_in a{};
  socklen_t len = sizeof(a);
  DSV_CHECK(::getsockname(s.fd(), reinterpret_cast<sockaddr*>(&a), &len) == 0, "getsockname: {}",
            std::strerror(errno));
  return ntohs(a.sin_port);
}

bool wait_readable(const Socket& s, int timeout_ms) {
  pollfd p{s.fd(), POLLIN, 0};
  const int rc = ::poll(&p, 1, timeout_ms);
  return rc > 0;
}

Socket accept_tcp(const Socket& listener, int timeout_ms) {
  if (!wait_readable(listener, timeout_ms)) return Socket();
  Socket c(::accept4(listener.fd(), nullptr, nullptr, SOCK_CLOEXEC));
  if (c.valid()) set_nodelay(c.fd());
  return c;
}

Socket connect_tcp(const std::string& host, int port, int timeout_ms, std::string* why) {
  sockaddr_in a{};
  try {
    a = resolve(host, port);
  } catch (const Error& e) {
    if (why) *why = e.what();
    return Socket();
  }
  Socket s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!s.valid()) {
    if (why) *why = std::strerror(errno);
    return Socket();
  }
  int rc = ::connect(s.fd(), reinterpret_cast<const sockaddr*>(&a), sizeof(a));
  if (rc != 0 && errno != EINPROGRESS) {
    if (why) *why = std::strerror(errno);
    return Socket();
  }
  if (rc != 0) {
    pollfd p{s.fd(), POLLOUT, 0};
    if (::poll(&p, 1, timeout_ms) <= 0) {
      if (why) *why = "timed out";
      return Socket();
    }
    int err = 0;
    socklen_t len = sizeof(err);
    ::getsockopt(s.fd(), SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) {
      if (why) *why = std::strerror(err);
      return Socket();
    }
  }
  const int flags = ::fcntl(s.fd(), F_GETFL);
  ::fcntl(s.fd(), F_SETFL, flags & ~O_NONBLOCK);
  set_nodelay(s.fd());
  return s;
}

namespace {

// Waits for `events` on the socket in slices; throws on abort/deadline.
void wait_io(const Socket& s, short events, const AbortCheck& abort, int64_t deadline, const char* what) {
  while (true) {
    pollfd p{s.fd(), events, 0};
    const int rc = ::poll(&p, 1, kSliceMs);
    if (rc > 0) return;
    if (rc < 0 && errno != EINTR) fail("{}: poll failed: {}", what, std::strerror(errno));
    if (abort) {
      const std::string reason = abort();
      if (!reason.empty()) fail("{}", reason);
    }
    if (deadline > 0 && now_ms() > deadline) fail("{}: timed out", what);
  }
}

}  // namespace

void send_all(const Socket& s, const void* data, size_t n, const AbortCheck& abort, int64_t deadline_ms,
              const char* what) {
  DSV_CHECK(s.valid(), "{}: not connected", what);
  const int64_t deadline = deadline_ms > 0 ? now_ms() + deadline_ms : 0;
  const auto* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    wait_io(s, POLLOUT, abort, deadline, what);
    const ssize_t k = ::send(s.fd(), p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) continue;
      fail("{}: connection lost ({})", what, std::strerror(errno));
    }
    p += k;
    n -= static_cast<size_t>(k);
  }
}

void recv_all(const Socket& s, void* data, size_t n, const AbortCheck& abort, int64_t deadline_ms, const char* what) {
  DSV_CHECK(s.valid(), "{}: not connected", what);
  const int64_t deadline = deadline_ms > 0 ? now_ms() + deadline_ms : 0;
  auto* p = static_cast<uint8_t*>(data);
  while (n > 0) {
    wait_io(s, POLLIN, abort, deadline, what);
    const ssize_t k = ::recv(s.fd(), p, n, MSG_DONTWAIT);
    if (k == 0) fail("{}: connection closed by the peer", what);
    if (k < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) continue;
      fail("{}: connection lost ({})", what, std::strerror(errno));
    }
    p += k;
    n -= static_cast<size_t>(k);
  }
}

}  // namespace dsv41::dist
