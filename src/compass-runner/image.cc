// `compass-runner image build` (image.h): debootstrap a small Debian, add the agent user,
// `podman import` it. Every program runs through process.h.
#include "compass-runner/image.h"

#include <fcntl.h>
#include <linux/openat2.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/unique_fd.h"
#include "compass-runner/backend.h"
#include "compass-runner/podman_cli.h"
#include "compass-runner/podman_conf.h"
#include "compass-runner/podman_userns.h"
#include "compass-runner/process.h"
#include "compass-runner/sam_box_process.h"

namespace runner::image {
namespace {

namespace fs = std::filesystem;
using std::chrono::minutes;

constexpr const char* kSuite = "bookworm";
constexpr const char* kMirror = "http://deb.debian.org/debian";
// A shell, curl, python3 (the full standard library: python3-minimal has no json) and node
// for agents and the demo; dig, ip and nft so tests can show
// from inside that the sandbox cannot use them; ps for the roster's eye.
constexpr const char* kPackages =
    "curl,python3,nodejs,ca-certificates,dnsutils,iproute2,nftables,procps";

void progress(const std::string& line) {
  (void)std::fprintf(stderr, "compass-runner image build: %s\n", line.c_str());
}

// Mounts at or under `dir` (debootstrap mounts /proc and /sys in the target while it works;
// removing the tree with them mounted would walk into the host's).
std::vector<std::string> mountsUnder(const std::string& dir) {
  std::ifstream in("/proc/self/mountinfo");
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);) {
    // Field 5 is the mount point (octal escapes aside, which a mkdtemp path never has).
    size_t pos = 0;
    for (int field = 0; field < 4 && pos != std::string::npos; ++field)
      pos = line.find(' ', pos + 1);
    if (pos == std::string::npos) continue;
    const size_t end = line.find(' ', pos + 1);
    const std::string mp = line.substr(pos + 1, end - pos - 1);
    if (mp == dir || mp.rfind(dir + "/", 0) == 0) out.push_back(mp);
  }
  return out;
}

// The build's scratch directory; removed (after unmounting anything left in it) on scope exit.
class Scratch {
 public:
  Scratch() {
    char tmpl[] = "/var/tmp/compass-image-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) {
      throw RunnerError(std::string("image build: mkdtemp(/var/tmp/compass-image-XXXXXX): ") +
                        std::strerror(errno));
    }
    dir_ = tmpl;
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  ~Scratch() {
    const auto mounts = mountsUnder(dir_);
    const std::vector<std::string> innermost_first(mounts.rbegin(), mounts.rend());
    for (const auto& mount : innermost_first) {
      try {
        runCommand({"umount", "--lazy", mount});
      } catch (const std::exception&) {
      }
    }
    if (!mountsUnder(dir_).empty()) {
      progress("leaving " + dir_ + " in place: something is still mounted in it");
      return;
    }
    std::error_code ec;
    fs::remove_all(dir_, ec);  // never follows symlinks out of the tree
  }
  [[nodiscard]] const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
};

void check(const std::string& what, const CommandResult& r, const std::string& log) {
  if (r.status == 0) return;
  throw RunnerError("image build: " + what + " failed (exit " + std::to_string(r.status) + ")" +
                    (log.empty() ? ": " + r.err : "; the end of " + log + ":\n" + tailOfFile(log)));
}

}  // namespace

bool exists(const std::string& name) {
  const std::string conf = podman::containersConfPath();
  podman::writeContainersConf(conf);
  const CommandResult r = podman::run(conf, {"image", "exists", name});
  if (r.status == 0) return true;
  if (r.status == 1) return false;
  throw RunnerError("podman image exists " + name + ": exit " + std::to_string(r.status) + ": " +
                    r.err);
}

