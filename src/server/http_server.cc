#include "server/http_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/buffer.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/string.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>

#include "net/deadline_stream.h"

namespace dsinfer::server {
namespace {

namespace beast = boost::beast;
namespace http = boost::beast::http;
using Clock = net::Clock;

using net::DeadlineSocketStream;
using net::MillisUntil;

const char* Reason(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 204:
      return "No Content";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 403:
      return "Forbidden";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 413:
      return "Payload Too Large";
    case 422:
      return "Unprocessable Entity";
    case 429:
      return "Too Many Requests";
    case 431:
      return "Request Header Fields Too Large";
    case 500:
      return "Internal Server Error";
    case 503:
      return "Service Unavailable";
    case 529:
      return "Overloaded";
    default:
      return "Status";
  }
}

// Writes all of `data`, waiting for writability at most `timeout` per stall.
bool WriteAll(int fd, std::string_view data, std::chrono::milliseconds timeout) {
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::send(fd, data.data() + done, data.size() - done, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd pfd{fd, POLLOUT, 0};
      int r = ::poll(&pfd, 1, static_cast<int>(timeout.count()));
      if (r <= 0 || (pfd.revents & (POLLERR | POLLHUP))) return false;
      continue;
    }
    return false;
  }
  return true;
}

std::string StatusAndHeaders(int status, std::string_view content_type, const HeaderList& extra,
                             bool keep_alive, std::string_view length_or_chunked) {
  std::string head = "HTTP/1.1 " + std::to_string(status) + " " + Reason(status) + "\r\n";
  if (!content_type.empty()) head.append("Content-Type: ").append(content_type).append("\r\n");
  for (const auto& [name, value] : extra)
    head.append(name).append(": ").append(value).append("\r\n");
  head.append(length_or_chunked).append("\r\n");
  head.append(keep_alive ? "Connection: keep-alive\r\n" : "Connection: close\r\n");
  head.append("\r\n");
  return head;
}

class SocketResponseSink final : public ResponseSink {
 public:
  // `head_only`: a HEAD request, answered with the headers a GET would get and no body.
  SocketResponseSink(int fd, bool keep_alive, std::chrono::milliseconds write_timeout,
                     bool head_only)
      : fd_(fd), keep_alive_(keep_alive), write_timeout_(write_timeout), head_only_(head_only) {}

  void Send(int status, std::string_view content_type, std::string_view body,
            const HeaderList& extra_headers) override {
    if (responded_) return;
    responded_ = true;
    std::string out = StatusAndHeaders(status, content_type, extra_headers, keep_alive_,
                                       "Content-Length: " + std::to_string(body.size()));
    if (!head_only_) out.append(body);
    if (!WriteAll(fd_, out, write_timeout_)) broken_ = true;
  }
  bool BeginStream(int status, std::string_view content_type,
                   const HeaderList& extra_headers) override {
    if (responded_) return false;
    responded_ = true;
    streaming_ = true;
    std::string out = StatusAndHeaders(status, content_type, extra_headers, keep_alive_,
                                       "Transfer-Encoding: chunked");
    if (!WriteAll(fd_, out, write_timeout_)) broken_ = true;
    return !broken_;
  }
  bool WriteChunk(std::string_view data) override {
    if (broken_ || !streaming_ || ended_ || head_only_) return false;
    if (data.empty()) return true;  // an empty chunk would end the body
    char size_line[32];
    std::snprintf(size_line, sizeof(size_line), "%zx\r\n", data.size());
    std::string out = size_line;
    out.append(data).append("\r\n");
    if (!WriteAll(fd_, out, write_timeout_)) broken_ = true;
    return !broken_;
  }
  void EndStream() override {
    if (!streaming_ || ended_) return;
    ended_ = true;
    if (!broken_ && !head_only_ && !WriteAll(fd_, "0\r\n\r\n", write_timeout_)) broken_ = true;
  }
  bool ClientGone() override {
    if (broken_) return true;
    pollfd pfd{fd_, POLLIN | POLLRDHUP, 0};
    if (::poll(&pfd, 1, 0) <= 0) return false;
    if (pfd.revents & (POLLRDHUP | POLLHUP | POLLERR)) return broken_ = true;
    if (pfd.revents & POLLIN) {
      // Pipelined bytes are not a disconnect; a zero-length peek is.
      char byte;
      ssize_t n = ::recv(fd_, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) return broken_ = true;
    }
    return false;
  }

  bool responded() const { return responded_; }
  // The connection can carry another request only after a complete, intact response.
  bool reusable() const { return keep_alive_ && responded_ && !broken_ && (!streaming_ || ended_); }

