// The thin HTTP layer: plain request/response values that the API handlers work on, and a
// server that binds them to sockets (cpp-httplib lives only in src/serve/http_server.cpp). The
// API can therefore be driven in-process by tests, without sockets.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dsv41::serve {

struct HttpRequest {
  std::string method;  // "GET", "POST", ...
  std::string path;    // without the query string
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
  // True once the client has closed its connection (set by the socket server; absent in-process).
  std::function<bool()> client_gone;
  // Header value by case-insensitive name; "" when absent.
  std::string header(std::string_view name) const;
};

// Writes one piece of a streamed body; returns false once the client is gone.
using BodyWriter = std::function<bool(std::string_view)>;

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
  // When set, the body is produced by this function (called once, on the connection's thread)
  // instead of `body`; it returns when the stream is complete or the writer failed.
  std::function<void(const BodyWriter&)> stream;
};

using HttpHandler = std::function<HttpResponse(const HttpRequest&)>;

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  int port = 8888;                     // 0: pick a free port (see HttpServer::port)
  int threads = 128;                   // connection threads (a streaming request holds one)
  size_t max_body_bytes = 8u << 20;    // larger bodies get 413
  int read_timeout_s = 10;             // a client that stalls this long while sending is dropped
  int write_timeout_s = 10;
};

class HttpServer {
 public:
  HttpServer(HttpServerOptions o, HttpHandler handler);
  ~HttpServer();
  // Binds and starts serving on background threads; throws dsv41::Error when it cannot bind.
  void start();
  void stop();
  int port() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dsv41::serve
