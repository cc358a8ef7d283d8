#pragma once
// Reading a small file that may be hostile or misplaced (a FIFO, /dev/zero, a directory bound
// where a config or resolv.conf should be): open(2) with O_NONBLOCK so a FIFO cannot block,
// fstat(2) so only a regular file is read, and a size cap so nothing exhausts memory. Header
// only, with no dependency, so the static nano-init can use it too.

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <optional>
#include <string>

#include "common/unique_fd.h"

namespace common {

/// The whole text of the regular file at `path`, at most `max_bytes` bytes. On failure returns
/// nullopt and sets *error (if given) to the reason: the open(2) errno text, "is a directory",
/// "is not a regular file", "is larger than N bytes", or the read(2) errno text. Never blocks
/// on a FIFO or device; /proc files (regular, size 0) are read to their end.
inline std::optional<std::string> readRegularFile(const std::string& path, size_t max_bytes,
                                                  std::string* error = nullptr) {
  auto fail = [&](const std::string& why) -> std::optional<std::string> {
    if (error != nullptr) *error = why;
    return std::nullopt;
  };
  const UniqueFd fd(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY));
  if (!fd.valid()) return fail(std::strerror(errno));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return fail(std::strerror(errno));
  if (S_ISDIR(st.st_mode)) return fail("is a directory");
  if (!S_ISREG(st.st_mode)) return fail("is not a regular file");
  std::string text;
  std::array<char, 4096> buf{};
  for (;;) {
    const ssize_t n = ::read(fd.get(), buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return fail(std::strerror(errno));
    if (n == 0) return text;
    if (text.size() + static_cast<size_t>(n) > max_bytes) {
      return fail("is larger than " + std::to_string(max_bytes) + " bytes");
    }
    text.append(buf.data(), static_cast<size_t>(n));
  }
}

}  // namespace common
