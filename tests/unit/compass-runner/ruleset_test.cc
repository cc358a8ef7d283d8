// The nft text of egress `firewall`, byte for byte: what the runner loads is what a reviewer
// reads here. Each golden ruleset below was also loaded into a real netns with `nft -f -`
// (tests/integration/test_runner_firewall.py loads the real thing end to end).
#include "compass-runner/ruleset.h"

#include <gtest/gtest.h>

#include <stdexcept>

namespace runner::firewall {
namespace {

using asio::ip::make_address;

policy::Allowlist allowOf(std::initializer_list<const char*> entries) {
  policy::Allowlist list;
  for (const char* e : entries) list.add(policy::parseAllowRule(e));
  return list;
}

// Everything of the sandbox ruleset after the sets: the same for every policy.
const char* const kChains = R"(  chain output {
    type filter hook output priority filter; policy drop;
    oif "lo" accept
    ct state established,related accept
    ip daddr 10.231.0.1 meta l4proto { tcp, udp } th dport 53 accept
    ip6 daddr fd5a:7c3e:91b4::1 meta l4proto { tcp, udp } th dport 53 accept
    icmpv6 type { nd-neighbor-solicit, nd-neighbor-advert, nd-router-solicit } accept
    ip daddr @allow4 accept
    ip6 daddr @allow6 accept
    meta l4proto { tcp, udp } ip daddr . th dport @allow4p accept
    meta l4proto { tcp, udp } ip6 daddr . th dport @allow6p accept
    meta l4proto tcp reject with tcp reset
    reject with icmpx admin-prohibited
  }
  chain input {
    type filter hook input priority filter; policy drop;
    iif "lo" accept
    ct state established,related accept
    icmpv6 type { nd-neighbor-solicit, nd-neighbor-advert } accept
  }
}
)";

std::string sets(const std::string& e4, const std::string& e6, const std::string& e4p,
                 const std::string& e6p) {
  const auto one = [](const char* name, const char* type, const std::string& elements) {
    std::string s = std::string("  set ") + name + " {\n    type " + type + "\n    size 4096\n";
    if (!elements.empty()) s += "    elements = { " + elements + " }\n";
    return s + "  }\n";
  };
  return "flush ruleset\ntable inet compass_egress {\n" + one("allow4", "ipv4_addr", e4) +
         one("allow6", "ipv6_addr", e6) + one("allow4p", "ipv4_addr . inet_service", e4p) +
         one("allow6p", "ipv6_addr . inet_service", e6p);
}

TEST(Addressing, SlotsAreDisjointSubnetsOfThePools) {
  const Addressing a0 = addressingForSlot(0);
  EXPECT_EQ(a0.net4, "10.231.0.0/30");
  EXPECT_EQ(a0.host4, "10.231.0.1");
  EXPECT_EQ(a0.sandbox4, "10.231.0.2");
  EXPECT_EQ(a0.net6, "fd5a:7c3e:91b4::/64");
  EXPECT_EQ(a0.host6, "fd5a:7c3e:91b4::1");
  EXPECT_EQ(a0.sandbox6, "fd5a:7c3e:91b4::2");
  const Addressing a300 = addressingForSlot(300);
  EXPECT_EQ(a300.net4, "10.231.4.176/30");
  EXPECT_EQ(a300.host4, "10.231.4.177");
  EXPECT_EQ(a300.net6, "fd5a:7c3e:91b4:12c::/64");
  const Addressing last = addressingForSlot(kSlots - 1);
  EXPECT_EQ(last.sandbox4, "10.231.255.254");
  EXPECT_EQ(last.host6, "fd5a:7c3e:91b4:3fff::1");
  EXPECT_THROW(addressingForSlot(kSlots), std::out_of_range);
}

