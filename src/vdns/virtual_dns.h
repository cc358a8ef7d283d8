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
/// tun0's own addresses (never handed out as synthetic addresses).
inline constexpr const char* kTunAddress4 = "100.64.0.1";
inline constexpr int kTunPrefix4 = 10;
inline constexpr const char* kTunAddress6 = "100::1";
inline constexpr int kTunPrefix6 = 64;
/// tun0's MTU wherever it is made (the runner's podman tier, nano-init's own tun0): the
/// network stack's TCP_MSS is 65000 (src/netstack/lwip/lwipopts.h), and every packet is one
/// read(2) or write(2) on tun0, so the largest MTU moves the fewest (bench/README.md
/// "nano-init": 4 to 5 times less CPU per GiB than at 1500).
inline constexpr int kTunMtu = 65520;
/// TTL of every synthetic answer, in seconds. Short, so that a client cache never outlives the
/// pool's answer hold (see VirtualDns), and an evicted address is not used from a stale cache.
inline constexpr uint32_t kAnswerTtlSeconds = 5;
/// Default number of names remembered at once (each with its A and AAAA address).
inline constexpr size_t kDefaultPoolSize = 16384;

/// Counters for the sandbox's logs; bounded, never keyed by name.
struct Stats {
  uint64_t queries = 0;         ///< answer() calls that produced a response
  uint64_t dropped = 0;         ///< inputs too short for an ID, or responses (QR=1)
  uint64_t formerr = 0;         ///< malformed queries
  uint64_t nxdomain = 0;        ///< names that fail validation
  uint64_t synthesized = 0;     ///< A/AAAA answers with a synthetic address
  uint64_t empty = 0;           ///< other types: NOERROR with no data
  uint64_t pool_exhausted = 0;  ///< SERVFAIL because no address could be reused
  uint64_t evicted = 0;         ///< names forgotten to reuse their addresses
};

class VirtualDns {
 public:
  /// `pool_size`: most names remembered at once; each holds one A and one AAAA address, so this
  /// bounds both families (clamped to the synthetic address space).
  /// `answer_hold`: how long an answered address stays reserved after its last answer even
  /// with no live flow (so a client that resolved but has not connected yet keeps its name).
  explicit VirtualDns(size_t pool_size = kDefaultPoolSize,
                      std::chrono::milliseconds answer_hold = std::chrono::minutes(5));
  ~VirtualDns();
  VirtualDns(const VirtualDns&) = delete;
  VirtualDns& operator=(const VirtualDns&) = delete;

  /// Answers one query. Returns the response bytes; an empty string means "drop" (input too
  /// short to even echo an ID, or a response rather than a query). Malformed → FORMERR;
  /// A/AAAA for a valid name → one synthetic address (TTL kAnswerTtlSeconds); other types →
  /// NOERROR with no data; invalid names → NXDOMAIN; pool exhausted → SERVFAIL. The exact rules
  /// are listed at the top of virtual_dns.cc. `now` drives the pool's ageing.
  std::string answer(std::string_view query,
                     std::chrono::steady_clock::time_point now = std::chrono::steady_clock::now());

  /// The name an address was handed out for, if it is a live synthetic address.
  [[nodiscard]] std::optional<std::string> nameFor(const asio::ip::address& addr) const;

  /// A flow to `addr` opened / closed: an address with a live flow is never reused.
  /// Addresses that are not live synthetic addresses are ignored.
  void flowOpened(const asio::ip::address& addr);
  void flowClosed(const asio::ip::address& addr);

  /// Names remembered right now (≤ pool size).
  [[nodiscard]] size_t liveNames() const;
  [[nodiscard]] const Stats& stats() const;

 private:
  struct Impl;
  Impl* impl_;
};

/// Validates and normalizes a queried name (DESIGN.md "Rules that cut across"): ASCII letters
/// lower-cased, one trailing dot removed, RFC 1123 labels of 1..63 bytes of [a-z0-9-] that
/// neither start nor end with '-', 1..253 bytes in all. A name whose last label is all digits
/// is refused too: it is an address spelling, not a name (policy::isIpLiteral agrees). Kept
/// here rather than linking `policy`, because nano-init is static and policy pulls OpenSSL.
std::optional<std::string> normalizeName(std::string_view raw);

}  // namespace vdns
