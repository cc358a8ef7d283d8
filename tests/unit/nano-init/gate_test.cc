// The exec gate (src/nano-init/gate.h) over real pipes and socketpairs.
#include "nano-init/gate.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "nano-init/errors.h"

namespace nanoinit {
namespace {

struct Pipe {
  int r = -1;
  int w = -1;
  Pipe() {
    int fds[2];
    EXPECT_EQ(::pipe2(fds, O_CLOEXEC), 0);
    r = fds[0];
    w = fds[1];
  }
  ~Pipe() {
    if (w >= 0) ::close(w);
    if (r >= 0 && ::fcntl(r, F_GETFD) >= 0) ::close(r);
  }
  void send(const std::string& s) const {
    ASSERT_EQ(::write(w, s.data(), s.size()), static_cast<ssize_t>(s.size()));
  }
  void closeWrite() {
    ::close(w);
    w = -1;
  }
};

std::string gateError(int fd) {
  try {
    awaitGate(fd);
  } catch (const StepError& e) {
    return e.what();
  }
  return "";
}

TEST(GateTest, OpensOnArmedAndClosesTheDescriptor) {
  Pipe p;
  std::thread writer([&] { p.send("armed\n"); });  // may arrive after the read has blocked
  EXPECT_NO_THROW(awaitGate(p.r));
  writer.join();
  EXPECT_LT(::fcntl(p.r, F_GETFD), 0) << "the agent must not inherit the gate";
  p.r = -1;
}

TEST(GateTest, ClosedWithoutTheLineKeepsTheAgentBack) {
  Pipe p;
  p.closeWrite();
  const std::string e = gateError(p.r);
  EXPECT_NE(e.find("closed before egress was armed"), std::string::npos) << e;
  EXPECT_NE(e.find("fd " + std::to_string(p.r)), std::string::npos) << e;
  p.r = -1;  // closed by awaitGate
}

TEST(GateTest, AnythingButTheExactLineIsRefused) {
  for (const std::string& bad :
       std::vector<std::string>{"armed", "ARMED\n", "armedx\n", " armed\n", "ok\n", "armed\r\n",
                                std::string(100, 'a')}) {
    Pipe p;
    p.send(bad);
    p.closeWrite();
    const std::string e = gateError(p.r);
    EXPECT_NE(e.find("the agent was not started"), std::string::npos) << bad << ": " << e;
    p.r = -1;
  }
}

TEST(GateTest, OnASocketItSaysReadyBeforeItWaits) {
  int fds[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
  const int launcher = fds[0];
  std::thread gate([&] { EXPECT_NO_THROW(awaitGate(fds[1])); });
  // The launcher hears "ready" while nano-init is blocked on the gate, and only then opens it.
  std::string heard(kGateReady.size(), '\0');
  ASSERT_EQ(::recv(launcher, heard.data(), heard.size(), MSG_WAITALL),
            static_cast<ssize_t>(heard.size()));
  EXPECT_EQ(heard, kGateReady);
  ASSERT_EQ(::send(launcher, kGateOpen.data(), kGateOpen.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(kGateOpen.size()));
  gate.join();
  char c = 0;
  EXPECT_EQ(::recv(launcher, &c, 1, 0), 0) << "the gate's end is closed once it opened";
  ::close(launcher);
}

// Sends `line` on `fd` with `fds` attached (SCM_RIGHTS), as the podman tier passes tun0.
void sendWithFds(int fd, const std::string& line, const std::vector<int>& fds) {
  std::string copy = line;
  iovec iov{copy.data(), copy.size()};
  std::vector<char> control(CMSG_SPACE(sizeof(int) * fds.size()));
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control.data();
  msg.msg_controllen = control.size();
  cmsghdr* h = CMSG_FIRSTHDR(&msg);
  h->cmsg_level = SOL_SOCKET;
  h->cmsg_type = SCM_RIGHTS;
  h->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
  // An empty list still sends the (empty) SCM_RIGHTS header; memcpy must not see a null source.
  if (!fds.empty()) std::memcpy(CMSG_DATA(h), fds.data(), sizeof(int) * fds.size());
  ASSERT_EQ(::sendmsg(fd, &msg, MSG_NOSIGNAL), static_cast<ssize_t>(copy.size()));
}

// A socketpair whose [1] is the gate; "ready" already read off [0].
struct GateSocket {
  int fds[2] = {-1, -1};
  GateSocket() { EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0); }
  ~GateSocket() { ::close(fds[0]); }
};

// True once every copy of the pipe's write end is closed (the read end sees end of file).
bool writeEndGone(int read_end) {
  char c = 0;
  return ::read(read_end, &c, 1) == 0;
}

TEST(GateTest, TheDescriptorThatComesWithTheLineIsReturned) {
  GateSocket g;
  Pipe p;
  sendWithFds(g.fds[0], "armed\n", {p.w});
  p.closeWrite();
  common::UniqueFd passed = awaitGate(g.fds[1]);
  ASSERT_TRUE(passed.valid());
  EXPECT_EQ(::fcntl(passed.get(), F_GETFD) & FD_CLOEXEC, FD_CLOEXEC)
      << "the agent must not inherit it";
  ASSERT_EQ(::write(passed.get(), "x", 1), 1);  // the very pipe the launcher sent
  char c = 0;
  EXPECT_EQ(::read(p.r, &c, 1), 1);
  EXPECT_EQ(c, 'x');
}

TEST(GateTest, TheLineWithoutADescriptorReturnsNone) {
  GateSocket g;
  sendWithFds(g.fds[0], "armed\n", {});
  EXPECT_FALSE(awaitGate(g.fds[1]).valid());
}

TEST(GateTest, MoreThanOneDescriptorIsRefusedAndEveryOneClosed) {
  GateSocket g;
  Pipe p;
  const int second = ::dup(p.w);
  sendWithFds(g.fds[0], "armed\n", {p.w, second});
  ::close(second);
  p.closeWrite();
  const std::string e = gateError(g.fds[1]);
  EXPECT_NE(e.find("more than one descriptor"), std::string::npos) << e;
  EXPECT_TRUE(writeEndGone(p.r)) << "a refused descriptor was kept open";
}

TEST(GateTest, ADescriptorWithAnyOtherLineIsRefusedAndClosed) {
  GateSocket g;
  Pipe p;
  sendWithFds(g.fds[0], "ok\n", {p.w});
  p.closeWrite();
  const std::string e = gateError(g.fds[1]);
  EXPECT_NE(e.find("expected \"armed\""), std::string::npos) << e;
  EXPECT_TRUE(writeEndGone(p.r)) << "a refused descriptor was kept open";
}

TEST(GateTest, ALauncherGoneBeforeReadyKeepsTheAgentBack) {
  int fds[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
  ::close(fds[0]);  // the launcher died: "ready" has no reader, and no SIGPIPE may kill us
  const std::string e = gateError(fds[1]);
  EXPECT_NE(e.find("closed before egress was armed"), std::string::npos) << e;
}

TEST(GateTest, WithALifelineTheOpenedGateIsKeptCloseOnExecAndTheTunStillReturned) {
  GateSocket g;
  Pipe p;
  sendWithFds(g.fds[0], "armed\n", {p.w});
  p.closeWrite();
  common::UniqueFd lifeline;
  const common::UniqueFd passed = awaitGate(g.fds[1], &lifeline);
  EXPECT_TRUE(passed.valid());
  ASSERT_EQ(lifeline.get(), g.fds[1]) << "the opened gate itself is the lifeline";
  EXPECT_EQ(::fcntl(lifeline.get(), F_GETFD) & FD_CLOEXEC, FD_CLOEXEC)
      << "the agent must not inherit the lifeline";
  ASSERT_EQ(::send(g.fds[0], "x", 1, MSG_NOSIGNAL), 1) << "the launcher's end still has a reader";
}

TEST(GateTest, WithALifelineAGateClosedUnopenedIsStillRefusedAndNothingKept) {
  Pipe p;
  p.send("arm");
  p.closeWrite();
  common::UniqueFd lifeline;
  try {
    awaitGate(p.r, &lifeline);
    ADD_FAILURE() << "a gate closed without the line opened";
  } catch (const StepError& e) {
    EXPECT_NE(std::string(e.what()).find("the agent was not started"), std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(lifeline.valid());
  EXPECT_LT(::fcntl(p.r, F_GETFD), 0) << "a refused gate is closed";
  p.r = -1;
}

TEST(GateTest, ALifelineOnAnythingButASocketOrPipeIsRefused) {
  char path[] = "/tmp/gate-lifeline-XXXXXX";
  const int fd = ::mkstemp(path);
  ASSERT_GE(fd, 0);
  ::unlink(path);
  ASSERT_EQ(::write(fd, "armed\n", 6), 6);
  ASSERT_EQ(::lseek(fd, 0, SEEK_SET), 0);
  common::UniqueFd lifeline;
  try {
    awaitGate(fd, &lifeline);
    ADD_FAILURE() << "a regular file cannot tell that the launcher left";
  } catch (const StepError& e) {
    EXPECT_NE(std::string(e.what()).find("--lifeline needs a socket or a pipe"), std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(lifeline.valid());
  if (::fcntl(fd, F_GETFD) >= 0) ::close(fd);
}

TEST(GateTest, TheLifelineIgnoresBytesAndCallsGoneOnceWhenTheLauncherCloses) {
  Pipe p;
  p.send("armed\n");
  common::UniqueFd fd;
  awaitGate(p.r, &fd);
  p.r = -1;  // owned by the lifeline now
  asio::io_context io;
  int gone = 0;
  Lifeline lifeline(io, std::move(fd), [&] { ++gone; });
  p.send("anything the launcher says more is not a reason to stop\n");
  io.poll();
  io.restart();
  EXPECT_EQ(gone, 0);
  p.closeWrite();
  io.run();  // returns once the lifeline saw end of file and stopped waiting
  EXPECT_EQ(gone, 1);
}

TEST(GateTest, TheLifelineSeesALauncherThatDiedWithBytesUnread) {
  int fds[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
  ASSERT_EQ(::send(fds[0], "armed\n", 6, MSG_NOSIGNAL), 6);
  common::UniqueFd fd;
  awaitGate(fds[1], &fd);  // writes "ready", which the launcher never reads
  asio::io_context io;
  int gone = 0;
  Lifeline lifeline(io, std::move(fd), [&] { ++gone; });
  ::close(fds[0]);  // unread bytes: the reader may see ECONNRESET rather than end of file
  io.run();
  EXPECT_EQ(gone, 1);
}

TEST(GateTest, StdioOrAClosedDescriptorIsRefused) {
  EXPECT_NE(gateError(2).find("3 or above"), std::string::npos);
  Pipe p;
  const int fd = p.r;
  ::close(fd);
  p.r = -1;
  EXPECT_NE(gateError(fd).find("F_GETFD"), std::string::npos);
}

}  // namespace
}  // namespace nanoinit
