#pragma once
// Which resolved addresses an allowed name may lead to. An allowed name must not become a way
// into the host's own services: a name that resolves to loopback, link-local (the cloud
// metadata address 169.254.169.254 included), multicast, unspecified or broadcast space, or
// into the sandbox's own synthetic ranges, is refused with reason "forbidden-address" unless
// the operator permits that range with --allow-destination CIDR.

#include <asio/ip/address.hpp>

#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace policy {

/// Thrown by Cidr::parse() for a malformed prefix; what() is the reason.
class CidrError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

/// An address prefix, "198.51.100.0/24" or "2001:db8::/32". A bare address is a /32 or /128.
class Cidr {
 public:
  /// Parses `text`; throws CidrError if the address or prefix length is malformed, or if
  /// host bits are set beyond the prefix ("10.0.0.1/8" is refused: ambiguous intent).
  static Cidr parse(std::string_view text);
  /// True if `addr` lies in this prefix. IPv4-mapped IPv6 addresses are compared as IPv4.
  [[nodiscard]] bool contains(const asio::ip::address& addr) const;
  [[nodiscard]] std::string text() const;

 private:
  asio::ip::address network_;
  unsigned prefix_len_ = 0;
};

/// Returns `addr` with IPv4-mapped (::ffff:a.b.c.d), IPv4-compatible (::a.b.c.d, except
/// :: and ::1) and NAT64 well-known-prefix (64:ff9b::a.b.c.d, RFC 6052) IPv6 forms unwrapped
/// to IPv4, so no rule can be bypassed by re-spelling. 6to4, Teredo, local-use NAT64 and
/// IPv4-translated (::ffff:0:a.b.c.d) addresses stay IPv6: they are distinct addresses
/// (isForbiddenAddress() looks inside them).
asio::ip::address canonicalAddress(const asio::ip::address& addr);

/// True if `addr` (after canonicalAddress()) is in space no external flow may reach:
/// IPv4 0.0.0.0/8, 127.0.0.0/8, 169.254.0.0/16, 224.0.0.0/4, 240.0.0.0/4 (incl.
/// 255.255.255.255), 100.64.0.0/10 (the sandbox's synthetic range); IPv6 ::, ::1,
/// fe80::/10, ff00::/8, 100::/64 (the sandbox's synthetic range); and an IPv6 address that
/// embeds an IPv4 address in that space which a relay or translator would send the packet on
/// to: 6to4 2002:WWXX:YYZZ::/48 (RFC 3056; WW.XX.YY.ZZ), Teredo 2001:0::/32 (RFC 4380;
/// forbidden if the server address, bits 32-63, or the client address, bits 96-127
/// inverted, is), local-use NAT64 64:ff9b:1::/48 (RFC 8215, read with the /48 layout of
/// RFC 6052 §2.2: bits 48-63 and 72-87; a network that carves a longer NAT64 prefix out of
/// it, e.g. 64:ff9b:1::/96, must allow that prefix with --allow-destination, since its
/// addresses read as 0.0.0.0 under the /48 layout), IPv4-translated ::ffff:0:0:0/96
/// (RFC 2765 §2.1, SIIT; the last 32 bits).
bool isForbiddenAddress(const asio::ip::address& addr);

/// The operator's exceptions to isForbiddenAddress() (--allow-destination, repeatable).
class DestinationPolicy {
 public:
  void allow(const Cidr& cidr) { allowed_.push_back(cidr); }
  /// True if the flow may go to `addr`: not forbidden, or inside an allowed prefix.
  [[nodiscard]] bool permits(const asio::ip::address& addr) const;
  /// True if `addr` is inside a prefix the operator allowed (--allow-destination), compared
  /// as Cidr::contains() does: only the forms canonicalAddress() unwraps count as their IPv4
  /// address. A prefix permits what it literally contains, so allowing 127.0.0.0/8 does not
  /// permit 2002:7f00:1:: (6to4), a Teredo or a 64:ff9b:1::/48 form of it: such a form is
  /// permitted only by allowing an IPv6 prefix that contains it (e.g. 2002:7f00::/24).
  [[nodiscard]] bool allowsExplicitly(const asio::ip::address& addr) const;
  [[nodiscard]] const std::vector<Cidr>& allowed() const { return allowed_; }

 private:
  std::vector<Cidr> allowed_;
};

}  // namespace policy
