#pragma once
// Hand-built IP packets for the netstack tests (and the checksums that make them valid).

#include "netstack/packet.h"

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace netstack::testing {

inline void put16(std::vector<uint8_t>& b, size_t at, uint16_t v) {
  b[at] = static_cast<uint8_t>(v >> 8);
  b[at + 1] = static_cast<uint8_t>(v);
}

inline void put32(std::vector<uint8_t>& b, size_t at, uint32_t v) {
  for (int i = 0; i < 4; ++i) b[at + i] = static_cast<uint8_t>(v >> (24 - 8 * i));
}

/// An IPv4 or IPv6 packet carrying a TCP segment (flags, seq) or a UDP datagram, with valid
/// checksums. `src`/`dst` are 4 or 16 bytes.
inline std::vector<uint8_t> makePacket(bool v6, const std::vector<uint8_t>& src,
                                       const std::vector<uint8_t>& dst, uint16_t sport,
                                       uint16_t dport, uint8_t protocol, uint8_t flags = 0,
                                       uint32_t seq = 0, std::string_view payload = {}) {
  const size_t ip = v6 ? 40 : 20;
  const size_t l4h = protocol == kProtoTcp ? 20 : 8;
  const size_t l4 = l4h + payload.size();
  std::vector<uint8_t> b(ip + l4, 0);
  if (v6) {
    b[0] = 0x60;
    put16(b, 4, static_cast<uint16_t>(l4));
    b[6] = protocol;
    b[7] = 64;
    std::copy(src.begin(), src.end(), b.begin() + 8);
    std::copy(dst.begin(), dst.end(), b.begin() + 24);
  } else {
    b[0] = 0x45;
    put16(b, 2, static_cast<uint16_t>(ip + l4));
    b[6] = 0x40;
    b[8] = 64;
    b[9] = protocol;
    std::copy(src.begin(), src.end(), b.begin() + 12);
    std::copy(dst.begin(), dst.end(), b.begin() + 16);
    put16(b, 10, checksumFinish(checksumAdd({b.data(), 20})));
  }
  uint8_t* t = b.data() + ip;
  put16(b, ip, sport);
  put16(b, ip + 2, dport);
  if (protocol == kProtoTcp) {
    put32(b, ip + 4, seq);
    t[12] = 5 << 4;
    t[13] = flags;
    put16(b, ip + 14, 65535);
  } else {
    put16(b, ip + 4, static_cast<uint16_t>(l4));
  }
  std::copy(payload.begin(), payload.end(), b.begin() + static_cast<long>(ip + l4h));
  uint32_t sum = checksumAdd({src.data(), src.size()});
  sum = checksumAdd({dst.data(), dst.size()}, sum);
  sum += protocol;
  sum += static_cast<uint32_t>(l4);
  sum = checksumAdd({t, l4}, sum);
  put16(b, ip + (protocol == kProtoTcp ? 16 : 6), checksumFinish(sum));
  return b;
}

inline const std::vector<uint8_t> kAgent4 = {100, 64, 0, 1};
inline const std::vector<uint8_t> kSynthetic4 = {100, 64, 0, 7};
inline const std::vector<uint8_t> kAgent6 = {0x01, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
inline const std::vector<uint8_t> kSynthetic6 = {0x01, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 9};

}  // namespace netstack::testing
