#pragma once
// Host names as the boundary sees them (DESIGN.md "Rules that cut across"; RFC 1123 §2.1,
// RFC 1035 §2.3.4). Every rule and every request name passes through normalizeName() before
// any comparison, so "Api.Example.COM." and "api.example.com" are the same name.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace policy {

/// Longest name accepted, in bytes, without the trailing dot (RFC 1035 §2.3.4).
inline constexpr size_t kMaxNameBytes = 253;
/// Longest label accepted, in bytes (RFC 1035 §2.3.4).
inline constexpr size_t kMaxLabelBytes = 63;
/// The node's name inside every sandbox (seed 003, "What the agent sees"): sam-box carries it
/// to the node whatever the allowlist says, so no allowlist rule may name it.
inline constexpr const char* kMeshName = "mesh.sam.alt";

/// Normalizes a host name: lower-cases ASCII letters, drops one trailing dot, and validates
/// it per RFC 1123: 1..253 bytes, dot-separated labels of 1..63 bytes of [a-z0-9-] that
/// neither start nor end with '-'. Non-ASCII bytes are refused (IDN must arrive as
/// punycode, "xn--..."). An IP literal in any spelling is not a name: see isIpLiteral().
/// Returns the normalized name, or std::nullopt with `*reason` (if non-null) set to a
/// short human-readable reason such as "label longer than 63 bytes".
std::optional<std::string> normalizeName(std::string_view raw, std::string* reason = nullptr);

/// True if `host` is an address literal rather than a name, in any spelling a resolver or
/// inet_aton(3) would accept: dotted quad, shortened ("127.1"), decimal ("2130706433"),
/// hex ("0x7f000001"), octal ("0177.0.0.1"), IPv6 with or without brackets, IPv4-mapped
/// IPv6 ("::ffff:127.0.0.1"), IPv6 with a zone ("fe80::1%eth0"). A name whose last label is
/// all digits is also treated as a literal, since no top-level domain is numeric.
/// A trailing dot is ignored.
bool isIpLiteral(std::string_view host);

/// A CONNECT target "host:port" (RFC 9110 §9.3.6, authority-form; IPv6 in brackets).
struct Authority {
  std::string host;   ///< as written, brackets removed for IPv6; not yet normalized
  uint16_t port = 0;  ///< 1..65535
};

/// Splits "host:port" / "[v6]:port". The port is required, decimal, 1..65535, no sign and
/// no leading '+'. Returns std::nullopt with `*reason` set on any malformation.
std::optional<Authority> parseAuthority(std::string_view text, std::string* reason = nullptr);

}  // namespace policy
