#include "policy/address.h"

#include <gtest/gtest.h>

#include <string>

namespace policy {
namespace {

asio::ip::address ip(const char* text) { return asio::ip::make_address(text); }

std::string cidrRefusal(std::string_view text) {
  try {
    const Cidr cidr = Cidr::parse(text);
    ADD_FAILURE() << "accepted \"" << text << "\" as " << cidr.text();
    return "";
  } catch (const CidrError& e) {
    return e.what();
  }
}

TEST(CanonicalAddress, UnwrapsMappedAndCompatibleForms) {
  EXPECT_EQ(canonicalAddress(ip("::ffff:127.0.0.1")), ip("127.0.0.1"));
  EXPECT_EQ(canonicalAddress(ip("::ffff:7f00:1")), ip("127.0.0.1"));
  EXPECT_EQ(canonicalAddress(ip("::FFFF:A9FE:A9FE")), ip("169.254.169.254"));
  EXPECT_EQ(canonicalAddress(ip("::127.0.0.1")), ip("127.0.0.1"));
  EXPECT_EQ(canonicalAddress(ip("::7f00:1")), ip("127.0.0.1"));
  EXPECT_EQ(canonicalAddress(ip("::2")), ip("0.0.0.2"));
}

TEST(CanonicalAddress, KeepsUnspecifiedLoopbackAndOrdinaryAddresses) {
  EXPECT_EQ(canonicalAddress(ip("::")), ip("::"));
  EXPECT_EQ(canonicalAddress(ip("::1")), ip("::1"));
  EXPECT_EQ(canonicalAddress(ip("2001:db8::1")), ip("2001:db8::1"));
  EXPECT_EQ(canonicalAddress(ip("10.1.2.3")), ip("10.1.2.3"));
  // ::fffe:... is ordinary IPv6; the NAT64 well-known prefix is unwrapped (AddressNat64Test),
  // but the local-use NAT64 prefix 64:ff9b:1::/48 has no fixed embedding and is not.
  EXPECT_TRUE(canonicalAddress(ip("::fffe:7f00:1")).is_v6());
  EXPECT_TRUE(canonicalAddress(ip("64:ff9b:1::7f00:1")).is_v6());
}

TEST(IsForbiddenAddress, RefusesHostAndSpecialRangesV4) {
  for (const char* text : {"0.0.0.0", "0.1.2.3", "127.0.0.1", "127.255.255.254", "169.254.169.254",
                           "169.254.0.1", "224.0.0.1", "239.255.255.250", "240.0.0.1",
                           "255.255.255.255", "100.64.0.1", "100.127.255.255"}) {
    EXPECT_TRUE(isForbiddenAddress(ip(text))) << text;
  }
  for (const char* text :
       {"1.1.1.1", "8.8.8.8", "10.0.0.1", "192.168.1.1", "172.16.0.1", "100.63.255.255",
        "100.128.0.0", "169.253.255.255", "223.255.255.255", "126.255.255.255", "128.0.0.1"}) {
    EXPECT_FALSE(isForbiddenAddress(ip(text))) << text;
  }
}

TEST(IsForbiddenAddress, RefusesHostAndSpecialRangesV6) {
  for (const char* text : {"::", "::1", "fe80::1", "febf:ffff::1", "ff02::1", "ff0e::1", "100::1",
                           "100::ffff:ffff:ffff:ffff"}) {
    EXPECT_TRUE(isForbiddenAddress(ip(text))) << text;
  }
  for (const char* text :
       {"2001:db8::1", "2606:4700::1111", "fec0::1", "fc00::1", "100:0:0:1::", "::2:0:0:1"}) {
    EXPECT_FALSE(isForbiddenAddress(ip(text))) << text;
  }
}

TEST(IsForbiddenAddress, CannotBeBypassedByRespelling) {
  for (const char* text : {"::ffff:127.0.0.1", "::ffff:7f00:1", "::ffff:169.254.169.254",
                           "::127.0.0.1", "::7f00:1", "::ffff:0.0.0.0", "::ffff:100.64.0.1",
                           "::ffff:224.0.0.1", "::ffff:255.255.255.255", "::169.254.169.254"}) {
    EXPECT_TRUE(isForbiddenAddress(ip(text))) << text;
  }
  EXPECT_FALSE(isForbiddenAddress(ip("::ffff:8.8.8.8")));
  EXPECT_TRUE(isForbiddenAddress(ip("fe80::1%1")));
}

TEST(Cidr, ParsesPrefixesAndBareAddresses) {
  EXPECT_EQ(Cidr::parse("198.51.100.0/24").text(), "198.51.100.0/24");
  EXPECT_EQ(Cidr::parse("2001:db8::/32").text(), "2001:db8::/32");
  EXPECT_EQ(Cidr::parse("127.0.0.1").text(), "127.0.0.1/32");
  EXPECT_EQ(Cidr::parse("::1").text(), "::1/128");
  EXPECT_EQ(Cidr::parse("0.0.0.0/0").text(), "0.0.0.0/0");
  EXPECT_EQ(Cidr::parse("::/0").text(), "::/0");
  EXPECT_EQ(Cidr::parse("2001:DB8::/32").text(), "2001:db8::/32");
}

TEST(Cidr, StoresMappedPrefixesAsIpv4) {
  EXPECT_EQ(Cidr::parse("::ffff:10.0.0.0/104").text(), "10.0.0.0/8");
  EXPECT_EQ(Cidr::parse("::ffff:127.0.0.1").text(), "127.0.0.1/32");
  EXPECT_TRUE(Cidr::parse("::ffff:10.0.0.0/104").contains(ip("10.9.9.9")));
}

TEST(Cidr, RefusesMalformedPrefixes) {
  EXPECT_EQ(cidrRefusal("10.0.0.1/8"), "host bits set beyond /8");
  EXPECT_EQ(cidrRefusal("2001:db8::1/32"), "host bits set beyond /32");
  EXPECT_EQ(cidrRefusal("10.0.0.0/33"), "prefix length out of range");
  EXPECT_EQ(cidrRefusal("::/129"), "prefix length out of range");
  EXPECT_EQ(cidrRefusal("10.0.0.0/99999999999999999999"), "prefix length out of range");
  EXPECT_EQ(cidrRefusal("10.0.0.0/"), "prefix length is not a decimal number");
  EXPECT_EQ(cidrRefusal("10.0.0.0/-8"), "prefix length is not a decimal number");
  EXPECT_EQ(cidrRefusal("10.0.0.0/+8"), "prefix length is not a decimal number");
  EXPECT_EQ(cidrRefusal("10.0.0.0/08"), "prefix length is not a decimal number");
  EXPECT_EQ(cidrRefusal("10.0.0.0/8/8"), "prefix length is not a decimal number");
  EXPECT_EQ(cidrRefusal(""), "empty prefix");
  EXPECT_EQ(cidrRefusal("fe80::%eth0/10"), "zone id not allowed in a prefix");
  // Only the strict dotted quad: the shorthand spellings stay out of operator input too.
  EXPECT_EQ(cidrRefusal("127.1"), "not an IP address: 127.1");
  EXPECT_EQ(cidrRefusal("0x7f000001"), "not an IP address: 0x7f000001");
  EXPECT_EQ(cidrRefusal("example.com/24"), "not an IP address: example.com");
  EXPECT_EQ(cidrRefusal("[::1]/128"), "not an IP address: [::1]");
  EXPECT_EQ(cidrRefusal("/8"), "not an IP address: ");
}

TEST(Cidr, ContainsComparesCanonicalAddresses) {
  const Cidr loopback = Cidr::parse("127.0.0.0/8");
  EXPECT_TRUE(loopback.contains(ip("127.0.0.1")));
  EXPECT_TRUE(loopback.contains(ip("::ffff:127.0.0.1")));
  EXPECT_TRUE(loopback.contains(ip("::127.0.0.1")));
  EXPECT_FALSE(loopback.contains(ip("128.0.0.1")));
  EXPECT_FALSE(loopback.contains(ip("::1")));

  const Cidr doc = Cidr::parse("2001:db8::/32");
  EXPECT_TRUE(doc.contains(ip("2001:db8:ffff::1")));
  EXPECT_FALSE(doc.contains(ip("2001:db9::1")));
  EXPECT_FALSE(doc.contains(ip("10.0.0.1")));

  const Cidr odd = Cidr::parse("10.0.0.0/9");
  EXPECT_TRUE(odd.contains(ip("10.127.255.255")));
  EXPECT_FALSE(odd.contains(ip("10.128.0.0")));

  EXPECT_TRUE(Cidr::parse("0.0.0.0/0").contains(ip("255.255.255.255")));
  // IPv6 "everything" does not widen to IPv4 through mapped spellings.
  EXPECT_FALSE(Cidr::parse("::/0").contains(ip("::ffff:127.0.0.1")));
  EXPECT_TRUE(Cidr::parse("::/0").contains(ip("::1")));
}

TEST(DestinationPolicy, PermitsOrdinaryAddressesAndRefusesForbiddenOnes) {
  const DestinationPolicy policy;
  EXPECT_TRUE(policy.permits(ip("93.184.216.34")));
  EXPECT_TRUE(policy.permits(ip("2606:2800:220:1::1")));
  EXPECT_FALSE(policy.permits(ip("127.0.0.1")));
  EXPECT_FALSE(policy.permits(ip("::ffff:169.254.169.254")));
  EXPECT_FALSE(policy.permits(ip("::1")));
  EXPECT_FALSE(policy.permits(ip("100.64.0.7")));
  EXPECT_FALSE(policy.permits(ip("100::7")));
}

TEST(DestinationPolicy, OperatorCanAllowAForbiddenRange) {
  DestinationPolicy policy;
  policy.allow(Cidr::parse("127.0.0.1/32"));
  policy.allow(Cidr::parse("fe80::/64"));
  ASSERT_EQ(policy.allowed().size(), 2u);
  EXPECT_TRUE(policy.permits(ip("127.0.0.1")));
  EXPECT_TRUE(policy.permits(ip("::ffff:127.0.0.1")));
  EXPECT_FALSE(policy.permits(ip("127.0.0.2")));
  EXPECT_TRUE(policy.permits(ip("fe80::1")));
  EXPECT_FALSE(policy.permits(ip("fe80:0:0:1::1")));
  EXPECT_FALSE(policy.permits(ip("169.254.169.254")));
}

}  // namespace
}  // namespace policy

namespace policy {
namespace {

TEST(AddressNat64Test, WellKnownNat64PrefixIsJudgedAsItsIpv4Address) {
  EXPECT_TRUE(isForbiddenAddress(asio::ip::make_address("64:ff9b::a9fe:a9fe")));  // metadata
  EXPECT_TRUE(isForbiddenAddress(asio::ip::make_address("64:ff9b::127.0.0.1")));
  EXPECT_FALSE(isForbiddenAddress(asio::ip::make_address("64:ff9b::198.18.0.2")));
  EXPECT_EQ(canonicalAddress(asio::ip::make_address("64:ff9b::c612:2")).to_string(), "198.18.0.2");
}

}  // namespace
}  // namespace policy
