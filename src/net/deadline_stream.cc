#include "net/deadline_stream.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <boost/asio/error.hpp>
#include <cerrno>
#include <cstdint>

namespace dsinfer::net {

int MillisUntil(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return static_cast<int>(std::clamp<int64_t>(left.count(), 0, 1 << 30));
}

size_t RecvSomeUntil(int fd, boost::asio::mutable_buffer buffer, Clock::time_point deadline,
                     boost::system::error_code& ec) {
  ec = {};
  for (;;) {
    const int wait_ms = MillisUntil(deadline);
    if (wait_ms <= 0) {
      ec = boost::asio::error::timed_out;
      return 0;
    }
    pollfd pfd{fd, POLLIN, 0};
    const int r = ::poll(&pfd, 1, wait_ms);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      ec = boost::system::error_code(errno, boost::system::system_category());
      return 0;
    }
    if (r == 0) continue;  // poll's clock may run short of ours: re-check the deadline
    const ssize_t n = ::recv(fd, buffer.data(), buffer.size(), 0);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n < 0) {
      ec = boost::system::error_code(errno, boost::system::system_category());
      return 0;
    }
    if (n == 0) {
      ec = boost::asio::error::eof;
      return 0;
    }
    return static_cast<size_t>(n);
  }
}

}  // namespace dsinfer::net
