#include "compass-runner/options.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/sysinfo.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace runner {
namespace {

Command parse(std::vector<const char*> args) {
  args.insert(args.begin(), "compass-runner");
  return parseCommandLine(static_cast<int>(args.size()), args.data());
}

// The refusal message, or a failure if the command line was accepted.
std::string refusal(std::vector<const char*> args) {
  const auto c = parse(std::move(args));
  const auto* exit = std::get_if<Exit>(&c);
  if (exit == nullptr) return "ACCEPTED";
  EXPECT_EQ(exit->exit_code, kExitUsage) << exit->message;
  return exit->message;
}

const RunOptions& asRun(const Command& c) {
  const auto* run = std::get_if<RunOptions>(&c);
  if (run == nullptr) {
    ADD_FAILURE() << "not a run: " << std::get<Exit>(c).message;
    static const RunOptions kEmpty;
    return kEmpty;
  }
  return *run;
}

class TempFile {
 public:
  explicit TempFile(const std::string& text) {
    char tmpl[] = "/tmp/runner-options-XXXXXX";
    const int fd = ::mkstemp(tmpl);
    ::close(fd);
    path_ = tmpl;
    std::ofstream(path_) << text;
  }
  ~TempFile() { std::filesystem::remove(path_); }
  [[nodiscard]] const char* path() const { return path_.c_str(); }

