#include "policy/bundle.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace policy {
namespace {

using ::testing::HasSubstr;

constexpr const char* kSeedBundle = R"(version: v1
agent:
  id: researcher-1.prod.acme.example
  external_id: system:serviceaccount:agents:researcher
egress:
  allow:
    - api.github.com
    - "*.githubusercontent.com"
serves:
  name: code-reviewer
  port: 8080
)";

// Returns the refused bundle's error; fails the test if the bundle was accepted.
BundleError refusal(std::string_view yaml) {
  try {
    parseBundle(yaml);
  } catch (const BundleError& e) {
    return e;
  }
  ADD_FAILURE() << "accepted:\n" << yaml;
  return BundleError("<accepted>", "");
}

void expectRefused(std::string_view yaml, const std::string& field, const std::string& reason) {
  const BundleError e = refusal(yaml);
  EXPECT_EQ(e.field(), field) << e.what() << "\n--- for ---\n" << yaml;
  EXPECT_THAT(e.what(), HasSubstr(reason)) << yaml;
}

std::string minimal(std::string_view extra = "") {
  return "version: v1\nagent:\n  id: a.example\n" + std::string(extra);
}

TEST(ParseBundle, ParsesTheSeedExample) {
  const Bundle b = parseBundle(kSeedBundle);
  EXPECT_EQ(b.agent_id, "researcher-1.prod.acme.example");
  EXPECT_EQ(b.external_id, "system:serviceaccount:agents:researcher");
  ASSERT_EQ(b.egress_allow.size(), 2u);
  EXPECT_EQ(b.egress_allow[0].text(), "api.github.com");
  EXPECT_EQ(b.egress_allow[1].text(), "*.githubusercontent.com");
  ASSERT_TRUE(b.serves);
  EXPECT_EQ(b.serves->name, "code-reviewer");
  EXPECT_EQ(b.serves->port, 8080);
}

TEST(ParseBundle, MinimalBundleIsDefaultDeny) {
  const Bundle b = parseBundle(minimal());
  EXPECT_EQ(b.agent_id, "a.example");
  EXPECT_EQ(b.external_id, "");
  EXPECT_TRUE(b.egress_allow.empty());
  EXPECT_FALSE(b.serves);
}

TEST(ParseBundle, AcceptsFlowStyleQuotesCommentsAndNormalizesNames) {
  const Bundle b = parseBundle(
      "# written by the platform\n"
      "{version: \"v1\", agent: {id: 'Agent-1.Example.'}, egress: {allow: [A.com, "
      "\"*.B.com:443\"]}, serves: {name: Svc, port: 65535}}\n");
  EXPECT_EQ(b.agent_id, "agent-1.example");
  ASSERT_EQ(b.egress_allow.size(), 2u);
  EXPECT_EQ(b.egress_allow[1].text(), "*.b.com:443");
  EXPECT_EQ(b.serves->name, "svc");
  EXPECT_EQ(b.serves->port, 65535);
  EXPECT_TRUE(parseBundle(minimal("egress:\n  allow: []\n")).egress_allow.empty());
  EXPECT_TRUE(parseBundle(minimal("egress: {}\n")).egress_allow.empty());
  EXPECT_EQ(parseBundle("---\n" + minimal() + "...\n").agent_id, "a.example");
}

TEST(ParseBundle, RefusesEmptyAndNonMappingDocuments) {
  expectRefused("", "", "empty document");
  expectRefused("# only a comment\n", "", "empty document");
  expectRefused("---\n", "", "empty document");
  expectRefused("~\n", "", "empty document");
  expectRefused("v1\n", "", "expected a mapping");
  expectRefused("- version: v1\n", "", "expected a mapping");
}

