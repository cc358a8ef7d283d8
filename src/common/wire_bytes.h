#pragma once
// Big-endian ("network order", RFC 1035 §2.3.2) 16- and 32-bit fields in byte strings, as DNS
// messages hold them: read by the runner's firewall DNS forwarder, the virtual DNS and
// `nano-init check`, and written by them. Header only, with no dependency, so the static
// nano-init can use it too.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace common {

/// The 16-bit big-endian value in b[at] and b[at + 1]. The caller checks at + 2 <= b.size().
inline uint16_t get16(std::string_view b, size_t at) {
  return static_cast<uint16_t>((static_cast<uint8_t>(b[at]) << 8) |
                               static_cast<uint8_t>(b[at + 1]));
}

/// Appends `v` to *out as two bytes, most significant first.
inline void put16(std::string* out, uint16_t v) {
  out->push_back(static_cast<char>(v >> 8));
  out->push_back(static_cast<char>(v & 0xff));
}

/// Appends `v` to *out as four bytes, most significant first.
inline void put32(std::string* out, uint32_t v) {
  put16(out, static_cast<uint16_t>(v >> 16));
  put16(out, static_cast<uint16_t>(v & 0xffff));
}

}  // namespace common
