// The parts of the two load generators that do not depend on how the client reaches the
// upstream: see load_common.h.

#include "load_common.h"

#include <arpa/inet.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <system_error>
#include <thread>
#include <unordered_map>

namespace benchload {

namespace {

constexpr size_t kMaxEchoBacklogBytes = 1 << 20;  // upstream stops reading past this
constexpr int kListenBacklog = 4096;

volatile std::sig_atomic_t g_stop = 0;

void onSignal(int) { g_stop = 1; }

}  // namespace

void sysFail(const std::string& what) {
  throw std::system_error(errno, std::generic_category(), what);
}

void Fd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

// ---------------------------------------------------------------------------------------
// Arguments

Args::Args(const std::vector<std::string>& argv, size_t first) {
  for (size_t i = first; i < argv.size(); i += 2) {
    const std::string& key = argv[i];
    if (key.rfind("--", 0) != 0 || i + 1 >= argv.size()) {
      throw std::invalid_argument("expected --key value, got " + key);
    }
    values_[key.substr(2)] = argv[i + 1];
  }
}

std::string Args::str(const std::string& key, const std::string& def) const {
  auto it = values_.find(key);
  if (it != values_.end()) return it->second;
  if (def.empty()) throw std::invalid_argument("--" + key + " is required");
  return def;
}

uint64_t Args::num(const std::string& key, uint64_t def) const {
  auto it = values_.find(key);
  return it == values_.end() ? def : std::stoull(it->second);
}

// ---------------------------------------------------------------------------------------
// Bytes

void putU64(unsigned char* out, uint64_t v) {
  for (int i = 7; i >= 0; --i) {
    out[i] = static_cast<unsigned char>(v & 0xff);
    v >>= 8;
  }
}

uint64_t getU64(const unsigned char* in) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = (v << 8) | in[i];
  return v;
}

const std::vector<char>& sourceBytes() {
  static const std::vector<char> bytes = [] {
    std::vector<char> b(kIoChunkBytes);
    for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<char>((i * 131 + 7) & 0xff);
    return b;
  }();
  return bytes;
}

// ---------------------------------------------------------------------------------------
// Client side: blocking sockets with timeouts.

void setTimeouts(int fd) {
  timeval tv{};
  tv.tv_sec = kSocketTimeoutSeconds;
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

void sendAll(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR) continue;
      sysFail("send");
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
}

void recvExact(int fd, void* data, size_t n) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t r = ::recv(fd, p, n, 0);
    if (r == 0) throw std::runtime_error("recv: unexpected EOF");
    if (r < 0) {
      if (errno == EINTR) continue;
      sysFail("recv");
    }
    p += r;
    n -= static_cast<size_t>(r);
  }
}

void echoOnce(int fd) {
  sendAll(fd, "e", 1);
  char c = 0;
  recvExact(fd, &c, 1);
  if (c != 'e') throw std::runtime_error("echo: wrong byte");
}

