// DeadlineSocketStream over a socketpair: reads return what was sent, end at the deadline with
// timed_out (also for a peer that trickles bytes, the slow-loris case the server relies on),
// report eof on close, and drive Beast's parser as a SyncReadStream.
#include "net/deadline_stream.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/error.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <string>
#include <thread>

namespace dsinfer::net {
namespace {

namespace http = boost::beast::http;
using namespace std::chrono_literals;

struct SocketPair {
  int fds[2] = {-1, -1};
  SocketPair() { EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0); }
  ~SocketPair() {
    for (int fd : fds)
      if (fd >= 0) ::close(fd);
  }
  void Send(const std::string& s) const {
    ASSERT_EQ(::send(fds[1], s.data(), s.size(), 0), static_cast<ssize_t>(s.size()));
  }
};

TEST(MillisUntil, ClampsPastDeadlinesToZero) {
  EXPECT_EQ(MillisUntil(Clock::now() - 1s), 0);
  const int ms = MillisUntil(Clock::now() + 10s);
  EXPECT_GT(ms, 9000);
  EXPECT_LE(ms, 10000);
}

TEST(DeadlineSocketStream, ReadsWhatWasSent) {
  SocketPair p;
  p.Send("hello");
  DeadlineSocketStream stream(p.fds[0], Clock::now() + 5s);
  char buf[16];
  boost::system::error_code ec;
  const size_t n = stream.read_some(boost::asio::buffer(buf), ec);
  EXPECT_FALSE(ec) << ec.message();
  EXPECT_EQ(std::string(buf, n), "hello");
}

TEST(DeadlineSocketStream, TimesOutAtTheDeadlineWhenNothingArrives) {
  SocketPair p;
  const auto t0 = Clock::now();
  DeadlineSocketStream stream(p.fds[0], t0 + 100ms);
  char buf[16];
  boost::system::error_code ec;
  EXPECT_EQ(stream.read_some(boost::asio::buffer(buf), ec), 0u);
  EXPECT_EQ(ec, boost::asio::error::timed_out);
  const auto waited = Clock::now() - t0;
  EXPECT_GE(waited, 95ms);
  EXPECT_LT(waited, 5s);
}

TEST(DeadlineSocketStream, EofWhenThePeerCloses) {
  SocketPair p;
  ::close(p.fds[1]);
  p.fds[1] = -1;
  DeadlineSocketStream stream(p.fds[0], Clock::now() + 5s);
  char buf[16];
  boost::system::error_code ec;
  EXPECT_EQ(stream.read_some(boost::asio::buffer(buf), ec), 0u);
  EXPECT_EQ(ec, boost::asio::error::eof);
}

TEST(DeadlineSocketStream, BeastParsesARequestThroughIt) {
  SocketPair p;
  p.Send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\nbody");
  DeadlineSocketStream stream(p.fds[0], Clock::now() + 5s);
  boost::beast::flat_buffer buffer;
  http::request_parser<http::string_body> parser;
  boost::system::error_code ec;
  http::read(stream, buffer, parser, ec);
  ASSERT_FALSE(ec) << ec.message();
  EXPECT_EQ(parser.get().target(), "/v1/completions");
  EXPECT_EQ(parser.get().body(), "body");
}

TEST(DeadlineSocketStream, ATricklingPeerCannotOutliveTheDeadline) {
  SocketPair p;
  std::thread trickle([&] {
    const std::string head = "GET / HTTP/1.1\r\nHost: a-long-host-name-sent-one-byte-at-a-time\r\n";
    for (char c : head) {
      if (::send(p.fds[1], &c, 1, MSG_NOSIGNAL) != 1) return;
      std::this_thread::sleep_for(20ms);
    }
  });
  const auto t0 = Clock::now();
  DeadlineSocketStream stream(p.fds[0], t0 + 200ms);
  boost::beast::flat_buffer buffer;
  http::request_parser<http::string_body> parser;
  boost::system::error_code ec;
  http::read_header(stream, buffer, parser, ec);
  EXPECT_EQ(ec, boost::asio::error::timed_out);
  EXPECT_LT(Clock::now() - t0, 1s);
  ::shutdown(p.fds[0], SHUT_RDWR);  // ends the trickler's sends
  trickle.join();
}

}  // namespace
}  // namespace dsinfer::net
