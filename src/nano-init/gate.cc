// The exec gate (gate.h).
#include "nano-init/gate.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "nano-init/errors.h"

namespace nanoinit {
namespace {

// Descriptors that came through the gate (close-on-exec); `truncated` if more were sent than
// fitted (the kernel closed the rest).
struct Passed {
  std::vector<common::UniqueFd> fds;
  bool truncated = false;
};

// One byte of the gate into *c, and any descriptors that came with it into *passed.
// recvmsg(2) on a socket, so that SCM_RIGHTS is not dropped; read(2) on anything else (a pipe).
// Returns what read(2) would; retries EINTR.
ssize_t readByte(int fd, char* c, Passed* passed) {
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 4)];
  while (true) {
    iovec iov{c, 1};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    const ssize_t n = ::recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == ENOTSOCK) {
      ssize_t r = -1;
      do {
        r = ::read(fd, c, 1);
      } while (r < 0 && errno == EINTR);
      return r;
    }
    if (n < 0) return n;
    for (cmsghdr* h = CMSG_FIRSTHDR(&msg); h != nullptr; h = CMSG_NXTHDR(&msg, h)) {
      if (h->cmsg_level != SOL_SOCKET || h->cmsg_type != SCM_RIGHTS) continue;
      const size_t count = (h->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int received = -1;
        std::memcpy(&received, CMSG_DATA(h) + i * sizeof(int), sizeof(int));
        passed->fds.emplace_back(received);
      }
    }
    if ((msg.msg_flags & MSG_CTRUNC) != 0) passed->truncated = true;
    return n;
  }
}

}  // namespace

common::UniqueFd awaitGate(int fd, common::UniqueFd* lifeline) {
  const std::string what = "egress gate (fd " + std::to_string(fd) + ")";
  if (fd < 3) throw StepError(what + ": must be 3 or above (0..2 are stdin, stdout, stderr)");
  if (::fcntl(fd, F_GETFD) < 0) throwErrno(what + ": fcntl(F_GETFD)");
  common::UniqueFd gate(fd);  // closed before returning, so the agent never inherits it
  ssize_t sent = -1;
  do {
    sent = ::send(fd, kGateReady.data(), kGateReady.size(), MSG_NOSIGNAL);
  } while (sent < 0 && errno == EINTR);
  // ENOTSOCK (a pipe), EPIPE or ECONNRESET (the launcher is gone): the read says what follows.
  std::string line;
  Passed passed;
  char c = 0;
  constexpr size_t kMax = 64;
  while (line.size() < kMax && (line.empty() || line.back() != '\n')) {
    const ssize_t n = readByte(fd, &c, &passed);
    // ECONNRESET: the launcher died with our "ready" unread; as closed.
    if (n < 0 && errno != ECONNRESET) throwErrno(what + ": read");
    if (n <= 0) break;
    line.push_back(c);
  }
  const bool opened = line == kGateOpen && passed.fds.size() <= 1 && !passed.truncated;
  if (opened && lifeline != nullptr) {
    struct stat st {};
    if (::fstat(fd, &st) != 0) throwErrno(what + ": fstat");
    if (!S_ISSOCK(st.st_mode) && !S_ISFIFO(st.st_mode)) {
      throw StepError(what +
                      ": --lifeline needs a socket or a pipe (nothing else can tell that the "
                      "launcher closed its end); the agent was not started");
    }
    if (::fcntl(fd, F_SETFD, FD_CLOEXEC) != 0) throwErrno(what + ": fcntl(F_SETFD)");
    *lifeline = std::move(gate);
  } else {
    gate.reset();
  }
  if (line.empty()) {
    throw StepError(what +
                    ": closed before egress was armed (the launcher stopped the start and "
                    "gives its reason, or it exited); the agent was not started");
  }
  if (line != kGateOpen) {
    throw StepError(what + ": expected \"armed\", got " + std::to_string(line.size()) +
                    " other bytes; the agent was not started");
  }
  if (passed.fds.size() > 1 || passed.truncated) {
    throw StepError(what +
                    ": more than one descriptor came with \"armed\" (at most one, "
                    "tun0); the agent was not started");
  }
  return passed.fds.empty() ? common::UniqueFd() : std::move(passed.fds.front());
}

Lifeline::Lifeline(asio::io_context& io, common::UniqueFd fd, std::function<void()> gone)
    : fd_(io, fd.release()), gone_(std::move(gone)) {
  wait();
}

void Lifeline::wait() {
  fd_.async_wait(asio::posix::stream_descriptor::wait_read, [this](const std::error_code& ec) {
    if (ec == asio::error::operation_aborted) return;  // nano-init is ending
    if (!ec) {
      std::array<char, 256> buf{};
      ssize_t n;
      do {
        n = ::read(fd_.native_handle(), buf.data(), buf.size());
      } while (n < 0 && errno == EINTR);
      if (n > 0) {
        wait();  // the launcher said something more: not ours to act on
        return;
      }
    }
    // End of file, or a read error (ECONNRESET: the launcher died with bytes unread): it is
    // gone. A gate that cannot be watched any more (`ec`) fails closed the same way.
    if (gone_) std::exchange(gone_, nullptr)();
  });
}

}  // namespace nanoinit
