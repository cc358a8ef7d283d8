#include "compass-runner/state_roots.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/unique_fd.h"
#include "compass-runner/backend.h"

namespace runner {
namespace {

// FNV-1a, 64 bits, as 16 hex digits: a file name for a path.
std::string entryName(const std::string& root) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (const unsigned char c : root) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string name(16, '0');
  for (int i = 15; i >= 0; --i, h >>= 4) name[static_cast<size_t>(i)] = kHex[h & 0xF];
  return name;
}

void checkRegistry(const std::string& registry) {
  if (::mkdir(registry.c_str(), 0700) != 0 && errno != EEXIST) {
    throw RunnerError("state roots: mkdir(" + registry + "): " + std::strerror(errno));
  }
  struct stat st {};
  if (::lstat(registry.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != ::geteuid() ||
      (st.st_mode & 022) != 0) {
    throw RunnerError("state roots: " + registry +
                      " must be a directory owned by the runner's user and not writable by "
                      "others");
  }
}

}  // namespace

void registerStateRoot(const std::string& root, const std::string& registry) {
  const std::string path = registry + "/" + entryName(root);
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode)) return;
  checkRegistry(registry);
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  common::UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
  const std::string text = root + "\n";
  if (!fd.valid() ||
      ::write(fd.get(), text.data(), text.size()) != static_cast<ssize_t>(text.size())) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throw RunnerError("state roots: write(" + tmp + "): " + std::strerror(err));
  }
  fd.reset();
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throw RunnerError("state roots: rename(" + tmp + "): " + std::strerror(err));
  }
}

std::vector<std::string> knownStateRoots(const std::string& own, const std::string& registry) {
  std::vector<std::string> roots = {own};
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(registry, ec)) {
    if (e.path().filename().string().find(".tmp.") != std::string::npos) continue;
    std::ifstream in(e.path());
    std::string root;
    std::getline(in, root);
    if (root.empty() || root.front() != '/') continue;
    std::error_code dir_ec;
    if (!std::filesystem::is_directory(root, dir_ec)) {
      if (!dir_ec || dir_ec == std::errc::no_such_file_or_directory) {
        std::filesystem::remove(e.path(), dir_ec);  // that root is gone
      }
      continue;
    }
    if (std::find(roots.begin(), roots.end(), root) == roots.end()) roots.push_back(root);
  }
  return roots;
}

}  // namespace runner
