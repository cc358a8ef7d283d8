// The exec gate (gate.h).
#include "nano-init/gate.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <string>

#include "nano-init/errors.h"

namespace nanoinit {

void awaitGate(int fd) {
  const std::string what = "egress gate (fd " + std::to_string(fd) + ")";
  if (fd < 3) throw StepError(what + ": must be 3 or above (0..2 are stdin, stdout, stderr)");
  if (::fcntl(fd, F_GETFD) < 0) throwErrno(what + ": fcntl(F_GETFD)");
  ssize_t sent = -1;
  do {
    sent = ::send(fd, kGateReady.data(), kGateReady.size(), MSG_NOSIGNAL);
  } while (sent < 0 && errno == EINTR);
  // ENOTSOCK (a pipe), EPIPE or ECONNRESET (the launcher is gone): the read says what follows.
  std::string line;
  char c = 0;
  constexpr size_t kMax = 64;
  while (line.size() < kMax && (line.empty() || line.back() != '\n')) {
    const ssize_t n = ::read(fd, &c, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throwErrno(what + ": read");
    if (n == 0) break;
    line.push_back(c);
  }
  ::close(fd);
  if (line == kGateOpen) return;
  if (line.empty()) {
    throw StepError(what +
                    ": closed before egress was armed (the launcher failed to arm it, or "
                    "exited); the agent was not started");
  }
  throw StepError(what + ": expected \"armed\", got " + std::to_string(line.size()) +
                  " other bytes; the agent was not started");
}

}  // namespace nanoinit
