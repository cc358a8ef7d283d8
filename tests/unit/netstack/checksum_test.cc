// The eight-bytes-per-step Internet checksum (netstack/checksum.h) against the plain RFC 1071
// definition: sixteen-bit big-endian words, the odd last byte padded with zero, end-around
// carry. Both users are checked: checksumAdd() (packet intake) and lwIP's LWIP_CHKSUM.

#include "netstack/checksum.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "netstack/packet.h"

extern "C" uint16_t netstack_lwip_chksum(const void* data, int len);

namespace netstack {
namespace {

/// RFC 1071, word by word: the sum of big-endian 16-bit words, folded to 16 bits.
uint16_t referenceSum(const uint8_t* p, size_t n) {
  uint64_t sum = 0;
  for (size_t i = 0; i + 1 < n; i += 2) sum += static_cast<uint64_t>(p[i] << 8 | p[i + 1]);
  if (n % 2 != 0) sum += static_cast<uint64_t>(p[n - 1]) << 8;
  while (sum >> 16) sum = (sum & 0xffff) + (sum >> 16);
  return static_cast<uint16_t>(sum);
}

/// Folds a 32-bit partial sum to 16 bits, as checksumFinish() does before inverting.
uint16_t fold(uint32_t sum) {
  while (sum >> 16) sum = (sum & 0xffff) + (sum >> 16);
  return static_cast<uint16_t>(sum);
}

/// The memory-order reading of a big-endian sum: what LWIP_CHKSUM returns.
uint16_t memoryOrder(uint16_t big_endian_sum) {
  const uint8_t bytes[2] = {static_cast<uint8_t>(big_endian_sum >> 8),
                            static_cast<uint8_t>(big_endian_sum)};
  uint16_t v;
  std::memcpy(&v, bytes, 2);
  return v;
}

TEST(ChecksumTest, MatchesRfc1071ForEveryLengthAndAlignment) {
  std::mt19937 rng(1071);
  std::vector<uint8_t> buf(2048 + 8);
  for (auto& b : buf) b = static_cast<uint8_t>(rng());
  for (size_t offset = 0; offset < 8; ++offset) {
    for (size_t len = 0; len <= 300; ++len) {
      const uint8_t* p = buf.data() + offset;
      const uint16_t want = referenceSum(p, len);
      ASSERT_EQ(fold(checksumAdd({p, len})), want) << "offset " << offset << " len " << len;
      ASSERT_EQ(netstack_lwip_chksum(p, static_cast<int>(len)), memoryOrder(want))
          << "offset " << offset << " len " << len;
    }
  }
}

TEST(ChecksumTest, CarriesAndLargeInputs) {
  // All-ones words make the largest sums: every fold and carry of the final sum must be exact.
  std::vector<uint8_t> ones(65535, 0xff);
  for (const size_t len : {size_t{8}, size_t{31}, size_t{32}, size_t{33}, size_t{4097},
                           size_t{65534}, size_t{65535}}) {
    ASSERT_EQ(fold(checksumAdd({ones.data(), len})), referenceSum(ones.data(), len)) << len;
  }
  std::mt19937 rng(9293);
  std::vector<uint8_t> big(65535);
  for (auto& b : big) b = static_cast<uint8_t>(rng());
  EXPECT_EQ(fold(checksumAdd({big.data(), big.size()})), referenceSum(big.data(), big.size()));
  EXPECT_EQ(netstack_lwip_chksum(big.data(), static_cast<int>(big.size())),
            memoryOrder(referenceSum(big.data(), big.size())));
  EXPECT_EQ(netstack_lwip_chksum(big.data(), 0), 0);
  EXPECT_EQ(netstack_lwip_chksum(big.data(), -1), 0);
}

TEST(ChecksumTest, ChainsWithAPartialSum) {
  // checksumAdd(b, checksumAdd(a)) is the sum of a then b when a has an even length: the
  // pseudo-header sum is chained into the segment's this way.
  std::mt19937 rng(768);
  std::vector<uint8_t> all(600);
  for (auto& b : all) b = static_cast<uint8_t>(rng());
  for (const size_t split : {size_t{0}, size_t{12}, size_t{40}, size_t{598}}) {
    const uint32_t partial = checksumAdd({all.data(), split});
    const uint32_t chained = checksumAdd({all.data() + split, all.size() - split}, partial);
    EXPECT_EQ(fold(chained), referenceSum(all.data(), all.size())) << split;
  }
  // A partial sum near the top of 32 bits still carries end-around: 0xffffffff is ones'
  // complement zero, so adding it changes nothing.
  const uint8_t word[2] = {0x12, 0x34};
  EXPECT_EQ(fold(checksumAdd({word, 2}, 0xffffffffu)), 0x1234);
}

}  // namespace
}  // namespace netstack
