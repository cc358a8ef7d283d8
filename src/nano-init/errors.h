#pragma once
// Errors as data: every privileged step throws StepError naming the literal call that failed
// and errno, once, at the failing syscall; callers only add which start-up step it was.

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>

namespace nanoinit {

class StepError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Throws StepError("<call>: <strerror(errno)>" + hint).
[[noreturn]] inline void throwErrno(const std::string& call, const std::string& hint = "") {
  const int err = errno;
  throw StepError(call + ": " + std::strerror(err) + hint);
}

}  // namespace nanoinit