TEST(ParseBundle, RefusesWrongOrMissingVersion) {
  expectRefused("agent:\n  id: a.example\n", "version", "required");
  expectRefused("version: v2\nagent:\n  id: a.example\n", "version", "unsupported version \"v2\"");
  // Under another version, unknown keys are not the error to report.
  expectRefused("version: v2\nagent:\n  id: a.example\nnew_thing: 1\n", "version",
                "unsupported version");
  expectRefused("version: V1\nagent:\n  id: a.example\n", "version", "unsupported version");
  expectRefused("version: 1\nagent:\n  id: a.example\n", "version", "unsupported version");
  expectRefused("version: [v1]\nagent:\n  id: a.example\n", "version", "a sequence");
  expectRefused("version:\nagent:\n  id: a.example\n", "version", "null");
}

TEST(ParseBundle, RefusesUnknownKeysAtEveryLevel) {
  expectRefused(minimal("egres:\n  allow: [a.com]\n"), "egres", "unknown key");
  expectRefused(minimal("  role: admin\n"), "agent.role", "unknown key");
  expectRefused(minimal("egress:\n  allow: []\n  deny: []\n"), "egress.deny", "unknown key");
  expectRefused(minimal("serves:\n  name: s\n  port: 1\n  host: 0.0.0.0\n"), "serves.host",
                "unknown key");
  expectRefused(minimal("\"<<\": {}\n"), "\"<<\"", "unknown key");
  expectRefused(minimal("\"bad\\nkey\": 1\n"), "\"bad?key\"", "unknown key");
}

TEST(ParseBundle, RefusesDuplicateKeys) {
  expectRefused("version: v1\nversion: v1\nagent:\n  id: a.example\n", "version", "duplicate key");
  expectRefused("version: v1\nagent:\n  id: a.example\n  id: b.example\n", "agent.id",
                "duplicate key");
  expectRefused(minimal("egress:\n  allow: [a.com]\n  allow: [b.com]\n"), "egress.allow",
                "duplicate key");
  expectRefused(minimal("serves: {name: a, port: 1, port: 2}\n"), "serves.port", "duplicate key");
  expectRefused(minimal("agent:\n  id: b.example\n"), "agent", "duplicate key");
  expectRefused("version: v1\n\"version\": v1\nagent:\n  id: a.example\n", "version",
                "duplicate key");
}

TEST(ParseBundle, RefusesAnchorsAliasesAndTags) {
  expectRefused("version: v1\nagent: &a\n  id: a.example\nserves: *a\n", "",
                "YAML anchors are not allowed");
  expectRefused("version: &v v1\nagent:\n  id: a.example\n", "", "YAML anchors are not allowed");
  expectRefused("version: v1\nagent:\n  id: *x\n", "", "");
  expectRefused("version: v1\nagent:\n  id: !!str a.example\n", "", "YAML tags are not allowed");
  expectRefused(minimal("serves: {name: a, port: !!int 80}\n"), "", "YAML tags are not allowed");
  expectRefused("!!map\nversion: v1\nagent:\n  id: a.example\n", "", "YAML tags are not allowed");
}

TEST(ParseBundle, RefusesMultipleDocuments) {
  expectRefused(minimal() + "---\n" + minimal(), "", "more than one YAML document");
  expectRefused(minimal() + "---\n", "", "more than one YAML document");
}

TEST(ParseBundle, RefusesWrongTypes) {
  expectRefused("version: v1\nagent: a.example\n", "agent", "expected a mapping");
  expectRefused("version: v1\nagent: []\n", "agent", "expected a mapping");
  expectRefused("version: v1\nagent:\n  id: [a.example]\n", "agent.id", "expected a string");
  expectRefused("version: v1\nagent:\n  id: {a: b}\n", "agent.id", "expected a string");
  expectRefused(minimal("egress: [a.com]\n"), "egress", "expected a mapping");
  expectRefused(minimal("egress:\n"), "egress", "expected a mapping");
  expectRefused(minimal("egress:\n  allow: a.com\n"), "egress.allow", "expected a sequence");
  expectRefused(minimal("egress:\n  allow:\n    - [a.com]\n"), "egress.allow[0]",
                "expected a string");
  expectRefused(minimal("egress:\n  allow:\n    - a.com\n    -\n"), "egress.allow[1]",
                "expected a string, got null");
  expectRefused(minimal("serves: code-reviewer\n"), "serves", "expected a mapping");
  expectRefused(minimal("serves: {name: [a], port: 1}\n"), "serves.name", "expected a string");
  expectRefused(minimal("? [a, b]\n: c\n"), "", "key is a sequence");
}

