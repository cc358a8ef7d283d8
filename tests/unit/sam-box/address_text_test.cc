#include "sam-box/server_internal.h"

#include <gtest/gtest.h>

namespace sambox {
namespace {

TEST(AddressTextTest, WritesWhatAsioWrites) {
  for (const char* text :
       {"0.0.0.0", "127.0.0.1", "10.0.9.99", "100.64.10.1", "198.18.0.2", "255.255.255.255",
        "1.20.199.200", "::1", "2001:db8::2", "::ffff:10.0.0.1", "fe80::1"}) {
    const auto addr = asio::ip::make_address(text);
    EXPECT_EQ(addressText(addr), addr.to_string()) << text;
  }
  for (unsigned v = 0; v < 256; ++v) {
    const asio::ip::address addr(asio::ip::address_v4(
        {static_cast<unsigned char>(v), 0, 7, static_cast<unsigned char>(255 - v)}));
    EXPECT_EQ(addressText(addr), addr.to_string());
  }
}

}  // namespace
}  // namespace sambox
