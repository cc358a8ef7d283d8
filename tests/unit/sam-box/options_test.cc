#include "sam-box/options.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace sambox {
namespace {

class OptionsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("sambox-options-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string writeBundle(const std::string& text) {
    const auto path = dir_ / "bundle.yaml";
    std::ofstream(path) << text;
    return path.string();
  }

  std::filesystem::path dir_;
};

const char* kServingBundle =
    "version: v1\nagent:\n  id: reviewer.prod.acme.example\n  external_id: sa:reviewer\n"
    "egress:\n  allow: [api.github.com]\nserves:\n  name: code-reviewer\n  port: 8080\n";

std::string errorOf(const Flags& flags) {
  try {
    buildConfig(flags);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST_F(OptionsTest, EgressOnlyBoxNeedsNoBundle) {
  Flags f;
  f.socket = "/tmp/x.sock";
  f.egress_allow = {"api.github.com", "*.githubusercontent.com:443"};
  const Config cfg = buildConfig(f);
  EXPECT_FALSE(cfg.bundle.has_value());
  EXPECT_EQ(cfg.agentId(), "");
  EXPECT_TRUE(cfg.allowlist.allows("raw.githubusercontent.com", 443));
  EXPECT_FALSE(cfg.allowlist.allows("raw.githubusercontent.com", 80));
  EXPECT_FALSE(cfg.verifyCredential());
}

TEST_F(OptionsTest, MissingSocketIsRefused) {
  EXPECT_NE(errorOf(Flags{}).find("--socket"), std::string::npos);
}

TEST_F(OptionsTest, ServesWithoutAgentIngressSocketIsRefused) {
  Flags f;
  f.socket = "/tmp/x.sock";
  f.bundle = writeBundle(kServingBundle);
  f.insecure_unverified_bundle = true;
  EXPECT_NE(errorOf(f).find("--agent-ingress-socket is required"), std::string::npos);
  f.agent_ingress_socket = "/tmp/ingress.sock";
  const Config cfg = buildConfig(f);
  ASSERT_TRUE(cfg.ingress.has_value());
  EXPECT_EQ(cfg.ingress->port, 7080);
}

TEST_F(OptionsTest, BundleWithoutVerificationOrInsecureFlagIsRefused) {
  Flags f;
  f.socket = "/tmp/x.sock";
  f.bundle = writeBundle("version: v1\nagent:\n  id: a.example\n  external_id: sa:a\n");
  EXPECT_NE(errorOf(f).find("--credential-issuer is required"), std::string::npos);
  f.credential_issuer = "https://issuer.example";
  EXPECT_NE(errorOf(f).find("--credential-audience is required"), std::string::npos);
  f.credential_audience = "sam";
  EXPECT_EQ(errorOf(f), "");
  EXPECT_TRUE(buildConfig(f).verifyCredential());
  f.credential_issuer = "http://issuer.example";
  EXPECT_NE(errorOf(f).find("https://"), std::string::npos);
}

TEST_F(OptionsTest, VerifiedBundleNeedsExternalId) {
  Flags f;
  f.socket = "/tmp/x.sock";
  f.bundle = writeBundle("version: v1\nagent:\n  id: a.example\n");
  f.credential_issuer = "https://issuer.example";
  f.credential_audience = "sam";
  EXPECT_NE(errorOf(f).find("agent.external_id"), std::string::npos);
}

TEST_F(OptionsTest, ConflictingIdentityFlagsAreRefused) {
  Flags f;
  f.socket = "/tmp/x.sock";
  f.insecure_unverified_bundle = true;
  EXPECT_NE(errorOf(f).find("needs --bundle"), std::string::npos);
  f.bundle = writeBundle("version: v1\nagent:\n  id: a.example\n");
  f.credential_issuer = "https://issuer.example";
  EXPECT_NE(errorOf(f).find("cannot be combined"), std::string::npos);
  Flags g;
  g.socket = "/tmp/x.sock";
  g.credential_issuer = "https://issuer.example";
  EXPECT_NE(errorOf(g).find("need --bundle"), std::string::npos);
}

TEST_F(OptionsTest, BadBundleNamesTheField) {
  Flags f;
  f.socket = "/tmp/x.sock";
  f.insecure_unverified_bundle = true;
  f.bundle =
      writeBundle("version: v1\nagent:\n  id: a.example\nserves:\n  name: x\n  port: 70000\n");
  EXPECT_NE(errorOf(f).find("serves.port"), std::string::npos);
}

TEST_F(OptionsTest, BadFlagsNameTheFlag) {
  Flags f;
  f.socket = "/tmp/x.sock";
  f.egress_allow = {"10.0.0.0/8"};
  EXPECT_NE(errorOf(f).find("--egress-allow \"10.0.0.0/8\""), std::string::npos);
  f.egress_allow = {};
  f.allow_destination = {"127.0.0.1/8"};
  EXPECT_NE(errorOf(f).find("--allow-destination"), std::string::npos);
  f.allow_destination = {};
  f.metrics_addr = "localhost:9600";
  EXPECT_NE(errorOf(f).find("--metrics-addr"), std::string::npos);
  f.metrics_addr = "9600";
  EXPECT_NE(errorOf(f).find("expected HOST:PORT"), std::string::npos);
  f.egress_allow = {"https://api.github.com/"};
  EXPECT_NE(errorOf(f).find("a URL is not an allowlist entry"), std::string::npos);
  f.egress_allow = {};
  f.metrics_addr = "[::1]:9600";
  EXPECT_EQ(errorOf(f), "");
}

TEST_F(OptionsTest, ResolveCacheTtlIsWholeSecondsWithinItsRange) {
  Flags f;
  f.socket = "/tmp/x.sock";
  EXPECT_EQ(buildConfig(f).resolve_cache_ttl, kResolveCacheTtl);  // the default
  f.resolve_cache_ttl = "0";
  EXPECT_EQ(buildConfig(f).resolve_cache_ttl, std::chrono::milliseconds(0));
  f.resolve_cache_ttl = "3600";
  EXPECT_EQ(buildConfig(f).resolve_cache_ttl, std::chrono::seconds(3600));
  for (const char* bad : {"", "-1", "+5", "3601", "1.5", "5s", " 5", "99999999999"}) {
    f.resolve_cache_ttl = bad;
    EXPECT_NE(errorOf(f).find("--resolve-cache-ttl"), std::string::npos) << bad;
  }
}

}  // namespace
}  // namespace sambox
