#include "compass-runner/microvm_rootfs.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/unique_fd.h"
#include "compass-runner/backend.h"
#include "compass-runner/microvm_cache.h"
#include "compass-runner/podman_cli.h"
#include "compass-runner/process.h"

namespace runner::microvm {
namespace {

constexpr auto kMkfsTimeout = std::chrono::minutes(10);

std::string trimmed(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

// mkfs.erofs SOURCE into `out` through a temporary file (a killed build leaves no half image
// under the final name). --quiet: its progress would otherwise be one line per file.
void mkfsErofs(const std::string& source, const std::string& out) {
  const std::string tmp = tempPathFor(out);
  try {
    runChecked("mkfs.erofs", {"mkfs.erofs", "--quiet", tmp, source}, "", kMkfsTimeout);
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  if (::rename(tmp.c_str(), out.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throw RunnerError("rename " + tmp + " to " + out + ": " + std::strerror(err));
  }
}

// The image's id from podman's own store (the default storage of rootful podman: no
// /etc/containers/storage.conf, overlay driver), for an exact name such as the default image's:
// reading one small JSON file instead of starting podman (~100 ms) on every agent's start.
// "" when the store is elsewhere or the name is not found there; the caller then asks podman.
std::string idFromStore(const std::string& image) {
  if (::access("/etc/containers/storage.conf", F_OK) == 0) return "";
  std::ifstream in("/var/lib/containers/storage/overlay-images/images.json");
  if (!in) return "";
  try {
    const nlohmann::json images = nlohmann::json::parse(in);
    for (const auto& i : images) {
      const auto names = i.find("names");
      if (names == i.end() || !names->is_array()) continue;
      for (const auto& n : *names) {
        if (!n.is_string() || n.get<std::string>() != image) continue;
        const std::string id = i.value("id", "");
        if (id.size() == 64 && id.find_first_not_of("0123456789abcdef") == std::string::npos) {
          return id;
        }
      }
    }
  } catch (const std::exception&) {
    return "";
  }
  return "";
}

}  // namespace

ImageUnmount podmanUnmount(const std::string& conf) {
  return [conf](const std::string& image_id) -> std::string {
    try {
      const CommandResult r = podman::run(conf, {"image", "unmount", image_id});
      // An image removed since has no mount left to undo.
      if (r.status == 0 || r.err.find("image not known") != std::string::npos) return "";
      return "exit " + std::to_string(r.status) + ": " + trimmed(r.err);
    } catch (const std::exception& e) {
      return e.what();
    }
  };
}

std::string imageRootfs(const std::string& image, bool default_image, const std::string& conf,
                        const std::string& cache_dir) {
  std::string id = idFromStore(image);
  if (id.empty()) {
    const CommandResult r = podman::run(conf, {"image", "inspect", "--format", "{{.Id}}", image});
    if (r.status == 0) id = trimmed(r.out);
  }
  if (id.empty() || id.find('/') != std::string::npos || id.find('.') != std::string::npos) {
    throw SpecRefused("--image " + image + ": no such image" +
                      (default_image ? "; run `compass-runner image build` first"
                                     : " (no registry is reachable: build or import it)"));
  }
  const std::string out = cache_dir + "/rootfs-" + id + ".erofs";
  if (::access(out.c_str(), R_OK) == 0) return out;

  const std::string lock_path = rootfsLockPath(cache_dir);
  common::UniqueFd lock(::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  if (!lock.valid()) throw RunnerError("open " + lock_path + ": " + std::strerror(errno));
  while (::flock(lock.get(), LOCK_EX) != 0) {
    if (errno != EINTR) throw RunnerError("flock " + lock_path + ": " + std::strerror(errno));
  }
  // With the lock held no other build runs: what a killed one left (its ~200 MB temporary, its
  // image mount) goes now, not only at the next gc.
  std::vector<std::string> notes;
  removeDeadTemporaries(cache_dir, true, podmanUnmount(conf), &notes);
  for (const auto& n : notes) note(n);
  if (::access(out.c_str(), R_OK) == 0) return out;  // another start built it meanwhile
  // Seconds of silence otherwise (about 10 s for the default image on 2 cores).
  note("microvm: building the guest's root image of " + image + " in " + cache_dir +
       " (once per image; later starts reuse it)");
  const std::string mount =
      trimmed(podman::runChecked("podman image mount", conf, {"image", "mount", image}));
  try {
    mkfsErofs(mount, out);
  } catch (...) {
    podman::run(conf, {"image", "unmount", image});
    throw;
  }
  podman::run(conf, {"image", "unmount", image});
  return out;
}

void dirRootfs(const std::string& dir, const std::string& out) { mkfsErofs(dir, out); }

}  // namespace runner::microvm
