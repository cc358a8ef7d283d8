#include "compass-runner/netns.h"

#include <fcntl.h>
#include <net/if.h>
#include <sched.h>
// After <net/if.h>: linux/if_tun.h needs its struct ifreq but must not redeclare IFF_*.
#include <linux/if_tun.h>
#include <sys/ioctl.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <thread>

#include "compass-runner/backend.h"
#include "compass-runner/process.h"
#include "vdns/virtual_dns.h"

namespace runner::netns {
namespace {

constexpr const char* kPrefix = "compass-";

std::string errnoText(const std::string& call) { return call + ": " + std::strerror(errno); }

}  // namespace

std::string nameFor(const std::string& id) { return kPrefix + id; }

std::string pathOf(const std::string& name) { return std::string(kDir) + "/" + name; }

void create(const std::string& name) {
  if (exists(name)) throw RunnerError("netns: " + pathOf(name) + " exists already");
  runChecked("netns: create " + name, {"ip", "netns", "add", name});
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
  // One ip process for the whole list; `ip -batch` stops at the first failing line and
  // names it.
  const std::string mtu = std::to_string(kTunMtu);
  const std::string v4 = std::string(vdns::kTunAddress4) + "/" + std::to_string(vdns::kTunPrefix4);
  const std::string v6 = std::string(vdns::kTunAddress6) + "/" + std::to_string(vdns::kTunPrefix6);
  const std::string batch =
      "link set lo up\n"
      "link set tun0 mtu " +
      mtu +
      " up\n"
      "address add " +
      v4 +
      " dev tun0\n"
      "address add " +
      v6 +
      " dev tun0 nodad\n"
      "route add 0.0.0.0/0 dev tun0\n"
      "route add ::/0 dev tun0\n";
  runChecked("netns: configure tun0 in " + name, {"ip", "-n", name, "-batch", "-"}, batch);
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
