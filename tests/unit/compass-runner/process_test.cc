#include "compass-runner/process.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "compass-runner/backend.h"
#include "compass-runner/state.h"

namespace runner {
namespace {

// Real children, real /bin/sh: nothing here is faked.

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/runner-process-XXXXXX";
    path_ = ::mkdtemp(tmpl);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  [[nodiscard]] const std::string& path() const { return path_; }

 private:
  std::string path_;
};

TEST(RunCommandTest, CapturesStdoutStderrAndStatus) {
  const auto r = runCommand({"/bin/sh", "-c", "echo out; echo err >&2; exit 3"});
  EXPECT_EQ(r.status, 3);
  EXPECT_EQ(r.out, "out\n");
  EXPECT_EQ(r.err, "err\n");
}

TEST(RunCommandTest, FeedsInputOnStdin) {
  const auto r = runCommand({"sh", "-c", "tr a-z A-Z"}, "hello\n");
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.out, "HELLO\n");
}

TEST(RunCommandTest, SetEnvAddsAndReplacesOnTopOfTheInheritedEnvironment) {
  ::setenv("RUNNER_TEST_KEEP", "kept", 1);
  ::setenv("RUNNER_TEST_REPLACE", "old", 1);
  const auto r = runCommand(
      {"sh", "-c", "echo \"$RUNNER_TEST_KEEP $RUNNER_TEST_REPLACE $RUNNER_TEST_NEW\"; env"}, "",
      std::chrono::seconds(10), "", {"RUNNER_TEST_REPLACE=new", "RUNNER_TEST_NEW=a=b"});
  ::unsetenv("RUNNER_TEST_KEEP");
  ::unsetenv("RUNNER_TEST_REPLACE");
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.out.substr(0, r.out.find('\n')), "kept new a=b");
  // Replaced, not duplicated: the child sees the variable once.
  EXPECT_EQ(r.out.find("RUNNER_TEST_REPLACE=old"), std::string::npos);
}

TEST(RunCommandTest, SetEnvEntryWithoutEqualsIsRefused) {
  EXPECT_THROW(runCommand({"true"}, "", std::chrono::seconds(10), "", {"NOEQUALS"}), RunnerError);
}

TEST(RunCommandTest, LargeInputAndOutputDoNotDeadlock) {
  const std::string input(3 << 20, 'x');  // larger than any pipe buffer, both ways
  const auto r = runCommand({"cat"}, input);
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.out.size(), size_t{1} << 20);  // capped at 1 MiB, the rest read and dropped
}

TEST(RunCommandTest, CommandThatIgnoresItsInputIsNotAnError) {
  const std::string input(1 << 20, 'x');
  const auto r = runCommand({"true"}, input);
  EXPECT_EQ(r.status, 0);
}

TEST(RunCommandTest, SignalledCommandReportsOneHundredTwentyEightPlusN) {
  const auto r = runCommand({"sh", "-c", "kill -TERM $$"});
  EXPECT_EQ(r.status, 128 + SIGTERM);
}

TEST(RunCommandTest, TimeoutKillsTheCommandAndWhatItStarted) {
  TempDir dir;
  const std::string pidfile = dir.path() + "/child.pid";
  const auto r = runCommand({"sh", "-c", "sleep 100 & echo $! > " + pidfile + "; wait"}, "",
                            std::chrono::milliseconds(300));
  EXPECT_EQ(r.status, -1);
  const pid_t child = std::stoi(slurp(pidfile));
  // The background sleep was in the command's process group, so it was killed too; give the
  // kernel the moment it needs to deliver SIGKILL and let init reap it.
  for (int i = 0; i < 200 && processStartTime(child) != 0; ++i) ::usleep(10000);
  EXPECT_EQ(processStartTime(child), 0U);
}

TEST(RunCommandTest, DescendantHoldingThePipesDoesNotHoldTheCaller) {
  // The shell exits at once; its background child keeps stdout open for 100 s.
  const auto start = std::chrono::steady_clock::now();
  const auto r = runCommand({"sh", "-c", "echo first; setsid sleep 100 & echo $! >&2; exit 0"});
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.out, "first\n");
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(50));
  ::kill(std::stoi(r.err), SIGKILL);
}

