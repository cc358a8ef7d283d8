#include "sam-box/local_addresses.h"

#include "policy/address.h"

#include <ifaddrs.h>
#include <netinet/in.h>

#include <algorithm>
#include <cstring>

namespace sambox {

void LocalAddresses::refresh() {
  ifaddrs* list = nullptr;
  readable_ = ::getifaddrs(&list) == 0;
  read_at_ = std::chrono::steady_clock::now();
  addresses_.clear();
  if (!readable_) return;
  for (const ifaddrs* ifa = list; ifa != nullptr; ifa = ifa->ifa_next) {
    if (ifa->ifa_addr == nullptr) continue;
    if (ifa->ifa_addr->sa_family == AF_INET) {
      asio::ip::address_v4::bytes_type b{};
      std::memcpy(b.data(), &reinterpret_cast<const sockaddr_in*>(ifa->ifa_addr)->sin_addr,
                  b.size());
      addresses_.emplace_back(asio::ip::address_v4(b));
    } else if (ifa->ifa_addr->sa_family == AF_INET6) {
      asio::ip::address_v6::bytes_type b{};
      std::memcpy(b.data(), &reinterpret_cast<const sockaddr_in6*>(ifa->ifa_addr)->sin6_addr,
                  b.size());
      addresses_.emplace_back(asio::ip::address_v6(b));
    }
  }
  ::freeifaddrs(list);
}

bool LocalAddresses::contains(const asio::ip::address& addr) {
  if (std::chrono::steady_clock::now() - read_at_ >= kRefresh) refresh();
  if (!readable_) return true;
  const auto canonical = policy::canonicalAddress(addr);
  return std::any_of(addresses_.begin(), addresses_.end(), [&](const asio::ip::address& a) {
    return policy::canonicalAddress(a) == canonical;
  });
}

}  // namespace sambox