bool isDirectoryIn(const std::string& root, const std::string& path) {
  const common::UniqueFd dir(::open(root.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!dir.valid()) throw RunnerError(root + ": " + std::strerror(errno));
  open_how how{};
  how.flags = O_PATH | O_DIRECTORY | O_CLOEXEC;
  how.resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS;
  const std::string relative = path.empty() || path.front() != '/' ? path : path.substr(1);
  const common::UniqueFd found(static_cast<int>(::syscall(
      SYS_openat2, dir.get(), relative.empty() ? "." : relative.c_str(), &how, sizeof how)));
  if (found.valid()) return true;
  if (errno == ENOENT || errno == ENOTDIR || errno == ELOOP || errno == ENAMETOOLONG) return false;
  throw RunnerError(root + " " + path + ": " + std::strerror(errno));
}

bool hasDirectory(const std::string& name, const std::string& path) {
  const std::string conf = podman::containersConfPath();
  podman::writeContainersConf(conf);
  const CommandResult mounted = podman::run(conf, {"image", "mount", name});
  if (mounted.status != 0) {
    throw RunnerError("podman image mount " + name + ": exit " + std::to_string(mounted.status) +
                      ": " + mounted.err);
  }
  std::string root = mounted.out;
  while (!root.empty() && (root.back() == '\n' || root.back() == ' ')) root.pop_back();
  bool found = false;
  std::exception_ptr failed;
  try {
    found = isDirectoryIn(root, path);
  } catch (...) {
    failed = std::current_exception();
  }
  podman::run(conf, {"image", "unmount", name});  // a leftover mount is only a mount count
  if (failed) std::rethrow_exception(failed);
  return found;
}

void build(const BuildOptions& opts) {
  if (::geteuid() != 0) {
    throw RunnerError(
        "image build: needs root (debootstrap, and the podman tier is rootful podman)");
  }
  if (opts.name.empty()) throw RunnerError("image build: the image name is empty");
  if (!opts.force && exists(opts.name)) {
    progress(opts.name + " exists (--force rebuilds it)");
    return;
  }
  const std::string conf = podman::containersConfPath();
  Scratch scratch;
  const std::string root = scratch.dir() + "/rootfs";
  const std::string log = scratch.dir() + "/debootstrap.log";

  progress("debootstrap " + std::string(kSuite) + " from " + kMirror + " (about a minute; log " +
           log + ")");
  {
    SpawnOptions s;
    s.argv = {
        "debootstrap", "--variant=minbase", std::string("--include=") + kPackages, kSuite, root,
        kMirror};
    s.stdout_path = log;
    s.stderr_path = log;
    s.new_session = true;
    const int status = waitExit(spawn(s));
    check("debootstrap", CommandResult{status, "", ""}, log);
  }

  // The agent's user: uid/gid kAgentUid ("agent"), the --user of every podman agent.
  const std::string uid = std::to_string(podman::kAgentUid);
  check("useradd agent",
        runCommand({"chroot", root, "useradd", "--create-home", "--uid", uid, "--user-group",
                    "--shell", "/bin/bash", "agent"}),
        "");
  // The mount points of the sandbox's socket and nano-init, so podman creates nothing.
  fs::create_directories(root + "/run/sam");
  // Package caches are dead weight in every agent.
  for (const char* d : {"/var/cache/apt/archives", "/var/lib/apt/lists"}) {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(root + d, ec)) {
      if (e.is_regular_file()) fs::remove(e.path(), ec);
    }
  }

  const std::string tar = scratch.dir() + "/rootfs.tar";
  progress("tar and podman import as " + opts.name);
  check("tar", runCommand({"tar", "--numeric-owner", "-C", root, "-cf", tar, "."}, "", minutes(10)),
        "");
  if (opts.force) podman::run(conf, {"image", "rm", "--force", "--ignore", opts.name});
  check("podman import",
        podman::run(
            conf,
            {"import", "--change", "USER=" + uid + ":" + uid, "--change", "WORKDIR=/home/agent",
             "--change", "ENV=HOME=/home/agent", "--change", "CMD=/bin/bash", tar, opts.name},
            minutes(10)),
        "");
  progress("done: " + opts.name);
}

}  // namespace runner::image
