// The supervisor with real processes: each test forks a fresh process that runs a Supervisor
// (as PID 1 of a new PID namespace when root, else as a subreaper) and reports its exit code.
#include "nano-init/pid1.h"

#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <thread>

#include "nano-init/caps.h"

namespace nanoinit {
namespace {

using std::chrono::milliseconds;

// Runs `argv` under a Supervisor in a forked process; returns that process's exit code.
int supervise(const std::vector<std::string>& argv, bool new_pid_ns,
              milliseconds grace = milliseconds(500), bool drop_caps = false) {
  const pid_t outer = ::fork();
  if (outer == 0) {
    if (new_pid_ns) {
      if (::unshare(CLONE_NEWPID) != 0) ::_exit(200);
      const pid_t init = ::fork();
      if (init < 0) ::_exit(201);
      if (init > 0) {
        int st = 0;
        ::waitpid(init, &st, 0);
        ::_exit(WIFEXITED(st) ? WEXITSTATUS(st) : 202);
      }
    }
    try {
      asio::io_context io;
      Supervisor sup(io, grace);
      sup.spawn(argv, [&] {
        if (drop_caps) caps::dropAll();
      });
      int code = -1;
      sup.start([&](int c) {
        code = c;
        io.stop();
      });
      io.run();
      ::_exit(code);
    } catch (...) {
      ::_exit(203);
    }
  }
  int st = 0;
  ::waitpid(outer, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

bool root() { return ::geteuid() == 0; }

TEST(Pid1Test, ExitStatusPropagates) {
  EXPECT_EQ(supervise({"sh", "-c", "exit 7"}, false), 7);
  EXPECT_EQ(supervise({"true"}, false), 0);
  EXPECT_EQ(supervise({"sh", "-c", "kill -USR1 $$"}, false), 128 + SIGUSR1);
  EXPECT_EQ(supervise({"/nonexistent/binary"}, false), 127);
}

TEST(Pid1Test, AsPid1ExitStatusAndSignalsPropagate) {
  if (!root()) GTEST_SKIP() << "needs root for a PID namespace";
  EXPECT_EQ(supervise({"sh", "-c", "test $$ -eq 2 && exit 9"}, true), 9);
  EXPECT_EQ(supervise({"sh", "-c", "kill -KILL $$"}, true), 128 + SIGKILL);
}

TEST(Pid1Test, SetsidGrandchildrenAreGoneAfterExit) {
  char dir[] = "/tmp/pid1testXXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  const std::string pidfile = std::string(dir) + "/pid";
  for (bool ns : {false, true}) {
    if (ns && !root()) continue;
    // A setsid'd grandchild that ignores SIGTERM: only the SIGKILL after the grace ends it.
    const auto start = std::chrono::steady_clock::now();
    const int code = supervise({"sh", "-c",
                                "setsid sh -c 'trap \"\" TERM; echo $$ > " + pidfile +
                                    "; while :; do sleep 1; done' & "
                                    "while [ ! -s " +
                                    pidfile + " ]; do sleep 0.01; done; exit 3"},
                               ns, milliseconds(300));
    EXPECT_EQ(code, 3);
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
    if (!ns) {
      std::ifstream in(pidfile);
      pid_t pid = 0;
      ASSERT_TRUE(in >> pid);
      EXPECT_NE(::kill(pid, 0), 0) << "setsid grandchild " << pid << " survived";
    }
    ::unlink(pidfile.c_str());
  }
  ::rmdir(dir);
}

TEST(Pid1Test, OrphansAreReaped) {
  // The child leaves an orphan that exits at once, then checks it is no zombie.
  const int code = supervise({"sh", "-c",
                              "sh -c 'sleep 0.1 & echo $! > /tmp/orphan.$PPID' ; sleep 0.6; "
                              "p=$(cat /tmp/orphan.$$); rm -f /tmp/orphan.$$; "
                              "s=$(awk '{print $3}' /proc/$p/stat 2>/dev/null); [ \"$s\" != Z ]"},
                             false);
  EXPECT_EQ(code, 0);
}

TEST(Pid1Test, SigtermIsForwarded) {
  const pid_t outer = ::fork();
  if (outer == 0) {
    asio::io_context io;
    Supervisor sup(io, milliseconds(2000));
    sup.spawn({"sh", "-c", "trap 'exit 42' TERM; while :; do sleep 0.05; done"}, [] {});
    int code = -1;
    sup.start([&](int c) {
      code = c;
      io.stop();
    });
    io.run();
    ::_exit(code);
  }
  std::this_thread::sleep_for(milliseconds(300));
  ::kill(outer, SIGTERM);
  int st = 0;
  ::waitpid(outer, &st, 0);
  ASSERT_TRUE(WIFEXITED(st));
  EXPECT_EQ(WEXITSTATUS(st), 42);
}

TEST(Pid1Test, ChildHasNoCapabilities) {
  const int code =
      supervise({"sh", "-c",
                 "grep -q '^CapEff:[[:space:]]*0000000000000000$' /proc/self/status && "
                 "grep -q '^CapBnd:[[:space:]]*0000000000000000$' /proc/self/status && "
                 "grep -q '^NoNewPrivs:[[:space:]]*1$' /proc/self/status"},
                false, milliseconds(500), /*drop_caps=*/true);
  EXPECT_EQ(code, 0);
}

}  // namespace
}  // namespace nanoinit
