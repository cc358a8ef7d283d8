#include "compass-runner/microvm_initramfs.h"

#include <elf.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include "common/unique_fd.h"
#include "compass-runner/backend.h"
#include "compass-runner/process.h"

namespace runner::microvm {
namespace {

namespace fs = std::filesystem;

constexpr size_t kMaxCpioName = 4096;

// What both stages use, sourced by each (a builtin: no fork). $B is each stage's busybox.
// die: says why on the console and, once the control port is fd 3, to the runner ("fail …"),
// then powers the guest off. port: sets P to /dev/vportNpM of the port named $1.
constexpr std::string_view kGuestLib = R"SH(# compass-runner microvm guest: shared by both stages.
log() { read -r up _ < /proc/uptime; echo "compass-init: [$up] $*" > /dev/console; }
die() {
  echo "compass-init: FATAL: $*" > /dev/console
  [ -e /proc/self/fd/3 ] && echo "fail $*" >&3
  $B poweroff -f; $B reboot -f
}
port() {
  for p in /sys/class/virtio-ports/*; do
    n=; read -r n < "$p/name" 2>/dev/null
    [ "$n" = "$1" ] && { P="/dev/${p##*/}"; return 0; }
  done
  return 1
}
)SH";

// Stage 1: PID 1 in the initramfs. Every failure says why on the console and on the control
// port ("fail …", which the runner shows), then powers the guest off.
constexpr std::string_view kStage1 = R"SH(#!/bin/busybox sh
# compass-runner microvm guest, stage 1 (PID 1 in the initramfs). Every external command is a
# fork and exec, which costs ~30 ms under TCG: the mounts go in fstab files, the modules in one
# modprobe, and the port lookups use shell builtins only.
B=/bin/busybox
. /compass/lib.sh
$B mount -a -T /etc/fstab.early
log "stage 1: loading modules"
read -r modules < /lib/modules/order
$B modprobe -a $modules || die "modprobe $modules"
i=0
until port compass.control && [ -c "$P" ] && [ -b /dev/vda ]; do
  i=$((i + 1)); [ $i -gt 2000 ] && die "no control port or /dev/vda after 20 s"
  $B usleep 10000
done
exec 3<>"$P" || die "open $P"
echo boot >&3
log "stage 1: mounting the root"
$B mkdir /rw/upper /rw/work /dev/pts /dev/shm || die "mkdir in the scratch tmpfs and /dev"
$B mount -a -T /etc/fstab.root || die "mount the root (erofs on /dev/vda, tmpfs overlay)"
$B mkdir -p -m 0700 /newroot/.compass /newroot/dev /newroot/proc /newroot/sys ||
  die "make the mount points in the root"
$B mount -a -T /etc/fstab.new || die "mount /dev, /proc, /sys and the launch step in the root"
cd /newroot || die "cd /newroot"
# switch_root without emptying the initramfs (/.compass is a bind of its /compass, and stays
# out of the agent's reach: 0700 root).
$B mount --move . / || die "move the root to /"
exec $B chroot . /.compass/busybox sh /.compass/stage2
)SH";

// Mount tables for stage 1's `mount -a -T` (one process per table, not per mount).
constexpr std::string_view kFstabEarly =
    "proc /proc proc nosuid,nodev,noexec 0 0\n"
    "sysfs /sys sysfs nosuid,nodev,noexec 0 0\n"
    "devtmpfs /dev devtmpfs nosuid 0 0\n"
    "scratch /rw tmpfs mode=0755 0 0\n";
constexpr std::string_view kFstabRoot =
    "/dev/vda /lower erofs ro,nodev 0 0\n"
    "root /newroot overlay nodev,lowerdir=/lower,upperdir=/rw/upper,workdir=/rw/work 0 0\n";
