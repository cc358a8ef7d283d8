#include "compass-runner/microvm_cache.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <set>
#include <utility>

#include "common/unique_fd.h"
#include "compass-runner/backend.h"

namespace runner::microvm {
namespace {

namespace fs = std::filesystem;

constexpr const char* kDefaultCacheDir = "/var/lib/compass/microvm";
constexpr const char* kRootfsLock = "rootfs.lock";
constexpr std::string_view kRootfsPrefix = "rootfs-";
constexpr std::string_view kRootfsTempStem = ".erofs.tmp";
constexpr std::string_view kTempStem = ".tmp";
constexpr std::string_view kStripStem = "nano-init.strip";
// How long an initramfs or nano-init temporary must be untouched before a writer whose pid is
// gone here is taken to be dead (writeCached()'s window for replaced archives too).
constexpr auto kSmallTempAge = std::chrono::minutes(10);

std::string octalMode(mode_t mode) {
  char buf[8];
  (void)std::snprintf(buf, sizeof buf, "%04o", static_cast<unsigned>(mode & 07777));
  return buf;
}

bool isImageId(std::string_view id) {
  return id.size() == 64 && id.find_first_not_of("0123456789abcdef") == std::string_view::npos;
}

// The image id of a root image's temporary name (rootfs-ID.erofs.tmp.PID), "" if not one.
std::string rootfsTempImage(std::string_view name) {
  if (!name.starts_with(kRootfsPrefix)) return "";
  const size_t stem = name.rfind(kRootfsTempStem);
  if (stem == std::string_view::npos) return "";
  const std::string_view id = name.substr(kRootfsPrefix.size(), stem - kRootfsPrefix.size());
  return isImageId(id) ? std::string(id) : "";
}

struct DirCloser {
  void operator()(DIR* d) const { ::closedir(d); }
};

// The names of `dir_fd`'s entries (its own descriptor is left open).
std::vector<std::string> entriesOf(int dir_fd) {
  std::vector<std::string> names;
  const int fd = ::dup(dir_fd);
  if (fd < 0) return names;
  const std::unique_ptr<DIR, DirCloser> dir(::fdopendir(fd));
  if (!dir) {
    const common::UniqueFd owned(fd);
    return names;
  }
  while (const dirent* e = ::readdir(dir.get())) names.emplace_back(e->d_name);
  return names;
}

using FileId = std::pair<dev_t, ino_t>;

// Every file some process has open (/proc/PID/fd/*, all of them for root). A writer's child
// outlives it: mkfs.erofs, not killed with the runner, goes on writing the temporary.
std::set<FileId> openFiles() {
  std::set<FileId> open;
  std::error_code ec;
  for (const auto& p : fs::directory_iterator("/proc", ec)) {
    const std::string pid = p.path().filename().string();
    if (pid.empty() || pid.find_first_not_of("0123456789") != std::string::npos) continue;
    std::error_code fd_ec;
    for (const auto& fd : fs::directory_iterator(p.path() / "fd", fd_ec)) {
      struct stat st {};
      if (::stat(fd.path().c_str(), &st) == 0 && S_ISREG(st.st_mode)) {
        open.emplace(st.st_dev, st.st_ino);
      }
    }
  }
  return open;
}

}  // namespace

std::string cacheDirSetting() {
  const char* v = std::getenv("COMPASS_MICROVM_CACHE");
  if (v == nullptr || *v == '\0') return kDefaultCacheDir;
  std::string dir = v;
  if (dir.front() != '/') {
    throw SpecRefused("COMPASS_MICROVM_CACHE=\"" + dir +
                      "\": not an absolute path (QEMU runs in the agent's state dir and would "
                      "not find images cached under a relative one); give an absolute path, or "
                      "unset it for " +
                      kDefaultCacheDir);
  }
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  return dir;
}

std::string cacheDir() {
  std::string dir = cacheDirSetting();
  std::error_code ec;
  fs::create_directories(fs::path(dir).parent_path(), ec);
  // The cache dir itself is made 0700 from the start: the umask can only take bits away.
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    throw RunnerError("cannot create the microvm cache dir " + dir +
                      " (COMPASS_MICROVM_CACHE): " + std::strerror(errno));
  }
  // What is cached here is booted for later agents: the directory must be ours alone, or
  // anyone who could write it could plant a root image or an initramfs. Checked on the
  // directory opened (no symlink followed), not on a path that could be swapped meanwhile.
  const common::UniqueFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  struct stat st {};
  if (!fd.valid() || ::fstat(fd.get(), &st) != 0) {
    throw SpecRefused("the microvm cache dir " + dir +
                      " (COMPASS_MICROVM_CACHE) cannot be opened as a directory (a symlink is "
                      "refused): " +
                      std::strerror(errno));
  }
  if (st.st_uid != ::geteuid()) {
    throw SpecRefused("the microvm cache dir " + dir + " (COMPASS_MICROVM_CACHE) belongs to uid " +
                      std::to_string(st.st_uid) +
                      ", not to this user: whoever owns it could plant what the guest boots");
  }
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
    throw SpecRefused("the microvm cache dir " + dir + " (COMPASS_MICROVM_CACHE) has mode " +
                      octalMode(st.st_mode) +
                      ": writable by its group or others, who could plant what later guests "
                      "boot. Remove it (or check what is in it and chmod 0700 it), or point "
                      "COMPASS_MICROVM_CACHE at a directory of this user's alone");
  }
  if ((st.st_mode & 07777) != 0700) ::fchmod(fd.get(), 0700);
  return dir;
}

