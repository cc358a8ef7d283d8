#include "compass-runner/netns.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <net/if.h>
#include <net/route.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <unistd.h>
// After <net/if.h>: linux/if_tun.h needs its struct ifreq but must not redeclare IFF_*.
#include <linux/if_tun.h>
// After <netinet/in.h> (libc-compat keeps it from redefining in6_addr): struct in6_ifreq.
#include <linux/ipv6.h>
#include <sys/ioctl.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <functional>
#include <thread>

#include "compass-runner/backend.h"
#include "compass-runner/process.h"
#include "vdns/virtual_dns.h"

namespace runner::netns {
namespace {

constexpr const char* kPrefix = "compass-";

std::string errnoText(const std::string& call) { return call + ": " + std::strerror(errno); }

// Runs `fn` on a short-lived thread: setns() (and unshare()) change only the calling thread's
// namespace, so the runner's own threads never leave the root netns. `fn` returns "" or the
// failing call with errno; that becomes RunnerError("netns: <what>: <error>").
void onThread(const std::string& what, const std::function<std::string()>& fn) {
  std::string error;
  std::thread worker([&] { error = fn(); });
  worker.join();
  if (!error.empty()) throw RunnerError("netns: " + what + ": " + error);
}

// As `ip netns add` makes kDir (ip-netns(8)): a shared mount point, so a namespace mounted in
// it shows in every mount namespace (podman's included) and its removal does too.
std::string makeDirSharedMount() {
  if (::mkdir(kDir, 0755) != 0 && errno != EEXIST) return errnoText(std::string("mkdir ") + kDir);
  if (::mount("", kDir, nullptr, MS_SHARED | MS_REC, nullptr) == 0) return "";
  if (errno != EINVAL) return errnoText(std::string("mount --make-rshared ") + kDir);
  // EINVAL: not a mount point yet; bind it onto itself, then share it.
  if (::mount(kDir, kDir, nullptr, MS_BIND | MS_REC, nullptr) != 0) {
    return errnoText(std::string("mount --rbind ") + kDir + " " + kDir);
  }
  if (::mount("", kDir, nullptr, MS_SHARED | MS_REC, nullptr) != 0) {
    return errnoText(std::string("mount --make-rshared ") + kDir);
  }
  return "";
}

// One interface ioctl on `sock`; "" or the call with errno.
std::string ifIoctl(int sock, unsigned long request, ifreq& ifr, const char* call) {
  if (::ioctl(sock, request, &ifr) == 0) return "";
  return errnoText(std::string(call) + "(" + ifr.ifr_name + ")");
}

std::string setUp(int sock, const char* dev) {
  ifreq ifr{};
  std::strncpy(ifr.ifr_name, dev, IFNAMSIZ - 1);
  if (auto e = ifIoctl(sock, SIOCGIFFLAGS, ifr, "SIOCGIFFLAGS"); !e.empty()) return e;
  ifr.ifr_flags = static_cast<short>(ifr.ifr_flags | IFF_UP);
  return ifIoctl(sock, SIOCSIFFLAGS, ifr, "SIOCSIFFLAGS");
}

sockaddr_in inet4(const char* text) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  ::inet_pton(AF_INET, text, &a.sin_addr);
  return a;
}

// In the calling thread's netns (the tun0 worker's): what `ip -batch` did before, as
// ioctls, in the same order. IPv6 needs no "nodad": tun0 (IFF_TUN) is IFF_NOARP, for which
// the kernel skips duplicate address detection, so the address is usable at once.
std::string configureTunHere() {
  common::UniqueFd s4(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  common::UniqueFd s6(::socket(AF_INET6, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!s4.valid() || !s6.valid()) return errnoText("socket");
  if (auto e = setUp(s4.get(), "lo"); !e.empty()) return e;
  ifreq ifr{};
  std::strncpy(ifr.ifr_name, "tun0", IFNAMSIZ - 1);
  ifr.ifr_mtu = vdns::kTunMtu;
  if (auto e = ifIoctl(s4.get(), SIOCSIFMTU, ifr, "SIOCSIFMTU"); !e.empty()) return e;
  if (auto e = setUp(s4.get(), "tun0"); !e.empty()) return e;
  const sockaddr_in addr = inet4(vdns::kTunAddress4);
  std::memcpy(&ifr.ifr_addr, &addr, sizeof addr);
  if (auto e = ifIoctl(s4.get(), SIOCSIFADDR, ifr, "SIOCSIFADDR"); !e.empty()) return e;
  sockaddr_in mask{};
  mask.sin_family = AF_INET;
  mask.sin_addr.s_addr = htonl(~((uint32_t{1} << (32 - vdns::kTunPrefix4)) - 1));
  std::memcpy(&ifr.ifr_netmask, &mask, sizeof mask);
  if (auto e = ifIoctl(s4.get(), SIOCSIFNETMASK, ifr, "SIOCSIFNETMASK"); !e.empty()) return e;
  const unsigned index = ::if_nametoindex("tun0");
  if (index == 0) return errnoText("if_nametoindex(tun0)");
  in6_ifreq a6{};
  ::inet_pton(AF_INET6, vdns::kTunAddress6, &a6.ifr6_addr);
  a6.ifr6_prefixlen = vdns::kTunPrefix6;
  a6.ifr6_ifindex = static_cast<int>(index);
  if (::ioctl(s6.get(), SIOCSIFADDR, &a6) != 0) return errnoText("SIOCSIFADDR(tun0, IPv6)");
  rtentry r4{};
  sockaddr_in any = inet4("0.0.0.0");
  std::memcpy(&r4.rt_dst, &any, sizeof any);
  std::memcpy(&r4.rt_genmask, &any, sizeof any);
  r4.rt_flags = RTF_UP;
  char dev[] = "tun0";
  r4.rt_dev = dev;
  if (::ioctl(s4.get(), SIOCADDRT, &r4) != 0) return errnoText("SIOCADDRT(0.0.0.0/0 dev tun0)");
  in6_rtmsg r6{};
  r6.rtmsg_dst_len = 0;    // ::/0
  r6.rtmsg_metric = 1024;  // what `ip route add ::/0 dev tun0` sets
  r6.rtmsg_flags = RTF_UP;
  r6.rtmsg_ifindex = static_cast<int>(index);
  if (::ioctl(s6.get(), SIOCADDRT, &r6) != 0) return errnoText("SIOCADDRT(::/0 dev tun0)");
  return "";
}

std::string enter(const std::string& name) {
  common::UniqueFd ns(::open(pathOf(name).c_str(), O_RDONLY | O_CLOEXEC));
  if (!ns.valid()) return errnoText("open(" + pathOf(name) + ")");
  if (::setns(ns.get(), CLONE_NEWNET) != 0) {
    return errnoText("setns(" + pathOf(name) + ", CLONE_NEWNET)");
  }
  return "";
}

}  // namespace

std::string nameFor(const std::string& id) { return kPrefix + id; }

std::string pathOf(const std::string& name) { return std::string(kDir) + "/" + name; }

void create(const std::string& name) {
  // What `ip netns add` does, in-process: one exec of ip fewer on the agent's path to start.
  if (exists(name)) throw RunnerError("netns: " + pathOf(name) + " exists already");
  if (const std::string e = makeDirSharedMount(); !e.empty()) {
    throw RunnerError("netns: create " + name + ": " + e);
  }
  const std::string path = pathOf(name);
  {
    // O_EXCL: a racing creator of the same name loses here, before anything is mounted.
    common::UniqueFd f(::open(path.c_str(), O_RDONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0));
    if (!f.valid()) throw RunnerError("netns: create " + name + ": " + errnoText("open " + path));
  }
  try {
    onThread("create " + name, [&]() -> std::string {
      if (::unshare(CLONE_NEWNET) != 0) return errnoText("unshare(CLONE_NEWNET)");
      if (::mount("/proc/thread-self/ns/net", path.c_str(), nullptr, MS_BIND, nullptr) != 0) {
        return errnoText("mount --bind /proc/thread-self/ns/net " + path);
      }
      return "";
    });
  } catch (...) {
    ::unlink(path.c_str());
    throw;
  }
}

common::UniqueFd openTun(const std::string& name) {
  // setns() changes only the calling thread's namespace: a short-lived thread does it, so the
  // runner's own threads never leave the root netns. A tun device belongs to the netns of
  // the process that ran TUNSETIFF on it.
  common::UniqueFd tun;
  std::string error;
  std::thread worker([&] {
    common::UniqueFd ns(::open(pathOf(name).c_str(), O_RDONLY | O_CLOEXEC));
    if (!ns.valid()) {
      error = errnoText("open(" + pathOf(name) + ")");
      return;
    }
    if (::setns(ns.get(), CLONE_NEWNET) != 0) {
      error = errnoText("setns(" + pathOf(name) + ", CLONE_NEWNET)");
      return;
    }
    common::UniqueFd fd(::open("/dev/net/tun", O_RDWR | O_CLOEXEC));
    if (!fd.valid()) {
      error = errnoText("open(/dev/net/tun)");
      return;
    }
    ifreq ifr{};
    std::strncpy(ifr.ifr_name, "tun0", IFNAMSIZ - 1);
    ifr.ifr_flags = IFF_TUN | IFF_NO_PI;
    if (::ioctl(fd.get(), TUNSETIFF, &ifr) != 0) {
      error = errnoText("ioctl(TUNSETIFF, tun0) in " + name);
      return;
    }
    tun = std::move(fd);
  });
  worker.join();
  if (!error.empty()) throw RunnerError("netns: tun0: " + error);
  return tun;
}

void configureTun(const std::string& name) {
  onThread("configure tun0 in " + name, [&]() -> std::string {
    if (std::string e = enter(name); !e.empty()) return e;
    return configureTunHere();
  });
}

bool awaitRunning(const std::string& name, const std::string& dev,
                  std::chrono::milliseconds timeout) {
  bool up = false;
  onThread("wait for " + dev + " to be up" + (name.empty() ? "" : " in " + name),
           [&]() -> std::string {
             if (!name.empty()) {
               if (std::string e = enter(name); !e.empty()) return e;
             }
             const common::UniqueFd s(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
             if (!s.valid()) return errnoText("socket");
             const auto deadline = std::chrono::steady_clock::now() + timeout;
             for (;;) {
               ifreq ifr{};
               std::strncpy(ifr.ifr_name, dev.c_str(), IFNAMSIZ - 1);
               if (auto e = ifIoctl(s.get(), SIOCGIFFLAGS, ifr, "SIOCGIFFLAGS"); !e.empty()) {
                 return e;
               }
               if ((ifr.ifr_flags & IFF_RUNNING) != 0) {
                 up = true;
                 return "";
               }
               if (std::chrono::steady_clock::now() >= deadline) return "";
               std::this_thread::sleep_for(std::chrono::microseconds(200));
             }
           });
  return up;
}

bool remove(const std::string& name) noexcept {
  try {
    if (!exists(name)) return true;
    const CommandResult r = runCommand({"ip", "netns", "del", name});
    return r.status == 0 || !exists(name);
  } catch (const std::exception&) {
    return false;
  }
}

bool exists(const std::string& name) {
  struct stat st {};
  return ::lstat(pathOf(name).c_str(), &st) == 0;
}

std::vector<std::string> listAgentIds() {
  std::vector<std::string> ids;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(kDir, ec)) {
    const std::string n = e.path().filename().string();
    if (n.rfind(kPrefix, 0) == 0 && n.size() > std::strlen(kPrefix)) {
      ids.push_back(n.substr(std::strlen(kPrefix)));
    }
  }
  return ids;
}

}  // namespace runner::netns
