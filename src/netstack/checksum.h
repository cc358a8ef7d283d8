#pragma once
// The Internet checksum's ones' complement sum (RFC 1071), eight bytes per step. Every byte an
// agent sends is summed once by parsePacket() (packet.cc) and every byte towards it once by
// lwIP (LWIP_CHKSUM, lwipopts.h), so this loop is a large part of nano-init's cost per byte.
// RFC 1071 §2(B): the sum may be accumulated over wider words in memory order and folded to 16
// bits at the end; the folded result equals the sum of 16-bit words in memory order.

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace netstack {

/// Ones' complement sum of `len` bytes at `data`, as 16-bit words in memory order (the last
/// odd byte padded with zero), folded to 16 bits, not inverted. Any alignment.
inline uint16_t onesSumMemoryOrder(const void* data, size_t len) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t acc = 0;
  // Four independent 64-bit additions per step; each carry out is added back in (end-around
  // carry), which keeps the ones' complement sum exact.
  while (len >= 32) {
    uint64_t w[4];
    std::memcpy(w, p, sizeof w);
    for (const uint64_t x : w) {
      acc += x;
      acc += acc < x ? 1 : 0;
    }
    p += 32;
    len -= 32;
  }
  while (len >= 8) {
    uint64_t x;
    std::memcpy(&x, p, 8);
    acc += x;
    acc += acc < x ? 1 : 0;
    p += 8;
    len -= 8;
  }
  // The tail (0..7 bytes), zero-padded to eight: the same memory-order words.
  if (len > 0) {
    uint64_t x = 0;
    std::memcpy(&x, p, len);
    acc += x;
    acc += acc < x ? 1 : 0;
  }
  acc = (acc & 0xffffffffu) + (acc >> 32);
  acc = (acc & 0xffffffffu) + (acc >> 32);
  acc = (acc & 0xffffu) + (acc >> 16);
  acc = (acc & 0xffffu) + (acc >> 16);
  return static_cast<uint16_t>(acc);
}

}  // namespace netstack
