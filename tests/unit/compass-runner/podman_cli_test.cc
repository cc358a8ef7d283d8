// The podman and sam-box command lines the podman tier builds: what the container is given
// (and, as important, what it is not).
#include "compass-runner/podman_cli.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "compass-runner/sam_box_process.h"

namespace runner::podman {
namespace {

using V = std::vector<std::string>;

// The value after `flag` (every occurrence).
V valuesOf(const V& argv, const std::string& flag) {
  V out;
  for (size_t i = 0; i + 1 < argv.size(); ++i) {
    if (argv[i] == flag) out.push_back(argv[i + 1]);
  }
  return out;
}

bool has(const V& argv, const std::string& word) {
  return std::find(argv.begin(), argv.end(), word) != argv.end();
}

RunSpec boundarySpec() {
  RunSpec s;
  s.name = "compass-a0123456789";
  s.agent_id = "a0123456789";
  s.image = "localhost/compass-agent:latest";
  s.netns_path = "/run/netns/compass-a0123456789";
  s.id_base = 0x70010000;
  s.user = "1000:1000";
  s.pass_fds = 1;
  s.dns = {"100.127.255.253"};
  s.mounts = {{"/run/compass-runner/a0123456789/sam", kSandboxBoundaryDir, true},
              {"/usr/lib/compass/nano-init", kSandboxNanoInit, true}};
  s.pidfile = "/run/compass-runner/a0123456789/container.pid";
  s.argv = {kSandboxNanoInit, "run", "--gate-fd", "3", kSandboxSocket, "sh", "-c", "echo hi"};
  return s;
}

TEST(PodmanRunArgs, BoundaryAgent) {
  const V a = runArgs(boundarySpec());
  ASSERT_EQ(a.front(), "run");
  EXPECT_EQ(valuesOf(a, "--name"), V{"compass-a0123456789"});
  EXPECT_EQ(valuesOf(a, "--label"), V{"compass.agent=a0123456789"});
  EXPECT_EQ(valuesOf(a, "--network"), V{"ns:/run/netns/compass-a0123456789"});
  EXPECT_EQ(valuesOf(a, "--preserve-fds"), V{"1"});
  const std::string map = "0:" + std::to_string(0x70010000) + ":65536";
  EXPECT_EQ(valuesOf(a, "--uidmap"), V{map});
  EXPECT_EQ(valuesOf(a, "--gidmap"), V{map});
  EXPECT_EQ(valuesOf(a, "--user"), V{"1000:1000"});
  EXPECT_EQ(valuesOf(a, "--cap-drop"), V{"all"});
  EXPECT_EQ(valuesOf(a, "--security-opt"),
            (V{"no-new-privileges", "mask=/sys/class/net:/sys/devices/virtual/net"}));
  EXPECT_EQ(valuesOf(a, "--dns"), V{"100.127.255.253"});
  EXPECT_EQ(valuesOf(a, "--dns-search"), V{"."});  // not the host's search domain
  EXPECT_EQ(valuesOf(a, "--pull"), V{"never"});
  EXPECT_EQ(valuesOf(a, "--pids-limit"), V{std::to_string(kDefaultPids)});
  EXPECT_TRUE(has(a, "--no-hosts"));
  // The image's HEALTHCHECK, VOLUMEs and STOPSIGNAL are not obeyed.
  EXPECT_TRUE(has(a, "--no-healthcheck"));
  EXPECT_EQ(valuesOf(a, "--image-volume"), V{"ignore"});
  EXPECT_EQ(valuesOf(a, "--stop-signal"), V{"SIGTERM"});
  EXPECT_EQ(valuesOf(a, "--volume"), (V{"/run/compass-runner/a0123456789/sam:/run/sam:ro",
                                        "/usr/lib/compass/nano-init:/run/sam/nano-init:ro"}));
  EXPECT_EQ(valuesOf(a, "--entrypoint"), V{kSandboxNanoInit});
  // The image, then nano-init's arguments and the command, in order, at the end.
  const V tail(a.end() - 8, a.end());
  EXPECT_EQ(tail, (V{"localhost/compass-agent:latest", "run", "--gate-fd", "3", kSandboxSocket,
                     "sh", "-c", "echo hi"}));
  // Never a terminal, never a capability, never the host's network or user namespace.
  for (const char* absent :
       {"-t", "-i", "--tty", "--interactive", "--privileged", "--cap-add", "--rm"}) {
    EXPECT_FALSE(has(a, absent)) << absent;
  }
  for (const char* ns_flag : {"--userns", "--pid", "--ipc", "--uts", "--cgroupns"}) {
    EXPECT_TRUE(valuesOf(a, ns_flag).empty()) << ns_flag;
  }
}

TEST(PodmanRunArgs, LimitsWorkdirAndRootfs) {
  RunSpec s = boundarySpec();
  s.resources.memory_bytes = 64ULL << 20;
  s.resources.cpus = 0.5;
  s.resources.pids = 100;
  s.workdir = "/work";
  s.rootfs = "/srv/rootfs";
  s.pass_fds = 0;
  s.argv = {"python3", "-c", "print(1)"};
  const V a = runArgs(s);
  EXPECT_EQ(valuesOf(a, "--memory"), V{"67108864b"});
  EXPECT_EQ(valuesOf(a, "--memory-swap"), V{"67108864b"});
  EXPECT_EQ(valuesOf(a, "--cpus"), V{"0.5"});
  EXPECT_EQ(valuesOf(a, "--pids-limit"), V{"100"});
  EXPECT_EQ(valuesOf(a, "--workdir"), V{"/work"});
  EXPECT_EQ(valuesOf(a, "--rootfs"), V{"/srv/rootfs"});
  EXPECT_FALSE(has(a, "localhost/compass-agent:latest"));
  EXPECT_FALSE(has(a, "--preserve-fds"));
  EXPECT_EQ(valuesOf(a, "--entrypoint"), V{"python3"});
  EXPECT_EQ(V(a.end() - 3, a.end()), (V{"/srv/rootfs", "-c", "print(1)"}));
}

TEST(PodmanUpdateArgs, MemoryAndCpusOnly) {
  Resources r;
  EXPECT_TRUE(updateArgs("c", r).empty());
  r.memory_bytes = 1ULL << 30;
  r.cpus = 2;
  EXPECT_EQ(updateArgs("c", r), (V{"update", "--memory", "1073741824b", "--memory-swap",
                                   "1073741824b", "--cpus", "2", "c"}));
  r = Resources{};
  r.pids = 10;  // podman 4.3's update has no --pids-limit: setPidsLimit() does it
  EXPECT_TRUE(updateArgs("c", r).empty());
}

TEST(PodmanFlags, Spelling) {
  EXPECT_EQ(cpusFlag(1.0), "1");
  EXPECT_EQ(cpusFlag(0.25), "0.25");
  EXPECT_EQ(cpusFlag(1.5), "1.5");
  EXPECT_EQ(memoryFlag(1), "1b");
  EXPECT_EQ(podmanArgv({"ps"}), (V{"podman", "ps"}));
  EXPECT_EQ(podmanEnv("/run/c.conf"), (V{"CONTAINERS_CONF=/run/c.conf"}));
}

TEST(SamBoxArgv, EgressBundleAndSidecar) {
  SamBoxOptions o;
  o.binary = "/usr/bin/sam-box";
  o.socket = "/run/compass-runner/a1/agent.sock";
  o.metrics_addr = "127.0.0.1:9000";
  o.egress_allow = {"allowed.example", "*.pypi.org:443"};
  EXPECT_EQ(samBoxArgv(o),
            (V{"/usr/bin/sam-box", "run", "--socket", "/run/compass-runner/a1/agent.sock",
               "--metrics-addr", "127.0.0.1:9000", "--egress-allow", "allowed.example",
               "--egress-allow", "*.pypi.org:443"}));
  o.bundle = "/b.yaml";
  o.insecure_unverified_bundle = true;
  o.sidecar_socket = "/run/sam-node.sock";
  const V a = samBoxArgv(o);
  EXPECT_EQ(valuesOf(a, "--bundle"), V{"/b.yaml"});
  EXPECT_TRUE(has(a, "--insecure-unverified-bundle"));
  EXPECT_EQ(valuesOf(a, "--sidecar-socket"), V{"/run/sam-node.sock"});
  // Without a bundle the insecure flag is never given (sam-box refuses it alone).
  o.bundle.clear();
  EXPECT_FALSE(has(samBoxArgv(o), "--insecure-unverified-bundle"));
}

TEST(SamBoxArgv, ACredentialIsPassedAndTheBundleIsVerifiedNotTakenAsWritten) {
  AgentSpec spec;
  spec.state_dir = "/run/compass-runner/a1";
  spec.bundle_path = "/b.yaml";
  spec.credential = {"https://issuer.example", "sam", "/var/run/token", "/etc/issuer-ca.pem"};
  V a = samBoxArgv(boundarySamBoxOptions(spec, "/usr/bin/sam-box", "/s.sock"));
  EXPECT_EQ(valuesOf(a, "--bundle"), V{"/b.yaml"});
  EXPECT_FALSE(has(a, "--insecure-unverified-bundle"));
  EXPECT_EQ(valuesOf(a, "--credential-issuer"), V{"https://issuer.example"});
  EXPECT_EQ(valuesOf(a, "--credential-audience"), V{"sam"});
  EXPECT_EQ(valuesOf(a, "--credential-path"), V{"/var/run/token"});
  EXPECT_EQ(valuesOf(a, "--credential-ca"), V{"/etc/issuer-ca.pem"});
  // Path and CA left to sam-box's defaults are not passed at all.
  spec.credential.path.clear();
  spec.credential.ca.clear();
  a = samBoxArgv(boundarySamBoxOptions(spec, "/usr/bin/sam-box", "/s.sock"));
  EXPECT_FALSE(has(a, "--credential-path"));
  EXPECT_FALSE(has(a, "--credential-ca"));
  // No issuer: the bundle is taken as written, and said to be.
  spec.credential = {};
  a = samBoxArgv(boundarySamBoxOptions(spec, "/usr/bin/sam-box", "/s.sock"));
  EXPECT_TRUE(has(a, "--insecure-unverified-bundle"));
  EXPECT_FALSE(has(a, "--credential-issuer"));
}

}  // namespace
}  // namespace runner::podman