 private:
  int fd_;
  bool keep_alive_;
  std::chrono::milliseconds write_timeout_;
  bool responded_ = false;
  bool streaming_ = false;
  bool ended_ = false;
  bool broken_ = false;
  bool head_only_ = false;
};

// The OpenAI error shape. The message is escaped (an exception's text can quote request bytes)
// and ill-formed UTF-8 in it replaced.
std::string PlainErrorJson(std::string_view message,
                           std::string_view type = "invalid_request_error") {
  const nlohmann::ordered_json body = {
      {"error", {{"message", message}, {"type", type}, {"param", nullptr}, {"code", nullptr}}}};
  return body.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

void SendEarlyError(int fd, int status, std::string_view message,
                    std::chrono::milliseconds timeout) {
  std::string body = PlainErrorJson(message);
  std::string out = StatusAndHeaders(status, "application/json", {}, false,
                                     "Content-Length: " + std::to_string(body.size()));
  out.append(body);
  WriteAll(fd, out, timeout);
}

// After an early error the client may still be sending its body; closing with unread data
// would reset the connection and destroy our response. Read and discard for a short while first.
void LingeringClose(int fd) {
  ::shutdown(fd, SHUT_WR);
  auto deadline = Clock::now() + std::chrono::seconds(2);
  char sink[16384];
  size_t drained = 0;
  while (drained < (64u << 20)) {
    int wait_ms = MillisUntil(deadline);
    if (wait_ms <= 0) return;
    pollfd pfd{fd, POLLIN, 0};
    if (::poll(&pfd, 1, wait_ms) <= 0) return;
    ssize_t n = ::recv(fd, sink, sizeof(sink), 0);
    if (n <= 0) return;
    drained += static_cast<size_t>(n);
  }
}

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return out;
}

}  // namespace

const std::string* HttpRequest::Header(std::string_view lower_name) const {
  for (const auto& [name, value] : headers)
    if (name == lower_name) return &value;
  return nullptr;
}

Result<std::unique_ptr<HttpServer>> HttpServer::Listen(HttpServerOptions options,
                                                       HttpHandler handler) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(options.port));
  std::string host = options.host == "localhost" ? "127.0.0.1" : options.host;
  if (::inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1)
    return InvalidArgument("--host must be an IPv4 address, got '" + options.host + "'");
  if (options.port < 0 || options.port > 65535) return InvalidArgument("--port out of range");
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return IoError(std::string("socket: ") + std::strerror(errno));
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    int err = errno;
    ::close(fd);
    return IoError("bind " + host + ":" + std::to_string(options.port) + ": " + std::strerror(err));
  }
  if (::listen(fd, 512) != 0) {
    int err = errno;
    ::close(fd);
    return IoError(std::string("listen: ") + std::strerror(err));
  }
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  int port = ntohs(addr.sin_port);
  return std::unique_ptr<HttpServer>(
      new HttpServer(std::move(options), std::move(handler), fd, port));
}

HttpServer::HttpServer(HttpServerOptions options, HttpHandler handler, int listen_fd, int port)
    : options_(std::move(options)),
      handler_(std::move(handler)),
      listen_fd_(listen_fd),
      port_(port) {
  int fds[2];
  DSINFER_CHECK(::pipe2(fds, O_CLOEXEC) == 0);
  stop_read_fd_ = fds[0];
  stop_write_fd_ = fds[1];
}

HttpServer::~HttpServer() {
  StopAccepting();
  // Connection threads hold `this`; every one ends within its deadlines once stopped.
  std::unique_lock lock(mu_);
  connections_cv_.wait(lock, [&] { return open_connections_.load() == 0; });
  lock.unlock();
  ::close(stop_read_fd_);
}

void HttpServer::Start() {
  accept_thread_ = std::thread([this] { AcceptLoop(); });
}

void HttpServer::StopAccepting() {
  {
    std::lock_guard lock(mu_);
    if (stopped_) return;
    stopped_ = true;
  }
  ::close(stop_write_fd_);  // wakes the accept loop and idle connections
  if (accept_thread_.joinable()) accept_thread_.join();
  ::close(listen_fd_);
}

bool HttpServer::WaitForConnections(std::chrono::steady_clock::time_point deadline) {
  std::unique_lock lock(mu_);
  return connections_cv_.wait_until(lock, deadline, [&] { return open_connections_.load() == 0; });
}

