#include "proto/capsule.h"

#include <gtest/gtest.h>

namespace proto {
namespace {

TEST(CapsuleTest, VarintRoundTripsAtEveryLengthBoundary) {
  for (uint64_t v :
       {0ULL, 63ULL, 64ULL, 16383ULL, 16384ULL, 1073741823ULL, 1073741824ULL, (1ULL << 62) - 1}) {
    std::string buf;
    appendVarint(v, &buf);
    size_t used = 0;
    ASSERT_EQ(readVarint(buf, &used), v);
    EXPECT_EQ(used, buf.size());
  }
  std::string buf;
  EXPECT_THROW(appendVarint(1ULL << 62, &buf), std::invalid_argument);
}

TEST(CapsuleTest, Rfc9000ExampleVarints) {
  size_t used = 0;
  EXPECT_EQ(readVarint(std::string("\xc2\x19\x7c\x5e\xff\x14\xe8\x8c", 8), &used),
            151288809941952652ULL);
  EXPECT_EQ(readVarint(std::string("\x9d\x7f\x3e\x7d", 4), &used), 494878333ULL);
  EXPECT_EQ(readVarint(std::string("\x7b\xbd", 2), &used), 15293ULL);
  EXPECT_EQ(readVarint(std::string("\x25", 1), &used), 37ULL);
  EXPECT_FALSE(readVarint(std::string("\x7b", 1), &used).has_value());
}

TEST(CapsuleTest, DatagramsSplitAnywhereDecode) {
  std::string stream;
  appendDatagramCapsule("hello", &stream);
  appendDatagramCapsule(std::string(1000, 'x'), &stream);
  appendDatagramCapsule("", &stream);
  CapsuleReader reader;
  std::vector<std::string> got;
  for (char c : stream) {
    reader.append(std::string_view(&c, 1));
    while (reader.next() == CapsuleReader::Status::kDatagram) got.emplace_back(reader.payload());
  }
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0], "hello");
  EXPECT_EQ(got[1], std::string(1000, 'x'));
  EXPECT_EQ(got[2], "");
  EXPECT_EQ(reader.buffered(), 0u);
}

TEST(CapsuleTest, UnknownTypesAndContextIdsAreSkipped) {
  std::string stream;
  appendVarint(0x17, &stream);  // unknown capsule type
  appendVarint(3, &stream);
  stream += "abc";
  appendVarint(0, &stream);  // DATAGRAM with Context ID 2
  appendVarint(3, &stream);
  appendVarint(2, &stream);
  stream += "zz";
  appendDatagramCapsule("ok", &stream);
  CapsuleReader reader;
  reader.append(stream);
  ASSERT_EQ(reader.next(), CapsuleReader::Status::kDatagram);
  EXPECT_EQ(reader.payload(), "ok");
  EXPECT_EQ(reader.next(), CapsuleReader::Status::kNeedMore);
}

TEST(CapsuleTest, OversizedCapsuleIsRefusedBeforeBuffering) {
  std::string stream;
  appendVarint(0, &stream);
  appendVarint(kMaxCapsuleValueBytes + 1, &stream);
  CapsuleReader reader;
  reader.append(stream);
  EXPECT_EQ(reader.next(), CapsuleReader::Status::kTooLarge);
}

}  // namespace
}  // namespace proto
