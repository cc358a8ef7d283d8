// Per-agent host id ranges: distinct per agent, released, and never shared under
// concurrency (real files in a temporary directory).
#include "compass-runner/podman_userns.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <filesystem>
#include <set>
#include <thread>

#include "compass-runner/backend.h"

namespace runner::podman {
namespace {

class ClaimDir : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/podman-userns-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    root_ = tmpl;
    dir_ = root_ + "/claims";
  }
  void TearDown() override { std::filesystem::remove_all(root_); }
  std::string root_, dir_;
};

TEST_F(ClaimDir, RangesAreDistinctAlignedAndAboveTheUsualSubuids) {
  const IdRange a = claimIds("a1", dir_);
  const IdRange b = claimIds("a2", dir_);
  EXPECT_EQ(a.base, kIdBase);
  EXPECT_EQ(b.base, kIdBase + kIdsPerAgent);
  EXPECT_EQ(a.agentHostId(), kIdBase + kAgentUid);
  EXPECT_NE(a.agentHostId(), 0U);
  struct stat st {};
  ASSERT_EQ(::stat(dir_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700U);
  EXPECT_EQ(claimedIds(dir_).size(), 2U);
}

TEST_F(ClaimDir, ReleaseFreesTheSlotForReuse) {
  claimIds("a1", dir_);
  const IdRange b = claimIds("a2", dir_);
  releaseIds("a1", dir_);
  releaseIds("a1", dir_);  // idempotent
  EXPECT_EQ(claimIds("a3", dir_).base, kIdBase);
  EXPECT_EQ(claimedIds(dir_).size(), 2U);
  releaseIds("a2", dir_);
  EXPECT_EQ(claimIds("a4", dir_).base, b.base);
}

TEST_F(ClaimDir, ConcurrentClaimsNeverShareARange) {
  constexpr int kThreads = 8, kEach = 25;
  std::vector<std::vector<uint32_t>> got(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        got[t].push_back(claimIds("t" + std::to_string(t) + "-" + std::to_string(i), dir_).base);
      }
    });
  }
  for (auto& th : threads) th.join();
  std::set<uint32_t> all;
  for (const auto& g : got) all.insert(g.begin(), g.end());
  EXPECT_EQ(all.size(), static_cast<size_t>(kThreads * kEach));
}

TEST_F(ClaimDir, RefusesADirectoryOthersCanWrite) {
  ASSERT_EQ(::mkdir(dir_.c_str(), 0777), 0);
  ASSERT_EQ(::chmod(dir_.c_str(), 0777), 0);
  EXPECT_THROW(claimIds("a1", dir_), RunnerError);
}

}  // namespace
}  // namespace runner::podman
