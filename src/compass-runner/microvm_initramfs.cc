#include "compass-runner/microvm_initramfs.h"

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
#include "compass-runner/elf_check.h"
#include "compass-runner/microvm_cache.h"
#include "compass-runner/microvm_guest_scripts.h"
#include "compass-runner/process.h"

namespace runner::microvm {
namespace {

namespace fs = std::filesystem;

constexpr size_t kMaxCpioName = 4096;
// Changes whenever the firewall layer's layout does.
constexpr const char* kFirewallLayout = "firewall layout 1;";
// Changes whenever what addModules() makes of a .ko does (in both cache keys): an archive
// cached by an older runner holds the modules as they were then.
constexpr const char* kModuleFormat = "modules unsigned 1;";
// struct module_signature (include/linux/module_signature.h): algo, hash, id_type, signer_len,
// key_id_len, 3 bytes of padding, then the signature's length as a big-endian 32-bit number.
constexpr size_t kModuleSignatureInfo = 12;
constexpr std::string_view kModuleSignatureMarker = "~Module signature appended~\n";

std::string readFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw RunnerError("cannot read " + path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void writeFileAtomically(const std::string& path, const std::string& data, mode_t mode) {
  const std::string tmp = tempPathFor(path);
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
  (void)std::snprintf(buf, sizeof buf, "%08X", v);
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

// The cache file for `key` under `cache_dir`: PREFIX + a hash of the key + ".cpio". An existing
// one is touched (in use: keep it younger than writeCached()'s clean-up).
std::string cachedPath(const std::string& cache_dir, const char* prefix, const std::string& key) {
  char hex[17];
  (void)std::snprintf(hex, sizeof hex, "%016zx", std::hash<std::string>{}(key));
  std::string path = cache_dir + "/" + prefix + hex + ".cpio";
  if (::access(path.c_str(), R_OK) == 0) ::utimensat(AT_FDCWD, path.c_str(), nullptr, 0);
  return path;
}

// Writes `archive` to `path`, then removes older archives of the same prefix (another
// nano-init, kernel or layout) once nothing can be copying them.
void writeCached(const std::string& cache_dir, const char* prefix, const std::string& path,
                 const std::string& archive) {
  writeFileAtomically(path, archive, 0600);
  std::error_code ec;
  const auto now = fs::file_time_type::clock::now();
  for (const auto& f : fs::directory_iterator(cache_dir, ec)) {
    const std::string name = f.path().filename().string();
    if (name.rfind(prefix, 0) == 0 && f.path() != path &&
        now - fs::last_write_time(f.path(), ec) > std::chrono::minutes(10)) {
      fs::remove(f.path(), ec);
    }
  }
}

// Adds the .ko files of `copy` flat in lib/modules/RELEASE/, and the order file and a
// modules.dep naming no dependencies for `order`: modprobe -a loads them in the order given,
// which is their dependency order.
void addModules(std::vector<CpioEntry>& e, const GuestKernel& kernel,
                const std::vector<std::string>& copy, const std::vector<std::string>& order) {
  for (const auto& m : copy) {
    const std::string ko = kernel.modules + "/" + m + ".ko";
    e.push_back({"lib/modules/" + kernel.release + "/" + fs::path(m).filename().string() + ".ko",
                 S_IFREG | 0644, stripModuleSignature(readFile(ko), ko), 0, 0});
  }
  std::string names, dep;
  for (const auto& m : order) {
    const std::string name = fs::path(m).filename().string();
    names += (names.empty() ? "" : " ") + name;
    dep += name + ".ko:\n";
  }
  e.push_back({"lib/modules/order", S_IFREG | 0644, names + "\n", 0, 0});
  e.push_back({"lib/modules/" + kernel.release + "/modules.dep", S_IFREG | 0644, dep, 0, 0});
}

// `nft` as the runner runs it elsewhere (findProgram(): on PATH unless it has a slash), if it
// is an executable file.
std::string findNft(const std::string& nft) {
  try {
    std::string path = findProgram(nft);
    if (::access(path.c_str(), X_OK) == 0) return path;
  } catch (const RunnerError&) {
    // said below, with what to install
  }
  throw RunnerError(
      "--egress firewall in the microvm tier needs nft on the host, copied into the "
      "guest (apt-get install nftables)");
}

// The shared libraries `binary` loads, as (name in the guest, host path), from ldd(1); the
// dynamic loader is named "ld.so". Throws RunnerError if ldd fails or names no loader.
std::vector<std::pair<std::string, std::string>> sharedLibraries(const std::string& binary) {
  const CommandResult r = runCommand({"ldd", binary}, "", std::chrono::seconds(30));
  if (r.status != 0) throw RunnerError("ldd " + binary + " failed: " + r.err);
  std::vector<std::pair<std::string, std::string>> libs;
  bool loader = false;
  std::istringstream in(r.out);
  for (std::string line; std::getline(in, line);) {
    std::istringstream words(line);
    std::string first, arrow, target;
    words >> first >> arrow >> target;
    if (arrow == "=>" && target.starts_with("/")) {
      libs.emplace_back(first, target);
    } else if (first.starts_with("/")) {
      libs.emplace_back("ld.so", first);
      loader = true;
    }
  }
  if (!loader) throw RunnerError("ldd " + binary + " names no dynamic loader");
  return libs;
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

namespace {

// Firewall fields go into a file both stages source: only the characters their kind needs.
void checkChars(const char* field, const std::string& value, std::string_view allowed) {
  if (value.empty() || value.find_first_not_of(allowed) != std::string::npos) {
    throw RunnerError(std::string("microvm firewall: ") + field + " \"" + value +
                      "\": unexpected character");
  }
}

std::string firewallEnv(const GuestFirewall& fw) {
  constexpr std::string_view kAddress = "0123456789abcdef.:/";
  checkChars("address4", fw.address4, kAddress);
  checkChars("address6", fw.address6, kAddress);
  checkChars("gateway4", fw.gateway4, kAddress);
  checkChars("gateway6", fw.gateway6, kAddress);
  return "FW_ADDR4=" + fw.address4 + "\nFW_ADDR6=" + fw.address6 + "\nFW_GW4=" + fw.gateway4 +
         "\nFW_GW6=" + fw.gateway6 + "\n";
}

}  // namespace

std::string agentCpio(const GuestAgent& agent) {
  std::vector<CpioEntry> e = {{"compass", S_IFDIR | 0700, "", 0, 0}};
  std::string env = agentEnv(agent);
  if (agent.firewall) {
    env += "COMPASS_EGRESS=firewall\n";
    e.push_back({"compass/firewall.env", S_IFREG | 0600, firewallEnv(*agent.firewall), 0, 0});
    e.push_back({"compass/firewall.nft", S_IFREG | 0600, agent.firewall->ruleset, 0, 0});
  }
  e.push_back({"compass/agent.env", S_IFREG | 0600, env, 0, 0});
  return cpioArchive(e);
}

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

std::string stripModuleSignature(std::string ko, const std::string& what) {
  const size_t tail = kModuleSignatureInfo + kModuleSignatureMarker.size();
  if (!ko.ends_with(kModuleSignatureMarker)) return ko;
  if (ko.size() <= tail) {
    throw RunnerError("module " + what + ": signature trailer without its signature information");
  }
  const auto* len = reinterpret_cast<const unsigned char*>(ko.data() + ko.size() - tail +
                                                           kModuleSignatureInfo - 4);
  const uint64_t sig_len = (uint64_t{len[0]} << 24) | (uint64_t{len[1]} << 16) |
                           (uint64_t{len[2]} << 8) | uint64_t{len[3]};
  // The kernel's own bound (mod_check_sig()): something of the module must be left.
  if (sig_len >= ko.size() - tail) {
    throw RunnerError("module " + what + ": its signature trailer claims " +
                      std::to_string(sig_len) + " bytes of signature, more than the file holds");
  }
  ko.resize(ko.size() - tail - sig_len);
  return ko;
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

std::string baseInitramfs(const GuestKernel& kernel, const std::string& nano_init,
                          const std::string& busybox, const std::string& cache_dir) {
  // kLayout changes whenever the archive's layout below does (the scripts are in the key).
  constexpr const char* kLayout = "layout 6;";
  std::string key = kLayout + std::string(kModuleFormat) + stamp(nano_init) + stamp(busybox) +
                    stamp(kernel.vmlinuz);
  for (const auto& m : guestModules()) key += stamp(kernel.modules + "/" + m + ".ko");
  key += std::string(guestLibScript()) + std::string(stage1Script()) + std::string(stage2Script()) +
         std::string(fstabEarly()) + std::string(fstabRoot()) + std::string(fstabNew()) +
         kernel.release;
  std::string path = cachedPath(cache_dir, "initramfs-", key);
  if (::access(path.c_str(), R_OK) == 0) return path;

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
      {"etc/fstab.early", S_IFREG | 0644, std::string(fstabEarly()), 0, 0},
      {"etc/fstab.root", S_IFREG | 0644, std::string(fstabRoot()), 0, 0},
      {"etc/fstab.new", S_IFREG | 0644, std::string(fstabNew()), 0, 0},
      {"lower", S_IFDIR | 0755, "", 0, 0},
      {"rw", S_IFDIR | 0755, "", 0, 0},
      {"newroot", S_IFDIR | 0755, "", 0, 0},
      {"compass", S_IFDIR | 0700, "", 0, 0},
      {"init", S_IFREG | 0755, std::string(stage1Script()), 0, 0},
      {"compass/stage2", S_IFREG | 0700, std::string(stage2Script()), 0, 0},
      {"compass/lib.sh", S_IFREG | 0700, std::string(guestLibScript()), 0, 0},
      // One busybox, reachable from the agent's root too (/.compass/busybox, stage 2).
      {"compass/busybox", S_IFREG | 0755, readFile(busybox), 0, 0},
      {"bin/busybox", S_IFLNK | 0777, "/compass/busybox", 0, 0},
      {"compass/nano-init", S_IFREG | 0755, strippedNanoInit(nano_init, cache_dir), 0, 0},
  };
  addModules(e, kernel, guestModules(), guestModules());
  writeCached(cache_dir, "initramfs-", path, cpioArchive(e));
  return path;
}

const std::vector<std::string>& firewallModules() {
  static const std::vector<std::string> kModules = {"net/core/failover",
                                                    "drivers/net/net_failover",
                                                    "drivers/net/virtio_net",
                                                    "net/netfilter/nfnetlink",
                                                    "net/netfilter/nf_tables",
                                                    "net/ipv4/netfilter/nf_defrag_ipv4",
                                                    "net/ipv6/netfilter/nf_defrag_ipv6",
                                                    "net/netfilter/nf_conntrack",
                                                    "net/netfilter/nft_ct",
                                                    "net/ipv4/netfilter/nf_reject_ipv4",
                                                    "net/ipv6/netfilter/nf_reject_ipv6",
                                                    "net/netfilter/nft_reject",
                                                    "net/netfilter/nft_reject_inet"};
  return kModules;
}

std::string firewallLayer(const GuestKernel& kernel, const std::string& nft,
                          const std::string& cache_dir) {
  const std::string nft_path = findNft(nft);
  const auto libs = sharedLibraries(nft_path);
  std::string key = std::string(kFirewallLayout) + kModuleFormat + stamp(nft_path) + kernel.release;
  for (const auto& [name, lib] : libs) key += name + "=" + stamp(lib);
  // The layer's order file names the base's modules too: a change to those is a new layer.
  for (const auto& m : guestModules()) key += m + ";";
  for (const auto& m : firewallModules()) key += stamp(kernel.modules + "/" + m + ".ko");
  std::string path = cachedPath(cache_dir, "fwlayer-", key);
  if (::access(path.c_str(), R_OK) == 0) return path;

  std::vector<CpioEntry> e = {{"compass", S_IFDIR | 0700, "", 0, 0},
                              {"compass/nft", S_IFDIR | 0700, "", 0, 0},
                              {"compass/nft/nft", S_IFREG | 0700, readFile(nft_path), 0, 0}};
  for (const auto& [name, lib] : libs) {
    e.push_back({"compass/nft/" + name, S_IFREG | 0700, readFile(lib), 0, 0});
  }
  std::vector<std::string> all = guestModules();
  all.insert(all.end(), firewallModules().begin(), firewallModules().end());
  addModules(e, kernel, firewallModules(), all);
  writeCached(cache_dir, "fwlayer-", path, cpioArchive(e));
  return path;
}

void writeAgentInitramfs(const std::string& base, const std::vector<std::string>& layers,
                         const GuestAgent& agent, const std::string& out) {
  std::error_code ec;
  fs::copy_file(base, out, fs::copy_options::overwrite_existing, ec);
  if (ec) throw RunnerError("cannot copy " + base + " to " + out + ": " + ec.message());
  ::chmod(out.c_str(), 0600);
  std::ofstream f(out, std::ios::binary | std::ios::app);
  for (const auto& layer : layers) {
    std::ifstream in(layer, std::ios::binary);
    if (!in || !(f << in.rdbuf())) {
      std::string what = "cannot append ";
      what.append(layer).append(" to ").append(out);
      throw RunnerError(what);
    }
  }
  const std::string archive = agentCpio(agent);
  f.write(archive.data(), static_cast<std::streamsize>(archive.size()));
  if (!f.flush()) throw RunnerError("cannot write " + out);
}

}  // namespace runner::microvm