TEST(ParseBundle, RefusesMissingRequiredFields) {
  expectRefused("version: v1\n", "agent", "required");
  expectRefused("version: v1\nagent: {}\n", "agent.id", "required");
  expectRefused("version: v1\nagent:\n  external_id: x\n", "agent.id", "required");
  expectRefused("version: v1\nagent:\n  id:\n", "agent.id", "got null");
  expectRefused(minimal("serves:\n  port: 8080\n"), "serves.name", "required");
  expectRefused(minimal("serves:\n  name: svc\n"), "serves.port", "required");
}

TEST(ParseBundle, RefusesBadNames) {
  expectRefused("version: v1\nagent:\n  id: bad_name.example\n", "agent.id", "invalid character");
  expectRefused("version: v1\nagent:\n  id: 127.0.0.1\n", "agent.id", "ip literal is not a name");
  expectRefused("version: v1\nagent:\n  id: \"::1\"\n", "agent.id", "ip literal is not a name");
  expectRefused("version: v1\nagent:\n  id: a.example..\n", "agent.id", "empty label");
  expectRefused("version: v1\nagent:\n  id: \"\"\n", "agent.id", "empty name");
  expectRefused(
      "version: v1\nagent:\n  id: b\xc3\xbc"
      "cher.example\n",
      "agent.id", "non-ASCII byte");
  expectRefused("version: v1\nagent:\n  id: " + std::string(64, 'a') + ".example\n", "agent.id",
                "label longer than 63 bytes");
  expectRefused(minimal("serves: {name: \"*.svc\", port: 80}\n"), "serves.name",
                "invalid character");
  expectRefused(minimal("serves: {name: 10.0.0.1, port: 80}\n"), "serves.name",
                "ip literal is not a name");
}

TEST(ParseBundle, RefusesBadAllowEntriesWithTheirIndex) {
  expectRefused(minimal("egress:\n  allow: [a.com, b.com, \"*\"]\n"), "egress.allow[2]",
                "'*' alone");
  expectRefused(minimal("egress:\n  allow: [10.0.0.0/8]\n"), "egress.allow[0]", "CIDR not allowed");
  expectRefused(minimal("egress:\n  allow: [a.com, 169.254.169.254]\n"), "egress.allow[1]",
                "IP literal not allowed");
  expectRefused(minimal("egress:\n  allow: [\"a.*.com\"]\n"), "egress.allow[0]", "'*'");
  expectRefused(minimal("egress:\n  allow: [\"a.com:70000\"]\n"), "egress.allow[0]",
                "port out of range");
  expectRefused(minimal("egress:\n  allow: [\"\"]\n"), "egress.allow[0]", "empty entry");
  std::string many = "egress:\n  allow: [";
  for (size_t i = 0; i <= kMaxAllowEntries; ++i) many += "a,";
  many += "]\n";
  ASSERT_LT(many.size(), kMaxBundleBytes);
  expectRefused(minimal(many), "egress.allow", "more than 4096 entries");
}

TEST(ParseBundle, RefusesBadPorts) {
  for (const char* port : {"0", "-1", "70000", "65536", "8080x", "8080.5", "true", "\"8080\"",
                           "'8080'", "0x1f90", "0o17620", "+8080", "08080", "8_080", "1e3", "~",
                           "[8080]", "99999999999999999999", "\"\""}) {
    const std::string yaml = minimal("serves:\n  name: svc\n  port: " + std::string(port) + "\n");
    const BundleError e = refusal(yaml);
    EXPECT_EQ(e.field(), "serves.port") << port << ": " << e.what();
  }
  EXPECT_EQ(parseBundle(minimal("serves:\n  name: svc\n  port: 1\n")).serves->port, 1);
}

