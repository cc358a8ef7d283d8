#pragma once
// Owning wrapper for a POSIX file descriptor: the only place in the tree that calls close().

#include <unistd.h>

#include <utility>

namespace common {

/// Owns one file descriptor and closes it on destruction. Move-only. -1 means "none".
class UniqueFd {
 public:
  UniqueFd() = default;
  /// Takes ownership of `fd` (may be -1).
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  UniqueFd(UniqueFd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    if (this != &other) reset(std::exchange(other.fd_, -1));
    return *this;
  }
  ~UniqueFd() { reset(); }

  /// The descriptor, still owned; -1 when empty.
  [[nodiscard]] int get() const { return fd_; }
  [[nodiscard]] bool valid() const { return fd_ >= 0; }
  /// Gives up ownership without closing; returns the descriptor.
  int release() { return std::exchange(fd_, -1); }
  /// Closes the current descriptor (if any) and takes `fd`.
  void reset(int fd = -1) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

}  // namespace common
