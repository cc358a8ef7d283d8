#pragma once
// The sandbox's virtual DNS (seed 003, "The pieces"; issue 3 "Network"): a pure function from a
// DNS query (RFC 1035 wire format) to an answer, over a pool of synthetic addresses. A → an
// address from 100.64.0.0/10, AAAA → one from 100::/64, and the pair name <-> address is
// remembered so that a later flow to that address carries the name the agent asked for.
// Nothing is ever sent to a real resolver. No I/O here: the netstack feeds queries in.
// Single-threaded.

#include <asio/ip/address.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace vdns {

/// The resolver address the sandbox's resolv.conf names (seed 003 pod spec).
inline constexpr const char* kResolverAddress = "100.127.255.253";

class VirtualDns {
 public:
  /// `pool_size`: most names remembered at once per family (bounded memory).
  /// `answer_hold`: how long an answered address stays reserved after its last answer even
  /// with no live flow (so a client that resolved but has not connected yet keeps its name).
  explicit VirtualDns(size_t pool_size = 65536,
                      std::chrono::milliseconds answer_hold = std::chrono::minutes(5));
  ~VirtualDns();
  VirtualDns(const VirtualDns&) = delete;
  VirtualDns& operator=(const VirtualDns&) = delete;

  /// Answers one query. Returns the response bytes; an empty string means "drop" (input too
  /// short to even echo an ID). Malformed → FORMERR; A/AAAA for a valid name → one synthetic
  /// address (TTL short); other types → NOERROR with no data; invalid names → NXDOMAIN...
  /// (exact rules documented in virtual_dns.cc and tested). `now` drives the pool's ageing.
  std::string answer(std::string_view query,
                     std::chrono::steady_clock::time_point now = std::chrono::steady_clock::now());

  /// The name an address was handed out for, if it is a live synthetic address.
  [[nodiscard]] std::optional<std::string> nameFor(const asio::ip::address& addr) const;

  /// A flow to `addr` opened / closed: an address with a live flow is never reused.
  void flowOpened(const asio::ip::address& addr);
  void flowClosed(const asio::ip::address& addr);

 private:
  struct Impl;
  Impl* impl_;
};

}  // namespace vdns
