#include "nano-init/netlink.h"

#include <arpa/inet.h>
#include <linux/if_addr.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <net/if.h>
#include <sys/socket.h>

#include <array>
#include <cstring>

#include "nano-init/errors.h"

namespace nanoinit::netlink {
namespace {

constexpr size_t kBufBytes = 4096;

// A request under construction: header, fixed body, then attributes.
struct Msg {
  alignas(nlmsghdr) std::array<char, 512> buf{};
  nlmsghdr* hdr() { return reinterpret_cast<nlmsghdr*>(buf.data()); }
  template <typename T>
  T* body() {
    return reinterpret_cast<T*>(buf.data() + NLMSG_HDRLEN);
  }
  void init(uint16_t type, uint16_t flags, size_t body_len) {
    hdr()->nlmsg_len = static_cast<uint32_t>(NLMSG_LENGTH(body_len));
    hdr()->nlmsg_type = type;
    hdr()->nlmsg_flags = static_cast<uint16_t>(NLM_F_REQUEST | NLM_F_ACK | flags);
  }
  void attr(uint16_t type, const void* data, size_t len) {
    const size_t at = NLMSG_ALIGN(hdr()->nlmsg_len);
    auto* rta = reinterpret_cast<rtattr*>(buf.data() + at);
    rta->rta_type = type;
    rta->rta_len = static_cast<uint16_t>(RTA_LENGTH(len));
    std::memcpy(RTA_DATA(rta), data, len);
    hdr()->nlmsg_len = static_cast<uint32_t>(at + RTA_ALIGN(rta->rta_len));
  }
};

}  // namespace

Socket::Socket() : fd_(::socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE)) {
  if (!fd_.valid()) throwErrno("socket(AF_NETLINK, NETLINK_ROUTE)");
}

void Socket::request(const void* msg, size_t len, const std::string& what) {
  auto* hdr = static_cast<nlmsghdr*>(const_cast<void*>(msg));
  hdr->nlmsg_seq = ++seq_;
  sockaddr_nl kernel{};
  kernel.nl_family = AF_NETLINK;
  if (::sendto(fd_.get(), msg, len, 0, reinterpret_cast<sockaddr*>(&kernel), sizeof kernel) < 0) {
    throwErrno("netlink sendto (" + what + ")");
  }
  alignas(nlmsghdr) std::array<char, kBufBytes> buf{};
  while (true) {
    const ssize_t n = ::recv(fd_.get(), buf.data(), buf.size(), 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      throwErrno("netlink recv (" + what + ")");
    }
    auto remaining = static_cast<int>(n);
    for (auto* h = reinterpret_cast<nlmsghdr*>(buf.data()); NLMSG_OK(h, remaining);
         h = NLMSG_NEXT(h, remaining)) {
      if (h->nlmsg_seq != seq_ || h->nlmsg_type != NLMSG_ERROR) continue;
      const auto* err = static_cast<const nlmsgerr*>(NLMSG_DATA(h));
      if (err->error == 0) return;
      errno = -err->error;
      throwErrno(what);
    }
  }
}

void Socket::linkUp(int ifindex) {
  Msg m;
  m.init(RTM_NEWLINK, 0, sizeof(ifinfomsg));
  auto* ifi = m.body<ifinfomsg>();
  ifi->ifi_family = AF_UNSPEC;
  ifi->ifi_index = ifindex;
  ifi->ifi_flags = IFF_UP;
  ifi->ifi_change = IFF_UP;
  request(m.buf.data(), m.hdr()->nlmsg_len,
          "RTM_NEWLINK ifindex " + std::to_string(ifindex) + " up");
}

void Socket::addAddress(int ifindex, const std::string& addr, int prefix) {
  Msg m;
  m.init(RTM_NEWADDR, NLM_F_CREATE | NLM_F_REPLACE, sizeof(ifaddrmsg));
  auto* ifa = m.body<ifaddrmsg>();
  std::array<unsigned char, 16> bytes{};
  const bool v6 = addr.find(':') != std::string::npos;
  if (::inet_pton(v6 ? AF_INET6 : AF_INET, addr.c_str(), bytes.data()) != 1) {
    throw StepError("inet_pton(" + addr + "): not an address");
  }
  ifa->ifa_family = v6 ? AF_INET6 : AF_INET;
  ifa->ifa_prefixlen = static_cast<unsigned char>(prefix);
  ifa->ifa_index = static_cast<uint32_t>(ifindex);
  // No duplicate address detection: the tun has no peers, and DAD would delay IPv6 by ~1 s.
  ifa->ifa_flags = v6 ? IFA_F_NODAD : 0;
  const size_t len = v6 ? 16 : 4;
  m.attr(IFA_LOCAL, bytes.data(), len);
  m.attr(IFA_ADDRESS, bytes.data(), len);
  request(
      m.buf.data(), m.hdr()->nlmsg_len,
      "RTM_NEWADDR " + addr + "/" + std::to_string(prefix) + " ifindex " + std::to_string(ifindex));
}

void Socket::addDefaultRoute(int ifindex, int family) {
  Msg m;
  m.init(RTM_NEWROUTE, NLM_F_CREATE | NLM_F_REPLACE, sizeof(rtmsg));
  auto* rt = m.body<rtmsg>();
  rt->rtm_family = static_cast<unsigned char>(family == 6 ? AF_INET6 : AF_INET);
  rt->rtm_dst_len = 0;
  rt->rtm_table = RT_TABLE_MAIN;
  rt->rtm_protocol = RTPROT_BOOT;
  rt->rtm_scope = RT_SCOPE_UNIVERSE;
  rt->rtm_type = RTN_UNICAST;
  const auto oif = static_cast<uint32_t>(ifindex);
  m.attr(RTA_OIF, &oif, sizeof oif);
  request(m.buf.data(), m.hdr()->nlmsg_len,
          "RTM_NEWROUTE default (IPv" + std::to_string(family) + ") dev ifindex " +
              std::to_string(ifindex));
}

}  // namespace nanoinit::netlink
