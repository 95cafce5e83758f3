// HttpCall against a one-shot socket server in a thread: a chunked SSE response written in
// pieces, a length-delimited body collected whole, a server that never answers (the deadline must
// fire), and a refused connection.
#include "measure/http_client.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>

#include "measure/sse.h"

namespace dsinfer::measure {
namespace {

// Listens on 127.0.0.1, an ephemeral port.
struct Listener {
  int fd = -1;
  int port = 0;
  Listener() {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    EXPECT_EQ(::listen(fd, 4), 0);
    socklen_t len = sizeof(a);
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    port = ntohs(a.sin_port);
  }
  ~Listener() { ::close(fd); }
};

std::string ReadRequest(int c) {
  std::string req;
  char buf[4096];
  while (req.find("\r\n\r\n") == std::string::npos) {
    ssize_t n = ::recv(c, buf, sizeof(buf), 0);
    if (n <= 0) break;
    req.append(buf, static_cast<size_t>(n));
  }
  return req;
}

TEST(HttpClient, StreamsAChunkedSseBodyInPieces) {
  Listener l;
  std::string seen_request;
  std::thread server([&] {
    int c = ::accept(l.fd, nullptr, nullptr);
    seen_request = ReadRequest(c);
    const std::string pieces[] = {
        "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n",
        "a\r\ndata: {\"a\"\r\n", "5\r\n:1}\n\n\r\n", "e\r\ndata: [DONE]\n\n\r\n", "0\r\n\r\n"};
    for (const auto& p : pieces) {
      ::send(c, p.data(), p.size(), MSG_NOSIGNAL);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ::close(c);
  });
  auto url = ParseUrl("http://127.0.0.1:" + std::to_string(l.port));
  ASSERT_TRUE(url.ok());
  HttpRequestSpec req;
  req.path = "/v1/completions";
  req.headers = {{"Authorization", "Bearer k"}};
  req.body = "{}";
  req.timeout_s = 10;
  SseReader sse;
  std::vector<std::string> events;
  int pieces = 0;
  auto r = HttpCall(*url, req, [&](std::string_view b) {
    ++pieces;
    for (auto& e : sse.Feed(b)) events.push_back(e);
  });
  server.join();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->status, 200);
  EXPECT_GE(pieces, 2);  // delivered as it arrived, not at the end
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0], "{\"a\":1}");
  EXPECT_TRUE(sse.done());
  EXPECT_NE(seen_request.find("POST /v1/completions HTTP/1.1"), std::string::npos);
  EXPECT_NE(seen_request.find("Authorization: Bearer k"), std::string::npos);
}

TEST(HttpClient, CollectsALengthDelimitedBody) {
  Listener l;
  std::string seen_request;
  const std::string body(40000, 'm');  // larger than one body read
  std::thread server([&] {
    int c = ::accept(l.fd, nullptr, nullptr);
    seen_request = ReadRequest(c);
    const std::string out = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: " +
                            std::to_string(body.size()) + "\r\n\r\n" + body;
    ::send(c, out.data(), out.size(), MSG_NOSIGNAL);
    ::close(c);
  });
  auto url = ParseUrl("http://127.0.0.1:" + std::to_string(l.port));
  ASSERT_TRUE(url.ok());
  HttpRequestSpec req;
  req.method = "GET";
  req.path = "/metrics";
  req.timeout_s = 10;
  auto r = HttpCall(*url, req);
  server.join();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->body, body);
  EXPECT_EQ(seen_request.rfind("GET /metrics HTTP/1.1\r\n", 0), 0u);
  EXPECT_EQ(seen_request.find("Content-Length"), std::string::npos);  // a GET has no body
}

TEST(HttpClient, DeadlineFiresWhenTheServerNeverAnswers) {
  Listener l;  // the kernel accepts into the backlog; nobody ever answers
  auto url = ParseUrl("http://127.0.0.1:" + std::to_string(l.port));
  HttpRequestSpec req;
  req.path = "/x";
  req.timeout_s = 0.3;
  const auto t0 = std::chrono::steady_clock::now();
  auto r = HttpCall(*url, req);
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_FALSE(r.ok());
  EXPECT_LT(waited, 5.0);
  EXPECT_GE(waited, 0.25);
}

TEST(HttpClient, RefusedConnectionIsAnError) {
  int port = 0;
  {
    Listener l;
    port = l.port;
  }  // closed: nothing listens there now
  auto url = ParseUrl("http://127.0.0.1:" + std::to_string(port));
  HttpRequestSpec req;
  req.path = "/x";
  req.timeout_s = 2;
  auto r = HttpCall(*url, req);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("connect"), std::string::npos) << r.status().ToString();
}

TEST(HttpClient, ParseUrl) {
  auto u = ParseUrl("http://localhost:8080/proxy/");
  ASSERT_TRUE(u.ok());
  EXPECT_EQ(u->host, "localhost");
  EXPECT_EQ(u->port, 8080);
  EXPECT_EQ(u->path_prefix, "/proxy");
  EXPECT_EQ(ParseUrl("http://h")->port, 80);
  EXPECT_FALSE(ParseUrl("https://h").ok());
  EXPECT_FALSE(ParseUrl("http://h:99999").ok());
}

}  // namespace
}  // namespace dsinfer::measure