// New proc and sysfs instances in the root (busybox's `mount -a` does not do MS_MOVE), the one
// devtmpfs again, and the launch step bound at /.compass.
constexpr std::string_view kFstabNew =
    "proc /newroot/proc proc nosuid,nodev,noexec 0 0\n"
    "sysfs /newroot/sys sysfs nosuid,nodev,noexec 0 0\n"
    "devtmpfs /newroot/dev devtmpfs nosuid 0 0\n"
    "devpts /newroot/dev/pts devpts newinstance,ptmxmode=0666,mode=0620,nosuid,noexec 0 0\n"
    "shm /newroot/dev/shm tmpfs mode=1777,nosuid,nodev 0 0\n"
    "/compass /newroot/.compass none bind 0 0\n";

// Stage 2: PID 1 in the agent's root (fd 3 = the control port, kept across the chroot).
constexpr std::string_view kStage2 =
    R"SH(# compass-runner microvm guest, stage 2 (PID 1 in the agent's root).
B=/.compass/busybox
. /.compass/lib.sh
. /.compass/agent.env || die "read agent.env"
port compass.boundary && BOX=$P || die "no boundary port"
port compass.stdout && OUT=$P || die "no stdout port"
port compass.stderr && ERR=$P || die "no stderr port"
$B rm -f /etc/resolv.conf
echo "nameserver 100.127.255.253" > /etc/resolv.conf || die "write /etc/resolv.conf"
$B chmod 0600 /dev/net/tun || die "chmod /dev/net/tun"
HOME=/
while IFS=: read -r _ _ uid _ _ home _; do
  [ "$uid" = "$COMPASS_UID" ] && { [ -d "$home" ] && HOME=$home; break; }
done < /etc/passwd
export HOME PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
if [ -n "$COMPASS_PIDS" ]; then ulimit -u "$COMPASS_PIDS" || die "ulimit -u $COMPASS_PIDS"; fi
cd "$COMPASS_WORKDIR" || die "--workdir $COMPASS_WORKDIR: no such directory in the root"
USER_IDS="$COMPASS_UID:$COMPASS_GID"
unset COMPASS_UID COMPASS_GID COMPASS_PIDS COMPASS_WORKDIR n p P i
log "stage 2: starting nano-init as $USER_IDS"
echo up >&3
# The agent gets no user namespaces (an unprivileged way to the kernel's whole surface).
echo 0 > /proc/sys/user/max_user_namespaces || die "user.max_user_namespaces=0"
# 3>&-: the control port stays with this script; the agent must not report its own status.
/.compass/nano-init run --user "$USER_IDS" "h2+dev://$BOX" "$@" </dev/null >"$OUT" 2>"$ERR" 3>&- &
pid=$!
while read -r cmd; do [ "$cmd" = stop ] && kill -TERM $pid; done <&3 &
wait $pid
rc=$?
log "stage 2: the agent exited with status $rc; powering off"
echo "exit $rc" >&3
$B sync
$B poweroff -f
$B reboot -f
)SH";

std::string readFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw RunnerError("cannot read " + path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void writeFileAtomically(const std::string& path, const std::string& data, mode_t mode) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    // O_EXCL|O_NOFOLLOW: never write through a name someone else put there.
    ::unlink(tmp.c_str());
    const common::UniqueFd fd(
        ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode));
    if (!fd.valid()) throw RunnerError("cannot create " + tmp + ": " + std::strerror(errno));
    size_t done = 0;
    while (done < data.size()) {
      const ssize_t n = ::write(fd.get(), data.data() + done, data.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        ::unlink(tmp.c_str());
        throw RunnerError("cannot write " + tmp + ": " + std::strerror(errno));
      }
      done += static_cast<size_t>(n);
    }
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    ::unlink(tmp.c_str());
    throw RunnerError("cannot rename " + tmp + " to " + path);
  }
}

void appendHex(std::string& out, uint32_t v) {
  char buf[9];
  std::snprintf(buf, sizeof buf, "%08X", v);
  out.append(buf, 8);
}

void pad4(std::string& out) {
  while (out.size() % 4 != 0) out += '\0';
}

// "path:size:mtime;" for the cache key.
std::string stamp(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) throw RunnerError("cannot find " + path);
  return path + ":" + std::to_string(st.st_size) + ":" + std::to_string(st.st_mtim.tv_sec) + "." +
         std::to_string(st.st_mtim.tv_nsec) + ";";
}

