#pragma once
// A minimal rtnetlink client (RFC 3549): link up, add an address, add a default route. Written
// by hand because nano-init is static and Debian ships no static libnl. Each request is sent
// with NLM_F_ACK and its answer checked, so a failure names the exact operation.

#include <cstdint>
#include <string>

#include "common/unique_fd.h"

namespace nanoinit::netlink {

class Socket {
 public:
  /// Opens NETLINK_ROUTE in the calling thread's network namespace.
  Socket();
  /// Sets IFF_UP on the interface with this index.
  void linkUp(int ifindex);
  /// Adds (or replaces) `addr`/`prefix` on the interface. `addr` is "a.b.c.d" or an IPv6 text.
  void addAddress(int ifindex, const std::string& addr, int prefix);
  /// Adds (or replaces) the default route of this family ("4" or "6") out of `ifindex`.
  void addDefaultRoute(int ifindex, int family);

 private:
  void request(const void* msg, size_t len, const std::string& what);
  common::UniqueFd fd_;
  uint32_t seq_ = 0;
};

}  // namespace nanoinit::netlink
