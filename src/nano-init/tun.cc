#include "nano-init/tun.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
// After <net/if.h>: linux/if_tun.h needs its struct ifreq but must not redeclare IFF_*.
#include <linux/if_tun.h>
#include <net/route.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "nano-init/errors.h"
#include "nano-init/netlink.h"
#include "vdns/virtual_dns.h"

namespace nanoinit::tun {
namespace {

constexpr const char* kTunDevice = "/dev/net/tun";

// True if `fd` is an attached tun device named tun0 without packet information (IFF_TUN |
// IFF_NO_PI, the framing the network stack reads): then it is ours to adopt.
bool isTun0(int fd) {
  ifreq ifr{};
  if (::ioctl(fd, TUNGETIFF, &ifr) != 0) return false;
  return std::strncmp(ifr.ifr_name, kName, IFNAMSIZ) == 0 && (ifr.ifr_flags & IFF_TUN) != 0 &&
         (ifr.ifr_flags & IFF_NO_PI) != 0;
}

// What a launcher may already have done to the namespace (the podman tier does it all, since
// the container holds no CAP_NET_ADMIN).
struct Observed {
  bool lo_up = false;
  bool tun_up = false;
  bool addr4 = false;
  bool addr6 = false;
  bool route4 = false;
  bool route6 = false;

  // The missing pieces, named as an operator would look for them; empty = complete.
  [[nodiscard]] std::string missing() const {
    std::string out;
    auto add = [&](bool have, const std::string& what) {
      if (!have) out += (out.empty() ? "" : ", ") + what;
    };
    add(lo_up, "lo up");
    add(tun_up, "tun0 up");
    add(addr4, std::string(vdns::kTunAddress4) + "/" + std::to_string(vdns::kTunPrefix4));
    add(addr6, std::string(vdns::kTunAddress6) + "/" + std::to_string(vdns::kTunPrefix6));
    add(route4, "the IPv4 default route via tun0");
    add(route6, "the IPv6 default route via tun0");
    return out;
  }
};

int prefixLength(const sockaddr* mask) {
  if (mask == nullptr) return -1;
  const auto* bytes = mask->sa_family == AF_INET
                          ? reinterpret_cast<const unsigned char*>(
                                &reinterpret_cast<const sockaddr_in*>(mask)->sin_addr)
                          : reinterpret_cast<const unsigned char*>(
                                &reinterpret_cast<const sockaddr_in6*>(mask)->sin6_addr);
  const int len = mask->sa_family == AF_INET ? 4 : 16;
  int bits = 0;
  for (int i = 0; i < len; ++i) bits += __builtin_popcount(bytes[i]);
  return bits;
}

bool isAddress(const sockaddr* a, const char* text) {
  std::array<unsigned char, 16> want{};
  if (a->sa_family == AF_INET) {
    return ::inet_pton(AF_INET, text, want.data()) == 1 &&
           std::memcmp(&reinterpret_cast<const sockaddr_in*>(a)->sin_addr, want.data(), 4) == 0;
  }
  return ::inet_pton(AF_INET6, text, want.data()) == 1 &&
         std::memcmp(&reinterpret_cast<const sockaddr_in6*>(a)->sin6_addr, want.data(), 16) == 0;
}

// Whether tun0 holds a default route in `file` (/proc/net/route or /proc/net/ipv6_route).
bool tunHasDefaultRoute(const char* file,
                        std::vector<std::string> (*parse)(const std::string& text)) {
  std::ifstream in(file);
  std::stringstream text;
  text << in.rdbuf();
  const auto ifaces = parse(text.str());
  return std::find(ifaces.begin(), ifaces.end(), kName) != ifaces.end();
}

Observed observe() {
  Observed o;
  struct ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) throwErrno("getifaddrs");
  for (const struct ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_name == nullptr) continue;
    const bool up = (i->ifa_flags & IFF_UP) != 0;
    if (std::strcmp(i->ifa_name, "lo") == 0) o.lo_up = o.lo_up || up;
    if (std::strcmp(i->ifa_name, kName) != 0) continue;
    o.tun_up = o.tun_up || up;
    if (i->ifa_addr == nullptr) continue;
    if (i->ifa_addr->sa_family == AF_INET && isAddress(i->ifa_addr, vdns::kTunAddress4) &&
        prefixLength(i->ifa_netmask) == vdns::kTunPrefix4) {
      o.addr4 = true;
    }
    if (i->ifa_addr->sa_family == AF_INET6 && isAddress(i->ifa_addr, vdns::kTunAddress6) &&
        prefixLength(i->ifa_netmask) == vdns::kTunPrefix6) {
      o.addr6 = true;
    }
  }
  ::freeifaddrs(list);
  o.route4 = tunHasDefaultRoute("/proc/net/route", defaultRoutes4);
  o.route6 = tunHasDefaultRoute("/proc/net/ipv6_route", defaultRoutes6);
  return o;
}

int ifindex(const char* name) {
  const unsigned idx = ::if_nametoindex(name);
  if (idx == 0) throwErrno(std::string("if_nametoindex(") + name + ")");
  return static_cast<int>(idx);
}

}  // namespace

