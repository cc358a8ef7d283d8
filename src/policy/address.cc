#include "policy/address.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <cstddef>
#include <span>
#include <system_error>
#include <utility>
#include <vector>

namespace policy {
namespace {

constexpr unsigned kV4Bits = 32;
constexpr unsigned kV6Bits = 128;
// An IPv4 address embedded in IPv6 (mapped or compatible) occupies the last 32 bits.
constexpr unsigned kV4InV6Offset = kV6Bits - kV4Bits;

// True if the first `bits` bits of `a` and `b` agree.
bool prefixEqual(std::span<const unsigned char> a, std::span<const unsigned char> b,
                 unsigned bits) {
  const unsigned whole = bits / 8;
  if (!std::equal(a.begin(), a.begin() + whole, b.begin())) return false;
  const unsigned rest = bits % 8;
  if (rest == 0) return true;
  const auto mask = static_cast<unsigned char>(0xff << (8 - rest));
  return (a[whole] & mask) == (b[whole] & mask);
}

// True if any bit at or after `bits` is set.
bool hostBitsSet(std::span<const unsigned char> a, unsigned bits) {
  for (unsigned i = bits; i < a.size() * 8; ++i) {
    if (a[i / 8] & (0x80 >> (i % 8))) return true;
  }
  return false;
}

bool inPrefix(const asio::ip::address& addr, const asio::ip::address& net, unsigned len) {
  if (addr.is_v4() != net.is_v4()) return false;
  if (addr.is_v4()) return prefixEqual(addr.to_v4().to_bytes(), net.to_v4().to_bytes(), len);
  return prefixEqual(addr.to_v6().to_bytes(), net.to_v6().to_bytes(), len);
}

struct Range {
  asio::ip::address network;
  unsigned len;
};

const std::vector<Range>& forbiddenRanges() {
  static const std::vector<Range> kRanges = [] {
    const std::pair<const char*, unsigned> spec[] = {
        {"0.0.0.0", 8},   {"127.0.0.0", 8},   {"169.254.0.0", 16}, {"224.0.0.0", 4},
        {"240.0.0.0", 4}, {"100.64.0.0", 10}, {"::", 128},         {"::1", 128},
        {"fe80::", 10},   {"ff00::", 8},      {"100::", 64},
    };
    std::vector<Range> ranges;
    for (const auto& [text, len] : spec) ranges.push_back({asio::ip::make_address(text), len});
    return ranges;
  }();
  return kRanges;
}

// The IPv4 addresses a packet to `v6` may end up at through a translator or tunnel that
// isForbiddenAddress() judges but canonicalAddress() keeps as IPv6 (they are distinct,
// routable IPv6 addresses): at most two, `count` of them.
struct EmbeddedV4 {
  std::array<asio::ip::address_v4, 2> addresses;
  size_t count = 0;

