// Deadline-bounded socket reads for Beast's synchronous HTTP parsers. Shared by the server (reading
// requests: a client that trickles bytes, a slow loris, cannot hold a connection thread forever)
// and the measure client (reading responses: a stalled server cannot hang a benchmark). POSIX
// sockets only; no Asio I/O objects.
#pragma once

#include <boost/asio/buffer.hpp>
#include <boost/system/error_code.hpp>
#include <boost/system/system_error.hpp>
#include <chrono>
#include <cstddef>

namespace dsinfer::net {

using Clock = std::chrono::steady_clock;

// Milliseconds from now until `deadline`, clamped to [0, 2^30] so it fits poll()'s timeout.
int MillisUntil(Clock::time_point deadline);

// One recv() into `buffer` after waiting for readability at most until `deadline`. Returns the
// byte count (> 0) or 0 with `ec` set: asio::error::timed_out past the deadline, asio::error::eof
// when the peer closed, the errno otherwise. EINTR/EAGAIN are retried.
size_t RecvSomeUntil(int fd, boost::asio::mutable_buffer buffer, Clock::time_point deadline,
                     boost::system::error_code& ec);

// Beast's SyncReadStream over a connected socket: each read waits at most until the deadline.
class DeadlineSocketStream {
 public:
  DeadlineSocketStream(int fd, Clock::time_point deadline) : fd_(fd), deadline_(deadline) {}
  void set_deadline(Clock::time_point deadline) { deadline_ = deadline; }

  // Reads into the first buffer of the sequence only (Beast passes a single buffer).
  template <class MutableBufferSequence>
  size_t read_some(const MutableBufferSequence& buffers, boost::system::error_code& ec) {
    ec = {};
    auto first = boost::asio::buffer_sequence_begin(buffers);
    if (first == boost::asio::buffer_sequence_end(buffers)) return 0;
    boost::asio::mutable_buffer buffer = *first;
    if (buffer.size() == 0) return 0;
    return RecvSomeUntil(fd_, buffer, deadline_, ec);
  }
  // Beast's trait also requires the throwing overload; its parsers only call the one above.
  template <class MutableBufferSequence>
  size_t read_some(const MutableBufferSequence& buffers) {
    boost::system::error_code ec;
    size_t n = read_some(buffers, ec);
    if (ec) throw boost::system::system_error(ec);
    return n;
  }

 private:
  int fd_;
  Clock::time_point deadline_;
};

}  // namespace dsinfer::net
