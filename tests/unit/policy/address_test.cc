#include "policy/address.h"

#include <gtest/gtest.h>

#include <array>
#include <string>
#include <vector>

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
  // but the local-use NAT64 prefix 64:ff9b:1::/48 is not (isForbiddenAddress() reads it with
  // the RFC 6052 /48 layout: AddressEmbeddedIpv4Test).
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

TEST(Cidr, RefusesNat64PrefixesThatWouldWidenToIpv4) {
  // Unwrapped, 64:ff9b::/96 is 0.0.0.0/0: allowing "the NAT64 range" must not allow loopback.
  for (const char* text : {"64:ff9b::/96", "64:ff9b::7f00:0/104", "64:ff9b::7f00:1"}) {
    EXPECT_NE(cidrRefusal(text).find("write the IPv4 prefix instead"), std::string::npos) << text;
  }
  EXPECT_EQ(Cidr::parse("127.0.0.0/8").text(), "127.0.0.0/8");  // the spelling that works
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

namespace policy {
namespace {

// IPv6 addresses that embed an IPv4 address a relay or translator would deliver to: 6to4
// (RFC 3056), Teredo (RFC 4380), NAT64 (RFC 6052 /96, RFC 8215 local-use /48).

asio::ip::address v6From(std::array<unsigned char, 16> bytes) {
  return asio::ip::address_v6(bytes);
}

// Every embedded spelling of `v4` (dotted quad): mapped, compatible, 6to4 (two subnets and
// hosts), Teredo as server and as client (each with a public partner), NAT64 /96 and
// local-use /48 (with a zero and a non-zero "u" octet and suffix), IPv4-translated (SIIT).
std::vector<asio::ip::address> embeddedForms(const char* v4_text) {
  const auto v4 = asio::ip::make_address_v4(v4_text).to_bytes();
  const std::array<unsigned char, 4> pub = {8, 8, 8, 8};
  std::vector<asio::ip::address> forms;
  forms.push_back(v6From({0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, v4[0], v4[1], v4[2], v4[3]}));
  forms.push_back(v6From({0x20, 0x02, v4[0], v4[1], v4[2], v4[3]}));
  forms.push_back(v6From({0x20, 0x02, v4[0], v4[1], v4[2], v4[3], 0xff, 0xff, 0xff, 0xff, 0xff,
                          0xff, 0xff, 0xff, 0xff, 0xff}));
  forms.push_back(v6From({0x20, 0x02, v4[0], v4[1], v4[2], v4[3], 0, 1, 0, 0, 0, 0, 0, 0, 0, 1}));
  // Teredo: server v4, client 8.8.8.8 (inverted: f7f7:f7f7), flags 0x8000, port 0xf227.
  forms.push_back(v6From(
      {0x20, 0x01, 0, 0, v4[0], v4[1], v4[2], v4[3], 0x80, 0, 0xf2, 0x27, 0xf7, 0xf7, 0xf7, 0xf7}));
  // Teredo: server 8.8.8.8, client v4 (inverted).
  forms.push_back(v6From({0x20, 0x01, 0, 0, pub[0], pub[1], pub[2], pub[3], 0x80, 0, 0xf2, 0x27,
                          static_cast<unsigned char>(~v4[0]), static_cast<unsigned char>(~v4[1]),
                          static_cast<unsigned char>(~v4[2]), static_cast<unsigned char>(~v4[3])}));
  forms.push_back(
      v6From({0, 0x64, 0xff, 0x9b, 0, 0, 0, 0, 0, 0, 0, 0, v4[0], v4[1], v4[2], v4[3]}));
  // IPv4-translated (SIIT, ::ffff:0:a.b.c.d).
  forms.push_back(v6From({0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0, 0, v4[0], v4[1], v4[2], v4[3]}));
  forms.push_back(v6From({0, 0x64, 0xff, 0x9b, 0, 1, v4[0], v4[1], 0, v4[2], v4[3]}));
  forms.push_back(v6From(
      {0, 0x64, 0xff, 0x9b, 0, 1, v4[0], v4[1], 0xff, v4[2], v4[3], 0xff, 0xff, 0xff, 0xff, 0xff}));
  return forms;
}

TEST(AddressEmbeddedIpv4Test, EveryEmbeddedFormOfAForbiddenIpv4IsForbidden) {
  for (const char* v4 : {"127.0.0.1", "169.254.169.254", "0.0.0.0", "224.0.0.1", "100.64.0.1",
                         "255.255.255.255", "240.0.0.1", "127.255.255.254"}) {
    for (const auto& form : embeddedForms(v4)) {
      EXPECT_TRUE(isForbiddenAddress(form)) << v4 << " as " << form.to_string();
      EXPECT_FALSE(DestinationPolicy().permits(form)) << v4 << " as " << form.to_string();
    }
  }
}

TEST(AddressEmbeddedIpv4Test, EmbeddedFormsOfAPublicIpv4StayAllowed) {
  for (const char* v4 : {"198.51.100.7", "8.8.8.8", "93.184.216.34", "100.128.0.1"}) {
    for (const auto& form : embeddedForms(v4)) {
      EXPECT_FALSE(isForbiddenAddress(form)) << v4 << " as " << form.to_string();
    }
  }
}

TEST(AddressEmbeddedIpv4Test, LiteralSpellingsOfTheLayouts) {
  // The layouts written out, independently of embeddedForms().
  for (const char* text : {
           "2002:7f00:1::",                       // 6to4 127.0.0.1
           "2002:a9fe:a9fe:1::1",                 // 6to4 169.254.169.254
           "2002::1",                             // 6to4 0.0.0.0
           "2002:e000:1::",                       // 6to4 224.0.0.1
           "2002:6440:1::",                       // 6to4 100.64.0.1
           "2001:0:7f00:1:8000:f227:f7f7:f7f7",   // Teredo server 127.0.0.1
           "2001:0:808:808:8000:f227:80ff:fffe",  // Teredo client 127.0.0.1
           "2001:0:808:808:8000:f227:5601:5601",  // Teredo client 169.254.169.254
           "2001:0:808:808:0:0:ffff:ffff",        // Teredo client 0.0.0.0
           "2001:0:808:808:0:0:1fff:fffe",        // Teredo client 224.0.0.1
           "2001:0:808:808:0:0:9bbf:fffe",        // Teredo client 100.64.0.1
           "64:ff9b::7f00:1",                     // NAT64 /96 127.0.0.1
           "64:ff9b:1:7f00:0:100::",              // NAT64 local /48 127.0.0.1
           "64:ff9b:1:a9fe:a9:fe00::",            // NAT64 local /48 169.254.169.254
           "64:ff9b:1::",                         // NAT64 local /48 0.0.0.0
           "64:ff9b:1:e000:0:100::",              // NAT64 local /48 224.0.0.1
           "64:ff9b:1:6440:0:100::",              // NAT64 local /48 100.64.0.1
           "64:ff9b:1:7f00:ff00:1ff:ffff:ffff",   // u octet and suffix set: still 127.0.0.1
           "::ffff:0:7f00:2",                     // IPv4-translated 127.0.0.2
           "::ffff:0:169.254.169.254",            // IPv4-translated, dotted
       }) {
    EXPECT_TRUE(isForbiddenAddress(ip(text))) << text;
  }
  for (const char* text : {
           "2002:c633:6407::1",                   // 6to4 198.51.100.7
           "2002:808:808:ffff::",                 // 6to4 8.8.8.8
           "2001:0:808:808:8000:f227:39cc:9bf8",  // Teredo 8.8.8.8 / client 198.51.100.7
           "64:ff9b::c633:6407",                  // NAT64 /96 198.51.100.7
           "64:ff9b:1:c633:64:700::",             // NAT64 local /48 198.51.100.7
           "2001:1::1", "2001:db8::7f00:1", "2003:7f00:1::", "2001:4860::8888",
           "64:ff9b:2:7f00:0:100::",  // outside both NAT64 prefixes
           "::ffff:0:c633:6407",      // IPv4-translated 198.51.100.7
           "::1:ffff:0:7f00:1",       // not the IPv4-translated prefix
       }) {
    EXPECT_FALSE(isForbiddenAddress(ip(text))) << text;
  }
}

TEST(AddressEmbeddedIpv4Test, OddSpellingsParseToTheSameAddress) {
  const auto plain = ip("2002:7f00:1::");
  for (const char* text : {"2002:7F00:0001::", "2002:7f00:0001:0000:0000:0000:0000:0000",
                           "2002:7f00:1:0::", "2002:7F00:1::0.0.0.0", "2002:7f00:0001:0:0::0"}) {
    EXPECT_EQ(ip(text), plain) << text;
    EXPECT_TRUE(isForbiddenAddress(ip(text))) << text;
  }
  EXPECT_TRUE(isForbiddenAddress(ip("2002:7f00:1::%1")));
  EXPECT_TRUE(isForbiddenAddress(ip("2001:0000:0808:0808:8000:F227:80FF:FFFE")));
  EXPECT_TRUE(isForbiddenAddress(ip("0064:FF9B:0001:A9FE:00A9:FE00:0:0")));
  EXPECT_FALSE(isForbiddenAddress(ip("2002:C633:6407::")));
}

TEST(AddressEmbeddedIpv4Test, CanonicalAddressKeepsTheseFormsIpv6) {
  // 2002::/16, 2001::/32, 64:ff9b:1::/48 and ::ffff:0:0:0/96 are distinct IPv6 addresses; only the
  // forbidden check looks inside them.
  for (const char* text : {"2002:7f00:1::", "2001:0:808:808:8000:f227:80ff:fffe",
                           "64:ff9b:1:7f00:0:100::", "::ffff:0:7f00:1"}) {
    EXPECT_EQ(canonicalAddress(ip(text)), ip(text)) << text;
  }
  EXPECT_NE(Cidr::parse("2002:7f00:1::/48").text(), "127.0.0.1/32");
  EXPECT_EQ(Cidr::parse("2002:7f00:1::/48").text(), "2002:7f00:1::/48");
}

TEST(AddressEmbeddedIpv4Test, AnAllowedIpv4RangeDoesNotPermitItsEmbeddedForms) {
  DestinationPolicy policy;
  policy.allow(Cidr::parse("127.0.0.0/8"));
  EXPECT_TRUE(policy.permits(ip("127.0.0.1")));
  EXPECT_TRUE(policy.permits(ip("::ffff:127.0.0.1")));
  EXPECT_TRUE(policy.permits(ip("64:ff9b::7f00:1")));  // canonicalAddress() unwraps /96
  for (const char* text : {"2002:7f00:1::", "2001:0:808:808:8000:f227:80ff:fffe",
                           "2001:0:7f00:1:8000:f227:f7f7:f7f7", "64:ff9b:1:7f00:0:100::"}) {
    EXPECT_FALSE(policy.allowsExplicitly(ip(text))) << text;
    EXPECT_FALSE(policy.permits(ip(text))) << text;
  }
  // The IPv6 prefix itself permits exactly what it contains.
  policy.allow(Cidr::parse("2002:7f00::/24"));
  EXPECT_TRUE(policy.permits(ip("2002:7f00:1::")));
  EXPECT_TRUE(policy.permits(ip("2002:7fff:ffff::1")));
  EXPECT_FALSE(policy.permits(ip("2002:a9fe:a9fe::")));
  EXPECT_FALSE(policy.permits(ip("2002::1")));
  // A local-use NAT64 network with a /96 is allowed by naming it (its addresses read as
  // 0.0.0.0 under the /48 layout).
  DestinationPolicy local_nat64;
  EXPECT_FALSE(local_nat64.permits(ip("64:ff9b:1::c633:6407")));
  local_nat64.allow(Cidr::parse("64:ff9b:1::/96"));
  EXPECT_TRUE(local_nat64.permits(ip("64:ff9b:1::c633:6407")));
  EXPECT_FALSE(local_nat64.permits(ip("64:ff9b:1:7f00:0:100::")));
}

}  // namespace
}  // namespace policy
