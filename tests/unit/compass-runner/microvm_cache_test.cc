// The microvm tier's cache dir (COMPASS_MICROVM_CACHE: absolute, the runner's alone), what gc
// removes of it (a dead writer's temporaries, its image mount), the QEMU binary's preflight
// check (COMPASS_QEMU) and the console excerpt of a failed start.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fcntl.h>

#include <algorithm>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "common/unique_fd.h"
#include "compass-runner/backend.h"
#include "compass-runner/microvm_backend.h"
#include "compass-runner/microvm_cache.h"
#include "compass-runner/microvm_qemu.h"
#include "microvm_test_util.h"

namespace runner::microvm {
namespace {

using testing::TempDir;
using testing::writeFile;

const std::string kImageId(64, 'a');

// Sets (or unsets, for nullptr) an environment variable for one test.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) saved_ = old;
    if (value != nullptr) {
      ::setenv(name, value, 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (saved_) {
      ::setenv(name_, saved_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> saved_;
};

// A pid no process has any more: a child that exited and was reaped.
pid_t deadPid() {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(0);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return pid;
}

mode_t modeOf(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return 0;
  return st.st_mode & 07777;
}

void makeOld(const std::string& path) {
  const timespec old[2] = {{::time(nullptr) - 3600, 0}, {::time(nullptr) - 3600, 0}};
  ::utimensat(AT_FDCWD, path.c_str(), old, AT_SYMLINK_NOFOLLOW);
}

template <typename F>
std::string refusal(F&& f) {
  try {
    f();
  } catch (const SpecRefused& e) {
    return e.what();
  }
  return "(not refused)";
}

TEST(MicrovmCacheDirTest, ARelativeCacheIsRefusedBeforeAnythingIsMade) {
  TempDir dir;
  const std::string cwd = std::filesystem::current_path();
  ASSERT_EQ(::chdir(dir.path().c_str()), 0);
  const ScopedEnv env("COMPASS_MICROVM_CACHE", "relative");
  const std::string what = refusal([] { cacheDirSetting(); });
  EXPECT_NE(what.find("COMPASS_MICROVM_CACHE=\"relative\""), std::string::npos) << what;
  EXPECT_NE(what.find("not an absolute path"), std::string::npos) << what;
  EXPECT_EQ(refusal([] { cacheDir(); }), what);
  EXPECT_FALSE(std::filesystem::exists(dir.path() + "/relative"));
  ASSERT_EQ(::chdir(cwd.c_str()), 0);
}

TEST(MicrovmCacheDirTest, DefaultAndTrailingSlashes) {
  {
    const ScopedEnv env("COMPASS_MICROVM_CACHE", nullptr);
    EXPECT_EQ(cacheDirSetting(), "/var/lib/compass/microvm");
  }
  const ScopedEnv env("COMPASS_MICROVM_CACHE", "/x/cache//");
  EXPECT_EQ(cacheDirSetting(), "/x/cache");
}

TEST(MicrovmCacheDirTest, MadeOursAloneEvenUnderAnOpenUmask) {
  TempDir dir;
  const std::string cache = dir.path() + "/a/cache";
  const ScopedEnv env("COMPASS_MICROVM_CACHE", cache.c_str());
  const mode_t old = ::umask(0);
  const std::string made = cacheDir();
  ::umask(old);
  EXPECT_EQ(made, cache);
  EXPECT_EQ(modeOf(cache), 0700U);
  EXPECT_EQ(cacheDir(), cache);  // and accepted as it is
}

TEST(MicrovmCacheDirTest, WritableByGroupOrOthersIsRefusedNamingTheMode) {
  TempDir dir;
  const std::string cache = dir.path() + "/cache";
  const ScopedEnv env("COMPASS_MICROVM_CACHE", cache.c_str());
  ASSERT_EQ(::mkdir(cache.c_str(), 0700), 0);
  for (const mode_t bad : {0777U, 0720U, 0702U, 01777U}) {
    ASSERT_EQ(::chmod(cache.c_str(), bad), 0);
    const std::string what = refusal([] { cacheDir(); });
    EXPECT_NE(what.find("COMPASS_MICROVM_CACHE"), std::string::npos) << what;
    char mode[8];
    (void)std::snprintf(mode, sizeof mode, "%04o", bad);
    EXPECT_NE(what.find(std::string("has mode ") + mode), std::string::npos) << what;
    EXPECT_NE(what.find("writable by its group or others"), std::string::npos) << what;
    EXPECT_EQ(modeOf(cache), bad) << "refused, not repaired";
  }
  // Readable by others is no danger to what is booted: tightened, accepted.
  ASSERT_EQ(::chmod(cache.c_str(), 0755), 0);
  EXPECT_EQ(cacheDir(), cache);
  EXPECT_EQ(modeOf(cache), 0700U);
}

TEST(MicrovmCacheDirTest, ASymlinkOrAnotherUsersDirIsRefused) {
  TempDir dir;
  const std::string real = dir.path() + "/real";
  const std::string link = dir.path() + "/link";
  ASSERT_EQ(::mkdir(real.c_str(), 0700), 0);
  ASSERT_EQ(::symlink(real.c_str(), link.c_str()), 0);
  {
    const ScopedEnv env("COMPASS_MICROVM_CACHE", link.c_str());
    EXPECT_NE(refusal([] { cacheDir(); }).find("a symlink is refused"), std::string::npos);
  }
  if (::geteuid() != 0) GTEST_SKIP() << "chown to another uid needs root";
  ASSERT_EQ(::chown(real.c_str(), 65534, 65534), 0);
  const ScopedEnv env("COMPASS_MICROVM_CACHE", real.c_str());
  EXPECT_NE(refusal([] { cacheDir(); }).find("belongs to uid 65534"), std::string::npos);
}

TEST(MicrovmCacheTempTest, TheWriterPidOfACacheTemporary) {
  EXPECT_EQ(temporaryWriter("rootfs-" + kImageId + ".erofs.tmp.4242"), 4242);
  EXPECT_EQ(temporaryWriter("initramfs-0123456789abcdef.cpio.tmp.17"), 17);
  EXPECT_EQ(temporaryWriter("fwlayer-0123456789abcdef.cpio.tmp.17"), 17);
  EXPECT_EQ(temporaryWriter("nano-init.strip.99"), 99);
  EXPECT_EQ(tempPathFor("/c/x.cpio"), "/c/x.cpio.tmp." + std::to_string(::getpid()));
  for (const char* other :
       {"rootfs-x.erofs", "rootfs.lock", "initramfs-1.cpio", "notes.tmp.12", "rootfs-.tmp.12",
        "initramfs-1.cpio.tmp.", "initramfs-1.cpio.tmp.1x", "initramfs-1.cpio.tmp.-3",
        "initramfs-1.cpio.tmp.0", "initramfs-1.cpio.tmp.99999999999", "nano-init.strip.", "."}) {
    EXPECT_FALSE(temporaryWriter(other)) << other;
  }
}

TEST(MicrovmCacheTempTest, ADeadWritersTemporariesGoALiveOnesStay) {
  TempDir dir;
  const std::string d = dir.path();
  const std::string dead = std::to_string(deadPid());
  const std::string live = std::to_string(::getpid());
  const std::string rootfs_dead = "rootfs-" + kImageId + ".erofs.tmp." + dead;
  const std::string rootfs_live = "rootfs-" + std::string(64, 'b') + ".erofs.tmp." + live;
  const std::string cpio_dead_old = "initramfs-1.cpio.tmp." + dead;
  const std::string cpio_dead_new = "fwlayer-1.cpio.tmp." + dead;
  const std::string cpio_live_old = "initramfs-2.cpio.tmp." + live;
  const std::string strip_dead_old = "nano-init.strip." + dead;
  const std::string unrelated = "notes.tmp." + dead;
  const std::string image = "rootfs-" + kImageId + ".erofs";
  for (const auto& n : {rootfs_dead, rootfs_live, cpio_dead_old, cpio_dead_new, cpio_live_old,
                        strip_dead_old, unrelated, image}) {
    writeFile(d + "/" + n, "x");
    if (n != cpio_dead_new) makeOld(d + "/" + n);
  }
  // A symlink with a temporary's name is never followed nor removed.
  const std::string link = "initramfs-3.cpio.tmp." + dead;
  ASSERT_EQ(::symlink((d + "/" + image).c_str(), (d + "/" + link).c_str()), 0);

  std::vector<std::string> unmounted;
  const ImageUnmount unmount = [&](const std::string& id) {
    unmounted.push_back(id);
    return std::string();
  };
  std::vector<std::string> notes;
  // A build may be running (the lock is not ours): the root image's temporary stays.
  auto removed = removeDeadTemporaries(d, false, unmount, &notes);
  std::sort(removed.begin(), removed.end());
  EXPECT_EQ(removed, (std::vector<std::string>{cpio_dead_old, strip_dead_old}));
  EXPECT_TRUE(unmounted.empty());
  EXPECT_TRUE(std::filesystem::exists(d + "/" + rootfs_dead));

  // No build runs: the dead build's temporary goes, after its image mount.
  removed = removeDeadTemporaries(d, true, unmount, &notes);
  EXPECT_EQ(removed, (std::vector<std::string>{rootfs_dead}));
  EXPECT_EQ(unmounted, (std::vector<std::string>{kImageId}));
  EXPECT_TRUE(notes.empty());
  for (const auto& n : {rootfs_live, cpio_dead_new, cpio_live_old, unrelated, image}) {
    EXPECT_TRUE(std::filesystem::exists(d + "/" + n)) << n;
  }
  EXPECT_TRUE(std::filesystem::is_symlink(d + "/" + link));
}

TEST(MicrovmCacheTempTest, ATemporaryStillOpenIsKeptThoughItsWriterPidIsGone) {
  // A killed runner's mkfs.erofs lives on and goes on writing the temporary.
  TempDir dir;
  const std::string tmp = "rootfs-" + kImageId + ".erofs.tmp." + std::to_string(deadPid());
  writeFile(dir.path() + "/" + tmp, "x");
  int unmounts = 0;
  const ImageUnmount unmount = [&](const std::string&) {
    ++unmounts;
    return std::string();
  };
  {
    const common::UniqueFd writer(::open((dir.path() + "/" + tmp).c_str(), O_WRONLY | O_CLOEXEC));
    ASSERT_TRUE(writer.valid());
    EXPECT_TRUE(removeDeadTemporaries(dir.path(), true, unmount, nullptr).empty());
    EXPECT_EQ(unmounts, 0);
  }
  EXPECT_EQ(removeDeadTemporaries(dir.path(), true, unmount, nullptr),
            (std::vector<std::string>{tmp}));
  EXPECT_EQ(unmounts, 1);
}

TEST(MicrovmCacheTempTest, AFailedUnmountIsSaidWithTheManualStep) {
  TempDir dir;
  const std::string tmp = "rootfs-" + kImageId + ".erofs.tmp." + std::to_string(deadPid());
  writeFile(dir.path() + "/" + tmp, "x");
  std::vector<std::string> notes;
  const auto removed = removeDeadTemporaries(
      dir.path(), true, [](const std::string&) { return std::string("exit 125: boom"); }, &notes);
  EXPECT_EQ(removed, (std::vector<std::string>{tmp}));
  ASSERT_EQ(notes.size(), 1U);
  EXPECT_NE(notes[0].find("exit 125: boom"), std::string::npos) << notes[0];
  EXPECT_NE(notes[0].find("podman image unmount " + kImageId), std::string::npos) << notes[0];
}

TEST(MicrovmCacheTempTest, GcLeavesARootImageTemporaryWhileABuildHoldsTheLock) {
  TempDir dir;
  const std::string tmp = "rootfs-" + kImageId + ".erofs.tmp." + std::to_string(deadPid());
  writeFile(dir.path() + "/" + tmp, "x");
  int unmounts = 0;
  const ImageUnmount unmount = [&](const std::string&) {
    ++unmounts;
    return std::string();
  };
  {
    // flock locks belong to the open file description: this one conflicts with gc's.
    const common::UniqueFd lock(
        ::open(rootfsLockPath(dir.path()).c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
    ASSERT_EQ(::flock(lock.get(), LOCK_EX), 0);
    reapCacheLeftovers(dir.path(), unmount);
    EXPECT_TRUE(std::filesystem::exists(dir.path() + "/" + tmp));
    EXPECT_EQ(unmounts, 0);
  }
  reapCacheLeftovers(dir.path(), unmount);
  EXPECT_FALSE(std::filesystem::exists(dir.path() + "/" + tmp));
  EXPECT_EQ(unmounts, 1);
  reapCacheLeftovers(dir.path() + "/missing", unmount);  // nothing to do, nothing made
  EXPECT_FALSE(std::filesystem::exists(dir.path() + "/missing"));
}

TEST(MicrovmQemuBinaryTest, AMissingOrUnusableCompassQemuIsRefusedNamingIt) {
  TempDir dir;
  {
    const ScopedEnv env("COMPASS_QEMU", "/nonexistent/qemu-system-x86_64");
    const std::string what = refusal([] { findQemu(); });
    EXPECT_NE(what.find("COMPASS_QEMU=\"/nonexistent/qemu-system-x86_64\""), std::string::npos)
        << what;
    EXPECT_NE(what.find("No such file or directory"), std::string::npos) << what;
  }
  const std::string plain = dir.path() + "/qemu";
  writeFile(plain, "not a program");
  for (const std::string& bad : {plain, dir.path()}) {
    const ScopedEnv env("COMPASS_QEMU", bad.c_str());
    const std::string what = refusal([] { findQemu(); });
    EXPECT_NE(what.find("COMPASS_QEMU="), std::string::npos) << what;
    EXPECT_NE(what.find("not an executable file"), std::string::npos) << what;
  }
  {
    const ScopedEnv env("COMPASS_QEMU", "no-such-qemu-binary");
    EXPECT_NE(refusal([] { findQemu(); }).find("not found on PATH"), std::string::npos);
  }
  {
    const ScopedEnv env("COMPASS_QEMU", "/bin/true");
    EXPECT_EQ(findQemu(), "/bin/true");
  }
  const ScopedEnv env("COMPASS_QEMU", nullptr);
  const ScopedEnv path("PATH", dir.path().c_str());
  const std::string what = refusal([] { findQemu(); });
  EXPECT_NE(what.find("qemu-system-x86_64: not found on PATH"), std::string::npos) << what;
  EXPECT_NE(what.find("set COMPASS_QEMU"), std::string::npos) << what;
}

TEST(MicrovmConsoleTest, AnEmptyConsoleIsSaidAndNoPathIsNamed) {
  TempDir dir;
  const std::string log = dir.path() + "/console.log";
  EXPECT_EQ(consoleExcerpt(log), "the guest printed nothing on its console");
  writeFile(log, "\n\r\n");
  EXPECT_EQ(consoleExcerpt(log), "the guest printed nothing on its console");
  writeFile(log, "Kernel panic - not syncing: boom\n");
  const std::string text = consoleExcerpt(log);
  EXPECT_EQ(text, "the end of the guest's console:\nKernel panic - not syncing: boom\n");
  EXPECT_EQ(text.find(log), std::string::npos);
}

}  // namespace
}  // namespace runner::microvm