// True if the ELF file at `path` has no PT_INTERP (statically linked).
bool isStaticElf(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  Elf64_Ehdr eh{};
  if (!in.read(reinterpret_cast<char*>(&eh), sizeof eh) ||
      std::string_view(reinterpret_cast<const char*>(eh.e_ident), 4) != ELFMAG ||
      eh.e_ident[EI_CLASS] != ELFCLASS64) {
    return false;
  }
  for (int i = 0; i < eh.e_phnum; ++i) {
    Elf64_Phdr ph{};
    in.seekg(static_cast<std::streamoff>(eh.e_phoff + uint64_t(i) * eh.e_phentsize));
    if (!in.read(reinterpret_cast<char*>(&ph), sizeof ph)) return false;
    if (ph.p_type == PT_INTERP) return false;
  }
  return true;
}

// nano-init without its debug sections (31 MiB → 3 MiB: the guest unpacks every byte of the
// initramfs, emulated under TCG). The unstripped file when `strip` is not installed.
std::string strippedNanoInit(const std::string& nano_init, const std::string& cache_dir) {
  const std::string out = cache_dir + "/nano-init.strip." + std::to_string(::getpid());
  try {
    const CommandResult r =
        runCommand({"strip", "-o", out, nano_init}, "", std::chrono::seconds(60));
    if (r.status == 0) {
      std::string data = readFile(out);
      ::unlink(out.c_str());
      return data;
    }
  } catch (const RunnerError&) {
    // strip is not installed: the unstripped binary works, only slower to unpack
  }
  ::unlink(out.c_str());
  return readFile(nano_init);
}

}  // namespace

std::string cpioArchive(const std::vector<CpioEntry>& entries) {
  std::string out;
  uint32_t ino = 1;
  auto add = [&](const std::string& name, uint32_t mode, const std::string& data, uint32_t maj,
                 uint32_t min) {
    if (name.size() >= kMaxCpioName || name.find('\0') != std::string::npos) {
      throw RunnerError("cpio: bad entry name \"" + name + "\"");
    }
    out += "070701";
    for (uint32_t v : {ino++, mode, 0U, 0U, 1U, 0U, static_cast<uint32_t>(data.size()), 0U, 0U, maj,
                       min, static_cast<uint32_t>(name.size() + 1), 0U}) {
      appendHex(out, v);
    }
    out += name;
    out += '\0';
    pad4(out);
    out += data;
    pad4(out);
  };
  for (const auto& e : entries) add(e.name, e.mode, e.data, e.rdev_major, e.rdev_minor);
  add("TRAILER!!!", 0, "", 0, 0);
  return out;
}

