#pragma once
// The Internet checksum's ones' complement sum (RFC 1071), 32-bit words in four sums. Every byte an
// agent sends is summed once by parsePacket() (packet.cc) and every byte towards it once by
// lwIP (LWIP_CHKSUM, lwipopts.h), so this loop is a large part of nano-init's cost per byte.
// RFC 1071 §2(B): the sum may be accumulated over wider words in memory order and folded to 16
// bits at the end; the folded result equals the sum of 16-bit words in memory order.

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace netstack {

/// Ones' complement sum of `len` bytes at `data`, as 16-bit words in memory order (the last
/// odd byte padded with zero), folded to 16 bits, not inverted. Any alignment; `len` below
/// 2^34 bytes (a packet is at most 64 KiB).
inline uint16_t onesSumMemoryOrder(const void* data, size_t len) {
  const auto* p = static_cast<const unsigned char*>(data);
  // 32-bit words added into four independent 64-bit sums: no carry can leave a sum before
  // 2^32 words, so there is no end-around carry to chain one addition to the next, and the
  // compiler may add several words per instruction. The sums are folded at the end.
  uint64_t sums[4] = {0, 0, 0, 0};
  while (len >= 16) {
    uint32_t w[4];
    std::memcpy(w, p, sizeof w);
    for (int i = 0; i < 4; ++i) sums[i] += w[i];
    p += 16;
    len -= 16;
  }
  // Each sum is below 2^32 * 2^30, so their total cannot overflow 64 bits.
  uint64_t acc = sums[0] + sums[1] + sums[2] + sums[3];
  while (len >= 4) {
    uint32_t x;
    std::memcpy(&x, p, 4);
    acc += x;
    p += 4;
    len -= 4;
  }
  // The tail (0..3 bytes), zero-padded to four: the same memory-order words.
  if (len > 0) {
    uint32_t x = 0;
    std::memcpy(&x, p, len);
    acc += x;
  }
  acc = (acc & 0xffffffffu) + (acc >> 32);
  acc = (acc & 0xffffffffu) + (acc >> 32);
  acc = (acc & 0xffffu) + (acc >> 16);
  acc = (acc & 0xffffu) + (acc >> 16);
  return static_cast<uint16_t>(acc);
}

}  // namespace netstack
