#include "nano-init/check.h"

#include <arpa/inet.h>
#include <net/if.h>
#include <net/route.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "common/read_file.h"
#include "common/unique_fd.h"
#include "common/wire_bytes.h"
#include "nano-init/resolv.h"
#include "nano-init/tun.h"
#include "vdns/virtual_dns.h"

namespace nanoinit::check {
namespace {

constexpr int kCapNetAdmin = 12;  // linux/capability.h
constexpr int kCapSysAdmin = 21;
constexpr uint16_t kQueryId = 0x5a3c;

// Files larger than this are not read (a resolv.conf bound to /dev/zero must not exhaust memory).
constexpr size_t kMaxFileBytes = 1 << 20;

std::optional<std::string> readFile(const char* path) {
  return common::readRegularFile(path, kMaxFileBytes);
}

std::string join(const std::vector<std::string>& items, const char* sep) {
  std::string out;
  for (const auto& i : items) out += (out.empty() ? "" : sep) + i;
  return out;
}

bool contains(const std::vector<std::string>& v, const std::string& s) {
  for (const auto& i : v) {
    if (i == s) return true;
  }
  return false;
}

// "Name:\tvalue" from /proc/self/status; nullopt if absent.
std::optional<std::string> statusField(const std::string& status, const std::string& name) {
  std::istringstream in(status);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(name + ":", 0) != 0) continue;
    std::istringstream rest(line.substr(name.size() + 1));
    std::string value;
    rest >> value;
    return value;
  }
  return std::nullopt;
}

// Rule 5 on a status text; empty if it holds.
std::string capabilityReason(const std::string& status) {
  const unsigned long long risky = (1ULL << kCapNetAdmin) | (1ULL << kCapSysAdmin);
  auto mask = [&](const char* field, unsigned long long* out) {
    const auto v = statusField(status, field);
    if (!v) return false;
    char* end = nullptr;
    errno = 0;
    *out = std::strtoull(v->c_str(), &end, 16);
    return errno == 0 && end != v->c_str() && *end == '\0';
  };
  std::vector<std::string> held;
  for (const char* field : {"CapEff", "CapPrm", "CapAmb"}) {
    unsigned long long m = 0;
    if (!mask(field, &m)) return std::string("/proc/self/status has no readable ") + field;
    if ((m & risky) != 0) held.push_back(field);
  }
  unsigned long long bnd = 0;
  if (!mask("CapBnd", &bnd)) return "/proc/self/status has no readable CapBnd";
  const auto nnp = statusField(status, "NoNewPrivs");
  if ((bnd & risky) != 0 && nnp.value_or("0") != "1") held.push_back("CapBnd without no_new_privs");
  if (held.empty()) return "";
  return "this process holds or can gain CAP_NET_ADMIN or CAP_SYS_ADMIN (" + join(held, ", ") +
         "), enough to re-route or leave its network namespace";
}

// The offset just past the (possibly compressed) name at `at`, or npos.
size_t skipName(const std::string& msg, size_t at) {
  while (at < msg.size()) {
    const auto len = static_cast<unsigned char>(msg[at]);
    if (len == 0) return at + 1;
    if ((len & 0xc0) == 0xc0) return at + 2 <= msg.size() ? at + 2 : std::string::npos;
    at += 1 + len;
  }
  return std::string::npos;
}

// An A answer in 100.64.0.0/10 for our query, or the reason there is none.
std::string judgeAnswer(const std::string& msg) {
  if (msg.size() < 12 || common::get16(msg, 0) != kQueryId) return "the answer is not ours";
  const uint16_t flags = common::get16(msg, 2);
  if ((flags & 0x8000) == 0 || (flags & 0x000f) != 0) {
    return "the virtual DNS answered rcode " + std::to_string(flags & 0x000f);
  }
  size_t at = skipName(msg, 12);
  if (at == std::string::npos || at + 4 > msg.size()) return "the answer is truncated";
  at += 4;
  for (uint16_t n = common::get16(msg, 6); n > 0; --n) {
    at = skipName(msg, at);
    if (at == std::string::npos || at + 10 > msg.size()) return "the answer is truncated";
    const uint16_t type = common::get16(msg, at);
    const uint16_t rdlen = common::get16(msg, at + 8);
    at += 10;
    if (at + rdlen > msg.size()) return "the answer is truncated";
    if (type == 1 && rdlen == 4) {
      const auto first = static_cast<unsigned char>(msg[at]);
      const auto second = static_cast<unsigned char>(msg[at + 1]);
      if (first == 100 && (second & 0xc0) == 64) return "";
      char text[INET_ADDRSTRLEN] = {};
      ::inet_ntop(AF_INET, msg.data() + at, text, sizeof text);
      return std::string("the DNS answer ") + text + " is not a synthetic address (100.64.0.0/10)";
    }
    at += rdlen;
  }
  return "the DNS answer holds no A record";
}

}  // namespace

