// A small HTTP/1.1 server: Boost.Beast parses requests (header/body limits, chunked bodies),
// POSIX sockets carry the bytes so every read and write has a deadline (slow-loris clients are
// dropped) and a handler can ask, without blocking, whether its client has gone away.
//
// Threading: one accept thread; one thread per open connection (capped by max_connections;
// beyond the cap a connection gets an immediate 503 and is closed). Handlers run on the
// connection's thread and may block (e.g. while streaming tokens).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "core/status.h"

namespace dsinfer::server {

using HeaderList = std::vector<std::pair<std::string, std::string>>;

struct HttpRequest {
  std::string method;  // "GET", "POST", ...
  std::string path;    // target without the query string
  std::string query;   // after '?', undecoded
  HeaderList headers;  // names lower-cased, in arrival order
  std::string body;
  // First value of a header (name lower-case), or nullptr.
  const std::string* Header(std::string_view lower_name) const;
};

// How a handler answers. Either Send once, or BeginStream + WriteChunk* + EndStream (chunked
// transfer encoding, flushed per call, suited to SSE).
class ResponseSink {
 public:
  virtual ~ResponseSink() = default;
  virtual void Send(int status, std::string_view content_type, std::string_view body,
                    const HeaderList& extra_headers = {}) = 0;
  virtual bool BeginStream(int status, std::string_view content_type,
                           const HeaderList& extra_headers = {}) = 0;
  // False once the client is gone or a write timed out; later calls do nothing.
  virtual bool WriteChunk(std::string_view data) = 0;
  virtual void EndStream() = 0;
  // Non-blocking: true when the peer closed or reset the connection.
  virtual bool ClientGone() = 0;
  // The tokens a generation used, for the access log (sinks that log it override this).
  virtual void NoteTokens(int64_t /*prompt*/, int64_t /*completion*/) {}
};

using HttpHandler = std::function<void(const HttpRequest&, ResponseSink&)>;

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;  // 0: pick a free port (see HttpServer::port())
  size_t max_header_bytes = 16 * 1024;
  size_t max_body_bytes = 8 * 1024 * 1024;
  int max_connections = 256;
  // Whole request (headers, then body) must arrive within these, or the connection is closed.
  std::chrono::milliseconds header_timeout{10000};
  std::chrono::milliseconds body_timeout{30000};
  std::chrono::milliseconds keep_alive_timeout{15000};  // idle wait for the next request
  std::chrono::milliseconds write_timeout{30000};       // a stalled reader is dropped
};

class HttpServer {
 public:
  // Binds and listens; requests are served once Start() runs.
  static Result<std::unique_ptr<HttpServer>> Listen(HttpServerOptions options, HttpHandler handler);
  ~HttpServer();  // StopAccepting + waits for every connection thread

  void Start();
  int port() const { return port_; }
  // Closes the listening socket and idle keep-alive connections; in-flight requests go on.
  void StopAccepting();
  // Waits until no connection is open, at most until `deadline`; true if all closed.
  bool WaitForConnections(std::chrono::steady_clock::time_point deadline);
  int open_connections() const { return open_connections_.load(); }
  int64_t rejected_connections() const { return rejected_connections_.load(); }

 private:
  HttpServer(HttpServerOptions options, HttpHandler handler, int listen_fd, int port);
  void AcceptLoop();
  void ServeConnection(int fd);

  HttpServerOptions options_;
  HttpHandler handler_;
  int listen_fd_ = -1;
  int port_ = 0;
  // Closing stop_write_fd_ makes stop_read_fd_ readable in every poll(): a broadcast "stop".
  int stop_read_fd_ = -1;
  int stop_write_fd_ = -1;
  std::thread accept_thread_;
  std::atomic<int> open_connections_{0};
  std::atomic<int64_t> rejected_connections_{0};
  std::mutex mu_;
  std::condition_variable connections_cv_;
  bool stopped_ = false;
};

}  // namespace dsinfer::server