TEST(ParseBundle, ValidatesExternalId) {
  const std::string prefix = "version: v1\nagent:\n  id: a.example\n  external_id: ";
  EXPECT_EQ(parseBundle(prefix + "\"x\"\n").external_id, "x");
  EXPECT_EQ(parseBundle(prefix + std::string(kMaxExternalIdBytes, 'x') + "\n").external_id.size(),
            kMaxExternalIdBytes);
  expectRefused(prefix + "\"\"\n", "agent.external_id", "empty");
  expectRefused(prefix + "\n", "agent.external_id", "got null");
  expectRefused(prefix + std::string(kMaxExternalIdBytes + 1, 'x') + "\n", "agent.external_id",
                "longer than 1024 bytes");
  expectRefused(prefix + "\"a b\"\n", "agent.external_id", "not printable ASCII");
  expectRefused(prefix + "\"a\\tb\"\n", "agent.external_id", "not printable ASCII");
  expectRefused(prefix + "\"a\\0b\"\n", "agent.external_id", "not printable ASCII");
  expectRefused(prefix + "caf\xc3\xa9\n", "agent.external_id", "not printable ASCII");
  expectRefused(prefix + "[a]\n", "agent.external_id", "expected a string");
}

TEST(ParseBundle, RefusesOversizeAndDeeplyNestedDocuments) {
  std::string big = minimal("# ");
  big += std::string(kMaxBundleBytes, 'x');
  expectRefused(big, "", "larger than 65536 bytes");
  std::string deep = minimal("serves: ") + std::string(10000, '[') + std::string(10000, ']');
  expectRefused(deep, "", "nested deeper than");
}

TEST(ParseBundle, ReportsYamlSyntaxErrorsWithPosition) {
  const BundleError e = refusal("version: v1\nagent:\n  id: [a.example\n");
  EXPECT_EQ(e.field(), "");
  EXPECT_THAT(e.what(), HasSubstr("invalid YAML (line "));
  expectRefused("version: v1\n  agent: x\n", "", "invalid YAML");
  expectRefused("version: v1\nagent: {id: a.example\n", "", "invalid YAML");
  expectRefused("version: v1\n\tagent: x\n", "", "invalid YAML");
}

TEST(ParseBundle, ErrorsNameTheLine) {
  const BundleError e = refusal("version: v1\nagent:\n  id: bad_name\n");
  EXPECT_THAT(e.what(), HasSubstr("(line 3, column 7)"));
}

class LoadBundleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("bundle_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path write(const std::string& name, const std::string& text) {
    const auto path = dir_ / name;
    std::ofstream(path, std::ios::binary) << text;
    return path;
  }
  std::filesystem::path dir_;
};

TEST_F(LoadBundleTest, ReadsAFile) {
  EXPECT_EQ(loadBundle(write("b.yaml", kSeedBundle)).agent_id, "researcher-1.prod.acme.example");
}

TEST_F(LoadBundleTest, RefusesMissingFileWithPathAndErrno) {
  try {
    loadBundle(dir_ / "missing.yaml");
    FAIL() << "loaded a missing file";
  } catch (const BundleError& e) {
    EXPECT_EQ(e.field(), "");
    EXPECT_THAT(e.what(), HasSubstr("missing.yaml"));
    EXPECT_THAT(e.what(), HasSubstr("No such file or directory"));
  }
}

TEST_F(LoadBundleTest, RefusesADirectory) { EXPECT_THROW(loadBundle(dir_), BundleError); }

TEST_F(LoadBundleTest, RefusesAFileOver64KiB) {
  const auto at_limit = write("limit.yaml", minimal("# ") + std::string(kMaxBundleBytes, 'x'));
  try {
    loadBundle(at_limit);
    FAIL() << "loaded an oversize file";
  } catch (const BundleError& e) {
    EXPECT_EQ(e.field(), "");
    EXPECT_THAT(e.what(), HasSubstr("larger than 65536 bytes"));
  }
  std::string exact = minimal("# ");
  exact += std::string(kMaxBundleBytes - exact.size() - 1, 'x') + "\n";
  ASSERT_EQ(exact.size(), kMaxBundleBytes);
  EXPECT_EQ(loadBundle(write("exact.yaml", exact)).agent_id, "a.example");
}

}  // namespace
}  // namespace policy
