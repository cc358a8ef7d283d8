#include "compass-runner/host_backend.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>

#include "compass-runner/backend.h"
#include "compass-runner/process.h"
#include "compass-runner/state.h"

namespace runner {
namespace {

constexpr uid_t kNobody = 65534;

// validate()'s refusal for `spec`, "" if accepted.
std::string refusal(const AgentSpec& spec) {
  try {
    makeHostBackend()->validate(spec);
  } catch (const RunnerError& e) {
    return e.what();
  }
  return "";
}

// refusal() as uid 65534, in a forked child (the test runs as root, and the root refusal
// comes first). The answer comes back through a pipe.
std::string refusalAsNobody(const AgentSpec& spec) {
  int p[2];
  EXPECT_EQ(::pipe(p), 0);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(p[0]);
    if (::setresgid(kNobody, kNobody, kNobody) != 0 ||
        ::setresuid(kNobody, kNobody, kNobody) != 0) {
      ::_exit(2);
    }
    const std::string why = refusal(spec);
    [[maybe_unused]] ssize_t n = ::write(p[1], why.data(), why.size());
    ::_exit(0);
  }
  ::close(p[1]);
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(p[0], buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  ::close(p[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "could not become uid 65534";
  return out;
}

AgentSpec plainSpec() {
  AgentSpec spec;
  spec.command = {"true"};
  return spec;
}

TEST(HostBackendTest, NameAndPosture) {
  const auto b = makeHostBackend();
  EXPECT_EQ(b->name(), "host");
  EXPECT_EQ(b->posture(plainSpec()), Posture::kUnenforced);
  AgentSpec firewall = plainSpec();
  firewall.egress = Posture::kFirewall;
  EXPECT_EQ(b->posture(firewall), Posture::kUnenforced);  // never claims what it cannot do
}

TEST(HostBackendTest, RootIsRefusedWhateverTheEnvironmentSays) {
  if (::getuid() != 0 && ::geteuid() != 0) GTEST_SKIP() << "runs as root only";
  ::setenv("USER", "nobody", 1);
  ::setenv("LOGNAME", "nobody", 1);
  ::setenv("SUDO_UID", "65534", 1);
  const std::string why = refusal(plainSpec());
  ::unsetenv("SUDO_UID");
  EXPECT_NE(why.find("refuses to run as root"), std::string::npos) << why;
  EXPECT_NE(why.find("--backend podman"), std::string::npos) << why;
}

TEST(HostBackendTest, APlainSpecIsAcceptedForAnOrdinaryUser) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to become uid 65534";
  EXPECT_EQ(refusalAsNobody(plainSpec()), "");
}

TEST(HostBackendTest, EveryConfiguredEgressPolicyIsRefused) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to become uid 65534";
  AgentSpec allow = plainSpec();  // --egress-allow x
  allow.egress_configured = true;
  allow.egress_allow = {"x.example"};
  AgentSpec empty_allow = plainSpec();  // --egress-allow ""
  empty_allow.egress_configured = true;
  AgentSpec mechanism = plainSpec();  // --egress firewall
  mechanism.egress_configured = true;
  mechanism.egress = Posture::kFirewall;
  AgentSpec bundle = plainSpec();  // a bundle with an egress section
  bundle.egress_configured = true;
  bundle.bundle_path = "/x/bundle.yaml";
  for (const auto& spec : {allow, empty_allow, mechanism, bundle}) {
    const std::string why = refusalAsNobody(spec);
    EXPECT_NE(why.find("cannot enforce egress"), std::string::npos) << why;
    EXPECT_NE(why.find("--backend podman"), std::string::npos) << why;
  }
  EXPECT_NE(refusalAsNobody(mechanism).find("--egress firewall"), std::string::npos);
  EXPECT_NE(refusalAsNobody(bundle).find("bundle's `egress` section"), std::string::npos);
}

TEST(HostBackendTest, SandboxOnlyFlagsAreRefusedNotIgnored) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to become uid 65534";
  AgentSpec image = plainSpec();
  image.image = "localhost/x";
  EXPECT_NE(refusalAsNobody(image).find("--image"), std::string::npos);
  AgentSpec memory = plainSpec();
  memory.resources.memory_bytes = 1 << 30;
  EXPECT_NE(refusalAsNobody(memory).find("no cgroup"), std::string::npos);
  AgentSpec pids = plainSpec();
  pids.resources.pids = 10;
  EXPECT_NE(refusalAsNobody(pids).find("--pids"), std::string::npos);
  AgentSpec sidecar = plainSpec();
  sidecar.sidecar_socket = "/run/sam/node.sock";
  EXPECT_NE(refusalAsNobody(sidecar).find("--sidecar-socket"), std::string::npos);
  AgentSpec workdir = plainSpec();
  workdir.workdir = "/nonexistent-workdir";
  EXPECT_NE(refusalAsNobody(workdir).find("--workdir"), std::string::npos);
}

TEST(HostBackendTest, ResizeIsAnErrorNeverAPretence) {
  AgentRecord rec;
  Resources r;
  r.memory_bytes = 1 << 30;
  try {
    makeHostBackend()->resize(rec, r);
    FAIL() << "resize pretended to work";
  } catch (const RunnerError& e) {
    EXPECT_NE(std::string(e.what()).find("no cgroup"), std::string::npos);
  }
}

TEST(HostBackendTest, BannerSaysEgressIsNotEnforcedAndHowToGraduate) {
  const std::string banner = host::unenforcedBanner();
  EXPECT_NE(banner.find("egress is NOT enforced"), std::string::npos);
  EXPECT_NE(banner.find("--backend podman"), std::string::npos);
}

TEST(KillAgentProcessesTest, KillsOnlyTheAgentsProcessesOfThatUid) {
  const std::string id = newAgentId();
  SpawnOptions o;
  o.argv = {"sleep", "100"};
  o.env = std::map<std::string, std::string>{{host::kAgentIdEnv, id}, {"PATH", "/usr/bin:/bin"}};
  const pid_t tagged = spawn(o);
  o.env =
      std::map<std::string, std::string>{{host::kAgentIdEnv, id + "0"}, {"PATH", "/usr/bin:/bin"}};
  const pid_t other = spawn(o);
  // Another uid is never touched, even with the same id.
  EXPECT_EQ(host::killAgentProcesses(id, ::geteuid() + 1), 0);
  EXPECT_EQ(host::killAgentProcesses(id, ::geteuid()), 1);
  EXPECT_EQ(waitExit(tagged), 128 + SIGKILL);
  EXPECT_EQ(::kill(other, 0), 0);  // a longer id that starts with this one is another agent
  ::kill(other, SIGKILL);
  waitExit(other);
}

}  // namespace
}  // namespace runner
