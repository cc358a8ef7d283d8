// Route netlink requests (rtnl.h). Messages are built as ip(8) builds them: a struct
// (ifinfomsg, ifaddrmsg, rtmsg) then attributes, 4-byte aligned, nested ones closed by
// patching their length (rtnetlink(7)).
#include "compass-runner/rtnl.h"

#include <arpa/inet.h>
#include <linux/if.h>
#include <linux/if_addr.h>
#include <linux/if_link.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <linux/veth.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <fcntl.h>
#include <array>
#include <cerrno>
#include <cstring>
#include <thread>

#include "compass-runner/backend.h"

namespace runner::rtnl {
namespace {

std::string errnoText(int err) { return std::strerror(err); }

// One request under construction: the netlink header, then what put() and attr() append.
class Message {
 public:
  Message(uint16_t type, uint16_t flags) : bytes_(sizeof(nlmsghdr), 0) {
    nlmsghdr h{};
    h.nlmsg_type = type;
    h.nlmsg_flags = static_cast<uint16_t>(NLM_F_REQUEST | flags);
    std::memcpy(bytes_.data(), &h, sizeof h);
  }

  template <class T>
  void put(const T& value) {
    append(&value, sizeof value);
  }

  void attr(uint16_t type, const void* data, size_t len) {
    rtattr a{};
    a.rta_len = static_cast<uint16_t>(RTA_LENGTH(len));
    a.rta_type = type;
    append(&a, sizeof a);
    append(data, len);
  }
  void attr(uint16_t type, const std::string& text) { attr(type, text.c_str(), text.size() + 1); }
  void attr32(uint16_t type, uint32_t value) { attr(type, &value, sizeof value); }

  // A nested attribute: begin() returns where it starts, end() sets its length.
  size_t begin(uint16_t type) {
    const size_t at = bytes_.size();
    attr(type, nullptr, 0);
    return at;
  }
  void end(size_t at) {
    const auto len = static_cast<uint16_t>(bytes_.size() - at);
    std::memcpy(bytes_.data() + at, &len, sizeof len);  // rta_len is the first field
  }

  std::vector<char> take() { return std::move(bytes_); }

 private:
  void append(const void* data, size_t len) {
    const size_t at = bytes_.size();
    bytes_.resize(at + NLMSG_ALIGN(len), 0);
    if (len != 0) std::memcpy(bytes_.data() + at, data, len);
  }

  std::vector<char> bytes_;
};

// A numeric address: its family and 4 or 16 bytes. Throws RunnerError naming `what`.
struct Address {
  int family = AF_UNSPEC;
  std::array<unsigned char, 16> bytes{};
  [[nodiscard]] size_t size() const { return family == AF_INET ? 4 : 16; }
};

Address parseAddress(const std::string& text, const std::string& what) {
  Address a;
  if (::inet_pton(AF_INET, text.c_str(), a.bytes.data()) == 1) {
    a.family = AF_INET;
  } else if (::inet_pton(AF_INET6, text.c_str(), a.bytes.data()) == 1) {
    a.family = AF_INET6;
  } else {
    throw RunnerError(what + ": \"" + text + "\" is not a numeric IPv4 or IPv6 address");
  }
  return a;
}

void checkName(const std::string& dev, const std::string& what) {
  if (dev.empty() || dev.size() >= IFNAMSIZ) {
    throw RunnerError(what + ": interface name \"" + dev + "\" must be 1 to " +
                      std::to_string(IFNAMSIZ - 1) + " bytes");
  }
}

common::UniqueFd openRoute() {
  common::UniqueFd fd(::socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE));
  if (!fd.valid()) throw RunnerError("socket(AF_NETLINK, NETLINK_ROUTE): " + errnoText(errno));
  timeval tv{};
  tv.tv_sec = kReplyTimeoutMs / 1000;
  tv.tv_usec = static_cast<suseconds_t>(kReplyTimeoutMs % 1000) * 1000;
  if (::setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) != 0) {
    throw RunnerError("setsockopt(netlink, SO_RCVTIMEO): " + errnoText(errno));
  }
  return fd;
}

}  // namespace

Socket::Socket() : fd_(openRoute()) {}

