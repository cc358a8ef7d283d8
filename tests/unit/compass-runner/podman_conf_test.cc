// containers.conf reading and the seed's pasta check (seed 002, podman:
// VerifyNoPastaForwards), on text: no podman involved.
#include "compass-runner/podman_conf.h"

#include <gtest/gtest.h>

#include "compass-runner/backend.h"

namespace runner::podman {
namespace {

ConfFile conf(const std::string& text,
              const std::string& path = "/etc/containers/containers.conf") {
  return ConfFile{path, text};
}

TEST(PodmanToml, TablesKeysStringsAndArrays) {
  const TomlValues v = parseToml(conf(R"(# a comment
top = "x"
[containers]
netns = "private"  # trailing comment
default_ulimits = [
  "nofile=1024:1024",   # per line
  'nproc=4096:4096',
]
pids_limit = 2048
[network]
pasta_options = ["-T", "5000"]
[engine.runtimes]
runc = ["/usr/bin/runc", "/usr/sbin/runc"]
)"));
  EXPECT_EQ(v.at("top"), std::vector<std::string>{"x"});
  EXPECT_EQ(v.at("containers.netns"), std::vector<std::string>{"private"});
  EXPECT_EQ(v.at("containers.default_ulimits"),
            (std::vector<std::string>{"nofile=1024:1024", "nproc=4096:4096"}));
  EXPECT_EQ(v.at("containers.pids_limit"), std::vector<std::string>{"2048"});
  EXPECT_EQ(v.at("network.pasta_options"), (std::vector<std::string>{"-T", "5000"}));
  EXPECT_EQ(v.at("engine.runtimes.runc").size(), 2U);
}

TEST(PodmanToml, EscapesMultilineStringsAndInlineTables) {
  const TomlValues v = parseToml(conf(R"([a]
s = "quote \" and \\ back"
m = """
two
lines"""
t = { x = "1", y = [1, 2] }
b = true
)"));
  EXPECT_EQ(v.at("a.s").front(), "quote \" and \\ back");
  EXPECT_EQ(v.at("a.m").front(), "two\nlines");
  EXPECT_TRUE(v.at("a.t").empty());
  EXPECT_EQ(v.at("a.b").front(), "true");
}

TEST(PodmanToml, TheShippedConfAndOursParse) {
  EXPECT_NO_THROW(parseToml(conf(kContainersConf, "ours")));
  const TomlValues v = parseToml(conf(kContainersConf, "ours"));
  EXPECT_EQ(v.at("engine.runtime").front(), "runc");
  EXPECT_EQ(v.at("containers.default_ulimits"),
            (std::vector<std::string>{"nofile=1024:1024", "nproc=4096:4096"}));
}

TEST(PodmanToml, RefusesWhatItCannotReadNamingFileAndLine) {
  for (const char* bad : {"[network\nx = 1\n", "a = \"unterminated\n", "a = [\"x\",\n",
                          "just words\n", "a = \"x\" extra\n", "a = [\"x\" \"y\"]\n"}) {
    try {
      parseToml(conf(bad, "/etc/c.conf"));
      ADD_FAILURE() << "parsed: " << bad;
    } catch (const RunnerError& e) {
      EXPECT_NE(std::string(e.what()).find("/etc/c.conf:"), std::string::npos) << e.what();
    }
  }
}

TEST(PastaOptions, ForwardsInEverySpelling) {
  using V = std::vector<std::string>;
  for (const V& fwd : {V{"-T", "5000"}, V{"-T5000"}, V{"--tcp-ns", "5000"}, V{"--tcp-ns=5000"},
                       V{"-U", "53"}, V{"--udp-ns=53"}, V{"-t", "8080"}, V{"-u", "auto"},
                       V{"--tcp-ports", "80"}, V{"--udp-ports=1-100"}, V{"-4T", "22"},
                       V{"--mtu", "1500", "-T", "1"}, V{"-T 5000"}, V{"-T"}}) {
    EXPECT_TRUE(pastaOptionsForward(fwd)) << fwd.front();
  }
}

TEST(PastaOptions, NoForward) {
  using V = std::vector<std::string>;
  for (const V& none : {V{}, V{"-T", "none"}, V{"--tcp-ns=none", "-U", "none"}, V{"--mtu", "1500"},
                        V{"-m1500"}, V{"-a", "10.0.0.2"}, V{"--map-gw"},
                        V{"-t", "none", "-u", "none"}, V{"--no-map-gw", "--ipv4-only"}}) {
    EXPECT_FALSE(pastaOptionsForward(none)) << (none.empty() ? "(empty)" : none.front());
  }
}

TEST(PastaRefusal, ForwardWithPastaAsTheNetworkIsRefusedNamingFileAndOption) {
  const auto r = pastaForwardRefusal(
      {conf("[network]\ndefault_rootless_network_cmd = \"pasta\"\n", "/usr/share/c.conf"),
       conf("[network]\npasta_options = [\"-T\", \"5432\"]\n", "/etc/containers/containers.conf")});
  ASSERT_TRUE(r.has_value());
  EXPECT_NE(r->find("/etc/containers/containers.conf"), std::string::npos) << *r;
  EXPECT_NE(r->find("pasta_options"), std::string::npos) << *r;
  EXPECT_NE(r->find("5432"), std::string::npos) << *r;
  EXPECT_NE(r->find("/usr/share/c.conf sets [network] default_rootless_network_cmd"),
            std::string::npos)
      << *r;
}

TEST(PastaRefusal, UnsetNetworkCommandCountsAsPasta) {
  const auto r = pastaForwardRefusal({conf("[network]\npasta_options = [\"-t\", \"80\"]\n")});
  ASSERT_TRUE(r.has_value());
  EXPECT_NE(r->find("defaults to pasta"), std::string::npos) << *r;
}

TEST(PastaRefusal, PastaChosenByNetnsOrCmdPath) {
  const ConfFile fwd = conf("[network]\npasta_options = [\"-U\", \"53\"]\n", "f");
  const ConfFile slirp = conf("[network]\ndefault_rootless_network_cmd = \"slirp4netns\"\n", "s");
  EXPECT_FALSE(pastaForwardRefusal({fwd, slirp}).has_value());
  EXPECT_TRUE(pastaForwardRefusal({fwd, slirp, conf("[containers]\nnetns = \"pasta\"\n")}));
  EXPECT_TRUE(
      pastaForwardRefusal({fwd, slirp, conf("[engine]\nnetwork_cmd_path = \"/usr/bin/pasta\"\n")}));
}

TEST(PastaRefusal, LaterFileChoosingPastaCounts) {
  const ConfFile slirp = conf("[network]\ndefault_rootless_network_cmd = \"slirp4netns\"\n", "a");
  const ConfFile pasta =
      conf("[network]\ndefault_rootless_network_cmd = \"pasta\"\npasta_options = [\"-T5\"]\n", "b");
  EXPECT_TRUE(pastaForwardRefusal({slirp, pasta}).has_value());
  // ...and a later file choosing slirp4netns disarms an earlier pasta.
  const ConfFile pasta_fwd =
      conf("[network]\ndefault_rootless_network_cmd = \"pasta\"\npasta_options = [\"-T\", \"5\"]\n",
           "c");
  EXPECT_FALSE(pastaForwardRefusal({pasta_fwd, slirp}).has_value());
}

TEST(PastaRefusal, NoForwardNoRefusal) {
  EXPECT_FALSE(pastaForwardRefusal({conf("[network]\npasta_options = [\"--mtu\", \"1500\"]\n"),
                                    conf(kContainersConf, "ours")})
                   .has_value());
  EXPECT_FALSE(pastaForwardRefusal({conf(kContainersConf, "ours")}).has_value());
  // pasta_options in another table is not pasta's.
  EXPECT_FALSE(pastaForwardRefusal({conf("[engine]\npasta_options = [\"-T\", \"1\"]\n")}));
}

TEST(PastaRefusal, UnreadableFileRefuses) {
  EXPECT_THROW(pastaForwardRefusal({conf("[network\n")}), RunnerError);
}

}  // namespace
}  // namespace runner::podman
