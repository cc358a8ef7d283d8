#include "compass-runner/podman_rootfs.h"

#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "compass-runner/backend.h"
#include "compass-runner/podman_userns.h"

namespace runner::podman {
namespace {

namespace fs = std::filesystem;

std::string merged(const std::string& id) { return std::string(kMountDir) + "/" + id; }
std::string scratch(const std::string& state_dir) { return state_dir + "/rootfs.d"; }

bool isMountPoint(const std::string& path) {
  std::ifstream in("/proc/self/mountinfo");
  for (std::string line; std::getline(in, line);) {
    // Field 5 is the mount point.
    size_t pos = 0;
    for (int field = 0; field < 4 && pos != std::string::npos; ++field) {
      pos = line.find(' ', pos + 1);
    }
    if (pos == std::string::npos) continue;
    const size_t end = line.find(' ', pos + 1);
    if (line.compare(pos + 1, end - pos - 1, path) == 0) return true;
  }
  return false;
}

// The most entries --rootfs may hold (the image built by `image build` has ~10,000).
constexpr size_t kMaxRootfsEntries = 200000;

// uid/gid u < 65536 → base + u: what the container's id u is on the host.
void shift(const std::string& path, uint32_t base) {
  auto one = [&](const std::string& p) {
    struct stat st {};
    if (::lstat(p.c_str(), &st) != 0) {
      throw RunnerError("lstat(" + p + "): " + std::strerror(errno));
    }
    const uid_t uid = st.st_uid < kIdsPerAgent ? base + st.st_uid : st.st_uid;
    const gid_t gid = st.st_gid < kIdsPerAgent ? base + st.st_gid : st.st_gid;
    if (::lchown(p.c_str(), uid, gid) != 0) {
      throw RunnerError("lchown(" + p + "): " + std::strerror(errno));
    }
  };
  one(path);
  // Never follows a symlink: directory symlinks are not descended, and lchown changes the
  // link itself.
  // Bounded: each entry costs a metadata copy-up, and start-up must end.
  size_t entries = 0;
  for (const auto& e : fs::recursive_directory_iterator(path)) {
    if (++entries > kMaxRootfsEntries) {
      throw RunnerError("more than " + std::to_string(kMaxRootfsEntries) +
                        " files: too large for a per-agent owner shift; build an image from it "
                        "(podman import) and use --image");
    }
    one(e.path().string());
  }
}

}  // namespace

std::string mountShiftedRootfs(const std::string& dir, const std::string& id,
                               const std::string& state_dir, uint32_t id_base) {
  // The overlay option string cannot carry these characters unescaped.
  std::error_code ec;
  const std::string lower = fs::canonical(dir, ec).string();
  if (ec) throw RunnerError("--rootfs " + dir + ": " + ec.message());
  // The host's own root (or a symlink to it) would be copied up and re-owned file by file:
  // never an agent's root file system.
  if (lower == "/") {
    throw RunnerError("--rootfs " + dir +
                      ": is the host's root directory; give a directory "
                      "holding the agent's own root file system");
  }
  // The overlay's upper dir lives in the state dir: it cannot be inside its own lower layer.
  if (state_dir.rfind(lower + "/", 0) == 0) {
    throw RunnerError("--rootfs " + dir + ": holds the runner's own state (" + state_dir +
                      "); give a directory holding only the agent's root file system");
  }
  if (lower.find_first_of(",:\\") != std::string::npos) {
    throw RunnerError("--rootfs " + dir +
                      ": a path with ',', ':' or '\\' cannot be an overlay "
                      "layer");
  }
  if (::mkdir(kMountDir, 0711) != 0 && errno != EEXIST) {
    throw RunnerError(std::string("mkdir(") + kMountDir + "): " + std::strerror(errno));
  }
  const std::string target = merged(id);
  const std::string upper = scratch(state_dir) + "/upper";
  const std::string work = scratch(state_dir) + "/work";
  for (const auto& d : {target, scratch(state_dir), upper, work}) {
    if (::mkdir(d.c_str(), 0700) != 0 && errno != EEXIST) {
      throw RunnerError("mkdir(" + d + "): " + std::strerror(errno));
    }
  }
  const std::string base = "lowerdir=" + lower + ",upperdir=" + upper + ",workdir=" + work;
  // metacopy: a chown copies up only the inode's metadata, not the file's data.
  if (::mount("overlay", target.c_str(), "overlay", MS_NODEV, (base + ",metacopy=on").c_str()) !=
          0 &&
      ::mount("overlay", target.c_str(), "overlay", MS_NODEV, base.c_str()) != 0) {
    throw RunnerError("mount(overlay " + base + " on " + target + "): " + std::strerror(errno));
  }
  try {
    // The merged root takes the upper dir's mode (0700 from mkdir): give it DIR's back.
    struct stat st {};
    if (::stat(lower.c_str(), &st) != 0 || ::chmod(target.c_str(), st.st_mode & 07777) != 0) {
      throw RunnerError("chmod(" + target + ") to the mode of " + lower + ": " +
                        std::strerror(errno));
    }
    shift(target, id_base);
  } catch (const std::exception& e) {
    unmountRootfs(id, state_dir);
    throw RunnerError(std::string("--rootfs: shifting owners into the agent's ids: ") + e.what());
  }
  return target;
}

bool unmountRootfs(const std::string& id, const std::string& state_dir) noexcept {
  try {
    const std::string target = merged(id);
    if (isMountPoint(target) && ::umount2(target.c_str(), MNT_DETACH) != 0) return false;
    std::error_code ec;
    if (!state_dir.empty()) fs::remove_all(scratch(state_dir), ec);
    fs::remove(target, ec);  // an empty mount point; never a tree
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

std::vector<std::string> rootfsIds() {
  std::vector<std::string> ids;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(kMountDir, ec)) {
    ids.push_back(e.path().filename().string());
  }
  return ids;
}

}  // namespace runner::podman
