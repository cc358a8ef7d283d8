#pragma once
// What the firewall's DNS forwarder answers (issue 4 "Egress firewall"; DESIGN.md "Names"):
// a function from one query (RFC 1035 §4 wire format, parsed with glibc's resolv(3)) to the reply
// bytes, given the allowlist and two callbacks — one that resolves a name on the host, one that
// opens answered addresses in the sandbox's allow sets. No I/O of its own, so every rule below is
// unit-tested and fuzzed (fuzz/dns_forwarder/).
//
// The rules, in order:
//   < 2 bytes, or QR=1 (an answer, not a query)        → nothing sent ("not-a-query")
//   < 12 bytes, QDCOUNT ≠ 1, ANCOUNT/NSCOUNT ≠ 0, ARCOUNT > 1, an additional record that is
//     not an OPT owned by the root, bytes after the last record, not parseable by ns_initparse,
//     compression loops, labels > 63, names > 255 bytes → FORMERR ("malformed")
//   opcode ≠ QUERY                                       → NOTIMP ("not-implemented")
//   class ≠ IN                                           → REFUSED ("class-not-in")
//   a name that is not an RFC 1123 host name (non-ASCII, '_', a '.' inside a label, > 253
//     bytes, an IP literal, the root)                    → REFUSED ("invalid-name")
//   a name no allowlist rule matches                     → REFUSED ("denied-name"); nothing is
//     resolved, so DNS carries nothing out of the sandbox
//   an allowed name, type other than A/AAAA (ANY too)    → NOERROR, no data
//   A/AAAA: resolver says no such name → NXDOMAIN; no data → NOERROR empty; failure →
//     SERVFAIL ("resolve-failed"); deadline → SERVFAIL ("resolve-timeout")
//   addresses: only the asked family (IPv4-mapped/compatible IPv6 dropped from AAAA), never
//     policy::isForbiddenAddress() (loopback, link-local incl. 169.254.169.254, unspecified,
//     multicast, …), never the firewall's own pools, never what `local` says is the host's
//     own; at most kMaxAnswerAddresses; none left → NOERROR empty ("forbidden-address")
//   admit(elements) BEFORE the reply; false → SERVFAIL ("admit-failed")
//   reply: ID, RD and the question echoed (case as sent), QR and RA set, TTL
//   kAnswerTtlSeconds, no EDNS; over `max_reply` bytes → answers dropped, TC set.

#include <asio/ip/address.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "compass-runner/ruleset.h"
#include "policy/allowlist.h"

namespace runner::firewall {

/// TTL of every answer, in seconds. The address stays in the allow set after it expires, so
/// the TTL only bounds how long a client keeps using an address the host no longer gives.
inline constexpr uint32_t kAnswerTtlSeconds = 30;
/// Most addresses answered per query (and so added to the sets per query).
inline constexpr size_t kMaxAnswerAddresses = 16;
/// Largest reply over UDP without EDNS (RFC 1035 §4.2.1); TCP replies may be up to 65535.
inline constexpr size_t kMaxUdpReply = 512;
inline constexpr size_t kMaxTcpReply = 65535;

/// What the host's resolver said about a name.
struct Resolution {
  enum class Status { kOk, kNoName, kNoData, kFailed, kTimedOut };
  Status status = Status::kFailed;
  std::vector<asio::ip::address> addresses;  ///< both families, resolver order
};

/// Resolves a normalized name on the host (getaddrinfo(3) in the forwarder). May block.
using ResolveFn = std::function<Resolution(const std::string& name)>;
/// Adds elements to the sandbox's allow sets; returns false if it could not (the reply is
/// then SERVFAIL: an address is never answered unless it is open). May block.
using AdmitFn = std::function<bool(const std::vector<AllowElement>& elements)>;
/// True if an address belongs to the host itself (its interfaces), so it is never answered.
using LocalFn = std::function<bool(const asio::ip::address& addr)>;

/// What answerQuery() needs besides the query.
struct AnswerContext {
  const policy::Allowlist* allow = nullptr;  ///< required
  ResolveFn resolve;                         ///< required
  AdmitFn admit;                             ///< required
  LocalFn local;                             ///< optional; absent = nothing is host-local
  size_t max_reply = kMaxUdpReply;           ///< kMaxUdpReply (UDP) or kMaxTcpReply (TCP)
};

/// The outcome of one query, for the reply and the forwarder's log line.
struct Answer {
  std::string reply;   ///< bytes to send; empty = send nothing
  std::string name;    ///< normalized query name; empty if the query had none valid
  uint16_t qtype = 0;  ///< the question's type (0 if unparsed)
  uint8_t rcode = 0;   ///< the reply's RCODE (RFC 1035 §4.1.1)
  /// Why the agent did not get an answer (kebab-case, see the file comment); empty when it
  /// got one (also an empty NOERROR for other types, or an honest NXDOMAIN).
  std::string reason;
  std::vector<asio::ip::address> answered;  ///< the addresses in the reply
  std::vector<asio::ip::address> filtered;  ///< resolved but never answered (forbidden)
};

/// Answers one query per the rules in the file comment. Never throws on any input bytes;
/// throws std::invalid_argument only if `ctx` lacks a required member. Thread-safe when the
/// callbacks are.
Answer answerQuery(std::string_view query, const AnswerContext& ctx);

/// Builds a query for `name` (RD set, one question, class IN) with `id`; for the firewall's
/// own look-ups from inside the sandbox. Throws std::invalid_argument if dn_comp(3) refuses
/// `name` (a label over 63 bytes, a name over 255) or it is the root.
std::string buildQuery(uint16_t id, const std::string& name, uint16_t qtype);

/// A reply as the sandbox sees it: RCODE and the A/AAAA addresses in its answer section.
struct ParsedReply {
  uint16_t id = 0;
  uint8_t rcode = 0;
  bool truncated = false;
  std::vector<asio::ip::address> addresses;
};

/// Parses a reply with ns_initparse/ns_parserr (resolv(3)); throws std::invalid_argument if it
/// is malformed (truncated, bytes after the last record, a bad name or compression pointer).
ParsedReply parseReply(std::string_view reply);

}  // namespace runner::firewall