  void add(const asio::ip::address_v6::bytes_type& b, std::array<size_t, 4> at,
           unsigned char flip = 0) {
    addresses[count++] = asio::ip::make_address_v4(asio::ip::address_v4::bytes_type{
        static_cast<unsigned char>(b[at[0]] ^ flip), static_cast<unsigned char>(b[at[1]] ^ flip),
        static_cast<unsigned char>(b[at[2]] ^ flip), static_cast<unsigned char>(b[at[3]] ^ flip)});
  }
};

EmbeddedV4 embeddedIpv4(const asio::ip::address_v6& v6) {
  const auto b = v6.to_bytes();
  EmbeddedV4 out;
  if (b[0] == 0x20 && b[1] == 0x02) {
    // 6to4, 2002:WWXX:YYZZ::/48 (RFC 3056 §2): the relay sends it to WW.XX.YY.ZZ.
    out.add(b, {2, 3, 4, 5});
  } else if (b[0] == 0x20 && b[1] == 0x01 && b[2] == 0x00 && b[3] == 0x00) {
    // Teredo, 2001:0000::/32 (RFC 4380 §4): bits 32-63 are the server's IPv4 address, bits
    // 96-127 the client's, every bit inverted. A relay sends the packet to the client's.
    out.add(b, {4, 5, 6, 7});
    out.add(b, {12, 13, 14, 15}, 0xff);
  } else if (b[0] == 0x00 && b[1] == 0x64 && b[2] == 0xff && b[3] == 0x9b && b[4] == 0x00 &&
             b[5] == 0x01) {
    // Local-use NAT64 prefix 64:ff9b:1::/48 (RFC 8215), read with the /48 layout of RFC 6052
    // §2.2: the IPv4 address in bits 48-63 and 72-87, around the "u" octet (bits 64-71,
    // skipped whatever its value) and before the suffix (ignored, as translators do).
    out.add(b, {6, 7, 9, 10});
  } else if (std::all_of(b.begin(), b.begin() + 8, [](auto x) { return x == 0; }) && b[8] == 0xff &&
             b[9] == 0xff && b[10] == 0 && b[11] == 0) {
    // IPv4-translated, ::ffff:0:0:0/96 (RFC 2765 §2.1, SIIT): a stateless translator sends
    // it to the IPv4 address in the last 32 bits.
    out.add(b, {12, 13, 14, 15});
  }
  // The NAT64 well-known prefix 64:ff9b::/96 (RFC 6052) needs no entry here:
  // canonicalAddress() already reads it as its IPv4 address.
  return out;
}

bool inForbiddenRange(const asio::ip::address& addr) {
  const auto& ranges = forbiddenRanges();
  return std::any_of(ranges.begin(), ranges.end(),
                     [&](const Range& range) { return inPrefix(addr, range.network, range.len); });
}

}  // namespace

asio::ip::address canonicalAddress(const asio::ip::address& addr) {
  if (!addr.is_v6()) return addr;
  const auto v6 = addr.to_v6();
  if (v6.is_v4_mapped()) return asio::ip::make_address_v4(asio::ip::v4_mapped, v6);
  const auto bytes = v6.to_bytes();
  const bool compatible =
      std::all_of(bytes.begin(), bytes.begin() + kV4InV6Offset / 8, [](auto b) { return b == 0; });
  // :: and ::1 keep their IPv6 meaning (unspecified, loopback); every other ::a.b.c.d is the
  // deprecated IPv4-compatible form, which some stacks still route as IPv4.
  // 64:ff9b::/96 (RFC 6052 well-known NAT64 prefix): where a NAT64 gateway exists, such an
  // address reaches the embedded IPv4 address, so it is judged as that address.
  static constexpr std::array<unsigned char, 12> kNat64Prefix = {0x00, 0x64, 0xff, 0x9b};
  const bool nat64 = std::equal(kNat64Prefix.begin(), kNat64Prefix.end(), bytes.begin());
  if ((compatible && !v6.is_unspecified() && !v6.is_loopback()) || nat64) {
    asio::ip::address_v4::bytes_type v4{};
    std::copy(bytes.begin() + kV4InV6Offset / 8, bytes.end(), v4.begin());
    return asio::ip::make_address_v4(v4);
  }
  return addr;
}

Cidr Cidr::parse(std::string_view text) {
  if (text.empty()) throw CidrError("empty prefix");
  const size_t slash = text.find('/');
  const std::string_view addr_text = text.substr(0, slash);
  if (addr_text.find('%') != std::string_view::npos) {
    throw CidrError("zone id not allowed in a prefix");
  }
  std::error_code ec;
  const auto addr = asio::ip::make_address(std::string(addr_text), ec);
  if (ec) throw CidrError("not an IP address: " + std::string(addr_text));
  const unsigned max_len = addr.is_v4() ? kV4Bits : kV6Bits;
  unsigned len = max_len;
  if (slash != std::string_view::npos) {
    const std::string_view len_text = text.substr(slash + 1);
    const bool digits =
        !len_text.empty() &&
        std::all_of(len_text.begin(), len_text.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (!digits || (len_text.size() > 1 && len_text.front() == '0')) {
      throw CidrError("prefix length is not a decimal number");
    }
    const auto [end, parse_ec] =
        std::from_chars(len_text.data(), len_text.data() + len_text.size(), len);
    if (parse_ec != std::errc() || end != len_text.data() + len_text.size() || len > max_len) {
      throw CidrError("prefix length out of range");
    }
  }
  const bool host_bits = addr.is_v4() ? hostBitsSet(addr.to_v4().to_bytes(), len)
                                      : hostBitsSet(addr.to_v6().to_bytes(), len);
  if (host_bits) throw CidrError("host bits set beyond /" + std::to_string(len));

  Cidr cidr;
  cidr.network_ = addr;
  cidr.prefix_len_ = len;
  // "::ffff:10.0.0.0/104" means 10.0.0.0/8; store it that way so contains(), which sees
  // canonical addresses, matches it. Shorter IPv6 prefixes stay IPv6 (fail closed).
  if (addr.is_v6() && len >= kV4InV6Offset) {
    const auto canonical = canonicalAddress(addr);
    if (canonical.is_v4()) {
      // 64:ff9b::/96 (NAT64) is unwrapped like ::ffff:0:0/96, but what it names is a
      // translator's way to an IPv4 host, not that host on this machine's own routes:
      // "64:ff9b::/96" would otherwise permit 0.0.0.0/0, 127.0.0.0/8 included. The operator
      // spells the IPv4 prefix.
      if (const auto bytes = addr.to_v6().to_bytes(); bytes[0] == 0x00 && bytes[1] == 0x64) {
        throw CidrError(
            "a NAT64 prefix (64:ff9b::/96) is checked as the IPv4 address it embeds: "
            "write the IPv4 prefix instead");
      }
      cidr.network_ = canonical;
      cidr.prefix_len_ = len - kV4InV6Offset;
    }
  }
  return cidr;
}

bool Cidr::contains(const asio::ip::address& addr) const {
  const auto canonical = canonicalAddress(addr);
  const auto network = canonicalAddress(network_);
  // A family mismatch never matches: "::/0" does not widen to IPv4 through mapped forms.
  return inPrefix(canonical, network, prefix_len_);
}

std::string Cidr::text() const { return network_.to_string() + "/" + std::to_string(prefix_len_); }

bool isForbiddenAddress(const asio::ip::address& addr) {
  const auto canonical = canonicalAddress(addr);
  if (inForbiddenRange(canonical)) return true;
  if (!canonical.is_v6()) return false;
  const auto embedded = embeddedIpv4(canonical.to_v6());
  return std::any_of(embedded.addresses.begin(), embedded.addresses.begin() + embedded.count,
                     [](const asio::ip::address_v4& v4) { return inForbiddenRange(v4); });
}

bool DestinationPolicy::permits(const asio::ip::address& addr) const {
  return !isForbiddenAddress(addr) || allowsExplicitly(addr);
}

bool DestinationPolicy::allowsExplicitly(const asio::ip::address& addr) const {
  return std::any_of(allowed_.begin(), allowed_.end(),
                     [&](const Cidr& cidr) { return cidr.contains(addr); });
}

}  // namespace policy
