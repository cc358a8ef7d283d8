#pragma once
// A name's A and AAAA addresses through getaddrinfo(3) — as nsswitch.conf says (/etc/hosts,
// then DNS) — with the resolver's search domains off: a rule or grant names an absolute name,
// and "api" must never become "api.corp.internal". Blocking; call it off any event loop.
// Shared by sam-box's resolver (sam-box/resolver.h) and sam-node's secret-use.

#include <asio/ip/address.hpp>

#include <string>
#include <vector>

namespace common {

struct AddressLookup {
  int gai_error = 0;                         ///< getaddrinfo(3) error code; 0 on success
  int sys_errno = 0;                         ///< errno, when gai_error is EAI_SYSTEM
  std::vector<asio::ip::address> addresses;  ///< A and AAAA, de-duplicated, resolver order;
                                             ///< IPv6 keep their scope (zone) id
};

/// Looks up `name` (already normalized, policy/name.h) for AF_UNSPEC, one entry per address.
/// Turns RES_DNSRCH and RES_DEFNAMES off for the calling thread first (res_init(3)). Never
/// throws; errors are in gai_error (gai_strerror(3) words them).
AddressLookup lookupAddresses(const std::string& name);

/// A failed lookup in words: gai_strerror(3), and strerror(3) of sys_errno for EAI_SYSTEM
/// (e.g. "System error: Too many open files"). "" if it did not fail.
std::string describeLookupError(const AddressLookup& lookup);

}  // namespace common
