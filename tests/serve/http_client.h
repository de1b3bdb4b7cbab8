// A minimal blocking HTTP/1.1 client on raw sockets (127.0.0.1 only) for the real-socket tests:
// it can also stall mid-request (slow loris) and drop a stream half-way (disconnect).
#pragma once
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace dsv41::test_support {

struct HttpResult {
  int status = 0;  // 0: no response (connection failed or closed early)
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;  // de-chunked
  std::string header(const std::string& name) const {
    for (auto& [k, v] : headers) {
      if (k.size() != name.size()) continue;
      bool same = true;
      for (size_t i = 0; i < k.size(); ++i) same = same && std::tolower(k[i]) == std::tolower(name[i]);
      if (same) return v;
    }
    return {};
  }
};

class Socket {
 public:
  explicit Socket(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      ::close(fd_);
      fd_ = -1;
    }
  }
  ~Socket() { close(); }
  Socket(const Socket&) = delete;
  bool ok() const { return fd_ >= 0; }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  bool send_all(const std::string& s) {
    size_t off = 0;
    while (off < s.size()) {
      const ssize_t n = ::send(fd_, s.data() + off, s.size() - off, MSG_NOSIGNAL);
      if (n <= 0) return false;
      off += static_cast<size_t>(n);
    }
    return true;
  }
  // Reads what is available within timeout_ms; returns "" on EOF/timeout and sets eof.
  std::string read_some(int timeout_ms, bool& eof) {
    pollfd p{fd_, POLLIN, 0};
    eof = false;
    if (::poll(&p, 1, timeout_ms) <= 0) return {};
    char buf[65536];
    const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
    if (n <= 0) {
      eof = true;
      return {};
    }
    return std::string(buf, static_cast<size_t>(n));
  }
  int fd() const { return fd_; }

 private:
  int fd_ = -1;
};

inline std::string build_request(const std::string& method, const std::string& path, const std::string& body,
                                 const std::vector<std::pair<std::string, std::string>>& headers = {}) {
  std::string r = method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n";
  for (auto& [k, v] : headers) r += k + ": " + v + "\r\n";
  if (!body.empty() || method == "POST") r += "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
  r += "\r\n" + body;
  return r;
}

// Parses status, headers and a (possibly chunked) body out of a complete response.
inline HttpResult parse_response(const std::string& raw) {
  HttpResult r;
  const size_t eoh = raw.find("\r\n\r\n");
  if (eoh == std::string::npos || raw.rfind("HTTP/1.", 0) != 0) return r;
  r.status = std::stoi(raw.substr(9, 3));
  size_t pos = raw.find("\r\n") + 2;
  bool chunked = false;
  while (pos < eoh) {
    const size_t e = raw.find("\r\n", pos);
    const std::string line = raw.substr(pos, e - pos);
    const size_t c = line.find(':');
    if (c != std::string::npos) {
      std::string k = line.substr(0, c), v = line.substr(c + 1);
      while (!v.empty() && v[0] == ' ') v.erase(0, 1);
      if (k == "Transfer-Encoding" && v.find("chunked") != std::string::npos) chunked = true;
      r.headers.emplace_back(k, v);
    }
    pos = e + 2;
  }
  std::string body = raw.substr(eoh + 4);
  if (!chunked) {
    r.body = body;
    return r;
  }
  size_t p = 0;
  while (p < body.size()) {
    const size_t e = body.find("\r\n", p);
    if (e == std::string::npos) break;
    const size_t n = std::stoul(body.substr(p, e - p), nullptr, 16);
    if (n == 0) break;
    r.body += body.substr(e + 2, n);
    p = e + 2 + n + 2;
  }
  return r;
}

// True once `raw` holds a whole response (by Content-Length or the last chunk), so a client need
// not wait for a keep-alive server to close.
inline bool response_complete(const std::string& raw) {
  const size_t eoh = raw.find("\r\n\r\n");
  if (eoh == std::string::npos) return false;
  const std::string head = raw.substr(0, eoh);
  const size_t cl = head.find("Content-Length: ");
  if (cl != std::string::npos) return raw.size() - eoh - 4 >= std::stoul(head.substr(cl + 16));
  return head.find("chunked") != std::string::npos && raw.size() >= 5 && raw.compare(raw.size() - 5, 5, "0\r\n\r\n") == 0;
}

// One request on a fresh connection; reads until the server closes it.
inline HttpResult http_request(int port, const std::string& method, const std::string& path, const std::string& body = {},
                               const std::vector<std::pair<std::string, std::string>>& headers = {},
                               int timeout_ms = 30000) {
  Socket s(port);
  if (!s.ok() || !s.send_all(build_request(method, path, body, headers))) return {};
  std::string raw;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (std::chrono::steady_clock::now() < deadline) {
    bool eof = false;
    raw += s.read_some(100, eof);
    if (eof || response_complete(raw)) break;
  }
  return parse_response(raw);
}

// The `data:` payloads of an SSE body, in order (comments skipped).
inline std::vector<std::string> sse_events(const std::string& body) {
  std::vector<std::string> out;
  size_t p = 0;
  while (p < body.size()) {
    size_t e = body.find("\n\n", p);
    if (e == std::string::npos) e = body.size();
    const std::string ev = body.substr(p, e - p);
    if (ev.rfind("data: ", 0) == 0) out.push_back(ev.substr(6));
    p = e + 2;
  }
  return out;
}

}  // namespace dsv41::test_support