std::vector<std::string> evaluate(const Observation& seen) {
  std::vector<std::string> reasons;
  const std::string tun = tun::kName;
  // 1. interfaces
  std::vector<std::string> others;
  for (const auto& name : seen.interfaces) {
    if (name != "lo" && name != tun) others.push_back(name);
  }
  if (!others.empty()) {
    reasons.push_back("this network namespace also holds " + join(others, ", ") +
                      " (a sandbox holds only lo and tun0)");
  }
  if (!contains(seen.interfaces, tun)) reasons.push_back("there is no tun0");
  // 2, 3. default routes
  auto routes = [&](const std::optional<std::string>& text, const char* family, auto parse) {
    if (!text) {
      reasons.push_back(std::string("the ") + family + " routing table cannot be read");
      return;
    }
    const std::vector<std::string> via = parse(*text);
    if (!contains(via, tun))
      reasons.push_back(std::string("no ") + family + " default route via tun0");
    std::vector<std::string> elsewhere;
    for (const auto& i : via) {
      if (i != tun && !contains(elsewhere, i)) elsewhere.push_back(i);
    }
    if (!elsewhere.empty()) {
      reasons.push_back(std::string("an ") + family + " default route via " +
                        join(elsewhere, ", "));
    }
  };
  routes(seen.route4, "IPv4", tun::defaultRoutes4);
  if (seen.ipv6_present) routes(seen.route6, "IPv6", tun::defaultRoutes6);
  // 4. resolv.conf
  if (!seen.resolv_conf) {
    reasons.push_back("/etc/resolv.conf cannot be read");
  } else if (!resolv::alreadyPointsAtVirtualDns(*seen.resolv_conf)) {
    reasons.push_back(std::string("/etc/resolv.conf does not name only ") + vdns::kResolverAddress);
  }
  // 5. capabilities
  if (!seen.status) {
    reasons.push_back("/proc/self/status cannot be read");
  } else if (std::string why = capabilityReason(*seen.status); !why.empty()) {
    reasons.push_back(why);
  }
  return reasons;
}

Observation observe() {
  Observation seen;
  if (struct if_nameindex* list = ::if_nameindex(); list != nullptr) {
    for (const struct if_nameindex* i = list; i->if_index != 0; ++i) {
      seen.interfaces.emplace_back(i->if_name);
    }
    ::if_freenameindex(list);
  } else {
    seen.interfaces.push_back(std::string("(if_nameindex failed: ") + std::strerror(errno) + ")");
  }
  seen.route4 = readFile("/proc/net/route");
  seen.ipv6_present = ::access("/proc/net/ipv6_route", F_OK) == 0;
  if (seen.ipv6_present) seen.route6 = readFile("/proc/net/ipv6_route");
  seen.resolv_conf = readFile("/etc/resolv.conf");
  seen.status = readFile("/proc/self/status");
  return seen;
}

std::string probeVirtualDns() {
  std::string query;
  common::put16(&query, kQueryId);
  common::put16(&query, 0x0100);  // RD
  common::put16(&query, 1);       // QDCOUNT
  for (int i = 0; i < 3; ++i) common::put16(&query, 0);
  std::istringstream labels(kProbeName);
  for (std::string label; std::getline(labels, label, '.');) {
    query.push_back(static_cast<char>(label.size()));
    query += label;
  }
  query.push_back('\0');
  common::put16(&query, 1);  // A
  common::put16(&query, 1);  // IN

  common::UniqueFd fd(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return std::string("socket(AF_INET, SOCK_DGRAM): ") + std::strerror(errno);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(53);
  ::inet_pton(AF_INET, vdns::kResolverAddress, &to.sin_addr);
  if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&to), sizeof to) != 0) {
    return std::string("connect(") + vdns::kResolverAddress + ":53): " + std::strerror(errno);
  }
  std::string last =
      std::string("no answer from the virtual DNS (") + vdns::kResolverAddress + ":53) within 2 s";
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (::send(fd.get(), query.data(), query.size(), 0) < 0) {
      last = std::string("send to the virtual DNS: ") + std::strerror(errno);
      continue;
    }
    pollfd p{fd.get(), POLLIN, 0};
    if (::poll(&p, 1, 1000) <= 0) continue;
    std::array<char, 1500> buf{};
    const ssize_t n = ::recv(fd.get(), buf.data(), buf.size(), 0);
    if (n < 0) {
      last = std::string("recv from the virtual DNS: ") + std::strerror(errno);
      continue;
    }
    last = judgeAnswer(std::string(buf.data(), static_cast<size_t>(n)));
    if (last.empty()) return "";
  }
  return last;
}

int run() {
  std::vector<std::string> reasons = evaluate(observe());
  // Rule 6 only once nothing but tun0 can carry the query.
  if (reasons.empty()) {
    if (std::string why = probeVirtualDns(); !why.empty()) reasons.push_back(why);
  }
  if (!reasons.empty()) {
    std::printf("not sandboxed: %s\n", join(reasons, "; ").c_str());
    return 1;
  }
  std::printf(
      "sandboxed: only lo and tun0; IPv4%s default routes via tun0 only; resolv.conf names only "
      "%s; no CAP_NET_ADMIN or CAP_SYS_ADMIN to gain; the virtual DNS answers\n",
      ::access("/proc/net/ipv6_route", F_OK) == 0 ? " and IPv6" : "", vdns::kResolverAddress);
  return 0;
}

}  // namespace nanoinit::check
