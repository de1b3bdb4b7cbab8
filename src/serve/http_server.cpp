// cpp-httplib binding of the thin HTTP layer. Every request goes to one handler; the handler
// already turns every failure into an HTTP response, the catch-alls here are the last guard.
#include <httplib.h>
#include <spdlog/spdlog.h>

#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <cctype>
#include <sys/socket.h>

#include <thread>

#include "dsv41/common/error.h"
#include "dsv41/serve/http.h"

namespace dsv41::serve {

std::string HttpRequest::header(std::string_view name) const {
  for (auto& [k, v] : headers) {
    if (k.size() != name.size()) continue;
    bool same = true;
    for (size_t i = 0; i < k.size() && same; ++i)
      same = std::tolower(static_cast<unsigned char>(k[i])) == std::tolower(static_cast<unsigned char>(name[i]));
    if (same) return v;
  }
  return {};
}

namespace {

const char* status_type(int status) {
  switch (status) {
    case 400: return "invalid_request_error";
    case 401: return "authentication_error";
    case 404: return "not_found_error";
    case 408: return "timeout_error";
    case 413: return "invalid_request_error";
    case 429: return "rate_limit_error";
    case 503: return "service_unavailable";
    default: return status >= 500 ? "internal_server_error" : "invalid_request_error";
  }
}

// OpenAI error object for failures that httplib detects itself (body too large, bad request
// line, handler exception).
std::string error_body(int status, const std::string& msg) {
  std::string out = R"({"error":{"message":")";
  for (char c : msg) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  out += R"(","type":")";
  out += status_type(status);
  out += R"(","param":null,"code":)" + std::to_string(status) + "}}";
  return out;
}

// httplib does not hand the connection's socket to handlers; it is the open socket whose local
// port and peer address match the request's (found through /proc/self/fd, once per request).
int find_connection_fd(const std::string& remote_addr, int remote_port, int local_port) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
    int fd = -1;
    try {
      fd = std::stoi(e.path().filename().string());
    } catch (const std::exception&) {
      continue;
    }
    sockaddr_storage local{}, peer{};
    socklen_t ll = sizeof local, pl = sizeof peer;
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &ll) != 0) continue;
    if (::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &pl) != 0) continue;
    char host[INET6_ADDRSTRLEN] = {};
    int lp = -1, pp = -1;
    if (local.ss_family == AF_INET && peer.ss_family == AF_INET) {
      lp = ntohs(reinterpret_cast<sockaddr_in*>(&local)->sin_port);
      pp = ntohs(reinterpret_cast<sockaddr_in*>(&peer)->sin_port);
      ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(&peer)->sin_addr, host, sizeof host);
    } else if (local.ss_family == AF_INET6 && peer.ss_family == AF_INET6) {
      lp = ntohs(reinterpret_cast<sockaddr_in6*>(&local)->sin6_port);
      pp = ntohs(reinterpret_cast<sockaddr_in6*>(&peer)->sin6_port);
      ::inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(&peer)->sin6_addr, host, sizeof host);
    } else {
      continue;
    }
    if (lp == local_port && pp == remote_port && remote_addr == host) return fd;
  }
  return -1;
}

void to_httplib(HttpResponse&& r, httplib::Response& res) {
  res.status = r.status;
  for (auto& [k, v] : r.headers) res.set_header(k, v);
  if (r.stream) {
    auto stream = std::make_shared<std::function<void(const BodyWriter&)>>(std::move(r.stream));
    res.set_chunked_content_provider(r.content_type, [stream](size_t, httplib::DataSink& sink) {
      try {
        (*stream)([&](std::string_view s) { return sink.write(s.data(), s.size()); });
      } catch (const std::exception& e) {
        spdlog::error("stream producer failed: {}", e.what());
      }
      sink.done();
      return true;
    });
  } else {
    res.set_content(std::move(r.body), r.content_type.c_str());
  }
}

}  // namespace

// httplib listens with a backlog of 5 (compiled into the library): a burst of clients overflows
// it and their SYNs are retried after 1 s, 3 s, 7 s ... Re-listening on the bound socket raises
// the backlog (Linux updates it in place).
class BackloggedServer : public httplib::Server {
 public:
  void raise_backlog(int n) {
    const socket_t s = svr_sock_.load();
    if (s != INVALID_SOCKET) ::listen(s, n);
  }
};

