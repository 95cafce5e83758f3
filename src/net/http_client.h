// A small blocking HTTP/1.1 client (the measure tools driving OpenAI-compatible servers; a
// decode worker asking a prefill worker for a bootstrap room): plain TCP (http://
// only), one connection per request (Connection: close), a deadline on every read and write, and
// the response body delivered piece by piece as it arrives (so SSE streams can be timed per chunk).
// Beast parses the response (chunked or length-delimited); the socket work is POSIX.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace dsinfer::net {

struct Url {
  std::string host;
  int port = 80;
  std::string path_prefix;  // e.g. "" or "/proxy"; request paths are appended to it
};
// "http://host:port[/prefix]" -> Url. https is rejected.
Result<Url> ParseUrl(const std::string& text);

struct HttpRequestSpec {
  std::string method = "POST";
  std::string path;  // "/v1/completions"
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
  double timeout_s = 600;  // for the whole exchange
};

struct HttpResult {
  int status = 0;
  std::string body;  // the whole body when no on_body callback was given
};

// Sends the request; on_body (optional) sees each body piece as it is read. Errors are IoError
// (refused connection, a read past the deadline, a malformed response) or kCancelled (a send past
// the deadline); any HTTP status is a success here and lands in HttpResult::status.
Result<HttpResult> HttpCall(const Url& url, const HttpRequestSpec& request,
                            const std::function<void(std::string_view)>& on_body = nullptr);

}  // namespace dsinfer::net
