// podman_checks.h checkRootfs() over a real directory standing for a --rootfs.
#include "compass-runner/podman_checks.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

namespace runner::podman {
namespace {

namespace fs = std::filesystem;

class CheckRootfsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("podman-checks-" + std::to_string(::getpid()));
    fs::create_directories(root_ / "etc");
    fs::create_directories(root_ / "work");
  }
  void TearDown() override { fs::remove_all(root_); }

  // The message checkRootfs() throws for `workdir`, or "" if it accepts it.
  std::string refusal(const std::string& workdir) const {
    AgentSpec spec;
    spec.rootfs = root_;
    spec.workdir = workdir;
    spec.command = {"true"};
    try {
      checkRootfs(spec);
    } catch (const RunnerError& e) {
      return e.what();
    }
    return "";
  }

  fs::path root_;
};

TEST_F(CheckRootfsTest, AWorkdirOfTheRootIsAccepted) {
  EXPECT_EQ(refusal("/work"), "");
  EXPECT_EQ(refusal("/work/"), "");
  EXPECT_EQ(refusal(""), "");
}

TEST_F(CheckRootfsTest, AMissingWorkdirIsRefusedNamingTheFlag) {
  EXPECT_NE(refusal("/missing").find("--workdir /missing: no such directory in --rootfs"),
            std::string::npos);
  // A name no file system holds (over NAME_MAX) is missing too, not a failure of the lookup.
  const std::string long_name = "/" + std::string(300, 'x');
  EXPECT_NE(refusal(long_name).find("no such directory"), std::string::npos);
}

// The root has no /run, /dev or /proc: the runtime makes them (and the runner mounts
// /run/sam) in every container, so they are left to podman; below /run/sam there is only
// what the runner puts there.
TEST_F(CheckRootfsTest, WhatTheRuntimeMakesIsLeftToPodman) {
  for (const char* w : {"/run", "/run/", "/run/sam", "/run/sam/", "//run//sam", "/run/./sam",
                        "/dev", "/dev/shm", "//dev", "/proc", "/proc/self", "/sys/fs"}) {
    EXPECT_EQ(refusal(w), "") << w;
  }
  for (const char* w : {"/run/sam/x", "/run/user", "/device", "/system"}) {
    EXPECT_NE(refusal(w).find("no such directory"), std::string::npos) << w;
  }
}

TEST_F(CheckRootfsTest, NotADirectoryRootfsIsRefused) {
  AgentSpec spec;
  spec.rootfs = root_ / "etc" / "missing";
  spec.command = {"true"};
  EXPECT_THROW(checkRootfs(spec), RunnerError);
}

}  // namespace
}  // namespace runner::podman
