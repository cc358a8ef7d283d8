#include "compass-runner/state_roots.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>

#include "compass-runner/state.h"

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

}  // namespace

void registerStateRoot(const std::string& root, const std::string& registry) {
  const std::string path = registry + "/" + entryName(root);
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode)) return;
  ensurePrivateDir(registry, "state roots");
  writeFileAtomically(path, root + "\n", 0600, "state roots");
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
