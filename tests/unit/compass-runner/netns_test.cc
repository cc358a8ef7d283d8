// netns::awaitRunning(): an interface counts as up only once the kernel reports it running.
// Needs root (it makes a network namespace of its own, removed at the end).
#include "compass-runner/netns.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>

#include "compass-runner/backend.h"

namespace runner::netns {
namespace {

using std::chrono::milliseconds;

class AwaitRunningTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "makes a network namespace: runs as root only";
    name_ = "compass-unit" + std::to_string(::getpid());
    create(name_);
  }
  void TearDown() override {
    if (!name_.empty()) {
      EXPECT_TRUE(remove(name_));
    }
  }
  std::string name_;
};

TEST_F(AwaitRunningTest, ADownLoopbackIsNotUpAndTheWaitEnds) {
  // A new netns's lo is down: the wait gives up after its timeout instead of hanging.
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(awaitRunning(name_, "lo", milliseconds(30)));
  EXPECT_GE(std::chrono::steady_clock::now() - t0, milliseconds(30));
}

TEST_F(AwaitRunningTest, ALoopbackSetUpIsRunning) {
  const std::string up = "ip -n " + name_ + " link set lo up";
  ASSERT_EQ(std::system(up.c_str()), 0);
  EXPECT_TRUE(awaitRunning(name_, "lo", milliseconds(2000)));
}

TEST_F(AwaitRunningTest, AMissingDeviceIsAnErrorNamingIt) {
  try {
    awaitRunning(name_, "nosuchdev0", milliseconds(10));
    FAIL() << "no error for a missing device";
  } catch (const RunnerError& e) {
    EXPECT_NE(std::string(e.what()).find("SIOCGIFFLAGS(nosuchdev0)"), std::string::npos)
        << e.what();
  }
}

TEST(AwaitRunningNoNetnsTest, AMissingNetnsIsAnError) {
  if (::geteuid() != 0) GTEST_SKIP() << "setns needs root";
  EXPECT_THROW(awaitRunning("compass-no-such-netns", "lo", milliseconds(10)), RunnerError);
}

}  // namespace
}  // namespace runner::netns