double cpuSeconds() {
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

double secondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::vector<double> latencySamplesUs(uint64_t warmup, uint64_t count,
                                     const std::function<Fd()>& open_echoed) {
  std::vector<double> us;
  us.reserve(count);
  for (uint64_t i = 0; i < warmup + count; ++i) {
    const auto t0 = Clock::now();
    Fd fd = open_echoed();
    const double s = secondsSince(t0);
    fd.reset();
    if (i >= warmup) us.push_back(s * 1e6);
  }
  return us;
}

void printSamplesUs(const std::vector<double>& us) {
  std::printf("[");
  for (size_t i = 0; i < us.size(); ++i) std::printf("%s%.2f", i ? "," : "", us[i]);
  std::printf("]");
}

int runThroughputOn(int fd, uint64_t up, uint64_t down) {
  std::array<unsigned char, 17> header{};
  header[0] = 't';
  putU64(header.data() + 1, up);
  putU64(header.data() + 9, down);

  const double cpu0 = cpuSeconds();
  const auto t0 = Clock::now();
  sendAll(fd, header.data(), header.size());
  std::string send_error;
  std::thread sender;
  if (up > 0) {
    sender = std::thread([&] {
      try {
        const auto& src = sourceBytes();
        for (uint64_t left = up; left > 0;) {
          const size_t n = static_cast<size_t>(std::min<uint64_t>(left, src.size()));
          sendAll(fd, src.data(), n);
          left -= n;
        }
      } catch (const std::exception& e) {
        send_error = e.what();
        ::shutdown(fd, SHUT_RDWR);  // unblocks the receiver below
      }
    });
  }
  // Receive `down` bytes and the 8-byte ack that follows them.
  std::vector<char> buf(kIoChunkBytes);
  std::array<unsigned char, 8> ack{};
  const uint64_t total = down + ack.size();
  std::string recv_error;
  try {
    for (uint64_t got = 0; got < total;) {
      const size_t want = static_cast<size_t>(std::min<uint64_t>(total - got, buf.size()));
      const ssize_t r = ::recv(fd, buf.data(), want, 0);
      if (r == 0) throw std::runtime_error("EOF after " + std::to_string(got) + " bytes");
      if (r < 0) {
        if (errno == EINTR) continue;
        sysFail("recv");
      }
      // Copy whatever part of [down, down + 8) this chunk covers into the ack.
      const uint64_t lo = std::max<uint64_t>(got, down);
      const uint64_t hi = got + static_cast<uint64_t>(r);
      for (uint64_t k = lo; k < hi; ++k) ack[k - down] = static_cast<unsigned char>(buf[k - got]);
      got = hi;
    }
  } catch (const std::exception& e) {
    recv_error = e.what();
    ::shutdown(fd, SHUT_RDWR);
  }
  if (sender.joinable()) sender.join();
  const double s = secondsSince(t0);
  const double cpu = cpuSeconds() - cpu0;
  if (!send_error.empty()) throw std::runtime_error("sending: " + send_error);
  if (!recv_error.empty()) throw std::runtime_error("receiving: " + recv_error);
  if (getU64(ack.data()) != up) throw std::runtime_error("upstream received a wrong count");
  std::printf("{\"seconds\":%.6f,\"up_bytes\":%llu,\"down_bytes\":%llu,\"cpu_s\":%.4f}\n", s,
              static_cast<unsigned long long>(up), static_cast<unsigned long long>(down), cpu);
  return 0;
}

int runHoldWith(uint64_t count, const std::function<Fd()>& open_echoed) {
  std::vector<Fd> open;
  open.reserve(count);
  const auto t0 = Clock::now();
  for (uint64_t i = 0; i < count; ++i) open.push_back(open_echoed());
  std::printf("{\"open\":%zu,\"seconds\":%.6f}\n", open.size(), secondsSince(t0));
  std::fflush(stdout);
  // Hold until the orchestrator sends a newline or closes our stdin (or gives up on it).
  pollfd p{0, POLLIN, 0};
  const auto deadline = Clock::now() + std::chrono::seconds(kHoldMaxSeconds);
  while (Clock::now() < deadline && g_stop == 0) {
    if (::poll(&p, 1, 200) > 0) {
      char c;
      const ssize_t r = ::read(0, &c, 1);
      if (r <= 0 || c == '\n') break;
    }
  }
  open.clear();
  std::printf("{\"closed\":%llu}\n", static_cast<unsigned long long>(count));
  return 0;
}

// ---------------------------------------------------------------------------------------
// Upstream: one thread, epoll, non-blocking sockets, one state machine per connection.

namespace {

struct Conn {
  enum class Mode { kHead, kEcho, kTransfer };
  Fd fd;
  Mode mode = Mode::kHead;
  std::array<unsigned char, 17> head{};
  size_t head_len = 0;
  uint64_t up_want = 0;
  uint64_t up_got = 0;
  uint64_t down_want = 0;
  uint64_t down_sent = 0;
  std::string out;  // echo bytes or the ack, not yet written
  size_t out_off = 0;
  bool ack_queued = false;
  bool peer_eof = false;
  uint32_t events = 0;
};

class Upstream {
 public:
  explicit Upstream(const sockaddr_in& addr) : scratch_(kIoChunkBytes) {
    listener_.reset(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (listener_.get() < 0) sysFail("socket");
    const int one = 1;
    ::setsockopt(listener_.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(listener_.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) {
      sysFail("bind");
    }
    if (::listen(listener_.get(), kListenBacklog) != 0) sysFail("listen");
    epoll_.reset(::epoll_create1(EPOLL_CLOEXEC));
    if (epoll_.get() < 0) sysFail("epoll_create1");
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = listener_.get();
    if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, listener_.get(), &ev) != 0) sysFail("epoll_ctl");
  }

  [[nodiscard]] uint16_t port() const {
    sockaddr_in sin{};
    socklen_t len = sizeof sin;
    ::getsockname(listener_.get(), reinterpret_cast<sockaddr*>(&sin), &len);
    return ntohs(sin.sin_port);
  }

  void run() {
    std::array<epoll_event, 256> events{};
    while (g_stop == 0) {
      const int n = ::epoll_wait(epoll_.get(), events.data(), events.size(), 200);
      if (n < 0) {
        if (errno == EINTR) continue;
        sysFail("epoll_wait");
      }
      for (int i = 0; i < n; ++i) {
        const int fd = events[i].data.fd;
        if (fd == listener_.get()) {
          acceptAll();
          continue;
        }
        auto it = conns_.find(fd);
        if (it != conns_.end() && !step(*it->second)) conns_.erase(it);
      }
    }
  }

 private:
  void acceptAll() {
    for (;;) {
      const int fd = ::accept4(listener_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) return;  // EAGAIN, or EMFILE: the backlog keeps it for the next round
      const int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      auto conn = std::make_unique<Conn>();
      conn->fd.reset(fd);
      conn->events = EPOLLIN;
      epoll_event ev{};
      ev.events = conn->events;
      ev.data.fd = fd;
      if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &ev) != 0) continue;  // conn closes
      conns_.emplace(fd, std::move(conn));
    }
  }

  static bool wantsRead(const Conn& c) {
    if (c.peer_eof) return false;
    if (c.mode == Conn::Mode::kEcho) return c.out.size() - c.out_off < kMaxEchoBacklogBytes;
    return true;
  }

  static bool wantsWrite(const Conn& c) {
    return c.out_off < c.out.size() ||
           (c.mode == Conn::Mode::kTransfer && c.down_sent < c.down_want);
  }

  /// Takes bytes read from the peer. False on a protocol error.
  static bool consume(Conn& c, const unsigned char* p, size_t n) {
    while (n > 0 && c.mode == Conn::Mode::kHead) {
      c.head[c.head_len++] = *p++;
      --n;
      if (c.head[0] == 'e') {
        c.mode = Conn::Mode::kEcho;
        c.out.push_back('e');
      } else if (c.head[0] != 't') {
        return false;
      } else if (c.head_len == c.head.size()) {
        c.mode = Conn::Mode::kTransfer;
        c.up_want = getU64(c.head.data() + 1);
        c.down_want = getU64(c.head.data() + 9);
      }
    }
    if (n == 0) return true;
    if (c.mode == Conn::Mode::kEcho) {
      c.out.append(reinterpret_cast<const char*>(p), n);
      return true;
    }
    c.up_got += n;
    return c.up_got <= c.up_want;
  }

  /// Writes pending bytes until done or EAGAIN. False on a socket error.
  static bool flush(Conn& c) {
    while (c.out_off < c.out.size()) {
      const ssize_t w =
          ::send(c.fd.get(), c.out.data() + c.out_off, c.out.size() - c.out_off, MSG_NOSIGNAL);
      if (w < 0) return errno == EAGAIN || errno == EINTR;
      c.out_off += static_cast<size_t>(w);
    }
    c.out.clear();
    c.out_off = 0;
    if (c.mode != Conn::Mode::kTransfer) return true;
    const auto& src = sourceBytes();
    while (c.down_sent < c.down_want) {
      const size_t n =
          static_cast<size_t>(std::min<uint64_t>(c.down_want - c.down_sent, src.size()));
      const ssize_t w = ::send(c.fd.get(), src.data(), n, MSG_NOSIGNAL);
      if (w < 0) return errno == EAGAIN || errno == EINTR;
      c.down_sent += static_cast<uint64_t>(w);
    }
    return true;
  }

  /// Advances one connection. False when it is finished (or failed) and should be closed.
  bool step(Conn& c) {
    // Bounded reads per step, so a busy upload cannot starve its own download.
    for (int i = 0; i < 8 && wantsRead(c); ++i) {
      const ssize_t r = ::recv(c.fd.get(), scratch_.data(), scratch_.size(), 0);
      if (r > 0) {
        if (!consume(c, scratch_.data(), static_cast<size_t>(r))) return false;
        continue;
      }
      if (r == 0) {
        c.peer_eof = true;
        break;
      }
      if (errno == EAGAIN || errno == EINTR) break;
      return false;
    }
    if (!flush(c)) return false;
    if (c.mode == Conn::Mode::kTransfer && !c.ack_queued && c.up_got == c.up_want &&
        c.down_sent == c.down_want) {
      c.ack_queued = true;
      std::array<unsigned char, 8> ack{};
      putU64(ack.data(), c.up_got);
      c.out.assign(reinterpret_cast<const char*>(ack.data()), ack.size());
      if (!flush(c)) return false;
    }
    if (c.peer_eof && !wantsWrite(c)) return false;  // nothing left to say: close
    if (c.peer_eof && c.mode == Conn::Mode::kTransfer && !c.ack_queued && c.up_got < c.up_want) {
      return false;  // the client gave up mid-transfer
    }
    const uint32_t want = (wantsRead(c) ? EPOLLIN : 0u) | (wantsWrite(c) ? EPOLLOUT : 0u);
    if (want != c.events) {
      epoll_event ev{};
      ev.events = want;
      ev.data.fd = c.fd.get();
      if (::epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, c.fd.get(), &ev) != 0) return false;
      c.events = want;
    }
    return true;
  }

  Fd listener_;
  Fd epoll_;
  std::vector<unsigned char> scratch_;
  std::unordered_map<int, std::unique_ptr<Conn>> conns_;
};

}  // namespace

int runServeOn(const sockaddr_in& addr) {
  Upstream upstream(addr);
  std::printf("{\"port\":%u}\n", static_cast<unsigned>(upstream.port()));
  std::fflush(stdout);
  upstream.run();
  return 0;
}

// ---------------------------------------------------------------------------------------
// Process set-up

bool stopRequested() { return g_stop != 0; }

void setUpProcess() {
  std::signal(SIGPIPE, SIG_IGN);
  struct sigaction sa {};
  sa.sa_handler = onSignal;
  ::sigaction(SIGTERM, &sa, nullptr);
  ::sigaction(SIGINT, &sa, nullptr);
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &rl);
  }
}

}  // namespace benchload
