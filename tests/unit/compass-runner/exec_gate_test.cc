// The runner's side of the exec gate (src/compass-runner/exec_gate.h), against the far end
// played by hand over the real socketpair, and a real child process as the launcher.
#include "compass-runner/exec_gate.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <thread>

#include "compass-runner/process.h"
#include "nano-init/gate.h"

namespace runner {
namespace {

using std::chrono::milliseconds;

// A child that lives until killed: the launcher whose exit awaitReady() watches.
struct Launcher {
  pid_t pid = ::fork();
  Launcher() {
    if (pid == 0) {
      ::pause();
      ::_exit(0);
    }
  }
  ~Launcher() { end(); }
  void end() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
      pid = -1;
    }
  }
};

void say(int fd, std::string_view s) {
  ASSERT_EQ(::send(fd, s.data(), s.size(), MSG_NOSIGNAL), static_cast<ssize_t>(s.size()));
}

TEST(ExecGateTest, ReadyThenOpenDeliversTheLineAndKeepsTheLifelineUntilShut) {
  Launcher launcher;  // first: a forked child must not hold the gate's ends
  ExecGate gate = ExecGate::make();
  const common::UniqueFd exited = pidFd(launcher.pid);
  ASSERT_TRUE(gate.pending());
  const int far = gate.remote();
  // "ready" may arrive in pieces and after the wait began.
  std::thread nano([&] {
    say(far, "rea");
    std::this_thread::sleep_for(milliseconds(20));
    say(far, "dy\n");
  });
  EXPECT_EQ(gate.awaitReady(exited.get(), milliseconds(10000)), ExecGate::Ready::kReady);
  nano.join();
  ASSERT_TRUE(gate.open());
  EXPECT_FALSE(gate.pending());
  EXPECT_TRUE(gate.holdsLifeline());
  std::string line(nanoinit::kGateOpen.size(), '\0');
  ASSERT_EQ(::recv(far, line.data(), line.size(), MSG_WAITALL), static_cast<ssize_t>(line.size()));
  EXPECT_EQ(line, nanoinit::kGateOpen);
  char c = 0;
  EXPECT_EQ(::recv(far, &c, 1, MSG_DONTWAIT), -1) << "the lifeline stays open after the line";
  EXPECT_EQ(errno, EAGAIN);
  gate.shut();
  EXPECT_FALSE(gate.holdsLifeline());
  EXPECT_EQ(::recv(far, &c, 1, 0), 0) << "shut() closes the lifeline";
}

TEST(ExecGateTest, OpenPassesADescriptorWithTheLine) {
  ExecGate gate = ExecGate::make();
  const int far = gate.remote();
  int pipe_fds[2];
  ASSERT_EQ(::pipe2(pipe_fds, O_CLOEXEC), 0);
  ASSERT_TRUE(gate.open(pipe_fds[1]));
  ::close(pipe_fds[1]);  // the runner's own copy: open() sent one, it kept nothing
  std::string line(nanoinit::kGateOpen.size(), '\0');
  iovec iov{line.data(), line.size()};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ASSERT_EQ(::recvmsg(far, &msg, MSG_WAITALL | MSG_CMSG_CLOEXEC),
            static_cast<ssize_t>(line.size()));
  EXPECT_EQ(line, nanoinit::kGateOpen);
  const cmsghdr* h = CMSG_FIRSTHDR(&msg);
  ASSERT_NE(h, nullptr);
  ASSERT_EQ(h->cmsg_type, SCM_RIGHTS);
  int received = -1;
  std::memcpy(&received, CMSG_DATA(h), sizeof(int));
  ASSERT_EQ(::write(received, "t", 1), 1);  // the same pipe
  char c = 0;
  EXPECT_EQ(::read(pipe_fds[0], &c, 1), 1);
  EXPECT_EQ(c, 't');
  ::close(received);
  ::close(pipe_fds[0]);
}

TEST(ExecGateTest, TheLauncherExitingFirstIsSaid) {
  Launcher launcher;  // first: a forked child must not hold the gate's ends
  ExecGate gate = ExecGate::make();
  const common::UniqueFd exited = pidFd(launcher.pid);
  launcher.end();
  EXPECT_EQ(gate.awaitReady(exited.get(), milliseconds(10000)), ExecGate::Ready::kLauncherExited);
}

TEST(ExecGateTest, AClosedOrWrongFarEndIsNotReady) {
  for (const std::string_view said : {"", "armed\n", "READY\n", "ready!"}) {
    Launcher launcher;
    ExecGate gate = ExecGate::make();
    const common::UniqueFd exited = pidFd(launcher.pid);
    if (!said.empty()) say(gate.remote(), said);
    gate.releaseRemote();  // the far end's only copy: closed
    EXPECT_EQ(gate.awaitReady(exited.get(), milliseconds(10000)), ExecGate::Ready::kClosed) << said;
  }
}

TEST(ExecGateTest, SilenceTimesOutAndAShutGateReadsAsClosed) {
  Launcher launcher;  // first: a forked child must not hold the gate's ends
  ExecGate gate = ExecGate::make();
  const common::UniqueFd exited = pidFd(launcher.pid);
  EXPECT_EQ(gate.awaitReady(exited.get(), milliseconds(50)), ExecGate::Ready::kTimedOut);
  const int far = gate.remote();
  gate.shut();
  char c = 0;
  EXPECT_EQ(::recv(far, &c, 1, 0), 0) << "nano-init must see the gate closed unopened";
  EXPECT_FALSE(gate.open());
}

}  // namespace
}  // namespace runner
