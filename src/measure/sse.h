// Incremental Server-Sent Events reader for streamed OpenAI responses. Bytes arrive in arbitrary
// pieces (a `data:` line may be split across reads, or several events may share one read); Feed()
// buffers the partial line and returns every complete `data:` payload in order. Comment lines
// (": keep-alive") and other fields are skipped. The payload `[DONE]` sets done() and is not
// returned. Multi-line data fields of one event are joined with '\n' as the SSE spec says.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace dsinfer::measure {

class SseReader {
 public:
  std::vector<std::string> Feed(std::string_view bytes);
  bool done() const { return done_; }

 private:
  std::string line_;  // the unterminated tail of the last Feed
  std::string data_;  // data lines of the event in progress
  bool has_data_ = false;
  bool done_ = false;
};

}  // namespace dsinfer::measure
