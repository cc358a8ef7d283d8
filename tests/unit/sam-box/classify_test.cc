#include "sam-box/classify.h"

#include <gtest/gtest.h>

#include "policy/allowlist.h"

namespace sambox {
namespace {

using proto::TunnelKind;

Config configWith(std::initializer_list<const char*> allow, bool with_bundle = true) {
  Config cfg;
  if (with_bundle) {
    cfg.bundle = policy::Bundle{};
    cfg.bundle->agent_id = "researcher-1.prod.acme.example";
  }
  for (const char* a : allow) cfg.allowlist.add(policy::parseAllowRule(a));
  return cfg;
}

Decision tcp(const Config& cfg, const char* authority) {
  return classify(cfg, TunnelKind::kConnectTcp, authority, false);
}

TEST(ClassifyTest, WildcardMatchesSubdomainsOnly) {
  const Config cfg = configWith({"*.pypi.org"});
  EXPECT_TRUE(tcp(cfg, "files.pypi.org:443").allowed);
  EXPECT_TRUE(tcp(cfg, "a.b.pypi.org:443").allowed);
  EXPECT_EQ(tcp(cfg, "pypi.org:443").reason, kReasonNotAllowlisted);
  EXPECT_EQ(tcp(cfg, "evilpypi.org:443").reason, kReasonNotAllowlisted);
  EXPECT_EQ(tcp(cfg, "files.pypi.org.evil.example:443").reason, kReasonNotAllowlisted);
}

TEST(ClassifyTest, CaseAndTrailingDotAreNormalized) {
  const Config cfg = configWith({"api.example.com"});
  const Decision d = tcp(cfg, "Api.Example.COM.:443");
  EXPECT_TRUE(d.allowed);
  EXPECT_EQ(d.name, "api.example.com");
  EXPECT_EQ(d.route, Route::kExternal);
  EXPECT_EQ(tcp(cfg, "api.example.com..:443").reason, kReasonInvalidName);
}

TEST(ClassifyTest, PortRestriction) {
  const Config cfg = configWith({"api.example.com:443", "any.example.com"});
  EXPECT_TRUE(tcp(cfg, "api.example.com:443").allowed);
  EXPECT_EQ(tcp(cfg, "api.example.com:80").reason, kReasonNotAllowlisted);
  EXPECT_TRUE(tcp(cfg, "any.example.com:22").allowed);
}

TEST(ClassifyTest, IpLiteralsInEverySpellingAreUnresolved) {
  const Config cfg = configWith({"*.example.com"});
  for (const char* a : {"198.18.0.2:80", "[2001:db8::2]:80", "3323068418:80", "0xc6120002:80",
                        "0306.022.0.2:80", "198.18.2:80", "[::ffff:198.18.0.2]:80",
                        "[::ffff:c612:2]:80", "127.0.0.1.:80", "[fe80::1%25eth0]:80"}) {
    const Decision d = tcp(cfg, a);
    EXPECT_FALSE(d.allowed) << a;
    EXPECT_EQ(d.route, Route::kUnresolved) << a;
    EXPECT_EQ(d.reason, kReasonUnresolved) << a;
  }
}

TEST(ClassifyTest, MalformedAuthorityIs400) {
  const Config cfg = configWith({"api.example.com"});
  for (const char* a : {"api.example.com", "api.example.com:", ":443", "api.example.com:0",
                        "api.example.com:65536", "[2001:db8::1:443", ""}) {
    const Decision d = tcp(cfg, a);
    EXPECT_FALSE(d.allowed) << a;
    EXPECT_EQ(d.status, 400) << a;
    EXPECT_EQ(d.route, Route::kMalformed) << a;
  }
}

TEST(ClassifyTest, MeshEntrypoint) {
  const Config cfg = configWith({});
  const Decision d = tcp(cfg, "MESH.sam.alt.:80");
  EXPECT_TRUE(d.allowed);
  EXPECT_EQ(d.route, Route::kMeshEntrypoint);
  EXPECT_EQ(tcp(cfg, "mesh.sam.alt:443").reason, kReasonMeshPort);
  EXPECT_EQ(classify(cfg, TunnelKind::kConnectUdp, "mesh.sam.alt:80", false).reason,
            kReasonMeshUdp);
  EXPECT_EQ(tcp(configWith({}, false), "mesh.sam.alt:80").reason, kReasonNoIdentity);
  // An allowlist entry cannot turn the mesh name into an external destination: a rule naming
  // it is refused (policy::parseAllowRule), and a wildcard above it does not count.
  EXPECT_EQ(tcp(configWith({"*.sam.alt"}, false), "mesh.sam.alt:80").reason, kReasonNoIdentity);
}

TEST(ClassifyTest, ALapsedIdentityRefusesTheMeshAndNothingElse) {
  const Config cfg = configWith({"api.example.com"});
  const Decision mesh = classify(cfg, TunnelKind::kConnectTcp, "Mesh.Sam.Alt.:80", true);
  EXPECT_FALSE(mesh.allowed);
  EXPECT_EQ(mesh.status, 403);
  EXPECT_EQ(mesh.route, Route::kMeshEntrypoint);
  EXPECT_EQ(mesh.reason, kReasonCredentialExpired);
  // External egress is the allowlist's, not the identity's.
  EXPECT_TRUE(classify(cfg, TunnelKind::kConnectTcp, "api.example.com:443", true).allowed);
  // A box without an identity has none to lapse: its refusal says so.
  EXPECT_EQ(
      classify(configWith({}, false), TunnelKind::kConnectTcp, "mesh.sam.alt:80", true).reason,
      kReasonNoIdentity);
}

TEST(ClassifyTest, EmptyAllowlistDeniesEverything) {
  const Config cfg = configWith({});
  EXPECT_EQ(tcp(cfg, "api.github.com:443").reason, kReasonNotAllowlisted);
  EXPECT_EQ(classify(cfg, TunnelKind::kConnectUdp, "dns.example:53", false).reason,
            kReasonNotAllowlisted);
}

}  // namespace
}  // namespace sambox
