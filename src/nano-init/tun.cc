#include "nano-init/tun.h"

#include <fcntl.h>
#include <net/if.h>
// After <net/if.h>: linux/if_tun.h needs its struct ifreq but must not redeclare IFF_*.
#include <linux/if_tun.h>
#include <sys/ioctl.h>

#include <cstring>
#include <string>

#include "nano-init/errors.h"
#include "nano-init/netlink.h"
#include "vdns/virtual_dns.h"

namespace nanoinit::tun {
namespace {

constexpr const char* kTunDevice = "/dev/net/tun";

// True if `fd` is an attached tun device named tun0 (then it is ours to adopt).
bool isTun0(int fd) {
  ifreq ifr{};
  if (::ioctl(fd, TUNGETIFF, &ifr) != 0) return false;
  return std::strncmp(ifr.ifr_name, kName, IFNAMSIZ) == 0 && (ifr.ifr_flags & IFF_TUN) != 0;
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

common::UniqueFd openTun() {
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
  return fd;
}

void configureNetwork() {
  netlink::Socket nl;
  nl.linkUp(ifindex("lo"));
  const int tun = ifindex(kName);
  nl.addAddress(tun, vdns::kTunAddress4, vdns::kTunPrefix4);
  nl.addAddress(tun, vdns::kTunAddress6, vdns::kTunPrefix6);
  nl.linkUp(tun);
  nl.addDefaultRoute(tun, 4);
  nl.addDefaultRoute(tun, 6);
}

}  // namespace nanoinit::tun
