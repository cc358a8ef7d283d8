#pragma once
// Whether a path names a Unix socket (stat(2), S_ISSOCK). Header only, with no dependency, so
// the static nano-init can use it too.

#include <sys/stat.h>

#include <string>

namespace common {

/// True if `path` exists (following symlinks, stat(2)) and is a socket. Never throws.
inline bool isSocket(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode);
}

}  // namespace common
