#include "compass-runner/sam_box_process.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "compass-runner/backend.h"

namespace runner {
namespace {

// SamBoxProcess's wait for the socket, against real child processes: a stand-in for sam-box
// (a shell script given sam-box's argv) that makes the socket late, exits, or never makes it.
// The real sam-box behind the runner is exercised by tests/integration/test_runner_podman.py.

class SamBoxProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/runner-sambox-XXXXXX";
    dir_ = ::mkdtemp(tmpl);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // A script that, run as `SCRIPT run --socket PATH …`, does `body` with $SOCK set.
  SamBoxOptions script(const std::string& body) {
    const std::string path = dir_ + "/fake-sam-box";
    std::ofstream(path) << "#!/bin/sh\nSOCK=\"$3\"\n" << body << "\n";
    ::chmod(path.c_str(), 0755);
    SamBoxOptions o;
    o.binary = path;
    o.socket = dir_ + "/agent.sock";
    o.log = dir_ + "/sam-box.log";
    o.metrics_addr = "127.0.0.1:1";
    return o;
  }

  std::string dir_;
};

TEST_F(SamBoxProcessTest, ReturnsOnceTheSocketExists) {
  // The socket appears about 150 ms after the start: the wait must see it, not time out.
  SamBoxProcess box;
  box.start(script("sleep 0.15\nexec python3 -c 'import socket,sys,time\n"
                   "s=socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); s.listen()\n"
                   "time.sleep(60)' \"$SOCK\""),
            std::chrono::seconds(10));
  struct stat st {};
  ASSERT_EQ(::stat((dir_ + "/agent.sock").c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_GT(box.pid(), 0);
  box.stop();
  EXPECT_EQ(box.pid(), -1);
}

TEST_F(SamBoxProcessTest, AFileThatIsNotASocketIsNotReadiness) {
  // A regular file at the socket's path, then the process exits: the start fails with the
  // exit, it does not take the file for a serving boundary.
  SamBoxProcess box;
  try {
    box.start(script("echo plain > \"$SOCK\"\nsleep 0.1\necho 'refusing to start: bad flag'\n"
                     "exit 3"),
              std::chrono::seconds(10));
    FAIL() << "start() returned without a socket";
  } catch (const RunnerError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("exited with status 3 before its socket was ready"), std::string::npos)
        << what;
    EXPECT_NE(what.find("refusing to start: bad flag"), std::string::npos) << what;
  }
  EXPECT_EQ(box.pid(), -1);
}

TEST_F(SamBoxProcessTest, AKilledBoxIsReportedWithItsSignal) {
  SamBoxProcess box;
  try {
    box.start(script("kill -KILL $$"), std::chrono::seconds(10));
    FAIL() << "start() returned without a socket";
  } catch (const RunnerError& e) {
    EXPECT_NE(std::string(e.what()).find("was killed by signal 9"), std::string::npos) << e.what();
  }
}

TEST_F(SamBoxProcessTest, NoSocketInTimeFailsAndStopsTheBox) {
  SamBoxProcess box;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    box.start(script("exec sleep 60"), std::chrono::milliseconds(300));
    FAIL() << "start() returned without a socket";
  } catch (const RunnerError& e) {
    EXPECT_NE(std::string(e.what()).find("did not create"), std::string::npos) << e.what();
  }
  // Bounded: the 300 ms deadline, then SIGTERM (sleep dies at once), not the script's 60 s.
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(30));
  EXPECT_EQ(box.pid(), -1);
}

}  // namespace
}  // namespace runner
