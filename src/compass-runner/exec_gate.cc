// The runner's side of the exec gate (exec_gate.h).
#include "compass-runner/exec_gate.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <string>

#include "compass-runner/backend.h"
#include "nano-init/gate.h"

namespace runner {

ExecGate ExecGate::make() {
  int fds[2] = {-1, -1};
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) {
    throw RunnerError(std::string("socketpair: ") + std::strerror(errno));
  }
  return ExecGate(common::UniqueFd(fds[0]), common::UniqueFd(fds[1]));
}

ExecGate::Ready ExecGate::awaitReady(int launcher, std::chrono::milliseconds timeout) {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + timeout;
  std::string heard;
  while (heard.size() < nanoinit::kGateReady.size()) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return Ready::kTimedOut;
    std::array<pollfd, 2> fds{{{local_.get(), POLLIN, 0}, {launcher, POLLIN, 0}}};
    if (::poll(fds.data(), fds.size(), static_cast<int>(left.count())) < 0) {
      if (errno == EINTR) continue;
      throw RunnerError(std::string("exec gate: poll: ") + std::strerror(errno));
    }
    if ((fds[0].revents & (POLLIN | POLLHUP | POLLERR)) == 0) {
      if (fds[1].revents != 0) return Ready::kLauncherExited;
      continue;
    }
    std::array<char, 8> buf{};
    const ssize_t n =
        ::recv(local_.get(), buf.data(), nanoinit::kGateReady.size() - heard.size(), MSG_DONTWAIT);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n < 0 && errno != ECONNRESET) {
      throw RunnerError(std::string("exec gate: recv: ") + std::strerror(errno));
    }
    if (n <= 0) return Ready::kClosed;
    heard.append(buf.data(), static_cast<size_t>(n));
  }
  return heard == nanoinit::kGateReady ? Ready::kReady : Ready::kClosed;
}

bool ExecGate::open(int passed_fd) noexcept {
  std::string line(nanoinit::kGateOpen);
  iovec iov{line.data(), line.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) std::array<char, CMSG_SPACE(sizeof(int))> control{};
  if (passed_fd >= 0) {
    msg.msg_control = control.data();
    msg.msg_controllen = control.size();
    cmsghdr* h = CMSG_FIRSTHDR(&msg);
    h->cmsg_level = SOL_SOCKET;
    h->cmsg_type = SCM_RIGHTS;
    h->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(h), &passed_fd, sizeof(int));
  }
  ssize_t n = -1;
  do {
    n = ::sendmsg(local_.get(), &msg, MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  if (n != static_cast<ssize_t>(line.size())) {
    local_.reset();
    return false;
  }
  opened_ = true;  // local_ stays open: the lifeline (`nano-init … --lifeline`)
  return true;
}

}  // namespace runner
