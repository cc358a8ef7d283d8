#pragma once
// Route netlink (rtnetlink(7), netlink(7)) for the egress firewall's links: what `ip link add
// … type veth`, `ip addr add`, `ip link set … up` and `ip route add default via` do
// (ip-link(8), ip-address(8), ip-route(8)), in-process, so arming the firewall execs no `ip`
// while podman starts beside it. Every request is acknowledged by the kernel before the call
// returns; a refusal is a RunnerError naming the operation, the device and the kernel's errno.

#include <cstdint>
#include <string>
#include <vector>

#include "common/unique_fd.h"

namespace runner::rtnl {

/// Longest wait for the kernel's answer to one request (SO_RCVTIMEO), in ms.
constexpr int kReplyTimeoutMs = 5000;

/// One NETLINK_ROUTE socket. A netlink socket belongs to the network namespace it was made
/// in, whichever thread uses it later (netlink(7)), so one made by inNetns() acts there.
class Socket {
 public:
  /// A socket in the runner's own network namespace. Throws RunnerError naming the call.
  Socket();

  /// A socket in the namespace mounted at `netns_path` (e.g. /run/netns/compass-<id>), made
  /// by a short-lived thread that setns(2)'d there. Throws RunnerError naming the call and
  /// errno (a missing file included).
  static Socket inNetns(const std::string& netns_path);

  /// `ip link add HOST type veth peer name PEER netns FD`: the pair, `host` in this
  /// socket's namespace, `peer` moved into the namespace open at `peer_netns_fd`. Both ends
  /// are created down. Throws RunnerError (EEXIST if `host` exists; names ≥ IFNAMSIZ bytes
  /// are refused before anything is sent).
  void addVeth(const std::string& host, const std::string& peer, int peer_netns_fd);

  /// `ip addr add ADDRESS/PREFIX dev DEV [nodad]`: `address` is numeric IPv4 or IPv6;
  /// `nodad` (IPv6 only, IFA_F_NODAD) makes the address usable at once instead of after
  /// duplicate address detection. Throws RunnerError for a bad address or prefix, an unknown
  /// device or the kernel's refusal.
  void addAddress(const std::string& dev, const std::string& address, unsigned prefix, bool nodad);

  /// `ip link set DEV up` (IFF_UP). Throws RunnerError.
  void setUp(const std::string& dev);

  /// `ip route add default via GATEWAY dev DEV` in the main table; the family (0.0.0.0/0 or
  /// ::/0) is the gateway's. Throws RunnerError (EEXIST if that default route exists).
  void addDefaultRoute(const std::string& dev, const std::string& gateway);

  /// `ip link del DEV` (RTM_DELLINK): removes the link, and for a veth its peer too. Throws
  /// RunnerError ("No such device" when there is none).
  void deleteLink(const std::string& dev);

  /// The interface index of `dev` in this socket's namespace (RTM_GETLINK). Throws
  /// RunnerError ("No such device" when there is none).
  unsigned indexOf(const std::string& dev);

 private:
  explicit Socket(common::UniqueFd fd) : fd_(std::move(fd)) {}
  // Sends one request (its nlmsg_len and sequence number are filled in here) and reads until
  // the answer for it: an acknowledgement (returns an empty vector) or, when the request asks
  // for data (RTM_GETLINK), that message. Throws RunnerError("<what>: <strerror>").
  std::vector<char> transact(std::vector<char> msg, const std::string& what);

  common::UniqueFd fd_;
  uint32_t seq_ = 0;
};

}  // namespace runner::rtnl
