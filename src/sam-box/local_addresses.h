#pragma once
// The host's own addresses. An allowed name that resolves to one of them would reach services
// bound to 0.0.0.0 or to that address on the box's host (a node port, a metrics listener, a
// bridge resolver), which the fixed forbidden ranges do not cover. Read with getifaddrs(3)
// in sam-box's network namespace, and re-read at most once per kRefresh.

#include <asio/ip/address.hpp>

#include <chrono>
#include <vector>

namespace sambox {

class LocalAddresses {
 public:
  static constexpr std::chrono::seconds kRefresh{1};
  /// True if `addr` (IPv4-mapped forms unwrapped) is assigned to an interface of this host.
  /// If the interface list cannot be read, every address counts as local (fail closed).
  bool contains(const asio::ip::address& addr);

 private:
  void refresh();
  std::vector<asio::ip::address> addresses_;
  bool readable_ = false;
  std::chrono::steady_clock::time_point read_at_{};
};

}  // namespace sambox