 private:
  std::string path_;
};

TEST(RunOptionsTest, AFlagGivenTwiceIsSaidSo) {
  const std::string msg =
      refusal({"run", "--egress", "boundary", "--egress", "firewall", "--", "true"});
  EXPECT_EQ(msg.rfind("compass-runner: --egress: given more than once; give it once\n", 0), 0U)
      << msg;
}

TEST(RunOptionsTest, AMisspeltTierWithAccelIsNamedAsAnUnknownBackend) {
  // Not "--accel: only the microvm tier has an accelerator": the tier is what is wrong.
  const std::string msg = refusal({"run", "--backend", "mikrovm", "--accel", "tcg", "--", "true"});
  EXPECT_NE(msg.find("unknown backend"), std::string::npos) << msg;
  EXPECT_NE(msg.find("microvm"), std::string::npos) << msg;
  const std::string podman =
      refusal({"run", "--backend", "podman", "--accel", "tcg", "--", "true"});
  EXPECT_NE(podman.find("only the microvm tier has an accelerator"), std::string::npos) << podman;
}

TEST(RunOptionsTest, EverythingAfterDoubleDashIsTheCommand) {
  const auto c = parse({"run", "--backend", "host", "--workdir", "/tmp", "--", "sh", "-c",
                        "echo hi", "--backend", "podman"});
  const auto& run = asRun(c);
  ASSERT_TRUE(run.backend.has_value());
  EXPECT_EQ(*run.backend, "host");
  EXPECT_EQ(run.spec.workdir, "/tmp");
  EXPECT_EQ(run.spec.command,
            (std::vector<std::string>{"sh", "-c", "echo hi", "--backend", "podman"}));
  EXPECT_FALSE(run.spec.egress_configured);
  EXPECT_TRUE(run.spec.egress_allow.empty());
}

TEST(RunOptionsTest, BackendAbsentIsNulloptAndEmptyIsKept) {
  EXPECT_FALSE(asRun(parse({"run", "--", "true"})).backend.has_value());
  const auto c = parse({"run", "--backend", "", "--", "true"});
  ASSERT_TRUE(asRun(c).backend.has_value());
  EXPECT_EQ(*asRun(c).backend, "");
}

TEST(RunOptionsTest, CommandIsRequired) {
  EXPECT_NE(refusal({"run"}).find("CMD is required"), std::string::npos);
  EXPECT_NE(refusal({"run", "--backend", "host", "--"}).find("CMD is required"), std::string::npos);
}

TEST(RunOptionsTest, EgressAllowEntriesAreNormalizedAndDeduplicated) {
  const auto c = parse({"run", "--egress-allow", "API.Example.com.", "--egress-allow",
                        "*.pypi.org:443", "--egress-allow", "api.example.com", "--", "true"});
  const auto& spec = asRun(c).spec;
  EXPECT_TRUE(spec.egress_configured);
  EXPECT_EQ(spec.egress_allow, (std::vector<std::string>{"api.example.com", "*.pypi.org:443"}));
}

TEST(RunOptionsTest, ExplicitlyEmptyAllowlistIsAConfiguredPolicy) {
  const auto c = parse({"run", "--egress-allow", "", "--", "true"});
  const auto& spec = asRun(c).spec;
  EXPECT_TRUE(spec.egress_configured);
  EXPECT_TRUE(spec.egress_allow.empty());
}

TEST(RunOptionsTest, BadEgressAllowEntriesAreRefusedNamingTheFlag) {
  for (const char* bad : {"1.2.3.4", "*", "a..b", "x.example:0", "*.x.example:99999", "10.0.0.0/8",
                          "ex ample.com", "[::1]"}) {
    const std::string why = refusal({"run", "--egress-allow", bad, "--", "true"});
    EXPECT_NE(why.find("--egress-allow \"" + std::string(bad) + "\""), std::string::npos)
        << bad << ": " << why;
  }
}

TEST(RunOptionsTest, EgressMechanism) {
  auto c = parse({"run", "--egress", "firewall", "--", "true"});
  EXPECT_EQ(asRun(c).spec.egress, Posture::kFirewall);
  EXPECT_TRUE(asRun(c).spec.egress_configured);
  c = parse({"run", "--egress", "boundary", "--", "true"});
  EXPECT_EQ(asRun(c).spec.egress, Posture::kBoundary);
  EXPECT_NE(refusal({"run", "--egress", "unenforced", "--", "true"}).find("--egress"),
            std::string::npos);
  EXPECT_NE(refusal({"run", "--egress", "", "--", "true"}).find("--egress"), std::string::npos);
}

TEST(RunOptionsTest, BundleGivesAgentIdAndAllowlist) {
  TempFile bundle(
      "version: v1\nagent:\n  id: researcher-1.example\negress:\n  allow: [api.github.com, "
      "\"*.githubusercontent.com\"]\n");
  const auto c =
      parse({"run", "--egress-allow", "api.github.com", "--bundle", bundle.path(), "--", "true"});
  const auto& spec = asRun(c).spec;
  EXPECT_EQ(spec.agent_id, "researcher-1.example");
  EXPECT_TRUE(spec.egress_configured);
  EXPECT_EQ(spec.egress_allow,
            (std::vector<std::string>{"api.github.com", "*.githubusercontent.com"}));
  EXPECT_EQ(spec.bundle_path, bundle.path());
}

TEST(RunOptionsTest, BundleEgressKeyCountsEvenWhenEmpty) {
  TempFile with_egress("version: v1\nagent:\n  id: a.example\negress: {}\n");
  EXPECT_TRUE(
      asRun(parse({"run", "--bundle", with_egress.path(), "--", "true"})).spec.egress_configured);
  TempFile without("version: v1\nagent:\n  id: a.example\n");
  const auto c = parse({"run", "--bundle", without.path(), "--", "true"});
  EXPECT_FALSE(asRun(c).spec.egress_configured);
  EXPECT_EQ(asRun(c).spec.agent_id, "a.example");
}

TEST(RunOptionsTest, BadBundlesAreRefusedWithTheField) {
  TempFile unknown_key("version: v1\nagent:\n  id: a.example\n  colour: red\n");
  EXPECT_NE(refusal({"run", "--bundle", unknown_key.path(), "--", "true"}).find("agent.colour"),
            std::string::npos);
  TempFile bad_allow("version: v1\nagent:\n  id: a.example\negress:\n  allow: [\"1.2.3.4\"]\n");
  EXPECT_NE(refusal({"run", "--bundle", bad_allow.path(), "--", "true"}).find("egress.allow[0]"),
            std::string::npos);
  EXPECT_NE(refusal({"run", "--bundle", "/nonexistent/bundle.yaml", "--", "true"})
                .find("--bundle \"/nonexistent/bundle.yaml\": no such file"),
            std::string::npos);
  EXPECT_NE(
      refusal({"run", "--bundle", "/tmp", "--", "true"}).find("--bundle \"/tmp\": not a regular"),
      std::string::npos);
}

TEST(RunOptionsTest, CredentialFlagsAreCheckedAndFilesMadeAbsolute) {
  TempFile bundle("version: v1\nagent:\n  id: a.example\n  external_id: sa:agents:a\n");
  TempFile token("eyJ.x.y");
  const auto c =
      parse({"run", "--bundle", bundle.path(), "--credential-issuer", "https://issuer.example",
             "--credential-audience", "sam", "--credential-path", token.path(), "--credential-ca",
             token.path(), "--", "true"});
  const Credential& cred = asRun(c).spec.credential;
  EXPECT_EQ(cred.issuer, "https://issuer.example");
  EXPECT_EQ(cred.audience, "sam");
  EXPECT_EQ(cred.path, token.path());
  EXPECT_EQ(cred.ca, token.path());
  EXPECT_TRUE(asRun(parse({"run", "--bundle", bundle.path(), "--", "true"}))
                  .spec.credential.issuer.empty());
}

TEST(RunOptionsTest, CredentialFlagsRefusedWithTheReason) {
  TempFile bundle("version: v1\nagent:\n  id: a.example\n  external_id: sa:a\n");
  const char* b = bundle.path();
  const char* iss = "https://issuer.example";
  auto has = [](const std::string& msg, std::string_view part) {
    return msg.find(part) != std::string::npos ? ::testing::AssertionSuccess()
                                               : ::testing::AssertionFailure() << msg;
  };
  EXPECT_TRUE(has(refusal({"run", "--bundle", b, "--credential-audience", "sam", "--", "true"}),
                  "--credential-audience: needs --credential-issuer"));
  EXPECT_TRUE(has(refusal({"run", "--bundle", b, "--credential-ca", b, "--", "true"}),
                  "--credential-ca: needs --credential-issuer"));
  EXPECT_TRUE(has(refusal({"run", "--bundle", b, "--credential-issuer", iss, "--", "true"}),
                  "needs --credential-audience"));
  EXPECT_TRUE(has(refusal({"run", "--bundle", b, "--credential-issuer", "http://issuer.example",
                           "--credential-audience", "sam", "--", "true"}),
                  "must be an https:// URL"));
  for (const char* bad :
       {"https://", "https:///path", "https://issuer example", "issuer.example"}) {
    EXPECT_TRUE(has(refusal({"run", "--bundle", b, "--credential-issuer", bad,
                             "--credential-audience", "sam", "--", "true"}),
                    "must be an https:// URL with a host"));
  }
  TempFile anonymous("version: v1\nagent:\n  id: a.example\n");
  EXPECT_TRUE(has(refusal({"run", "--bundle", anonymous.path(), "--credential-issuer", iss,
                           "--credential-audience", "sam", "--", "true"}),
                  "agent.external_id: required with --credential-issuer"));
  EXPECT_TRUE(has(
      refusal({"run", "--credential-issuer", iss, "--credential-audience", "sam", "--", "true"}),
      "--credential-issuer needs --bundle"));
  EXPECT_TRUE(has(refusal({"run", "--bundle", b, "--egress", "firewall", "--credential-issuer", iss,
                           "--credential-audience", "sam", "--", "true"}),
                  "egress firewall has no sam-box"));
  EXPECT_TRUE(
      has(refusal({"run", "--bundle", b, "--credential-issuer", iss, "--credential-audience", "sam",
                   "--credential-path", "/nonexistent/token", "--", "true"}),
          "--credential-path \"/nonexistent/token\": no such file"));
  EXPECT_TRUE(
      has(refusal({"run", "--bundle", b, "--credential-issuer", iss, "--credential-audience", "sam",
                   "--credential-path", b, "--credential-ca", "/tmp", "--", "true"}),
          "--credential-ca \"/tmp\": not a regular file"));
}

TEST(RunOptionsTest, AMissingDefaultTokenIsRefusedBeforeAnythingStarts) {
  // Without --credential-path, sam-box would read the projected token path only once podman
  // ran; the runner checks that file itself and names the flag to give instead.
  if (std::filesystem::exists("/var/run/secrets/tokens/sam-token")) {
    GTEST_SKIP() << "this host has a projected token at the default path";
  }
  TempFile bundle("version: v1\nagent:\n  id: a.example\n  external_id: sa:a\n");
  const std::string why =
      refusal({"run", "--bundle", bundle.path(), "--credential-issuer", "https://issuer.example",
               "--credential-audience", "sam", "--", "true"});
  EXPECT_NE(why.find("--credential-path: not given"), std::string::npos) << why;
  EXPECT_NE(why.find("\"/var/run/secrets/tokens/sam-token\""), std::string::npos) << why;
}

TEST(RunOptionsTest, AnEmptyAllowlistBesideNamesIsRefused) {
  // `""` says "allow nothing"; a name beside it says the opposite: neither is picked silently.
  std::string why =
      refusal({"run", "--egress-allow", "", "--egress-allow", "api.example.com", "--", "true"});
  EXPECT_NE(why.find("--egress-allow \"\""), std::string::npos) << why;
  EXPECT_NE(why.find("\"api.example.com\" from --egress-allow"), std::string::npos) << why;
  TempFile bundle("version: v1\nagent:\n  id: a.example\negress:\n  allow: [api.github.com]\n");
  why = refusal({"run", "--egress-allow", "", "--bundle", bundle.path(), "--", "true"});
  EXPECT_NE(why.find("\"api.github.com\" from --bundle"), std::string::npos) << why;
  // A bundle whose allowlist is empty agrees with it.
  TempFile empty("version: v1\nagent:\n  id: a.example\negress: {}\n");
  EXPECT_TRUE(asRun(parse({"run", "--egress-allow", "", "--bundle", empty.path(), "--", "true"}))
                  .spec.egress_allow.empty());
}

TEST(RunOptionsTest, ImageAndRootfsExcludeEachOther) {
  EXPECT_NE(refusal({"run", "--image", "x", "--rootfs", "/", "--", "true"}).find("--rootfs"),
            std::string::npos);
  EXPECT_NE(refusal({"run", "--rootfs", "/nonexistent-rootfs", "--", "true"}).find("--rootfs"),
            std::string::npos);
  EXPECT_EQ(asRun(parse({"run", "--rootfs", "/usr/../", "--", "true"})).spec.rootfs, "/");
}

TEST(RunOptionsTest, ARootfsWithoutEtcIsRefusedAsNoRootFilesystem) {
  // An empty directory (or a wrong path such as the image's parent) is no root filesystem.
  char dir[] = "/tmp/rootfs-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  const std::string why = refusal({"run", "--rootfs", dir, "--", "true"});
  EXPECT_NE(why.find("--rootfs"), std::string::npos) << why;
  EXPECT_NE(why.find("no etc/ directory"), std::string::npos) << why;
  const std::string etc = std::string(dir) + "/etc";
  ASSERT_EQ(::mkdir(etc.c_str(), 0755), 0);
  EXPECT_EQ(asRun(parse({"run", "--rootfs", dir, "--", "true"})).spec.rootfs, dir);
  ::rmdir(etc.c_str());
  ::rmdir(dir);
}

TEST(RunOptionsTest, EmptyValuesAreRefusedNamingTheFlag) {
  for (const char* flag : {"--image", "--rootfs", "--workdir", "--bundle", "--sidecar-socket",
                           "--memory", "--cpus", "--pids"}) {
    EXPECT_NE(refusal({"run", flag, "", "--", "true"}).find(flag), std::string::npos) << flag;
  }
}

TEST(RunOptionsTest, WorkdirMustBeAbsolute) {
  EXPECT_NE(refusal({"run", "--workdir", "rel/dir", "--", "true"}).find("--workdir"),
            std::string::npos);
}

// podman would join a `..` to the root's host path before cleaning it (looking outside the
// agent's root): refused wherever it stands; names that merely hold two dots are directories.
TEST(RunOptionsTest, WorkdirWithADotDotComponentIsRefused) {
  for (const char* w :
       {"/..", "/../tmp", "/../../l", "/tmp/..", "/tmp/../", "/a/../b", "//..//x"}) {
    EXPECT_NE(refusal({"run", "--workdir", w, "--", "true"}).find("must not contain \"..\""),
              std::string::npos)
        << w;
  }
  for (const char* w : {"/...", "/..a", "/a..", "/a/..b/", "/tmp/.", "//tmp//"}) {
    EXPECT_EQ(asRun(parse({"run", "--workdir", w, "--", "true"})).spec.workdir, w) << w;
  }
}

TEST(RunOptionsTest, Limits) {
  const auto c = parse({"run", "--memory", "512m", "--cpus", "0.5", "--pids", "100", "--", "true"});
  const auto& r = asRun(c).spec.resources;
  EXPECT_EQ(r.memory_bytes, uint64_t{512} << 20);
  EXPECT_EQ(r.cpus, 0.5);
  EXPECT_EQ(r.pids, 100U);
  EXPECT_NE(refusal({"run", "--memory", "lots", "--", "true"}).find("--memory \"lots\""),
            std::string::npos);
  EXPECT_NE(refusal({"run", "--pids", "-1", "--", "true"}).find("--pids"), std::string::npos);
  EXPECT_NE(refusal({"run", "--cpus", "0", "--", "true"}).find("--cpus"), std::string::npos);
}

TEST(ParseBytesTest, SuffixesAreBinary) {
  EXPECT_EQ(parseBytes("--memory", "6291456"), kMinMemoryBytes);
  EXPECT_EQ(parseBytes("--memory", "8192k"), uint64_t{8} << 20);
  EXPECT_EQ(parseBytes("--memory", "8192K"), uint64_t{8} << 20);
  EXPECT_EQ(parseBytes("--memory", "7m"), uint64_t{7} << 20);
  EXPECT_EQ(parseBytes("--memory", "1G"), uint64_t{1} << 30);
  EXPECT_EQ(parseBytes("--memory", "1024g"), kMaxMemoryBytes);
}

TEST(ParseBytesTest, ReasonsSayWhatIsWrong) {
  auto why = [](const char* text) {
    try {
      parseBytes("--memory", text);
    } catch (const RunnerError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(why("18446744073709551616").find("1 TiB"), std::string::npos);
  EXPECT_NE(why("1k").find("6 MiB"), std::string::npos);
  EXPECT_NE(why("5m").find("6 MiB"), std::string::npos);
}

TEST(ParseBytesTest, BadValuesAreRefusedNamingTheFlag) {
  for (const char* bad : {"", "0", "0k", "k", "-1", "+5", "1.5g", "1t", "1kb", "1 k", "12x",
                          "1025g", "99999999999999999999", "0x10", "1e6"}) {
    try {
      parseBytes("--memory", bad);
      ADD_FAILURE() << "accepted " << bad;
    } catch (const RunnerError& e) {
      EXPECT_NE(std::string(e.what()).find("--memory"), std::string::npos) << e.what();
    }
  }
}

TEST(ParseCpusTest, RangeIsHundredthToCpusOnline) {
  EXPECT_EQ(parseCpus("--cpus", "0.01"), 0.01);
  EXPECT_EQ(parseCpus("--cpus", "1"), 1.0);
  EXPECT_EQ(parseCpus("--cpus", std::to_string(get_nprocs())), get_nprocs());
  for (const std::string& bad :
       std::vector<std::string>{"", "0", "0.001", "-1", "+1", "abc", "1e1", "nan", "inf",
                                std::to_string(get_nprocs() + 1)}) {
    EXPECT_THROW(parseCpus("--cpus", bad), RunnerError) << bad;
  }
}

TEST(ParsePidsTest, FromNanoInitAndTheAgentUpToTheKernelLimit) {
  EXPECT_EQ(parsePids("--pids", "2"), kMinPids);
  EXPECT_EQ(parsePids("--pids", "4194304"), kMaxPids);
  for (const char* bad : {"", "0", "1", "-5", "4194305", "1.5", "ten", "99999999999"}) {
    EXPECT_THROW(parsePids("--pids", bad), RunnerError) << bad;
  }
}

TEST(SubcommandsTest, AgentsStopResizeGcImage) {
  auto c = parse({"agents", "--json"});
  ASSERT_NE(std::get_if<AgentsOptions>(&c), nullptr);
  EXPECT_TRUE(std::get<AgentsOptions>(c).json);
  c = parse({"stop", "a0123456789"});
  ASSERT_NE(std::get_if<StopOptions>(&c), nullptr);
  EXPECT_EQ(std::get<StopOptions>(c).id, "a0123456789");
  c = parse({"resize", "a0123456789", "--memory", "1g", "--pids", "50"});
  ASSERT_NE(std::get_if<ResizeOptions>(&c), nullptr);
  EXPECT_EQ(std::get<ResizeOptions>(c).resources.memory_bytes, uint64_t{1} << 30);
  EXPECT_EQ(std::get<ResizeOptions>(c).resources.pids, 50U);
  EXPECT_FALSE(std::get<ResizeOptions>(c).resources.cpus.has_value());
  c = parse({"gc"});
  EXPECT_NE(std::get_if<GcOptions>(&c), nullptr);
  c = parse({"image", "build", "--force", "--name", "localhost/x:1"});
  ASSERT_NE(std::get_if<ImageBuildOptions>(&c), nullptr);
  EXPECT_TRUE(std::get<ImageBuildOptions>(c).build.force);
  EXPECT_EQ(std::get<ImageBuildOptions>(c).build.name, "localhost/x:1");
  c = parse({"image", "build"});
  EXPECT_EQ(std::get<ImageBuildOptions>(c).build.name, image::kDefaultImage);
}

TEST(SubcommandsTest, Refusals) {
  EXPECT_NE(refusal({"resize", "a0123456789"}).find("at least one of"), std::string::npos);
  EXPECT_NE(refusal({"resize", "a0123456789", "--cpus", "x"}).find("--cpus"), std::string::npos);
  EXPECT_NE(refusal({"stop"}).find("id"), std::string::npos);
  EXPECT_NE(refusal({"image"}), "ACCEPTED");
  EXPECT_NE(refusal({"image", "build", "--name", ""}).find("--name"), std::string::npos);
  EXPECT_NE(refusal({"frobnicate"}).find("unknown command \"frobnicate\""), std::string::npos);
  EXPECT_NE(refusal({}), "ACCEPTED");
}

TEST(SubcommandsTest, HelpAndVersionExitZero) {
  for (auto args : {std::vector<const char*>{"--help"}, std::vector<const char*>{"--version"},
                    std::vector<const char*>{"run", "--help"},
                    std::vector<const char*>{"image", "build", "--help"}}) {
    const auto c = parse(args);
    const auto* exit = std::get_if<Exit>(&c);
    ASSERT_NE(exit, nullptr);
    EXPECT_EQ(exit->exit_code, 0);
    EXPECT_FALSE(exit->message.empty());
  }
  const auto c = parse({"--version"});
  EXPECT_EQ(std::get<Exit>(c).message.rfind("compass-runner 0.", 0), 0U);
}

}  // namespace
}  // namespace runner
