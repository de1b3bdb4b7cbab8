// Blocking TCP plumbing shared by the control plane and the CPU collective backend: sockets with
// RAII, listen/accept/connect, and sends/receives that never wait forever. Every wait runs in short
// poll slices and asks an abort check between slices, so a lost peer is noticed by the heartbeat
// monitor (or the deadline) instead of hanging the caller.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

namespace dsv41::dist {

// Returns a non-empty reason to give up a wait (e.g. "rank 1: no heartbeat for 5.0 s").
using AbortCheck = std::function<std::string()>;

class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket() { close(); }
  Socket(Socket&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Socket& operator=(Socket&& o) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;

  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  void close();
  // Wakes any thread blocked on this socket (shutdown both directions) without releasing the fd.
  void shutdown();

 private:
  int fd_ = -1;
};

// Listens on addr:port (port 0 = any free port; "0.0.0.0" = all interfaces). Throws dsv41::Error
// naming the address when the bind fails (e.g. the port is in use).
Socket listen_tcp(const std::string& addr, int port, int backlog = 16);
// The port a listening socket is bound to.
int bound_port(const Socket& s);
// Waits up to timeout_ms for a connection; returns an invalid Socket on timeout.
Socket accept_tcp(const Socket& listener, int timeout_ms);
// One connection attempt with a timeout; returns an invalid Socket (and sets why) on failure.
Socket connect_tcp(const std::string& host, int port, int timeout_ms, std::string* why = nullptr);

// Sends/receives exactly n bytes. Throws dsv41::Error on a closed/broken connection, when
// `abort` returns a reason, or when deadline_ms (> 0: since the call) passes without the transfer
// completing. `what` names the transfer in the message.
void send_all(const Socket& s, const void* data, size_t n, const AbortCheck& abort, int64_t deadline_ms,
              const char* what);
void recv_all(const Socket& s, void* data, size_t n, const AbortCheck& abort, int64_t deadline_ms, const char* what);
// Waits until the socket is readable for up to timeout_ms; true when data (or EOF) is ready.
bool wait_readable(const Socket& s, int timeout_ms);

int64_t now_ms();  // monotonic clock

}  // namespace dsv41::dist