TEST(Addressing, SlotOfAddressInvertsAddressing) {
  for (unsigned slot : {0u, 1u, 300u, kSlots - 1}) {
    const Addressing a = addressingForSlot(slot);
    for (const auto& text : {a.host4, a.sandbox4, a.host6, a.sandbox6}) {
      EXPECT_EQ(slotOfAddress(make_address(text)), slot) << text;
      EXPECT_TRUE(inPools(make_address(text))) << text;
    }
  }
  EXPECT_EQ(slotOfAddress(make_address("::ffff:10.231.0.6")), 1u);  // re-spelled, same slot
  for (const char* outside : {"10.88.0.1", "10.230.255.255", "10.232.0.0", "198.18.5.2", "fd00::2",
                              "fd5a:7c3e:91b5::1", "fd5a:7c3e:91b4:4000::1"}) {
    EXPECT_EQ(slotOfAddress(make_address(outside)), std::nullopt) << outside;
  }
  EXPECT_FALSE(inPools(make_address("10.88.0.1")));
  EXPECT_FALSE(inPools(make_address("198.18.0.1")));
  EXPECT_TRUE(inPools(make_address("fd5a:7c3e:91b4:ffff::9")));  // beyond the slots: still ours
}

TEST(AllowedPorts, MatchesLikeTheAllowlist) {
  const auto allow = allowOf({"allowed.example", "*.wild.example", "api.example:443",
                              "api.example:8443", "both.example:80", "both.example"});
  EXPECT_EQ(allowedPorts(allow, "allowed.example"), std::vector<uint16_t>{});
  EXPECT_EQ(allowedPorts(allow, "a.b.wild.example"), std::vector<uint16_t>{});
  EXPECT_EQ(allowedPorts(allow, "wild.example"), std::nullopt);  // `*.x` never matches x
  EXPECT_EQ(allowedPorts(allow, "evilwild.example"), std::nullopt);
  EXPECT_EQ(allowedPorts(allow, "api.example"), (std::vector<uint16_t>{443, 8443}));
  EXPECT_EQ(allowedPorts(allow, "both.example"), std::vector<uint16_t>{});  // any port wins
  EXPECT_EQ(allowedPorts(allow, "allowed.example.evil.com"), std::nullopt);
  EXPECT_EQ(allowedPorts(allow, "evil.com.allowed.example"), std::nullopt);
  EXPECT_EQ(allowedPorts(policy::Allowlist{}, "allowed.example"), std::nullopt);
}

TEST(ElementsFor, OnePerAddressOrPerAddressAndPort) {
  const std::vector<asio::ip::address> addrs = {make_address("198.51.100.7"),
                                                make_address("2001:db8::7")};
  const auto any = elementsFor("a.example", {}, addrs);
  ASSERT_EQ(any.size(), 2u);
  EXPECT_FALSE(any[0].port);
  EXPECT_EQ(any[1].address, addrs[1]);
  const auto ported = elementsFor("a.example", {80, 443}, addrs);
  ASSERT_EQ(ported.size(), 4u);
  EXPECT_EQ(ported[1].port, 443);
  EXPECT_EQ(ported[3].address, addrs[1]);
  EXPECT_EQ(ported[3].name, "a.example");
}

TEST(SandboxRuleset, EmptyPolicyIsPureDefaultDeny) {
  EXPECT_EQ(sandboxRuleset(addressingForSlot(0), {}), sets("", "", "", "") + kChains);
}

TEST(SandboxRuleset, OneName) {
  const auto e = elementsFor("allowed.example", {}, {make_address("198.51.100.7")});
  EXPECT_EQ(sandboxRuleset(addressingForSlot(0), e),
            sets("198.51.100.7 comment \"allowed.example\"", "", "", "") + kChains);
}

TEST(SandboxRuleset, HostPortRuleFillsThePortSets) {
  const auto allow = allowOf({"api.example:443"});
  const auto e = elementsFor("api.example", *allowedPorts(allow, "api.example"),
                             {make_address("198.51.100.8"), make_address("2001:db8::8")});
  EXPECT_EQ(sandboxRuleset(addressingForSlot(0), e),
            sets("", "", "198.51.100.8 . 443 comment \"api.example\"",
                 "2001:db8::8 . 443 comment \"api.example\"") +
                kChains);
}

