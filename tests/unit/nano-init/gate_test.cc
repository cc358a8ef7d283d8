// The exec gate (src/nano-init/gate.h) over real pipes and socketpairs.
#include "nano-init/gate.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <thread>
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

TEST(GateTest, ALauncherGoneBeforeReadyKeepsTheAgentBack) {
  int fds[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
  ::close(fds[0]);  // the launcher died: "ready" has no reader, and no SIGPIPE may kill us
  const std::string e = gateError(fds[1]);
  EXPECT_NE(e.find("closed before egress was armed"), std::string::npos) << e;
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
