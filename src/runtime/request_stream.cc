#include <mutex>

#include "runtime/engine.h"

namespace dsinfer::runtime {

const char* FinishReasonName(FinishReason r) {
  switch (r) {
    case FinishReason::kNone:
      return "none";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kCancelled:
      return "cancelled";
    case FinishReason::kError:
      return "error";
  }
  return "none";
}

std::optional<StreamEvent> RequestStream::Next(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, timeout, [&] { return !events_.empty(); })) return std::nullopt;
  StreamEvent ev = std::move(events_.front());
  events_.pop_front();
  return ev;
}

void RequestStream::Cancel() {
  std::lock_guard<std::mutex> lock(mu_);
  cancelled_ = true;
}

bool RequestStream::cancelled() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cancelled_;
}

void RequestStream::Push(StreamEvent event) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (event.finished) ++n_finished_;
    events_.push_back(std::move(event));
  }
  cv_.notify_all();
}

int RequestStream::n_finished() const {
  std::lock_guard<std::mutex> lock(mu_);
  return n_finished_;
}

}  // namespace dsinfer::runtime