TEST(SandboxRuleset, WildcardSubdomainAnsweredOnDemand) {
  const auto allow = allowOf({"*.cdn.example"});
  const auto e = elementsFor("img.cdn.example", *allowedPorts(allow, "img.cdn.example"),
                             {make_address("198.51.100.9"), make_address("198.51.100.10")});
  EXPECT_EQ(sandboxRuleset(addressingForSlot(0), e),
            sets("198.51.100.9 comment \"img.cdn.example\", 198.51.100.10 comment "
                 "\"img.cdn.example\"",
                 "", "", "") +
                kChains);
}

TEST(SandboxRuleset, Ipv6OnlyName) {
  const auto e = elementsFor("v6.example", {}, {make_address("2001:db8:5::2")});
  EXPECT_EQ(sandboxRuleset(addressingForSlot(0), e),
            sets("", "2001:db8:5::2 comment \"v6.example\"", "", "") + kChains);
}

TEST(SandboxRuleset, ResolverRulesFollowTheSlot) {
  const std::string r = sandboxRuleset(addressingForSlot(300), {});
  EXPECT_NE(r.find("ip daddr 10.231.4.177 meta l4proto { tcp, udp } th dport 53 accept"),
            std::string::npos);
  EXPECT_NE(r.find("ip6 daddr fd5a:7c3e:91b4:12c::1 meta l4proto { tcp, udp } th dport 53"),
            std::string::npos);
  EXPECT_TRUE(r.starts_with("flush ruleset\n"));  // atomic: replaces whatever was there
}

TEST(SandboxRuleset, CommentCannotBreakOutOfItsString) {
  const std::vector<AllowElement> e = {
      {make_address("198.51.100.7"), std::nullopt, "a\"; flush ruleset; \"b.example"}};
  EXPECT_EQ(addElementsBatch(e),
            "add element inet compass_egress allow4 { 198.51.100.7 comment "
            "\"aflushrulesetb.example\" }\n");
}

TEST(AddElementsBatch, OneLinePerElementIntoTheRightSet) {
  std::vector<AllowElement> e =
      elementsFor("a.example", {}, {make_address("198.51.100.7"), make_address("2001:db8::7")});
  const auto p =
      elementsFor("b.example", {443}, {make_address("198.51.100.8"), make_address("2001:db8::8")});
  e.insert(e.end(), p.begin(), p.end());
  EXPECT_EQ(
      addElementsBatch(e),
      "add element inet compass_egress allow4 { 198.51.100.7 comment \"a.example\" }\n"
      "add element inet compass_egress allow6 { 2001:db8::7 comment \"a.example\" }\n"
      "add element inet compass_egress allow4p { 198.51.100.8 . 443 comment \"b.example\" }\n"
      "add element inet compass_egress allow6p { 2001:db8::8 . 443 comment \"b.example\" }\n");
  EXPECT_EQ(addElementsBatch({}), "");
}

TEST(HostNatRuleset, Golden) {
  EXPECT_EQ(hostTableName("a0123456789"), "compass_nat_a0123456789");
  EXPECT_EQ(hostNatRuleset("a0123456789", "cva0123456789", addressingForSlot(1)),
            R"(table inet compass_nat_a0123456789 {
  chain postrouting {
    type nat hook postrouting priority srcnat; policy accept;
    ip saddr 10.231.0.4/30 oifname != "cva0123456789" masquerade
    ip6 saddr fd5a:7c3e:91b4:1::/64 oifname != "cva0123456789" masquerade
  }
  chain forward {
    type filter hook forward priority filter; policy accept;
    iifname "cva0123456789" ip daddr 10.231.0.0/16 drop
    iifname "cva0123456789" ip6 daddr fd5a:7c3e:91b4::/48 drop
    iifname "cva0123456789" ip saddr 10.231.0.4/30 accept
    iifname "cva0123456789" ip6 saddr fd5a:7c3e:91b4:1::/64 accept
    iifname "cva0123456789" drop
    oifname "cva0123456789" ct state established,related accept
    oifname "cva0123456789" drop
  }
  chain input {
    type filter hook input priority filter; policy accept;
    iifname "cva0123456789" ct state established,related accept
    iifname "cva0123456789" ip daddr 10.231.0.5 meta l4proto { tcp, udp } th dport 53 socket wildcard 0 accept
    iifname "cva0123456789" ip6 daddr fd5a:7c3e:91b4:1::1 meta l4proto { tcp, udp } th dport 53 socket wildcard 0 accept
    iifname "cva0123456789" icmpv6 type { nd-neighbor-solicit, nd-neighbor-advert } accept
    iifname "cva0123456789" drop
    iifname != "cva0123456789" ip daddr 10.231.0.5 drop
    iifname != "cva0123456789" ip6 daddr fd5a:7c3e:91b4:1::1 drop
  }
}
)");
}

