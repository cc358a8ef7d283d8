#include "common/resolve.h"

#include <netdb.h>
#include <netinet/in.h>
#include <resolv.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace common {
namespace {

// Once per thread: _res is thread-local in glibc.
void disableSearchDomains() {
  thread_local bool done = false;
  if (done) return;
  res_init();
  _res.options &= ~static_cast<unsigned long>(RES_DNSRCH | RES_DEFNAMES);
  done = true;
}

}  // namespace

AddressLookup lookupAddresses(const std::string& name) {
  disableSearchDomains();
  AddressLookup r;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;  // one entry per address, not one per socket type
  addrinfo* list = nullptr;
  r.gai_error = ::getaddrinfo(name.c_str(), nullptr, &hints, &list);
  if (r.gai_error != 0) {
    if (r.gai_error == EAI_SYSTEM) r.sys_errno = errno;
    return r;
  }
  for (const addrinfo* ai = list; ai != nullptr; ai = ai->ai_next) {
    asio::ip::address addr;
    if (ai->ai_family == AF_INET) {
      const auto* sin = reinterpret_cast<const sockaddr_in*>(ai->ai_addr);
      asio::ip::address_v4::bytes_type b{};
      std::memcpy(b.data(), &sin->sin_addr, b.size());
      addr = asio::ip::address_v4(b);
    } else if (ai->ai_family == AF_INET6) {
      const auto* sin6 = reinterpret_cast<const sockaddr_in6*>(ai->ai_addr);
      asio::ip::address_v6::bytes_type b{};
      std::memcpy(b.data(), &sin6->sin6_addr, b.size());
      addr = asio::ip::address_v6(b, sin6->sin6_scope_id);
    } else {
      continue;
    }
    if (std::find(r.addresses.begin(), r.addresses.end(), addr) == r.addresses.end()) {
      r.addresses.push_back(addr);
    }
  }
  ::freeaddrinfo(list);
  return r;
}

std::string describeLookupError(const AddressLookup& lookup) {
  if (lookup.gai_error == 0) return "";
  std::string text = ::gai_strerror(lookup.gai_error);
  if (lookup.gai_error == EAI_SYSTEM) text.append(": ").append(std::strerror(lookup.sys_errno));
  return text;
}

}  // namespace common
