#include "compass-runner/podman_userns.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/unique_fd.h"
#include "compass-runner/backend.h"
#include "compass-runner/state.h"

namespace runner::podman {
namespace {

std::string readAll(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The claim files with their holder's id.
std::vector<std::pair<std::filesystem::path, std::string>> claims(const std::string& dir) {
  std::vector<std::pair<std::filesystem::path, std::string>> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    out.emplace_back(e.path(), readAll(e.path()));
  }
  return out;
}

}  // namespace

IdRange claimIds(const std::string& id, const std::string& claim_dir) {
  ensurePrivateDir(claim_dir, "user namespace");
  for (uint32_t slot = 0; slot < kSlots; ++slot) {
    const std::string path = claim_dir + "/" + std::to_string(slot);
    common::UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
    if (!fd.valid()) {
      if (errno == EEXIST) continue;
      throw RunnerError("user namespace: open(" + path + "): " + std::strerror(errno));
    }
    if (::write(fd.get(), id.data(), id.size()) != static_cast<ssize_t>(id.size())) {
      const int err = errno;
      ::unlink(path.c_str());
      throw RunnerError("user namespace: write(" + path + "): " + std::strerror(err));
    }
    return IdRange{kIdBase + slot * kIdsPerAgent};
  }
  throw RunnerError("user namespace: all " + std::to_string(kSlots) + " host id ranges in " +
                    claim_dir + " are taken (run `compass-runner gc`)");
}

void releaseIds(const std::string& id, const std::string& claim_dir) noexcept {
  try {
    for (const auto& [path, holder] : claims(claim_dir)) {
      if (holder == id) ::unlink(path.c_str());
    }
  } catch (const std::exception&) {
    // Best effort: gc releases what is left.
  }
}

std::vector<std::string> claimedIds(const std::string& claim_dir) {
  std::vector<std::string> ids;
  for (const auto& [path, holder] : claims(claim_dir)) ids.push_back(holder);
  return ids;
}

}  // namespace runner::podman
