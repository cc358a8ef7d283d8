// SpawnedRunners with real child processes (/bin/sh scripts standing in for compass-runner).

#include "sam-node/spawn_child.h"

#include <gtest/gtest.h>

#include <signal.h>

#include <string>
#include <vector>

namespace samnode {
namespace {

TEST(SpawnChild, ParsesTheRunnersLine) {
  EXPECT_EQ(parseRunningLine("compass-runner: agent a0123 running (tier host, egress x, pid 1)"),
            "a0123");
  EXPECT_EQ(parseRunningLine("compass-runner: agent a.b_c-1 running"), "a.b_c-1");
  EXPECT_EQ(parseRunningLine("compass-runner: agent a0123 stopped"), std::nullopt);
  EXPECT_EQ(parseRunningLine("compass-runner: agent  running"), std::nullopt);
  EXPECT_EQ(parseRunningLine("compass-runner: agent a/b running"), std::nullopt);
  EXPECT_EQ(parseRunningLine("x compass-runner: agent a running"), std::nullopt);
}

TEST(SpawnChild, RunnerEnvironmentKeepsOnlyWhatARunnerReads) {
  const char* node_env[] = {"PATH=/usr/bin",
                            "HOME=/root",
                            "LC_ALL=C.UTF-8",
                            "COMPASS_MICROVM_CACHE=/var/cache/c",
                            "CONTAINERS_CONF=/etc/c.conf",
                            "OPENAI_API_KEY=sk-live",      // an env:// api_key, not allowlisted
                            "COMPASS_GITHUB_TOKEN=ghp_x",  // allowlisted prefix, but a secret
                            "AWS_SECRET_ACCESS_KEY=a",
                            "LD_PRELOAD=/tmp/evil.so",
                            "=nameless",
                            "NOEQUALS",
                            nullptr};
  const std::vector<std::string> env = runnerEnvironment(
      const_cast<char* const*>(node_env), {"OPENAI_API_KEY", "COMPASS_GITHUB_TOKEN"});
  EXPECT_EQ(env, (std::vector<std::string>{"PATH=/usr/bin", "HOME=/root", "LC_ALL=C.UTF-8",
                                           "COMPASS_MICROVM_CACHE=/var/cache/c",
                                           "CONTAINERS_CONF=/etc/c.conf"}));
}

TEST(SpawnChild, TheRunnerGetsOnlyTheGivenEnvironment) {
  SpawnedRunners runners({"PATH=/usr/bin:/bin", "COMPASS_X=1"});
  // The runner's id carries the names of its environment variables (sh adds PWD).
  SpawnOutcome o = runners.start(
      {"/bin/sh", "-c",
       "echo \"compass-runner: agent a$(env | cut -d= -f1 | grep -v '^PWD$' | sort | tr '\\n' "
       "'-')x running\" >&2; exec sleep 600"},
      "t", "caller");
  ASSERT_EQ(o.kind, SpawnOutcome::kRunning) << o.detail;
  EXPECT_EQ(o.id, "aCOMPASS_X-PATH-x");
}

TEST(SpawnChild, ReportsTheIdAndStopsTheRunnerAtTheEnd) {
  SpawnedRunners runners;
  SpawnOutcome o = runners.start(
      {"/bin/sh", "-c",
       "echo noise; echo 'compass-runner: agent a42 running (tier host)' >&2; exec sleep 600"},
      "t", "caller");
  ASSERT_EQ(o.kind, SpawnOutcome::kRunning) << o.detail;
  EXPECT_EQ(o.id, "a42");
  EXPECT_GT(o.pid, 0);
  EXPECT_EQ(runners.running(), 1u);
  EXPECT_EQ(kill(o.pid, 0), 0);
  // The destructor (end of scope) sends SIGTERM and reaps: sleep dies of it.
}

TEST(SpawnChild, RunnerThatExitsFirstGivesItsLastLine) {
  SpawnedRunners runners;
  SpawnOutcome o = runners.start(
      {"/bin/sh", "-c", "echo 'compass-runner: cannot start agent: no image' >&2; exit 3"}, "t",
      "caller");
  ASSERT_EQ(o.kind, SpawnOutcome::kExited);
  EXPECT_NE(o.detail.find("cannot start agent: no image"), std::string::npos) << o.detail;
  EXPECT_NE(o.detail.find("exit status 3"), std::string::npos) << o.detail;
}

TEST(SpawnChild, MissingProgramCannotStart) {
  SpawnedRunners runners;
  SpawnOutcome o = runners.start({"/nonexistent/compass-runner", "run"}, "t", "caller");
  EXPECT_EQ(o.kind, SpawnOutcome::kCannotStart);
  EXPECT_NE(o.detail.find("No such file"), std::string::npos) << o.detail;
}

TEST(SpawnChild, DeadlineStopsASilentRunner) {
  SpawnedRunners runners;
  SpawnOutcome o = runners.start({"/bin/sh", "-c", "exec sleep 600"}, "t", "caller",
                                 std::chrono::milliseconds(200));
  EXPECT_EQ(o.kind, SpawnOutcome::kTimeout);
}

TEST(PendingSpawns, CapsEachAgentAndTheNode) {
  PendingSpawns pending(3, 2);
  std::string why;
  auto a1 = pending.tryAcquire("a.example", &why);
  auto a2 = pending.tryAcquire("a.example", &why);
  ASSERT_TRUE(a1 && a2);
  EXPECT_FALSE(pending.tryAcquire("a.example", &why));
  EXPECT_NE(why.find("agent a.example already has 2 spawns"), std::string::npos) << why;
  auto b1 = pending.tryAcquire("b.example", &why);
  ASSERT_TRUE(b1);
  EXPECT_EQ(pending.pending(), 3u);
  EXPECT_FALSE(pending.tryAcquire("c.example", &why));
  EXPECT_NE(why.find("the node already has 3 spawns"), std::string::npos) << why;
  a1.reset();  // one of a's spawns answered: its slot serves anyone again
  EXPECT_EQ(pending.pending(), 2u);
  auto c1 = pending.tryAcquire("c.example");
  ASSERT_TRUE(c1);
  EXPECT_FALSE(pending.tryAcquire("a.example"));
  {
    PendingSpawns::Slot moved = std::move(*c1);
    c1.reset();  // the moved-from slot gives nothing back
    EXPECT_EQ(pending.pending(), 3u);
  }
  EXPECT_EQ(pending.pending(), 2u);
}

TEST(PendingSpawns, DefaultsAreTheNamedCaps) {
  PendingSpawns pending;
  std::vector<PendingSpawns::Slot> held;
  for (const char* agent : {"a", "a", "b", "b"}) {
    auto slot = pending.tryAcquire(agent);
    ASSERT_TRUE(slot) << agent;
    held.push_back(std::move(*slot));
  }
  EXPECT_EQ(held.size(), kMaxPendingSpawns);
  EXPECT_FALSE(pending.tryAcquire("c"));
  held.clear();
  EXPECT_EQ(pending.pending(), 0u);
}

}  // namespace
}  // namespace samnode
