#include "net/http_client.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/buffer_body.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <limits>

#include "net/deadline_stream.h"

namespace dsinfer::net {
namespace {

namespace http = boost::beast::http;
// Closes the socket on every path out.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

Status SendAll(int fd, std::string_view data, Clock::time_point deadline) {
  while (!data.empty()) {
    const int wait_ms = MillisUntil(deadline);
    if (wait_ms <= 0) return Status(StatusCode::kCancelled, "timed out sending the request");
    pollfd pfd{fd, POLLOUT, 0};
    if (::poll(&pfd, 1, wait_ms) <= 0) continue;
    const ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n < 0) return IoError(std::string("send: ") + std::strerror(errno));
    data.remove_prefix(static_cast<size_t>(n));
  }
  return Status::Ok();
}

Result<int> Connect(const Url& url) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(url.port);
  if (int rc = ::getaddrinfo(url.host.c_str(), port.c_str(), &hints, &found); rc != 0)
    return IoError("resolve " + url.host + ": " + ::gai_strerror(rc));
  int fd = -1;
  std::string last_error = "no address";
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd < 0) continue;
    if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) break;
    last_error = std::strerror(errno);
    ::close(fd);
    fd = -1;
  }
  ::freeaddrinfo(found);
  if (fd < 0) return IoError("connect " + url.host + ":" + port + ": " + last_error);
  return fd;
}

}  // namespace

Result<Url> ParseUrl(const std::string& text) {
  const std::string scheme = "http://";
  if (text.rfind(scheme, 0) != 0)
    return InvalidArgument("url '" + text + "': only http:// is supported");
  std::string rest = text.substr(scheme.size());
  Url url;
  const size_t slash = rest.find('/');
  if (slash != std::string::npos) {
    url.path_prefix = rest.substr(slash);
    while (!url.path_prefix.empty() && url.path_prefix.back() == '/') url.path_prefix.pop_back();
    rest = rest.substr(0, slash);
  }
  const size_t colon = rest.rfind(':');
  if (colon != std::string::npos) {
    char* end = nullptr;
    const long port = std::strtol(rest.c_str() + colon + 1, &end, 10);
    if (*end != '\0' || port <= 0 || port > 65535)
      return InvalidArgument("url '" + text + "': bad port");
    url.port = static_cast<int>(port);
    rest = rest.substr(0, colon);
  }
  if (rest.empty()) return InvalidArgument("url '" + text + "': no host");
  url.host = rest;
  return url;
}

Result<HttpResult> HttpCall(const Url& url, const HttpRequestSpec& request,
                            const std::function<void(std::string_view)>& on_body) {
  const auto deadline =
      Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(request.timeout_s * 1000));
  DSINFER_ASSIGN_OR_RETURN(int raw_fd, Connect(url));
  Fd fd{raw_fd};
  std::string head = request.method + " " + url.path_prefix + request.path + " HTTP/1.1\r\n";
  head += "Host: " + url.host + ":" + std::to_string(url.port) + "\r\n";
  head += "Connection: close\r\n";
  for (const auto& [k, v] : request.headers) head += k + ": " + v + "\r\n";
  if (!request.body.empty() || request.method == "POST")
    head += "Content-Length: " + std::to_string(request.body.size()) + "\r\n";
  head += "\r\n";
  DSINFER_RETURN_IF_ERROR(SendAll(fd.fd, head + request.body, deadline));

  DeadlineSocketStream stream(fd.fd, deadline);
  boost::beast::flat_buffer buffer;
  http::response_parser<http::buffer_body> parser;
  // No body limit. Not boost::none: Boost 1.74's parser compares a Content-Length against the
  // optional limit with `len > limit`, which is true for an empty optional, so every
  // length-delimited body would fail with body_limit (only chunked streams got through).
  parser.body_limit(std::numeric_limits<std::uint64_t>::max());
  boost::system::error_code ec;
  http::read_header(stream, buffer, parser, ec);
  if (ec) return IoError("reading the response header: " + ec.message());
  HttpResult result;
  result.status = static_cast<int>(parser.get().result_int());
  char piece[16384];  // one body read's bytes
  while (!parser.is_done()) {
    parser.get().body().data = piece;
    parser.get().body().size = sizeof(piece);
    http::read_some(stream, buffer, parser, ec);  // returns as soon as some body arrived
    if (ec == http::error::need_buffer) ec = {};
    if (ec) return IoError("reading the response body: " + ec.message());
    const size_t n = sizeof(piece) - parser.get().body().size;
    if (n == 0) continue;
    if (on_body) {
      on_body(std::string_view(piece, n));
    } else {
      result.body.append(piece, n);
    }
  }
  return result;
}

}  // namespace dsinfer::net
