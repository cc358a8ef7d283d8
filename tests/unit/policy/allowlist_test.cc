#include "policy/allowlist.h"

#include <gtest/gtest.h>

#include <string>

namespace policy {
namespace {

std::string refusal(std::string_view entry) {
  try {
    const AllowRule rule = parseAllowRule(entry);
    ADD_FAILURE() << "accepted \"" << entry << "\" as " << rule.text();
    return "";
  } catch (const AllowRuleError& e) {
    return e.what();
  }
}

Allowlist listOf(std::initializer_list<const char*> entries) {
  Allowlist list;
  for (const char* entry : entries) list.add(parseAllowRule(entry));
  return list;
}

TEST(ParseAllowRule, ParsesTheFourForms) {
  const AllowRule exact = parseAllowRule("api.github.com");
  EXPECT_FALSE(exact.wildcard);
  EXPECT_EQ(exact.name, "api.github.com");
  EXPECT_FALSE(exact.port);

  const AllowRule wildcard = parseAllowRule("*.githubusercontent.com");
  EXPECT_TRUE(wildcard.wildcard);
  EXPECT_EQ(wildcard.name, "githubusercontent.com");
  EXPECT_FALSE(wildcard.port);

  const AllowRule with_port = parseAllowRule("api.github.com:443");
  EXPECT_FALSE(with_port.wildcard);
  EXPECT_EQ(with_port.port, 443);

  const AllowRule both = parseAllowRule("*.pypi.org:8443");
  EXPECT_TRUE(both.wildcard);
  EXPECT_EQ(both.name, "pypi.org");
  EXPECT_EQ(both.port, 8443);
}

TEST(ParseAllowRule, NormalizesAndPrintsCanonicalText) {
  EXPECT_EQ(parseAllowRule("*.PyPI.org.:443").text(), "*.pypi.org:443");
  EXPECT_EQ(parseAllowRule("API.GitHub.com.").text(), "api.github.com");
  EXPECT_EQ(parseAllowRule("*.com").text(), "*.com");          // TLD wildcard: operator's choice
  EXPECT_EQ(parseAllowRule("localhost").text(), "localhost");  // address checks refuse later
}

TEST(ParseAllowRule, RefusesWildcardMisuse) {
  EXPECT_EQ(refusal("*"), "'*' alone would allow every name");
  EXPECT_EQ(refusal("*:443"), "'*' alone would allow every name");
  EXPECT_EQ(refusal("*."), "empty name");
  EXPECT_EQ(refusal("*.:443"), "empty name");
  EXPECT_EQ(refusal("a.*.com"), "'*' is allowed only as a leading \"*.\" label");
  EXPECT_EQ(refusal("*.*.com"), "'*' is allowed only as a leading \"*.\" label");
  EXPECT_EQ(refusal("*pypi.org"), "'*' is allowed only as a leading \"*.\" label");
  EXPECT_EQ(refusal("**.pypi.org"), "'*' is allowed only as a leading \"*.\" label");
  EXPECT_EQ(refusal("pypi.*"), "'*' is allowed only as a leading \"*.\" label");
  EXPECT_EQ(refusal("*.."), "empty name");
}

TEST(ParseAllowRule, RefusesIpLiteralsAndCidrs) {
  const std::string ip = "IP literal not allowed: the allowlist holds names only";
  const std::string cidr = "CIDR not allowed: the allowlist holds names only";
  for (const char* entry :
       {"127.0.0.1", "127.0.0.1:443", "127.1", "2130706433", "0x7f000001", "0177.0.0.1", "::1",
        "[::1]", "[::1]:443", "::ffff:127.0.0.1", "fe80::1%eth0", "*.1.2.3.4", "*.127.0.0.1:80",
        "169.254.169.254.", "example.123"}) {
    EXPECT_EQ(refusal(entry), ip) << entry;
  }
  EXPECT_EQ(refusal("10.0.0.0/8"), cidr);
  EXPECT_EQ(refusal("2001:db8::/32"), cidr);
  EXPECT_EQ(refusal("example.com/24"), cidr);
}

TEST(ParseAllowRule, RefusesBadNamesAndPorts) {
  EXPECT_EQ(refusal(""), "empty entry");
  EXPECT_EQ(refusal(":443"), "empty name");
  EXPECT_EQ(refusal("a..com"), "empty label");
  EXPECT_EQ(refusal("a.com.."), "empty label");
  EXPECT_EQ(refusal("bad_name.com"), "invalid character (only letters, digits, '-' and '.')");
  EXPECT_EQ(refusal("b\xc3\xbc"
                    "cher.de"),
            "non-ASCII byte (IDN must be punycode)");
  EXPECT_EQ(refusal(std::string(64, 'a') + ".com"), "label longer than 63 bytes");
  EXPECT_EQ(refusal("a.com:"), "empty port");
  EXPECT_EQ(refusal("a.com:0"), "port out of range (1..65535)");
  EXPECT_EQ(refusal("a.com:70000"), "port out of range (1..65535)");
  EXPECT_EQ(refusal("pypi.org/"),
            "a path is not an allowlist entry: give the host name only, "
            "e.g. \"pypi.org\" or \"pypi.org:443\"");
  EXPECT_EQ(refusal("a.com:-1"), "port is not a decimal number");
  EXPECT_EQ(refusal("a.com:+443"), "port is not a decimal number");
  EXPECT_EQ(refusal("a.com:443x"), "port is not a decimal number");
  // The node's name is never an egress rule, in any spelling; a wildcard above it is allowed.
  for (const char* mesh : {"mesh.sam.alt", "MESH.sam.alt.", "mesh.sam.alt:80"}) {
    EXPECT_NE(refusal(mesh).find("is the node's name"), std::string::npos) << mesh;
  }
  EXPECT_NO_THROW((void)parseAllowRule("*.sam.alt"));
  // Two colons after a name are a bad port, not an IPv6 literal (the reason said so before).
  EXPECT_EQ(refusal("x.test:80:80"), "port is not a decimal number");
  EXPECT_EQ(refusal("api.github.com:443:"), "port is not a decimal number");
  EXPECT_EQ(refusal("2001:db8::1"), "IP literal not allowed: the allowlist holds names only");
  EXPECT_EQ(refusal("::ffff:1.2.3.4:443"),
            "IP literal not allowed: the allowlist holds names only");
  EXPECT_EQ(refusal("a.com:080"), "port has leading zeros");
  EXPECT_EQ(refusal(" a.com"), "invalid character (only letters, digits, '-' and '.')");
}

TEST(Allowlist, EmptyDeniesEverything) {
  const Allowlist list;
  EXPECT_TRUE(list.empty());
  EXPECT_FALSE(list.allows("example.com", 443));
}

TEST(Allowlist, ExactRuleMatchesOnlyThatName) {
  const Allowlist list = listOf({"api.github.com"});
  EXPECT_TRUE(list.allows("api.github.com", 443));
  EXPECT_TRUE(list.allows("api.github.com", 80));
  EXPECT_FALSE(list.allows("github.com", 443));
  EXPECT_FALSE(list.allows("x.api.github.com", 443));
  EXPECT_FALSE(list.allows("api.github.com.evil", 443));
  EXPECT_FALSE(list.allows("evilapi.github.com", 443));
}

TEST(Allowlist, WildcardMatchesSubdomainsOnly) {
  const Allowlist list = listOf({"*.pypi.org"});
  EXPECT_TRUE(list.allows("files.pypi.org", 443));
  EXPECT_TRUE(list.allows("a.b.pypi.org", 443));
  EXPECT_FALSE(list.allows("pypi.org", 443));
  EXPECT_FALSE(list.allows("evilpypi.org", 443));
  EXPECT_FALSE(list.allows("pypi.org.evil.com", 443));
  EXPECT_FALSE(list.allows("org", 443));
}

TEST(Allowlist, PortRestrictsTheRule) {
  const Allowlist list = listOf({"api.github.com:443", "*.pypi.org:443"});
  EXPECT_TRUE(list.allows("api.github.com", 443));
  EXPECT_FALSE(list.allows("api.github.com", 80));
  EXPECT_TRUE(list.allows("files.pypi.org", 443));
  EXPECT_FALSE(list.allows("files.pypi.org", 22));
}

TEST(Allowlist, NameMustAlreadyBeNormalized) {
  const Allowlist list = listOf({"api.github.com", "*.pypi.org"});
  // Unnormalized spellings fail closed rather than being guessed at.
  EXPECT_FALSE(list.allows("API.github.com", 443));
  EXPECT_FALSE(list.allows("api.github.com.", 443));
  EXPECT_FALSE(list.allows("files.pypi.org.", 443));
  EXPECT_FALSE(list.allows("", 443));
  EXPECT_FALSE(list.allows(std::string_view("api.github.com\0x", 16), 443));
}

TEST(Allowlist, IpLiteralsNeverMatch) {
  Allowlist list = listOf({"*.com"});
  // A rule cannot be made to name an address, and no address is ever matched.
  EXPECT_FALSE(list.allows("127.0.0.1", 443));
  EXPECT_FALSE(list.allows("1.2.3.4", 443));
  EXPECT_FALSE(list.allows("::1", 443));
  EXPECT_FALSE(list.allows("a.com.123", 443));
  EXPECT_TRUE(list.allows("a.com", 443));
}

TEST(Allowlist, DuplicatesAreIgnored) {
  Allowlist list;
  list.add(parseAllowRule("api.github.com"));
  list.add(parseAllowRule("API.GITHUB.COM."));
  list.add(parseAllowRule("api.github.com:443"));
  list.add(parseAllowRule("*.api.github.com"));
  list.add(parseAllowRule("api.github.com:443"));
  ASSERT_EQ(list.rules().size(), 3u);
  EXPECT_EQ(list.rules()[0].text(), "api.github.com");
  EXPECT_EQ(list.rules()[1].text(), "api.github.com:443");
  EXPECT_EQ(list.rules()[2].text(), "*.api.github.com");
}

TEST(Allowlist, TldWildcardCoversTheTld) {
  const Allowlist list = listOf({"*.com"});
  EXPECT_TRUE(list.allows("example.com", 443));
  EXPECT_FALSE(list.allows("com", 443));
  EXPECT_FALSE(list.allows("example.org", 443));
}

}  // namespace
}  // namespace policy
