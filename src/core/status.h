// Status and Result<T>: recoverable failures (I/O, malformed input, capacity) travel as values.
// Broken invariants use DSINFER_CHECK (always on) instead. No exceptions cross library APIs.
// Thread-compatible value types.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <utility>

namespace dsinfer {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,  // the caller's input is malformed (request, CLI flag, file contents)
  kNotFound,         // a file, tensor or key is missing
  kOutOfRange,       // an index or size is past its limit
  kFailedPrecondition,
  kResourceExhausted,  // memory / KV budget / queue full
  kUnimplemented,
  kInternal,
  kIoError,
  kCancelled,
};

const char* StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  std::string ToString() const;

  // Prefixes context ("while loading X: ") so errors name what failed at every level.
  Status WithContext(const std::string& context) const {
    if (ok()) return *this;
    return Status(code_, context + ": " + message_);
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status InvalidArgument(std::string m) {
  return {StatusCode::kInvalidArgument, std::move(m)};
}
inline Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status OutOfRange(std::string m) { return {StatusCode::kOutOfRange, std::move(m)}; }
inline Status IoError(std::string m) { return {StatusCode::kIoError, std::move(m)}; }
inline Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }
inline Status Unimplemented(std::string m) { return {StatusCode::kUnimplemented, std::move(m)}; }
inline Status ResourceExhausted(std::string m) {
  return {StatusCode::kResourceExhausted, std::move(m)};
}
inline Status FailedPrecondition(std::string m) {
  return {StatusCode::kFailedPrecondition, std::move(m)};
}

// Result<T>: either a value or a non-ok Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}         // NOLINT: implicit by design
  Result(Status status) : status_(std::move(status)) {  // NOLINT
    if (status_.ok()) status_ = Internal("Result constructed from an ok Status without a value");
  }

  bool ok() const { return value_.has_value(); }
  const Status& status() const { return status_; }
  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }
  T& operator*() & { return *value_; }
  const T& operator*() const& { return *value_; }

 private:
  std::optional<T> value_;
  Status status_;
};

[[noreturn]] void CheckFailed(const char* file, int line, const char* expr, const std::string& msg);

}  // namespace dsinfer

#define DSINFER_CHECK(cond)                                             \
  do {                                                                  \
    if (!(cond)) ::dsinfer::CheckFailed(__FILE__, __LINE__, #cond, ""); \
  } while (0)
#define DSINFER_CHECK_MSG(cond, msg)                                       \
  do {                                                                     \
    if (!(cond)) ::dsinfer::CheckFailed(__FILE__, __LINE__, #cond, (msg)); \
  } while (0)

#define DSINFER_CONCAT_INNER(a, b) a##b
#define DSINFER_CONCAT(a, b) DSINFER_CONCAT_INNER(a, b)

// Returns the status from the enclosing function if it is not ok.
#define DSINFER_RETURN_IF_ERROR(expr)          \
  do {                                         \
    ::dsinfer::Status _dsinfer_st = (expr);    \
    if (!_dsinfer_st.ok()) return _dsinfer_st; \
  } while (0)

// DSINFER_ASSIGN_OR_RETURN(auto x, MakeX()); returns the error status if MakeX() failed.
#define DSINFER_ASSIGN_OR_RETURN(lhs, rexpr) \
  DSINFER_ASSIGN_OR_RETURN_IMPL(DSINFER_CONCAT(_dsinfer_res_, __LINE__), lhs, rexpr)
#define DSINFER_ASSIGN_OR_RETURN_IMPL(tmp, lhs, rexpr) \
  auto tmp = (rexpr);                                  \
  if (!tmp.ok()) return tmp.status();                  \
  lhs = std::move(tmp).value()