std::string rootfsLockPath(const std::string& cache_dir) { return cache_dir + "/" + kRootfsLock; }

std::string tempPathFor(const std::string& path) {
  return path + ".tmp." + std::to_string(::getpid());
}

std::optional<pid_t> temporaryWriter(std::string_view name) {
  const size_t dot = name.rfind('.');
  if (dot == std::string_view::npos || dot + 1 == name.size()) return std::nullopt;
  const std::string_view digits = name.substr(dot + 1);
  pid_t pid = 0;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), pid);
  if (ec != std::errc() || end != digits.data() + digits.size() || pid <= 0) return std::nullopt;
  const std::string_view stem = name.substr(0, dot);
  if (stem == kStripStem) return pid;
  if (!stem.ends_with(kTempStem)) return std::nullopt;
  for (std::string_view prefix :
       {kRootfsPrefix, std::string_view("initramfs-"), std::string_view("fwlayer-")}) {
    if (stem.starts_with(prefix) && stem.size() > prefix.size() + kTempStem.size()) return pid;
  }
  return std::nullopt;
}

bool processExists(pid_t pid) { return ::kill(pid, 0) == 0 || errno == EPERM; }

std::vector<std::string> removeDeadTemporaries(const std::string& cache_dir, bool builds_idle,
                                               const ImageUnmount& unmount,
                                               std::vector<std::string>* notes) {
  std::vector<std::string> removed;
  try {
    const common::UniqueFd dir(
        ::open(cache_dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    struct stat dst {};
    if (!dir.valid() || ::fstat(dir.get(), &dst) != 0 || dst.st_uid != ::geteuid()) return removed;
    const auto now = std::chrono::system_clock::now();
    std::optional<std::set<FileId>> open;  // read once, if some temporary's writer is gone
    for (const std::string& name : entriesOf(dir.get())) {
      const std::optional<pid_t> writer = temporaryWriter(name);
      if (!writer || processExists(*writer)) continue;
      struct stat st {};
      if (::fstatat(dir.get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 ||
          !S_ISREG(st.st_mode)) {
        continue;
      }
      if (!open) open = openFiles();
      if (open->count({st.st_dev, st.st_ino}) != 0) continue;  // still being written
      if (name.starts_with(kRootfsPrefix)) {
        if (!builds_idle) continue;
        const std::string image = rootfsTempImage(name);
        if (!image.empty() && unmount) {
          const std::string failed = unmount(image);
          if (!failed.empty() && notes != nullptr) {
            std::string note = "could not unmount podman image " + image;
            note += " (mounted by a build whose runner, pid " + std::to_string(*writer);
            note += ", is gone: " + failed;
            note += "); run `podman image unmount " + image + "`";
            notes->push_back(std::move(note));
          }
        }
      } else {
        const auto mtime = std::chrono::system_clock::from_time_t(st.st_mtim.tv_sec);
        if (now - mtime < kSmallTempAge) continue;
      }
      if (::unlinkat(dir.get(), name.c_str(), 0) == 0) removed.push_back(name);
    }
  } catch (const std::exception& e) {
    if (notes != nullptr) notes->push_back(cache_dir + ": " + e.what());
  }
  return removed;
}

void reapCacheLeftovers(const std::string& cache_dir, const ImageUnmount& unmount) {
  try {
    struct stat st {};
    if (::lstat(cache_dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != ::geteuid()) {
      return;  // nothing cached, or not a cache this runner would use (cacheDir())
    }
    // A build holds the lock from before its mount until after its unmount: with it held here,
    // no build runs, in this pid namespace or another sharing the cache.
    const std::string lock_path = rootfsLockPath(cache_dir);
    const common::UniqueFd lock(
        ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600));
    const bool idle = lock.valid() && ::flock(lock.get(), LOCK_EX | LOCK_NB) == 0;
    std::vector<std::string> notes;
    for (const auto& name : removeDeadTemporaries(cache_dir, idle, unmount, &notes)) {
      std::printf("removed microvm cache leftover of a dead runner: %s/%s\n", cache_dir.c_str(),
                  name.c_str());
    }
    for (const auto& n : notes) note("gc: " + n);
  } catch (const std::exception& e) {
    note("gc: microvm cache " + cache_dir + ": " + e.what());
  }
}

}  // namespace runner::microvm