Socket Socket::inNetns(const std::string& netns_path) {
  common::UniqueFd fd;
  std::string error;
  std::thread worker([&] {
    const common::UniqueFd ns(::open(netns_path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!ns.valid()) {
      error = "open(" + netns_path + "): " + errnoText(errno);
    } else if (::setns(ns.get(), CLONE_NEWNET) != 0) {
      error = "setns(" + netns_path + ", CLONE_NEWNET): " + errnoText(errno);
    } else {
      try {
        fd = openRoute();
      } catch (const RunnerError& e) {
        error = e.what();
      }
    }
  });
  worker.join();
  if (!error.empty()) throw RunnerError("rtnetlink: " + error);
  return Socket(std::move(fd));
}

std::vector<char> Socket::transact(std::vector<char> msg, const std::string& what) {
  nlmsghdr head{};
  std::memcpy(&head, msg.data(), sizeof head);
  head.nlmsg_len = static_cast<uint32_t>(msg.size());
  head.nlmsg_seq = ++seq_;
  std::memcpy(msg.data(), &head, sizeof head);
  sockaddr_nl kernel{};
  kernel.nl_family = AF_NETLINK;
  ssize_t sent;
  do {
    sent = ::sendto(fd_.get(), msg.data(), msg.size(), 0, reinterpret_cast<sockaddr*>(&kernel),
                    sizeof kernel);
  } while (sent < 0 && errno == EINTR);
  if (sent != static_cast<ssize_t>(msg.size())) {
    throw RunnerError(what + ": sendto(netlink): " + errnoText(sent < 0 ? errno : EMSGSIZE));
  }
  // Answers to earlier requests cannot be pending (each waited for its own), but a message
  // with another sequence number is skipped, not taken for ours.
  alignas(nlmsghdr) std::array<char, 32768> buf{};
  while (true) {
    ssize_t n;
    do {
      n = ::recv(fd_.get(), buf.data(), buf.size(), 0);
    } while (n < 0 && errno == EINTR);
    if (n < 0) {
      throw RunnerError(
          what + ": no answer from the kernel: " + errnoText(errno == EAGAIN ? ETIMEDOUT : errno));
    }
    // NLMSG_OK / NLMSG_NEXT, spelled out in size_t (the macros compare signed and unsigned).
    const auto got = static_cast<size_t>(n);
    for (size_t at = 0; at + sizeof(nlmsghdr) <= got;) {
      auto* h = reinterpret_cast<nlmsghdr*>(buf.data() + at);
      if (h->nlmsg_len < sizeof(nlmsghdr) || h->nlmsg_len > got - at) break;
      at += NLMSG_ALIGN(h->nlmsg_len);
      if (h->nlmsg_seq != head.nlmsg_seq) continue;
      if (h->nlmsg_type == NLMSG_ERROR) {
        if (h->nlmsg_len < NLMSG_LENGTH(sizeof(nlmsgerr))) {
          throw RunnerError(what + ": truncated netlink error message");
        }
        const auto* e = static_cast<const nlmsgerr*>(NLMSG_DATA(h));
        if (e->error == 0) return {};
        throw RunnerError(what + ": " + errnoText(-e->error));
      }
      const auto* start = reinterpret_cast<const char*>(h);
      return {start, start + h->nlmsg_len};
    }
  }
}

unsigned Socket::indexOf(const std::string& dev) {
  checkName(dev, "RTM_GETLINK");
  Message m(RTM_GETLINK, 0);
  m.put(ifinfomsg{});
  m.attr(IFLA_IFNAME, dev);
  const std::vector<char> reply = transact(m.take(), "RTM_GETLINK " + dev);
  if (reply.size() < NLMSG_LENGTH(sizeof(ifinfomsg))) {
    throw RunnerError("RTM_GETLINK " + dev + ": the kernel's answer holds no ifinfomsg");
  }
  ifinfomsg info{};
  std::memcpy(&info, reply.data() + NLMSG_HDRLEN, sizeof info);
  if (info.ifi_index <= 0) throw RunnerError("RTM_GETLINK " + dev + ": no interface index");
  return static_cast<unsigned>(info.ifi_index);
}

void Socket::deleteLink(const std::string& dev) {
  const std::string what = "RTM_DELLINK " + dev;
  checkName(dev, what);
  Message m(RTM_DELLINK, NLM_F_ACK);
  m.put(ifinfomsg{});
  m.attr(IFLA_IFNAME, dev);
  transact(m.take(), what);
}

void Socket::addVeth(const std::string& host, const std::string& peer, int peer_netns_fd) {
  const std::string what = "RTM_NEWLINK " + host + " type veth peer " + peer;
  checkName(host, what);
  checkName(peer, what);
  Message m(RTM_NEWLINK, NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL);
  m.put(ifinfomsg{});
  m.attr(IFLA_IFNAME, host);
  // One queue each way on both ends. A veth otherwise gets one per possible CPU and is then
  // cut to one (veth_init_queues()), and each cut waits for an expedited RCU grace period
  // (synchronize_net() under rtnl_lock) that every CPU must pass: in a 2-vCPU VM, while podman
  // mounts the agent's container, whose own mounts wait for the same grace periods.
  m.attr32(IFLA_NUM_TX_QUEUES, 1);
  m.attr32(IFLA_NUM_RX_QUEUES, 1);
  const size_t linkinfo = m.begin(IFLA_LINKINFO);
  m.attr(IFLA_INFO_KIND, std::string("veth"));
  const size_t data = m.begin(IFLA_INFO_DATA);
  const size_t peer_info = m.begin(VETH_INFO_PEER);
  m.put(ifinfomsg{});
  m.attr(IFLA_IFNAME, peer);
  m.attr32(IFLA_NUM_TX_QUEUES, 1);
  m.attr32(IFLA_NUM_RX_QUEUES, 1);
  m.attr32(IFLA_NET_NS_FD, static_cast<uint32_t>(peer_netns_fd));
  m.end(peer_info);
  m.end(data);
  m.end(linkinfo);
  transact(m.take(), what);
}

void Socket::addAddress(const std::string& dev, const std::string& address, unsigned prefix,
                        bool nodad) {
  const std::string what = "RTM_NEWADDR " + address + "/" + std::to_string(prefix) + " dev " + dev;
  const Address a = parseAddress(address, what);
  if (prefix > a.size() * 8) throw RunnerError(what + ": prefix longer than the address");
  ifaddrmsg msg{};
  msg.ifa_family = static_cast<unsigned char>(a.family);
  msg.ifa_prefixlen = static_cast<unsigned char>(prefix);
  msg.ifa_scope = RT_SCOPE_UNIVERSE;
  msg.ifa_index = indexOf(dev);
  const uint32_t flags = nodad && a.family == AF_INET6 ? IFA_F_NODAD : 0;
  msg.ifa_flags = static_cast<unsigned char>(flags);
  Message m(RTM_NEWADDR, NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL);
  m.put(msg);
  m.attr(IFA_LOCAL, a.bytes.data(), a.size());
  m.attr(IFA_ADDRESS, a.bytes.data(), a.size());
  if (flags != 0) m.attr32(IFA_FLAGS, flags);
  transact(m.take(), what);
}

void Socket::setUp(const std::string& dev) {
  const std::string what = "RTM_NEWLINK " + dev + " up";
  ifinfomsg info{};
  info.ifi_index = static_cast<int>(indexOf(dev));
  info.ifi_flags = IFF_UP;
  info.ifi_change = IFF_UP;
  Message m(RTM_NEWLINK, NLM_F_ACK);
  m.put(info);
  transact(m.take(), what);
}

void Socket::addDefaultRoute(const std::string& dev, const std::string& gateway) {
  const std::string what = "RTM_NEWROUTE default via " + gateway + " dev " + dev;
  const Address gw = parseAddress(gateway, what);
  rtmsg route{};
  route.rtm_family = static_cast<unsigned char>(gw.family);
  route.rtm_table = RT_TABLE_MAIN;
  route.rtm_protocol = RTPROT_BOOT;  // as `ip route add` marks a route it adds
  route.rtm_scope = RT_SCOPE_UNIVERSE;
  route.rtm_type = RTN_UNICAST;
  Message m(RTM_NEWROUTE, NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL);
  m.put(route);
  m.attr(RTA_GATEWAY, gw.bytes.data(), gw.size());
  m.attr32(RTA_OIF, indexOf(dev));
  transact(m.take(), what);
}

}  // namespace runner::rtnl
