#include "measure/sse.h"

namespace dsinfer::measure {

std::vector<std::string> SseReader::Feed(std::string_view bytes) {
  std::vector<std::string> events;
  for (char c : bytes) {
    if (c != '\n') {
      line_.push_back(c);
      continue;
    }
    if (!line_.empty() && line_.back() == '\r') line_.pop_back();
    if (line_.empty()) {  // blank line: the event ends
      if (has_data_) {
        if (data_ == "[DONE]") {
          done_ = true;
        } else {
          events.push_back(data_);
        }
      }
      data_.clear();
      has_data_ = false;
    } else if (line_.rfind("data:", 0) == 0) {
      std::string_view value = std::string_view(line_).substr(5);
      if (!value.empty() && value.front() == ' ') value.remove_prefix(1);
      if (has_data_) data_.push_back('\n');
      data_.append(value);
      has_data_ = true;
    }
    line_.clear();
  }
  return events;
}

}  // namespace dsinfer::measure