TEST(RunCommandTest, MissingProgramIsAnErrorNotExit127) {
  try {
    runCommand({"no-such-program-compass"});
    FAIL() << "no error";
  } catch (const RunnerError& e) {
    EXPECT_NE(std::string(e.what()).find("no-such-program-compass"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("not found on PATH"), std::string::npos);
  }
  try {
    runCommand({"/nonexistent/prog"});
    FAIL() << "no error";
  } catch (const RunnerError& e) {
    EXPECT_NE(std::string(e.what()).find("execve"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("No such file"), std::string::npos) << e.what();
  }
}

TEST(RunCheckedTest, ThrowsWithWhatCommandStatusAndStderr) {
  EXPECT_EQ(runChecked("echo", {"echo", "ok"}), "ok\n");
  try {
    runChecked("making things", {"sh", "-c", "echo broken >&2; exit 4"});
    FAIL() << "no error";
  } catch (const RunnerError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("making things: sh -c"), std::string::npos) << what;
    EXPECT_NE(what.find("exit 4: broken"), std::string::npos) << what;
  }
  try {
    runChecked("waiting", {"sleep", "10"}, "", std::chrono::milliseconds(100));
    FAIL() << "no error";
  } catch (const RunnerError& e) {
    EXPECT_NE(std::string(e.what()).find("timed out"), std::string::npos) << e.what();
  }
}

TEST(SpawnTest, EnvironmentCwdAndFiles) {
  TempDir dir;
  SpawnOptions o;
  o.argv = {"sh", "-c", "echo \"$GREETING $(pwd)\"; echo to-err >&2; cat"};
  o.env = std::map<std::string, std::string>{{"GREETING", "hi"}, {"PATH", "/usr/bin:/bin"}};
  o.cwd = dir.path();
  o.stdin_path = "/etc/hostname";
  o.stdout_path = dir.path() + "/out";
  o.stderr_path = dir.path() + "/err";
  EXPECT_EQ(waitExit(spawn(o)), 0);
  EXPECT_EQ(slurp(o.stdout_path), "hi " + dir.path() + "\n" + slurp("/etc/hostname"));
  EXPECT_EQ(slurp(o.stderr_path), "to-err\n");
  struct stat st {};
  ASSERT_EQ(::stat(o.stdout_path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600U);
}

TEST(SpawnTest, OnlyTheEnvironmentGiven) {
  TempDir dir;
  SpawnOptions o;
  o.argv = {"/usr/bin/env"};
  o.env = std::map<std::string, std::string>{{"ONLY", "this"}};
  o.stdout_path = dir.path() + "/out";
  EXPECT_EQ(waitExit(spawn(o)), 0);
  EXPECT_EQ(slurp(o.stdout_path), "ONLY=this\n");
}

TEST(SpawnTest, PassFdsAreRenumberedFromThreeAndNothingElseLeaks) {
  TempDir dir;
  int a[2], b[2];
  ASSERT_EQ(::pipe2(a, O_CLOEXEC), 0);
  ASSERT_EQ(::pipe2(b, O_CLOEXEC), 0);
  // A descriptor without CLOEXEC that must not reach the child either.
  const int stray = ::open("/dev/null", O_RDONLY);
  ASSERT_GE(stray, 0);
  SpawnOptions o;
  // Passed in "reverse" order (b's write end first) so that renumbering is visible.
  o.pass_fds = {b[1], a[1]};
  o.argv = {"sh", "-c", "echo to-three >&3; echo to-four >&4; ls /proc/self/fd | sort -n"};
  o.stdout_path = dir.path() + "/out";
  const pid_t pid = spawn(o);
  ::close(a[1]);
  ::close(b[1]);
  EXPECT_EQ(waitExit(pid), 0);
  char buf[64] = {};
  ASSERT_GT(::read(b[0], buf, sizeof buf - 1), 0);
  EXPECT_STREQ(buf, "to-three\n");
  std::fill(std::begin(buf), std::end(buf), 0);
  ASSERT_GT(::read(a[0], buf, sizeof buf - 1), 0);
  EXPECT_STREQ(buf, "to-four\n");
  // ls sees 0, 1, 2, the two passed ones and its own directory handle (5): nothing else.
  EXPECT_EQ(slurp(o.stdout_path), "0\n1\n2\n3\n4\n5\n");
  ::close(a[0]);
  ::close(b[0]);
  ::close(stray);
}

TEST(SpawnTest, NewSessionDetachesFromTheTerminal) {
  TempDir dir;
  SpawnOptions o;
  o.argv = {"sh", "-c", "ps -o sid= -p $$; echo $$"};
  o.new_session = true;
  o.stdout_path = dir.path() + "/out";
  const pid_t pid = spawn(o);
  EXPECT_EQ(waitExit(pid), 0);
  std::istringstream in(slurp(o.stdout_path));
  pid_t sid = 0, self = 0;
  in >> sid >> self;
  EXPECT_EQ(sid, self);  // session leader of its own session
}

TEST(SpawnTest, SignalsAreDefaultInTheChildWhateverTheParentDoes) {
  TempDir dir;
  sigset_t block, old;
  sigemptyset(&block);
  sigaddset(&block, SIGTERM);
  ASSERT_EQ(pthread_sigmask(SIG_BLOCK, &block, &old), 0);
  auto* previous = std::signal(SIGPIPE, SIG_IGN);
  SpawnOptions o;
  o.argv = {"sh", "-c", "grep -E '^Sig(Blk|Ign)' /proc/self/status"};
  o.stdout_path = dir.path() + "/out";
  const int status = waitExit(spawn(o));
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  std::signal(SIGPIPE, previous);
  EXPECT_EQ(status, 0);
  // Nothing blocked; nothing ignored that the shell did not ignore itself (SIGPIPE's bit is
  // 0x1000).
  const std::string status_text = slurp(o.stdout_path);
  EXPECT_NE(status_text.find("SigBlk:\t0000000000000000"), std::string::npos) << status_text;
  EXPECT_EQ(status_text.find("1000\n"), std::string::npos) << status_text;
}

TEST(SpawnTest, BadNetnsPathOrWorkdirIsAnError) {
  SpawnOptions o;
  o.argv = {"true"};
  o.netns_path = "/run/netns/no-such-compass-netns";
  try {
    spawn(o);
    FAIL() << "no error";
  } catch (const RunnerError& e) {
    EXPECT_NE(std::string(e.what()).find("no-such-compass-netns"), std::string::npos);
  }
  o.netns_path.clear();
  o.cwd = "/nonexistent-dir";
  try {
    spawn(o);
    FAIL() << "no error";
  } catch (const RunnerError& e) {
    EXPECT_NE(std::string(e.what()).find("chdir"), std::string::npos) << e.what();
  }
}

// The child's very first descriptor move fails (the limit leaves no room above the error
// pipe): spawn must say so, not return a pid whose process quietly exited 127.
TEST(SpawnTest, AChildThatCannotArrangeItsDescriptorsIsAnError) {
  const pid_t tester = ::fork();
  ASSERT_GE(tester, 0);
  if (tester == 0) {
    const int lowest = ::dup(0);
    ::close(lowest);
    // spawn's error pipe takes `lowest` and `lowest + 1`; the child must move the write end
    // above both, which this limit forbids.
    const rlimit lim{static_cast<rlim_t>(lowest) + 2, static_cast<rlim_t>(lowest) + 2};
    if (::setrlimit(RLIMIT_NOFILE, &lim) != 0) ::_exit(3);
    SpawnOptions o;
    o.argv = {"true"};
    o.stdin_path.clear();
    try {
      const pid_t pid = spawn(o);
      waitExit(pid);
      ::_exit(1);  // reported as started
    } catch (const RunnerError& e) {
      ::_exit(std::string(e.what()).find("arranging descriptors") != std::string::npos ? 0 : 2);
    }
  }
  EXPECT_EQ(waitExit(tester), 0) << "1 = spawn reported success, 2 = another error";
}

TEST(SpawnTest, JoinsTheNetworkNamespaceGiven) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to make a network namespace";
  const std::string name = "cr-unit-" + std::to_string(::getpid());
  ASSERT_EQ(runCommand({"ip", "netns", "add", name}).status, 0);
  const auto r =
      runCommand({"ip", "-o", "link", "show"}, "", std::chrono::seconds(10), "/run/netns/" + name);
  runCommand({"ip", "netns", "del", name});
  EXPECT_EQ(r.status, 0);
  // A fresh namespace holds only lo.
  EXPECT_NE(r.out.find(": lo:"), std::string::npos) << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
}

TEST(WaitExitTest, ExitCodesAndSignals) {
  SpawnOptions o;
  o.argv = {"sh", "-c", "exit 42"};
  EXPECT_EQ(waitExit(spawn(o)), 42);
  o.argv = {"sh", "-c", "kill -KILL $$"};
  EXPECT_EQ(waitExit(spawn(o)), 128 + SIGKILL);
}

TEST(PidFdTest, ReadableOnceTheProcessExits) {
  SpawnOptions o;
  o.argv = {"sh", "-c", "read x"};
  int p[2];
  ASSERT_EQ(::pipe2(p, O_CLOEXEC), 0);
  o.stdin_fd = p[0];
  const pid_t pid = spawn(o);
  ::close(p[0]);
  auto fd = pidFd(pid);
  pollfd pfd{fd.get(), POLLIN, 0};
  EXPECT_EQ(::poll(&pfd, 1, 0), 0);  // still running (it waits for a line)
  ::close(p[1]);                     // EOF: `read` fails, the shell exits
  EXPECT_EQ(::poll(&pfd, 1, 10000), 1);
  EXPECT_EQ(waitExit(pid), 1);
}

}  // namespace
}  // namespace runner