void requireIsolatedNamespace() {
  struct if_nameindex* list = ::if_nameindex();
  if (list == nullptr) throwErrno("if_nameindex");
  std::string others;
  for (const struct if_nameindex* i = list; i->if_index != 0; ++i) {
    const std::string name = i->if_name;
    if (name == "lo" || name == kName) continue;
    others += (others.empty() ? "" : ", ") + name;
  }
  ::if_freenameindex(list);
  if (!others.empty()) {
    throw StepError("this network namespace also holds " + others +
                    "; nano-init runs only where lo and tun0 are all there is (use "
                    "--create-namespaces, or a container with --network none)");
  }
}

common::UniqueFd openTun(common::UniqueFd passed) {
  if (passed.valid()) {
    if (!isTun0(passed.get())) {
      throw StepError(
          "the descriptor that came through the exec gate is not tun0 (IFF_TUN | IFF_NO_PI)");
    }
    return passed;
  }
  if (::fcntl(kInheritedFd, F_GETFD) >= 0 && isTun0(kInheritedFd)) {
    // Adopted: the launcher opened it in our netns; stop it leaking into the agent.
    if (::fcntl(kInheritedFd, F_SETFD, FD_CLOEXEC) != 0) throwErrno("fcntl(3, F_SETFD)");
    return common::UniqueFd(kInheritedFd);
  }
  common::UniqueFd fd(::open(kTunDevice, O_RDWR | O_CLOEXEC));
  if (!fd.valid()) {
    throwErrno(std::string("open(") + kTunDevice + ")",
               errno == EACCES || errno == EPERM
                   ? " (nano-init needs /dev/net/tun and CAP_NET_ADMIN, or a tun0 from its "
                     "launcher passed as fd 3)"
                   : "");
  }
  ifreq ifr{};
  std::strncpy(ifr.ifr_name, kName, IFNAMSIZ - 1);
  ifr.ifr_flags = IFF_TUN | IFF_NO_PI;
  if (::ioctl(fd.get(), TUNSETIFF, &ifr) != 0) {
    throwErrno("ioctl(TUNSETIFF, tun0)",
               errno == EPERM ? " (CAP_NET_ADMIN over this network namespace is missing; with "
                                "--create-namespaces, kernel.apparmor_restrict_unprivileged_userns "
                                "may have denied it)"
                              : "");
  }
  // Ours, so ours to size: the kernel's default of 1500 would cost the network stack 4 to 5
  // times the CPU per GiB (a launcher's tun0 keeps the MTU its launcher chose).
  common::UniqueFd s(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!s.valid()) throwErrno("socket(AF_INET, SOCK_DGRAM)");
  ifr.ifr_mtu = vdns::kTunMtu;
  if (::ioctl(s.get(), SIOCSIFMTU, &ifr) != 0) {
    throwErrno("ioctl(SIOCSIFMTU, tun0, " + std::to_string(vdns::kTunMtu) + ")");
  }
  return fd;
}

void configureNetwork() {
  const std::string missing = observe().missing();
  // A launcher that configured everything (the podman tier: the container has no
  // CAP_NET_ADMIN) is trusted as is; nothing is changed.
  if (missing.empty()) return;
  try {
    netlink::Socket nl;
    nl.linkUp(ifindex("lo"));
    const int tun = ifindex(kName);
    nl.addAddress(tun, vdns::kTunAddress4, vdns::kTunPrefix4);
    nl.addAddress(tun, vdns::kTunAddress6, vdns::kTunPrefix6);
    nl.linkUp(tun);
    nl.addDefaultRoute(tun, 4);
    nl.addDefaultRoute(tun, 6);
  } catch (const StepError& e) {
    // Fail closed, naming what the launcher left undone.
    throw StepError("tun0 lacks " + missing + ", and nano-init cannot add it (" + e.what() +
                    "); its launcher must configure tun0 or grant CAP_NET_ADMIN");
  }
}

std::vector<std::string> defaultRoutes4(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  std::string line;
  std::getline(in, line);  // header
  while (std::getline(in, line)) {
    char iface[IFNAMSIZ + 1] = {};
    unsigned dest = 1, gw = 0, flags = 0, refcnt = 0, use = 0, metric = 0, mask = 1;
    if (std::sscanf(line.c_str(), "%16s %x %x %x %u %u %u %x", iface, &dest, &gw, &flags, &refcnt,
                    &use, &metric, &mask) == 8 &&
        dest == 0 && mask == 0 && (flags & RTF_UP) != 0 && (flags & RTF_REJECT) == 0) {
      out.emplace_back(iface);
    }
  }
  return out;
}

std::vector<std::string> defaultRoutes6(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    char dest[33] = {}, iface[IFNAMSIZ + 1] = {};
    unsigned plen = 1, flags = 0;
    if (std::sscanf(line.c_str(), "%32s %x %*s %*s %*s %*s %*s %*s %x %16s", dest, &plen, &flags,
                    iface) == 4 &&
        plen == 0 && std::strspn(dest, "0") == std::strlen(dest) && (flags & RTF_UP) != 0 &&
        (flags & RTF_REJECT) == 0) {
      out.emplace_back(iface);
    }
  }
  return out;
}

}  // namespace nanoinit::tun
