// Status and Result<T>: errors as values at module boundaries.
//
//   Result<Checkpoint> ck = LoadCheckpoint(dir);
//   if (!ck.ok()) return ck.status();          // propagate with its message
//   use(ck.value());
//
// A Status message is one line a user can act on: what was wrong, where (file:line or
// config key), and what is expected. Thread contract: values, no shared state.
#pragma once

#include <optional>
#include <string>
#include <utility>

namespace echelon {

enum class StatusCode { kOk = 0, kInvalidArgument, kNotFound, kDataLoss, kFailedPrecondition, kInternal, kUnavailable, kAborted,
                        kDeadlineExceeded, kResourceExhausted, kCancelled };

class Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // Prefixes context ("loading run/checkpoints/final: ") to a failure; no-op on success.
  Status WithContext(const std::string& context) const {
    if (ok()) return *this;
    return Status(code_, context + ": " + message_);
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status InvalidArgument(std::string m) { return Status(StatusCode::kInvalidArgument, std::move(m)); }
inline Status NotFound(std::string m) { return Status(StatusCode::kNotFound, std::move(m)); }
inline Status DataLoss(std::string m) { return Status(StatusCode::kDataLoss, std::move(m)); }
inline Status FailedPrecondition(std::string m) { return Status(StatusCode::kFailedPrecondition, std::move(m)); }
inline Status Internal(std::string m) { return Status(StatusCode::kInternal, std::move(m)); }
inline Status Aborted(std::string m) { return Status(StatusCode::kAborted, std::move(m)); }
inline Status Unavailable(std::string m) { return Status(StatusCode::kUnavailable, std::move(m)); }
inline Status DeadlineExceeded(std::string m) { return Status(StatusCode::kDeadlineExceeded, std::move(m)); }
inline Status ResourceExhausted(std::string m) { return Status(StatusCode::kResourceExhausted, std::move(m)); }
inline Status Cancelled(std::string m) { return Status(StatusCode::kCancelled, std::move(m)); }

template <typename T>
class Result {
 public:
  Result(T value) : value_(std::move(value)) {}              // NOLINT(runtime/explicit)
  Result(Status status) : status_(std::move(status)) {}      // NOLINT(runtime/explicit)

  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }
  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  // By value: `for (auto& x : F().value())` must not bind to a temporary Result's inside.
  T value() && { return std::move(*value_); }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }

 private:
  Status status_;
  std::optional<T> value_;
};

}  // namespace echelon

#define ECHELON_RETURN_IF_ERROR(expr)          \
  do {                                         \
    ::echelon::Status _st = (expr);            \
    if (!_st.ok()) return _st;                 \
  } while (0)

#define ECHELON_CONCAT_INNER(a, b) a##b
#define ECHELON_CONCAT(a, b) ECHELON_CONCAT_INNER(a, b)
#define ECHELON_ASSIGN_OR_RETURN(lhs, expr) \
  ECHELON_ASSIGN_OR_RETURN_IMPL(ECHELON_CONCAT(_res_, __LINE__), lhs, expr)
#define ECHELON_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                  \
  if (!tmp.ok()) return tmp.status();                 \
  lhs = std::move(tmp).value()