void HttpServer::AcceptLoop() {
  for (;;) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {stop_read_fd_, POLLIN, 0}};
    int r = ::poll(fds, 2, -1);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 || (fds[1].revents != 0)) return;
    if (!(fds[0].revents & POLLIN)) continue;
    int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;  // EMFILE, ECONNABORTED...: keep serving the others
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (open_connections_.load() >= options_.max_connections) {
      ++rejected_connections_;
      std::string body = PlainErrorJson("too many open connections");
      std::string out = StatusAndHeaders(503, "application/json", {{"Retry-After", "1"}}, false,
                                         "Content-Length: " + std::to_string(body.size()));
      out.append(body);
      WriteAll(fd, out, std::chrono::milliseconds(100));
      ::close(fd);
      continue;
    }
    ++open_connections_;
    std::thread([this, fd] {
      ServeConnection(fd);
      ::close(fd);
      std::lock_guard lock(mu_);
      --open_connections_;
      connections_cv_.notify_all();
    }).detach();
  }
}

void HttpServer::ServeConnection(int fd) {
  beast::flat_buffer buffer;
  for (bool first = true;; first = false) {
    // Wait for the next request's first byte: idle connections end on stop or keep-alive expiry.
    if (buffer.size() == 0) {
      pollfd fds[2] = {{fd, POLLIN, 0}, {stop_read_fd_, POLLIN, 0}};
      int wait_ms = static_cast<int>(first ? options_.header_timeout.count()
                                           : options_.keep_alive_timeout.count());
      int r;
      do r = ::poll(fds, 2, wait_ms);
      while (r < 0 && errno == EINTR);
      if (r <= 0 || fds[1].revents != 0 || !(fds[0].revents & POLLIN)) return;
    }
    http::request_parser<http::string_body> parser;
    parser.header_limit(static_cast<uint32_t>(options_.max_header_bytes));
    parser.body_limit(options_.max_body_bytes);
    DeadlineSocketStream stream(fd, Clock::now() + options_.header_timeout);
    boost::system::error_code ec;
    try {
      http::read_header(stream, buffer, parser, ec);
      if (!ec && !parser.is_done()) {
        // curl and others wait for this before sending a large body.
        auto expect = parser.get().find(http::field::expect);
        if (expect != parser.get().end() && beast::iequals(expect->value(), "100-continue"))
          WriteAll(fd, "HTTP/1.1 100 Continue\r\n\r\n", options_.write_timeout);
        stream.set_deadline(Clock::now() + options_.body_timeout);
        http::read(stream, buffer, parser, ec);
      }
    } catch (const std::exception&) {
      ec = boost::asio::error::fault;
    }
    if (ec) {
      if (ec == http::error::header_limit) {
        SendEarlyError(fd, 431, "request headers too large", options_.write_timeout);
      } else if (ec == http::error::body_limit) {
        SendEarlyError(fd, 413, "request body too large", options_.write_timeout);
        LingeringClose(fd);
      } else if (ec == boost::asio::error::timed_out) {
        SendEarlyError(fd, 408, "request timed out", options_.write_timeout);
      } else if (ec != boost::asio::error::eof && ec != http::error::end_of_stream &&
                 ec != http::error::partial_message) {
        SendEarlyError(fd, 400, "malformed HTTP request", options_.write_timeout);
      }
      return;
    }
    const auto& msg = parser.get();
    HttpRequest request;
    request.method = std::string(msg.method_string());
    std::string_view target(msg.target().data(), msg.target().size());
    size_t q = target.find('?');
    request.path = std::string(target.substr(0, q));
    if (q != std::string_view::npos) request.query = std::string(target.substr(q + 1));
    for (const auto& field : msg)
      request.headers.emplace_back(
          Lower(std::string_view(field.name_string().data(), field.name_string().size())),
          std::string(field.value().data(), field.value().size()));
    request.body = msg.body();
    bool stopping;
    {
      std::lock_guard lock(mu_);
      stopping = stopped_;
    }
    SocketResponseSink sink(fd, msg.keep_alive() && !stopping, options_.write_timeout,
                            request.method == "HEAD");
    std::string failure = "no response";
    try {
      handler_(request, sink);
    } catch (const std::exception& e) {
      // Handlers report errors as responses; this only guards the connection thread (and says
      // what escaped, so that a report of the 500 can be traced; fuzz_service looks for these).
      failure = std::string("internal error: ") + e.what();
    }
    if (!sink.responded())
      sink.Send(500, "application/json", PlainErrorJson(failure, "server_error"), {});
    if (!sink.reusable()) return;
  }
}

}  // namespace dsinfer::server