struct HttpServer::Impl {
  HttpServerOptions opt;
  HttpHandler handler;
  BackloggedServer srv;
  std::thread thread;
  int bound_port = 0;
};

HttpServer::HttpServer(HttpServerOptions o, HttpHandler handler) : impl_(std::make_unique<Impl>()) {
  impl_->opt = std::move(o);
  impl_->handler = std::move(handler);
}

HttpServer::~HttpServer() { stop(); }

void HttpServer::start() {
  Impl& m = *impl_;
  const int threads = std::max(4, m.opt.threads);
  m.srv.new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  m.srv.set_payload_max_length(m.opt.max_body_bytes);
  m.srv.set_read_timeout(m.opt.read_timeout_s, 0);
  m.srv.set_write_timeout(m.opt.write_timeout_s, 0);
  m.srv.set_keep_alive_timeout(5);
  auto dispatch = [&m](const httplib::Request& req, httplib::Response& res) {
    HttpRequest r;
    r.method = req.method;
    r.path = req.path;
    r.body = req.body;
    for (auto& [k, v] : req.headers) r.headers.emplace_back(k, v);
    // Found on first use (only handlers that wait for tokens ask); the connection stays open
    // until the handler and its stream producer return, so the descriptor stays ours.
    auto fd = std::make_shared<int>(-2);
    r.client_gone = [fd, addr = req.remote_addr, rport = req.remote_port, lport = req.local_port] {
      if (*fd == -2) *fd = find_connection_fd(addr, rport, lport);
      if (*fd < 0) return false;
      char c = 0;
      const ssize_t n = ::recv(*fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
      return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
    };
    try {
      to_httplib(m.handler(r), res);
    } catch (const std::exception& e) {
      spdlog::error("handler failed on {} {}: {}", req.method, req.path, e.what());
      res.status = 500;
      res.set_content(error_body(500, "internal server error"), "application/json");
    }
  };
  for (const char* path : {R"(/.*)"}) {
    m.srv.Get(path, dispatch);
    m.srv.Post(path, dispatch);
    m.srv.Put(path, dispatch);
    m.srv.Delete(path, dispatch);
    m.srv.Patch(path, dispatch);
    m.srv.Options(path, dispatch);
  }
  m.srv.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr) {
    res.status = 500;
    res.set_content(error_body(500, "internal server error"), "application/json");
  });
  // Errors httplib produces itself (413 payload too large, 400 malformed request, ...) get the
  // OpenAI shape too.
  m.srv.set_error_handler(httplib::Server::HandlerWithResponse([](const httplib::Request&, httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    std::string msg = res.status == 413   ? "the request body is too large"
                      : res.status == 404 ? "no such route"
                      : res.status == 408 ? "the request took too long to arrive"
                      : res.status >= 500 ? "internal server error"
                                          : "malformed HTTP request";
    res.set_content(error_body(res.status, msg), "application/json");
    return httplib::Server::HandlerResponse::Handled;
  }));
  if (m.opt.port == 0) {
    m.bound_port = m.srv.bind_to_any_port(m.opt.host);
    if (m.bound_port <= 0) fail("cannot bind an HTTP port on {}", m.opt.host);
  } else {
    if (!m.srv.bind_to_port(m.opt.host, m.opt.port)) fail("cannot bind {}:{} (in use or not permitted)", m.opt.host, m.opt.port);
    m.bound_port = m.opt.port;
  }
  m.srv.raise_backlog(1024);
  m.thread = std::thread([&m] { m.srv.listen_after_bind(); });
  for (int i = 0; i < 5000 && !m.srv.is_running(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (!m.srv.is_running()) fail("the HTTP server on {}:{} did not start", m.opt.host, m.bound_port);
}

void HttpServer::stop() {
  if (!impl_) return;
  if (impl_->thread.joinable()) {
    impl_->srv.stop();
    impl_->thread.join();
  }
}

int HttpServer::port() const { return impl_->bound_port; }

}  // namespace dsv41::serve
