#include "compass-runner/veth.h"

#include <fcntl.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "compass-runner/backend.h"
#include "compass-runner/netns.h"
#include "compass-runner/process.h"
#include "compass-runner/rtnl.h"

namespace runner::firewall {
namespace {

constexpr const char* kLockDir = "/run/compass-runner";
constexpr const char* kLockFile = "/run/compass-runner/firewall.lock";
constexpr std::chrono::seconds kCommandTimeout{10};

bool linkExists(const std::string& name) {
  return std::filesystem::exists("/sys/class/net/" + name);
}

void setSysctl(const std::string& path) {
  std::string current;
  {
    std::ifstream in(path);
    if (!in) throw RunnerError("forwarding: cannot read " + path + ": " + std::strerror(errno));
    in >> current;
  }
  if (current == "1") return;
  std::ofstream out(path);
  out << "1\n";
  out.flush();
  if (!out)
    throw RunnerError("forwarding: cannot write 1 to " + path + ": " + std::strerror(errno));
}

}  // namespace

std::string hostVethName(const std::string& id) { return "cv" + id; }

void checkId(const std::string& id) {
  const bool ok = !id.empty() && id.size() <= 12 && std::all_of(id.begin(), id.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
  });
  if (!ok) {
    throw RunnerError("egress firewall: agent id \"" + id +
                      "\" must be 1..12 characters of [a-z0-9] (it names cv<id> and an nft table)");
  }
}

SlotLock::SlotLock() {
  if (::mkdir(kLockDir, 0700) != 0 && errno != EEXIST) {
    throw RunnerError(std::string("subnet allocation: mkdir ") + kLockDir + ": " +
                      std::strerror(errno));
  }
  fd_ = common::UniqueFd(::open(kLockFile, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!fd_.valid()) {
    throw RunnerError(std::string("subnet allocation: open ") + kLockFile + ": " +
                      std::strerror(errno));
  }
  while (::flock(fd_.get(), LOCK_EX) != 0) {
    if (errno != EINTR) {
      throw RunnerError(std::string("subnet allocation: flock ") + kLockFile + ": " +
                        std::strerror(errno));
    }
  }
}

Addressing allocateSubnet(const SlotLock& /*held*/) {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) {
    throw RunnerError(std::string("subnet allocation: getifaddrs: ") + std::strerror(errno));
  }
  std::set<unsigned> taken;
  std::string foreign;
  for (const ifaddrs* ifa = list; ifa != nullptr; ifa = ifa->ifa_next) {
    if (ifa->ifa_addr == nullptr) continue;
    asio::ip::address addr;
    if (ifa->ifa_addr->sa_family == AF_INET) {
      asio::ip::address_v4::bytes_type b{};
      std::memcpy(b.data(), &reinterpret_cast<const sockaddr_in*>(ifa->ifa_addr)->sin_addr, 4);
      addr = asio::ip::address_v4(b);
    } else if (ifa->ifa_addr->sa_family == AF_INET6) {
      asio::ip::address_v6::bytes_type b{};
      std::memcpy(b.data(), &reinterpret_cast<const sockaddr_in6*>(ifa->ifa_addr)->sin6_addr, 16);
      addr = asio::ip::address_v6(b);
    } else {
      continue;
    }
    const auto slot = slotOfAddress(addr);
    if (!slot) continue;
    const std::string ifname = ifa->ifa_name != nullptr ? ifa->ifa_name : "?";
    if (!ifname.starts_with("cv")) {
      foreign = ifname + " (" + addr.to_string() + ")";
      break;
    }
    taken.insert(*slot);
  }
  ::freeifaddrs(list);
  if (!foreign.empty()) {
    throw RunnerError(std::string("subnet allocation: the host already uses the firewall's "
                                  "pools ") +
                      kPool4 + " / " + kPool6 + " on " + foreign +
                      "; egress firewall cannot pick an address that is surely free");
  }
  for (unsigned slot = 0; slot < kSlots; ++slot) {
    if (!taken.contains(slot)) return addressingForSlot(slot);
  }
  throw RunnerError("subnet allocation: all " + std::to_string(kSlots) +
                    " firewall subnets are in use (run `compass-runner gc`?)");
}

void createVeth(const std::string& id, const std::string& netns_name, const Addressing& net) {
  const std::string dev = hostVethName(id);
  const std::string ns_path = netns::pathOf(netns_name);
  const common::UniqueFd ns(::open(ns_path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!ns.valid()) throw RunnerError("open " + ns_path + ": " + std::strerror(errno));
  // In ip's order; the first refusal ends it, and the caller removes the veth.
  rtnl::Socket host;
  host.addVeth(dev, "eth0", ns.get());
  host.addAddress(dev, net.host4, 30, /*nodad=*/false);
  host.addAddress(dev, net.host6, 64, /*nodad=*/true);
  host.setUp(dev);
}

void configureSandboxLink(const std::string& netns_path, const Addressing& net) {
  rtnl::Socket sandbox = rtnl::Socket::inNetns(netns_path);
  sandbox.setUp("lo");
  sandbox.addAddress("eth0", net.sandbox4, 30, /*nodad=*/false);
  sandbox.addAddress("eth0", net.sandbox6, 64, /*nodad=*/true);
  sandbox.setUp("eth0");
  sandbox.addDefaultRoute("eth0", net.host4);
  sandbox.addDefaultRoute("eth0", net.host6);
}

void bridgeToTap(const std::string& netns_path, const std::string& tap) {
  // The bridge forwards at once (no STP, forward_delay 0) and learns only two MACs: the
  // guest's and the host end's. addrgenmode none before each link comes up: no IPv6
  // link-local address, so the netns has no IP stack a guest could talk to, only frames.
  const std::string batch =
      "link add br0 type bridge stp_state 0 forward_delay 0\n"
      "tuntap add dev " +
      tap +
      " mode tap\n"
      "link set br0 addrgenmode none\n"
      "link set eth0 addrgenmode none\n"
      "link set " +
      tap +
      " addrgenmode none\n"
      "link set eth0 master br0\n"
      "link set " +
      tap +
      " master br0\n"
      "link set eth0 up\n"
      "link set " +
      tap +
      " up\n"
      "link set br0 up\n";
  runChecked("bridge", {"ip", "-batch", "-"}, batch, kCommandTimeout, netns_path);
}

void enableForwarding() {
  setSysctl("/proc/sys/net/ipv4/ip_forward");
  setSysctl("/proc/sys/net/ipv6/conf/all/forwarding");
}

void installHostNat(const std::string& id, const Addressing& net, bool mirror) {
  runChecked("host nat", {"nft", "-f", "-"}, hostNatRuleset(id, hostVethName(id), net, mirror),
             kCommandTimeout);
}

bool removeHostNat(const std::string& id) noexcept {
  try {
    const std::string table = hostTableName(id);
    if (runCommand({"nft", "delete", "table", "inet", table}, "", kCommandTimeout).status == 0) {
      return true;
    }
    return runCommand({"nft", "list", "table", "inet", table}, "", kCommandTimeout).status != 0;
  } catch (...) {
    return false;
  }
}

bool removeVeth(const std::string& id) noexcept {
  try {
    const std::string dev = hostVethName(id);
    if (!linkExists(dev)) return true;
    try {
      rtnl::Socket().deleteLink(dev);
    } catch (const RunnerError&) {
      // Told below: the link is still there, or it went away by itself meanwhile.
    }
    return !linkExists(dev);
  } catch (...) {
    return false;
  }
}

}  // namespace runner::firewall
