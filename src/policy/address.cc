#include "policy/address.h"

#include <algorithm>
#include <array>
#include <charconv>
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
  const auto& ranges = forbiddenRanges();
  return std::any_of(ranges.begin(), ranges.end(), [&](const Range& range) {
    return inPrefix(canonical, range.network, range.len);
  });
}

bool DestinationPolicy::permits(const asio::ip::address& addr) const {
  return !isForbiddenAddress(addr) || allowsExplicitly(addr);
}

bool DestinationPolicy::allowsExplicitly(const asio::ip::address& addr) const {
  return std::any_of(allowed_.begin(), allowed_.end(),
                     [&](const Cidr& cidr) { return cidr.contains(addr); });
}

}  // namespace policy