TEST(AddElementsBatch, DeleteUndoesAnAddByKeyWithoutComments) {
  const std::vector<AllowElement> e = {
      {asio::ip::make_address("198.51.100.7"), 80, "a.example"},
      {asio::ip::make_address("2001:db8::7"), std::nullopt, "a.example"}};
  EXPECT_EQ(deleteElementsBatch(e, "compass_nat_a0123456789"),
            "delete element inet compass_nat_a0123456789 allow4p { 198.51.100.7 . 80 }\n"
            "delete element inet compass_nat_a0123456789 allow6 { 2001:db8::7 }\n");
  EXPECT_EQ(deleteElementsBatch({}, "t"), "");
}

TEST(HostNatRuleset, MirrorLetsTheSandboxOutOnlyToItsAllowSets) {
  // A microVM guest's host table: the same table with the four allow sets, and forward opens
  // only what they hold; everything else of the plain table is unchanged.
  const std::string plain = hostNatRuleset("a0123456789", "cva0123456789", addressingForSlot(1));
  const std::string mirror =
      hostNatRuleset("a0123456789", "cva0123456789", addressingForSlot(1), /*mirror=*/true);
  for (const char* set : {"allow4", "allow6", "allow4p", "allow6p"}) {
    EXPECT_NE(mirror.find(std::string("  set ") + set + " {\n"), std::string::npos) << set;
  }
  EXPECT_EQ(mirror.find("iifname \"cva0123456789\" ip saddr 10.231.0.4/30 accept"),
            std::string::npos);
  EXPECT_EQ(mirror.find("ip6 saddr fd5a:7c3e:91b4:1::/64 accept"), std::string::npos);
  for (const char* rule :
       {"iifname \"cva0123456789\" ip saddr 10.231.0.4/30 ip daddr @allow4 accept",
        "iifname \"cva0123456789\" ip6 saddr fd5a:7c3e:91b4:1::/64 ip6 daddr @allow6 accept",
        "iifname \"cva0123456789\" ip saddr 10.231.0.4/30 meta l4proto { tcp, udp } ip daddr . "
        "th dport @allow4p accept",
        "iifname \"cva0123456789\" ip6 saddr fd5a:7c3e:91b4:1::/64 meta l4proto { tcp, udp } ip6 "
        "daddr . th dport @allow6p accept"}) {
    EXPECT_NE(mirror.find(rule), std::string::npos) << rule;
  }
  // The pools and the drop still come first and last; input is the plain table's.
  EXPECT_LT(mirror.find("ip daddr 10.231.0.0/16 drop"), mirror.find("@allow4 accept"));
  EXPECT_LT(mirror.find("@allow6p accept"), mirror.find("iifname \"cva0123456789\" drop"));
  EXPECT_EQ(mirror.substr(mirror.find("  chain input {")),
            plain.substr(plain.find("  chain input {")));
  // Elements go into the host table by name.
  const AllowElement e{asio::ip::make_address("198.51.100.7"), 80, "a.example"};
  EXPECT_EQ(addElementsBatch({e}, hostTableName("a0123456789")),
            "add element inet compass_nat_a0123456789 allow4p { 198.51.100.7 . 80 comment "
            "\"a.example\" }\n");
}

}  // namespace
}  // namespace runner::firewall
