#include "compass-runner/microvm_control.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <mutex>

#include "compass-runner/backend.h"
#include "compass-runner/process.h"

namespace runner::microvm {
namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kMaxLine = 4096;

int remainingMs(std::optional<Clock::time_point> deadline) {
  if (!deadline) return -1;
  const auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(*deadline - Clock::now()).count();
  return left < 0 ? 0 : static_cast<int>(std::min<int64_t>(left, 1 << 30));
}

}  // namespace

ControlChannel::ControlChannel(const std::string& path) {
  sockaddr_un addr{};
  if (path.size() >= sizeof addr.sun_path)
    throw RunnerError("control socket path too long: " + path);
  listener_.reset(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!listener_.valid()) throw RunnerError(std::string("socket: ") + std::strerror(errno));
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size());
  ::unlink(path.c_str());
  const mode_t old = ::umask(0177);
  const int rc = ::bind(listener_.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  const int err = errno;
  ::umask(old);
  if (rc != 0) throw RunnerError("bind " + path + ": " + std::strerror(err));
  if (::listen(listener_.get(), 1) != 0) {
    throw RunnerError("listen " + path + ": " + std::strerror(errno));
  }
}

bool ControlChannel::accept(int process, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (true) {
    pollfd fds[2] = {{listener_.get(), POLLIN, 0}, {process, POLLIN, 0}};
    const int n = ::poll(fds, 2, remainingMs(deadline));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    if (fds[0].revents & POLLIN) {
      common::UniqueFd conn(::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
      if (conn.valid()) {
        std::lock_guard lock(send_mu_);
        conn_ = std::move(conn);
        listener_.reset();  // one guest, one connection
        return true;
      }
    }
    if (fds[1].revents != 0) return false;
  }
}

ControlEvent ControlChannel::next(int process, std::optional<std::chrono::milliseconds> timeout) {
  std::optional<Clock::time_point> deadline;
  if (timeout) deadline = Clock::now() + *timeout;
  while (true) {
    if (const size_t nl = buffer_.find('\n'); nl != std::string::npos) {
      ControlEvent e{ControlEvent::Kind::kLine, buffer_.substr(0, std::min(nl, kMaxLine))};
      buffer_.erase(0, nl + 1);
      if (!e.line.empty() && e.line.back() == '\r') e.line.pop_back();
      return e;
    }
    if (eof_ || !conn_.valid()) return {ControlEvent::Kind::kClosed, ""};
    pollfd fds[2] = {{conn_.get(), POLLIN, 0}, {process, POLLIN, 0}};
    const int n = ::poll(fds, process >= 0 ? 2 : 1, remainingMs(deadline));
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) return {ControlEvent::Kind::kTimeout, ""};
    if (n < 0) return {ControlEvent::Kind::kClosed, ""};
    if (fds[0].revents != 0) {
      char buf[1024];
      const ssize_t got = ::read(conn_.get(), buf, sizeof buf);
      if (got < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      if (got <= 0) {
        eof_ = true;
        continue;
      }
      buffer_.append(buf, static_cast<size_t>(got));
      if (buffer_.size() > 4 * kMaxLine && buffer_.find('\n') == std::string::npos) {
        buffer_.resize(kMaxLine);
        buffer_ += '\n';
      }
      continue;
    }
    if (process >= 0 && fds[1].revents != 0) return {ControlEvent::Kind::kProcessExited, ""};
  }
}

bool ControlChannel::sendStop() { return sendLine("stop"); }

bool ControlChannel::sendLine(const std::string& line) {
  if (line.find('\n') != std::string::npos || line.size() > kMaxSendLine) return false;
  const std::string data = line + "\n";
  std::lock_guard lock(send_mu_);
  if (!conn_.valid() || send_broken_) return false;
  // Never blocks the caller for long, and never leaves part of a line: a line the guest does
  // not take within kSendTimeout ends the runner's side of the stream (SHUT_WR), so the guest
  // reads the fragment as an unterminated last line, which its `read` drops.
  const auto deadline = Clock::now() + kSendTimeout;
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n =
        ::send(conn_.get(), data.data() + done, data.size() - done, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{conn_.get(), POLLOUT, 0};
      const int ms = remainingMs(deadline);
      if (ms > 0 && ::poll(&p, 1, ms) > 0 && (p.revents & POLLOUT) != 0) continue;
      if (done == 0) return false;  // nothing sent: the stream is still whole
    }
    if (done > 0) {
      send_broken_ = true;
      ::shutdown(conn_.get(), SHUT_WR);
    }
    return false;
  }
  return true;
}

bool signalPidFd(int pidfd, int sig) {
  return pidfd >= 0 && ::syscall(SYS_pidfd_send_signal, pidfd, sig, nullptr, 0) == 0;
}

bool waitPidFd(int pidfd, std::chrono::milliseconds timeout) {
  pollfd fd{pidfd, POLLIN, 0};
  const auto deadline = Clock::now() + timeout;
  while (true) {
    const int n = ::poll(&fd, 1, remainingMs(deadline));
    if (n < 0 && errno == EINTR) continue;
    return n > 0;
  }
}

}  // namespace runner::microvm
