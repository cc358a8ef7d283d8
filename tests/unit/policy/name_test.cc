#include "policy/name.h"

#include <gtest/gtest.h>

#include <string>

namespace policy {
namespace {

std::string refusal(std::string_view raw) {
  std::string reason;
  const auto name = normalizeName(raw, &reason);
  EXPECT_FALSE(name.has_value()) << "accepted: " << *name;
  return reason;
}

TEST(NormalizeName, LowerCasesAndDropsOneTrailingDot) {
  EXPECT_EQ(normalizeName("Api.Example.COM."), "api.example.com");
  EXPECT_EQ(normalizeName("api.example.com"), "api.example.com");
  EXPECT_EQ(normalizeName("XN--BCHER-KVA.example"), "xn--bcher-kva.example");
}

TEST(NormalizeName, AcceptsSingleLabelsAndDigitsInsideLabels) {
  EXPECT_EQ(normalizeName("localhost"), "localhost");  // refused later, by address checks
  EXPECT_EQ(normalizeName("code-reviewer"), "code-reviewer");
  EXPECT_EQ(normalizeName("3com.example"), "3com.example");
  EXPECT_EQ(normalizeName("a1.b2.c3d"), "a1.b2.c3d");
}

TEST(NormalizeName, RefusesEmptyAndEmptyLabels) {
  EXPECT_EQ(refusal(""), "empty name");
  EXPECT_EQ(refusal("."), "empty name");
  EXPECT_EQ(refusal("a.com.."), "empty label");
  EXPECT_EQ(refusal(".a.com"), "empty label");
  EXPECT_EQ(refusal("a..com"), "empty label");
}

TEST(NormalizeName, RefusesBadCharacters) {
  EXPECT_NE(refusal("under_score.example"), "");
  EXPECT_NE(refusal("sp ace.example"), "");
  EXPECT_NE(refusal("a*b.example"), "");
  EXPECT_NE(refusal("*.example.com"), "");
  EXPECT_NE(refusal("host:443"), "");
  EXPECT_NE(refusal(std::string_view("a\0b.example", 11)), "");
  EXPECT_NE(refusal("a\tb.example"), "");
  EXPECT_NE(refusal("a/b"), "");
}

TEST(NormalizeName, RefusesNonAsciiBytes) {
  EXPECT_EQ(refusal("b\xc3\xbc"
                    "cher.example"),
            "non-ASCII byte (IDN must be punycode)");
  EXPECT_EQ(refusal("\xff"), "non-ASCII byte (IDN must be punycode)");
  // Fullwidth dot (U+FF0E) must not act as a separator.
  EXPECT_EQ(refusal("evil\xef\xbc\x8e"
                    "example"),
            "non-ASCII byte (IDN must be punycode)");
}

TEST(NormalizeName, RefusesHyphenAtLabelEdges) {
  EXPECT_EQ(refusal("-a.example"), "label starts or ends with '-'");
  EXPECT_EQ(refusal("a-.example"), "label starts or ends with '-'");
  EXPECT_EQ(refusal("a.-"), "label starts or ends with '-'");
}

TEST(NormalizeName, EnforcesLengthLimits) {
  const std::string label63(63, 'a');
  EXPECT_EQ(normalizeName(label63 + ".example"), label63 + ".example");
  EXPECT_EQ(refusal(std::string(64, 'a') + ".example"), "label longer than 63 bytes");

  // 253 bytes exactly: three labels of 63 and one of 61, joined by three dots.
  const std::string name253 = label63 + "." + label63 + "." + label63 + "." + std::string(61, 'b');
  ASSERT_EQ(name253.size(), 253u);
  EXPECT_EQ(normalizeName(name253), name253);
  EXPECT_EQ(normalizeName(name253 + "."), name253);  // the trailing dot does not count
  EXPECT_EQ(refusal(name253 + "a"), "name longer than 253 bytes");
  EXPECT_EQ(refusal(std::string(100000, 'a')), "name longer than 253 bytes");
}

TEST(NormalizeName, RefusesIpLiteralsInEverySpelling) {
  for (const char* literal : {"127.0.0.1", "127.0.0.1.", "127.1", "2130706433", "0x7f000001",
                              "0X7F.0.0.1", "0177.0.0.1", "::1", "[::1]", "::ffff:127.0.0.1",
                              "fe80::1%eth0", "1.2.3.256", "example.123", "example.0x1f"}) {
    EXPECT_EQ(refusal(literal), "ip literal is not a name") << literal;
  }
}

TEST(NormalizeName, ReasonIsOptional) { EXPECT_FALSE(normalizeName("a..b", nullptr)); }

TEST(IsIpLiteral, RecognizesIpv4Spellings) {
  EXPECT_TRUE(isIpLiteral("127.0.0.1"));
  EXPECT_TRUE(isIpLiteral("127.0.0.1."));
  EXPECT_TRUE(isIpLiteral("127.1"));
  EXPECT_TRUE(isIpLiteral("2130706433"));
  EXPECT_TRUE(isIpLiteral("0x7f000001"));
  EXPECT_TRUE(isIpLiteral("0x7f.1"));
  EXPECT_TRUE(isIpLiteral("0177.0.0.1"));
  EXPECT_TRUE(isIpLiteral("0"));
  EXPECT_TRUE(isIpLiteral("169.254.169.254"));
}

TEST(IsIpLiteral, RecognizesIpv6Spellings) {
  EXPECT_TRUE(isIpLiteral("::1"));
  EXPECT_TRUE(isIpLiteral("[::1]"));
  EXPECT_TRUE(isIpLiteral("::"));
  EXPECT_TRUE(isIpLiteral("::ffff:127.0.0.1"));
  EXPECT_TRUE(isIpLiteral("::ffff:7f00:1"));
  EXPECT_TRUE(isIpLiteral("::127.0.0.1"));  // IPv4-compatible
  EXPECT_TRUE(isIpLiteral("fe80::1%eth0"));
  EXPECT_TRUE(isIpLiteral("[fe80::1%25eth0]"));
  EXPECT_TRUE(isIpLiteral("2001:DB8::1"));
}

TEST(IsIpLiteral, TreatsNumericLastLabelAsLiteral) {
  EXPECT_TRUE(isIpLiteral("a.b.300"));
  EXPECT_TRUE(isIpLiteral("1.2.3.4.5"));
  EXPECT_TRUE(isIpLiteral("example.08"));
  EXPECT_TRUE(isIpLiteral("example.0xff."));
}

TEST(IsIpLiteral, NamesAreNotLiterals) {
  EXPECT_FALSE(isIpLiteral("localhost"));
  EXPECT_FALSE(isIpLiteral("example.com"));
  EXPECT_FALSE(isIpLiteral("1.2.3.com"));
  EXPECT_FALSE(isIpLiteral("123.example"));
  EXPECT_FALSE(isIpLiteral("0x"));
  EXPECT_FALSE(isIpLiteral("example.0xg"));
  EXPECT_FALSE(isIpLiteral(""));
  EXPECT_FALSE(isIpLiteral("."));
  EXPECT_FALSE(isIpLiteral("[example.com]"));
  EXPECT_FALSE(isIpLiteral(std::string(10000, '1') + "x"));
}

std::string authorityRefusal(std::string_view text) {
  std::string reason;
  const auto authority = parseAuthority(text, &reason);
  EXPECT_FALSE(authority.has_value()) << "accepted: " << text;
  EXPECT_FALSE(reason.empty());
  return reason;
}

TEST(ParseAuthority, SplitsNameAndPort) {
  const auto a = parseAuthority("Api.Example.com:443");
  ASSERT_TRUE(a);
  EXPECT_EQ(a->host, "Api.Example.com");  // not normalized here
  EXPECT_EQ(a->port, 443);
  const auto b = parseAuthority("x:1");
  ASSERT_TRUE(b);
  EXPECT_EQ(b->port, 1);
  const auto c = parseAuthority("x:65535");
  ASSERT_TRUE(c);
  EXPECT_EQ(c->port, 65535);
}

TEST(ParseAuthority, RemovesBracketsFromIpv6) {
  const auto a = parseAuthority("[::1]:8080");
  ASSERT_TRUE(a);
  EXPECT_EQ(a->host, "::1");
  EXPECT_EQ(a->port, 8080);
  const auto b = parseAuthority("[::ffff:127.0.0.1]:80");
  ASSERT_TRUE(b);
  EXPECT_EQ(b->host, "::ffff:127.0.0.1");
  const auto c = parseAuthority("[fe80::1%eth0]:80");
  ASSERT_TRUE(c);
  EXPECT_EQ(c->host, "fe80::1%eth0");
}

TEST(ParseAuthority, KeepsIpv4LiteralsForLaterRefusal) {
  const auto a = parseAuthority("127.0.0.1:22");
  ASSERT_TRUE(a);
  EXPECT_EQ(a->host, "127.0.0.1");
  EXPECT_TRUE(isIpLiteral(a->host));
}

TEST(ParseAuthority, RefusesMissingOrEmptyParts) {
  EXPECT_EQ(authorityRefusal("example.com"), "missing port");
  EXPECT_EQ(authorityRefusal("example.com:"), "missing port");
  EXPECT_EQ(authorityRefusal(":443"), "empty host");
  EXPECT_EQ(authorityRefusal("[]:443"), "empty host");
  EXPECT_EQ(authorityRefusal("[::1]"), "missing port");
  EXPECT_EQ(authorityRefusal("[::1]:"), "missing port");
  EXPECT_EQ(authorityRefusal(""), "missing port");
}

TEST(ParseAuthority, RefusesBadPorts) {
  EXPECT_EQ(authorityRefusal("x:0"), "port out of range");
  EXPECT_EQ(authorityRefusal("x:65536"), "port out of range");
  EXPECT_EQ(authorityRefusal("x:70000"), "port out of range");
  EXPECT_EQ(authorityRefusal("x:99999999999999999999"), "port out of range");
  EXPECT_EQ(authorityRefusal("x:+443"), "port is not a decimal number");
  EXPECT_EQ(authorityRefusal("x:-1"), "port is not a decimal number");
  EXPECT_EQ(authorityRefusal("x:443x"), "port is not a decimal number");
  EXPECT_EQ(authorityRefusal("x: 443"), "port is not a decimal number");
  EXPECT_EQ(authorityRefusal("x:0x1bb"), "port is not a decimal number");
  EXPECT_EQ(authorityRefusal("x:https"), "port is not a decimal number");
  // Decision: leading zeros are refused, so every port has exactly one spelling.
  EXPECT_EQ(authorityRefusal("x:080"), "port has leading zeros");
  EXPECT_EQ(authorityRefusal("x:00443"), "port has leading zeros");
}

TEST(ParseAuthority, RefusesBracketMistakes) {
  EXPECT_EQ(authorityRefusal("::1:80"), "IPv6 address must be in brackets");
  EXPECT_EQ(authorityRefusal("fe80::1:443"), "IPv6 address must be in brackets");
  EXPECT_EQ(authorityRefusal("[::1:80"), "'[' without ']'");
  EXPECT_EQ(authorityRefusal("::1]:80"), "IPv6 address must be in brackets");
  EXPECT_EQ(authorityRefusal("a]:80"), "misplaced bracket");
  EXPECT_EQ(authorityRefusal("[::1]x:80"), "expected ':' after ']'");
  EXPECT_EQ(authorityRefusal("[::1]]:80"), "expected ':' after ']'");
  EXPECT_EQ(authorityRefusal("[example.com]:443"), "bracketed host is not an IPv6 address");
  EXPECT_EQ(authorityRefusal("[127.0.0.1]:443"), "bracketed host is not an IPv6 address");
  EXPECT_EQ(authorityRefusal("[[::1]]:443"), "expected ':' after ']'");
  EXPECT_EQ(authorityRefusal("[[::1]:443"), "bracketed host is not an IPv6 address");
}

TEST(ParseAuthority, LeavesNameValidationToNormalizeName) {
  // parseAuthority only splits; the host is judged by normalizeName() afterwards.
  const auto a = parseAuthority("bad_name:80");
  ASSERT_TRUE(a);
  EXPECT_FALSE(normalizeName(a->host));
}

}  // namespace
}  // namespace policy