std::string shellQuote(std::string_view text) {
  std::string out = "'";
  for (char c : text) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

std::string agentEnv(const GuestAgent& agent) {
  std::string env = "COMPASS_UID=" + std::to_string(agent.uid) + "\n";
  env += "COMPASS_GID=" + std::to_string(agent.gid) + "\n";
  env += "COMPASS_WORKDIR=" + shellQuote(agent.workdir.empty() ? "/" : agent.workdir) + "\n";
  env += "COMPASS_PIDS=" + (agent.pids ? std::to_string(*agent.pids) : std::string()) + "\n";
  env += "set --";
  for (const auto& arg : agent.command) env += " " + shellQuote(arg);
  return env + "\n";
}

std::string agentCpio(const GuestAgent& agent) {
  return cpioArchive({{"compass", S_IFDIR | 0700, "", 0, 0},
                      {"compass/agent.env", S_IFREG | 0600, agentEnv(agent), 0, 0}});
}

std::string_view stage1Script() { return kStage1; }
std::string_view stage2Script() { return kStage2; }

std::string guestKernelDir() {
  const char* v = std::getenv("COMPASS_GUEST_KERNEL");
  return v != nullptr && *v != '\0' ? v : "/usr/local/lib/compass/guest-kernel";
}

GuestKernel findGuestKernel() {
  GuestKernel k;
  k.dir = guestKernelDir();
  std::error_code ec;
  std::vector<std::string> releases;
  for (const auto& e : fs::directory_iterator(k.dir + "/boot", ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("vmlinuz-", 0) == 0) releases.push_back(name.substr(8));
  }
  std::sort(releases.begin(), releases.end());
  for (auto it = releases.rbegin(); it != releases.rend(); ++it) {
    const std::string modules = k.dir + "/lib/modules/" + *it + "/kernel";
    if (fs::is_directory(modules, ec)) {
      k.release = *it;
      k.vmlinuz = k.dir + "/boot/vmlinuz-" + *it;
      k.modules = modules;
      return k;
    }
  }
  throw RunnerError("no guest kernel in " + k.dir +
                    " (boot/vmlinuz-RELEASE and lib/modules/RELEASE/): run scripts/install-deps "
                    "from a checkout, which unpacks Debian's linux-image-cloud-amd64 there "
                    "(`apt-get download` its linux-image-*-cloud-amd64 dependency, then "
                    "`dpkg-deb -x PACKAGE.deb DIR`), or set COMPASS_GUEST_KERNEL to such a "
                    "directory");
}

const std::vector<std::string>& guestModules() {
  static const std::vector<std::string> kModules = {"drivers/virtio/virtio_ring",
                                                    "drivers/virtio/virtio",
                                                    "drivers/virtio/virtio_mmio",
                                                    "drivers/char/virtio_console",
                                                    "drivers/block/virtio_blk",
                                                    "lib/libcrc32c",
                                                    "fs/erofs/erofs",
                                                    "fs/overlayfs/overlay",
                                                    "drivers/net/tun"};
  return kModules;
}

std::string findBusybox() {
  const char* v = std::getenv("COMPASS_BUSYBOX");
  const std::string path = v != nullptr && *v != '\0' ? v : "/bin/busybox";
  if (::access(path.c_str(), X_OK) != 0) {
    throw RunnerError("busybox not found at " + path +
                      " (install Debian's busybox-static: apt-get install busybox-static)");
  }
  if (!isStaticElf(path)) {
    throw RunnerError(path +
                      " is not statically linked; the guest launch step needs Debian's "
                      "busybox-static (apt-get install busybox-static)");
  }
  return path;
}

std::string cacheDir() {
  const char* v = std::getenv("COMPASS_MICROVM_CACHE");
  const std::string dir = v != nullptr && *v != '\0' ? v : "/var/lib/compass/microvm";
  std::error_code ec;
  fs::create_directories(dir, ec);
  // What is cached here is booted for later agents: the directory must be ours alone, or
  // anyone who could write it could plant a root image or an initramfs.
  const common::UniqueFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  struct stat st {};
  if (!fd.valid() || ::fstat(fd.get(), &st) != 0) {
    throw RunnerError("the microvm cache dir " + dir +
                      " (COMPASS_MICROVM_CACHE) cannot be opened as a directory (a symlink is "
                      "refused): " +
                      std::strerror(errno));
  }
  if (st.st_uid != ::geteuid()) {
    throw RunnerError("the microvm cache dir " + dir + " (COMPASS_MICROVM_CACHE) belongs to uid " +
                      std::to_string(st.st_uid) +
                      ", not to this user: whoever owns it could plant what the guest boots");
  }
  if ((st.st_mode & 07777) != 0700) ::fchmod(fd.get(), 0700);
  return dir;
}

std::string baseInitramfs(const GuestKernel& kernel, const std::string& nano_init,
                          const std::string& busybox, const std::string& cache_dir) {
  // kLayout changes whenever the archive's layout below does (the scripts are in the key).
  constexpr const char* kLayout = "layout 5;";
  std::string key = kLayout + stamp(nano_init) + stamp(busybox) + stamp(kernel.vmlinuz);
  for (const auto& m : guestModules()) key += stamp(kernel.modules + "/" + m + ".ko");
  key += std::string(kGuestLib) + std::string(kStage1) + std::string(kStage2) +
         std::string(kFstabEarly) + std::string(kFstabRoot) + std::string(kFstabNew) +
         kernel.release;
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016zx", std::hash<std::string>{}(key));
  const std::string path = cache_dir + "/initramfs-" + hex + ".cpio";
  if (::access(path.c_str(), R_OK) == 0) {
    // In use: keep it younger than the clean-up below, whichever runner does that.
    ::utimensat(AT_FDCWD, path.c_str(), nullptr, 0);
    return path;
  }

  std::vector<CpioEntry> e = {
      {"bin", S_IFDIR | 0755, "", 0, 0},
      {"dev", S_IFDIR | 0755, "", 0, 0},
      {"dev/console", S_IFCHR | 0600, "", 5, 1},
      {"proc", S_IFDIR | 0755, "", 0, 0},
      {"sys", S_IFDIR | 0755, "", 0, 0},
      {"lib", S_IFDIR | 0755, "", 0, 0},
      {"lib/modules", S_IFDIR | 0755, "", 0, 0},
      {"lib/modules/" + kernel.release, S_IFDIR | 0755, "", 0, 0},
      {"etc", S_IFDIR | 0755, "", 0, 0},
      {"etc/fstab.early", S_IFREG | 0644, std::string(kFstabEarly), 0, 0},
      {"etc/fstab.root", S_IFREG | 0644, std::string(kFstabRoot), 0, 0},
      {"etc/fstab.new", S_IFREG | 0644, std::string(kFstabNew), 0, 0},
      {"lower", S_IFDIR | 0755, "", 0, 0},
      {"rw", S_IFDIR | 0755, "", 0, 0},
      {"newroot", S_IFDIR | 0755, "", 0, 0},
      {"compass", S_IFDIR | 0700, "", 0, 0},
      {"init", S_IFREG | 0755, std::string(kStage1), 0, 0},
      {"compass/stage2", S_IFREG | 0700, std::string(kStage2), 0, 0},
      {"compass/lib.sh", S_IFREG | 0700, std::string(kGuestLib), 0, 0},
      // One busybox, reachable from the agent's root too (/.compass/busybox, stage 2).
      {"compass/busybox", S_IFREG | 0755, readFile(busybox), 0, 0},
      {"bin/busybox", S_IFLNK | 0777, "/compass/busybox", 0, 0},
      {"compass/nano-init", S_IFREG | 0755, strippedNanoInit(nano_init, cache_dir), 0, 0},
  };
  // Flat in lib/modules/RELEASE/, with a modules.dep naming no dependencies: modprobe -a
  // loads them in the order given, which is their dependency order.
  std::string order, dep;
  for (const auto& m : guestModules()) {
    const std::string name = fs::path(m).filename().string();
    e.push_back({"lib/modules/" + kernel.release + "/" + name + ".ko", S_IFREG | 0644,
                 readFile(kernel.modules + "/" + m + ".ko"), 0, 0});
    order += (order.empty() ? "" : " ") + name;
    dep += name + ".ko:\n";
  }
  e.push_back({"lib/modules/order", S_IFREG | 0644, order + "\n", 0, 0});
  e.push_back({"lib/modules/" + kernel.release + "/modules.dep", S_IFREG | 0644, dep, 0, 0});
  writeFileAtomically(path, cpioArchive(e), 0600);
  // Older bases (another nano-init, kernel or layout) go once nothing can be copying them.
  std::error_code ec;
  const auto now = fs::file_time_type::clock::now();
  for (const auto& f : fs::directory_iterator(cache_dir, ec)) {
    const std::string name = f.path().filename().string();
    if (name.rfind("initramfs-", 0) == 0 && f.path() != path &&
        now - fs::last_write_time(f.path(), ec) > std::chrono::minutes(10)) {
      fs::remove(f.path(), ec);
    }
  }
  return path;
}

void writeAgentInitramfs(const std::string& base, const GuestAgent& agent, const std::string& out) {
  std::error_code ec;
  fs::copy_file(base, out, fs::copy_options::overwrite_existing, ec);
  if (ec) throw RunnerError("cannot copy " + base + " to " + out + ": " + ec.message());
  ::chmod(out.c_str(), 0600);
  std::ofstream f(out, std::ios::binary | std::ios::app);
  const std::string archive = agentCpio(agent);
  f.write(archive.data(), static_cast<std::streamsize>(archive.size()));
  if (!f.flush()) throw RunnerError("cannot write " + out);
}

}  // namespace runner::microvm
