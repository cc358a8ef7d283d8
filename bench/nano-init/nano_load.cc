// nano-init-bench-load: the data plane of bench/nano_init_bench.py. One binary, five roles:
//   serve       the upstream: a single-threaded epoll server (in the bench's "up" netns)
//   latency     sequential connects (connect → 'e' → 'e' echoed), timed
//   throughput  one connection, N bytes up and M bytes down, timed
//   hold        opens N connections, reports, keeps them open until stdin closes or sends '\n'
//   agent       reads one command per line on stdin and runs it in a forked child, so one
//               long-lived process inside a sandbox (nano-init's agent, a pasta or
//               slirp4netns netns) can run every measurement there
//
// Same wire protocol as bench/load.cc (sam_box_bench.py's load generator), but this client
// dials a plain TCP target by NAME, resolved once with getaddrinfo() in the namespace it runs
// in (inside nano-init: through the virtual DNS), and the upstream listens on the bench's
// veth instead of loopback. load.cc refuses anything outside 127.0.0.0/8, so it cannot be
// reused as is.
//
// Addresses: every address this tool binds or dials must be in 127.0.0.0/8, 198.18.0.0/15
// (RFC 2544 benchmarking space: the bench's own veth between its netns) or 100.64.0.0/10
// (nano-init's synthetic addresses, which exist only inside a sandbox and lead to its tun0).
// Anything else is refused before a packet is sent.
//
// Wire protocol between client and upstream:
//   'e'                      upstream answers 'e', then echoes every byte until EOF
//   't' u64be up u64be down  client sends `up` bytes; upstream sends `down` bytes and then,
//                            once it has received all `up` and sent all `down`, the 8-byte
//                            big-endian count of bytes it received
// Results go to stdout as one JSON object per line. A role that fails prints
// {"error":"..."} (agent children) or a line on stderr (direct runs) and exits 1.

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kIoChunkBytes = 1 << 20;         // per read/write call on bulk data
constexpr size_t kMaxEchoBacklogBytes = 1 << 20;  // upstream stops reading past this
constexpr int kSocketTimeoutSeconds = 30;         // every blocking client call
constexpr int kHoldMaxSeconds = 300;              // `hold` gives up waiting for stdin
constexpr int kListenBacklog = 4096;
constexpr size_t kMaxCommandBytes = 4096;  // one agent command line

volatile std::sig_atomic_t g_stop = 0;

[[noreturn]] void sysFail(const std::string& what) {
  throw std::system_error(errno, std::generic_category(), what);
}

/// Owns one file descriptor.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) reset(std::exchange(o.fd_, -1));
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }
  [[nodiscard]] int get() const { return fd_; }
  void reset(int fd = -1) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

// ---------------------------------------------------------------------------------------
// Arguments: `--key value` pairs after the role.

class Args {
 public:
  Args(const std::vector<std::string>& argv, size_t first) {
    for (size_t i = first; i < argv.size(); i += 2) {
      const std::string& key = argv[i];
      if (key.rfind("--", 0) != 0 || i + 1 >= argv.size()) {
        throw std::invalid_argument("expected --key value, got " + key);
      }
      values_[key.substr(2)] = argv[i + 1];
    }
  }
  [[nodiscard]] std::string str(const std::string& key, const std::string& def = "") const {
    auto it = values_.find(key);
    if (it != values_.end()) return it->second;
    if (def.empty()) throw std::invalid_argument("--" + key + " is required");
    return def;
  }
  [[nodiscard]] uint64_t num(const std::string& key, uint64_t def) const {
    auto it = values_.find(key);
    return it == values_.end() ? def : std::stoull(it->second);
  }

 private:
  std::map<std::string, std::string> values_;
};

/// True for the only IPv4 space this tool may touch (see the top of the file).
bool permitted(const in_addr& a) {
  const uint32_t v = ntohl(a.s_addr);
  return (v >> 24) == 127 ||                   // 127.0.0.0/8
         (v >> 17) == (0xC612'0000u >> 17) ||  // 198.18.0.0/15
         (v >> 22) == (0x6440'0000u >> 22);    // 100.64.0.0/10
}

/// "HOST:PORT" → sockaddr_in, HOST resolved with getaddrinfo (IPv4); refused outside
/// permitted().
sockaddr_in resolve(const std::string& text, double* seconds = nullptr) {
  const auto colon = text.rfind(':');
  if (colon == std::string::npos) throw std::invalid_argument("want host:port, got " + text);
  const std::string host = text.substr(0, colon);
  const unsigned long port = std::stoul(text.substr(colon + 1));
  if (port > 65535) throw std::invalid_argument("bad port in " + text);
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const auto t0 = Clock::now();
  const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (seconds != nullptr) *seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  if (rc != 0 || res == nullptr) {
    throw std::runtime_error("cannot resolve " + host + ": " + ::gai_strerror(rc));
  }
  sockaddr_in sin{};
  std::memcpy(&sin, res->ai_addr, sizeof sin);
  ::freeaddrinfo(res);
  if (!permitted(sin.sin_addr)) {
    char buf[INET_ADDRSTRLEN] = {};
    ::inet_ntop(AF_INET, &sin.sin_addr, buf, sizeof buf);
    throw std::invalid_argument("refusing " + host + " = " + buf +
                                ": outside 127/8, 198.18/15 and 100.64/10");
  }
  sin.sin_port = htons(static_cast<uint16_t>(port));
  return sin;
}

std::string addressText(const sockaddr_in& sin) {
  char buf[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &sin.sin_addr, buf, sizeof buf);
  return buf;
}

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

/// Reads exactly n bytes; EOF or a timeout is an error.
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

Fd openStream(const sockaddr_in& target) {
  Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (fd.get() < 0) sysFail("socket");
  setTimeouts(fd.get());
  const int one = 1;
  ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&target), sizeof target) != 0) {
    sysFail("connect " + addressText(target));
  }
  return fd;
}

/// openStream, then one byte echoed: the path carries data end to end.
Fd openEchoed(const sockaddr_in& target) {
  Fd fd = openStream(target);
  sendAll(fd.get(), "e", 1);
  char c = 0;
  recvExact(fd.get(), &c, 1);
  if (c != 'e') throw std::runtime_error("echo: wrong byte");
  return fd;
}

/// CPU time (user + system) of this process, all threads, in seconds.
double cpuSeconds() {
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

double secondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

int runLatency(const Args& args) {
  double resolve_s = 0;
  const sockaddr_in target = resolve(args.str("target"), &resolve_s);
  const uint64_t count = args.num("count", 500);
  const uint64_t warmup = args.num("warmup", 20);
  std::vector<double> us;
  us.reserve(count);
  for (uint64_t i = 0; i < warmup + count; ++i) {
    const auto t0 = Clock::now();
    Fd fd = openEchoed(target);
    const double s = secondsSince(t0);
    fd.reset();
    if (i >= warmup) us.push_back(s * 1e6);
  }
  std::printf("{\"address\":\"%s\",\"resolve_us\":%.1f,\"samples_us\":[",
              addressText(target).c_str(), resolve_s * 1e6);
  for (size_t i = 0; i < us.size(); ++i) std::printf("%s%.2f", i ? "," : "", us[i]);
  std::printf("]}\n");
  return 0;
}

int runThroughput(const Args& args) {
  const sockaddr_in target = resolve(args.str("target"));
  const uint64_t up = args.num("up", 0);
  const uint64_t down = args.num("down", 0);
  Fd fd = openStream(target);
  std::array<unsigned char, 17> header{};
  header[0] = 't';
  putU64(header.data() + 1, up);
  putU64(header.data() + 9, down);

  const double cpu0 = cpuSeconds();
  const auto t0 = Clock::now();
  sendAll(fd.get(), header.data(), header.size());
  std::string send_error;
  std::thread sender;
  if (up > 0) {
    sender = std::thread([&] {
      try {
        const auto& src = sourceBytes();
        for (uint64_t left = up; left > 0;) {
          const size_t n = static_cast<size_t>(std::min<uint64_t>(left, src.size()));
          sendAll(fd.get(), src.data(), n);
          left -= n;
        }
      } catch (const std::exception& e) {
        send_error = e.what();
        ::shutdown(fd.get(), SHUT_RDWR);  // unblocks the receiver below
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
      const ssize_t r = ::recv(fd.get(), buf.data(), want, 0);
      if (r == 0) throw std::runtime_error("EOF after " + std::to_string(got) + " bytes");
      if (r < 0) {
        if (errno == EINTR) continue;
        sysFail("recv");
      }
      const uint64_t lo = std::max<uint64_t>(got, down);
      const uint64_t hi = got + static_cast<uint64_t>(r);
      for (uint64_t k = lo; k < hi; ++k) ack[k - down] = static_cast<unsigned char>(buf[k - got]);
      got = hi;
    }
  } catch (const std::exception& e) {
    recv_error = e.what();
    ::shutdown(fd.get(), SHUT_RDWR);
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

int runHold(const Args& args) {
  const sockaddr_in target = resolve(args.str("target"));
  const uint64_t count = args.num("count", 1000);
  std::vector<Fd> open;
  open.reserve(count);
  const auto t0 = Clock::now();
  for (uint64_t i = 0; i < count; ++i) open.push_back(openEchoed(target));
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

int runServe(const Args& args) {
  Upstream upstream(resolve(args.str("listen")));
  std::printf("{\"port\":%u}\n", static_cast<unsigned>(upstream.port()));
  std::fflush(stdout);
  upstream.run();
  return 0;
}

// ---------------------------------------------------------------------------------------
// Agent: one command per line, each run in a forked child (fresh rusage, fresh fds); the
// child's JSON lines pass through, then {"done":STATUS}. Stdin is read one byte at a time so
// that nothing meant for a `hold` child (its closing newline) is buffered here.

std::string jsonEscape(const std::string& s) {
  std::string out;
  for (const char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += ' ';
    } else {
      out += c;
    }
  }
  return out;
}

int runRole(const std::vector<std::string>& argv);

int runAgent() {
  for (;;) {
    std::string line;
    for (;;) {
      char c;
      const ssize_t r = ::read(0, &c, 1);
      if (g_stop != 0) return 0;  // SIGTERM/SIGINT (nano-init forwards them): done
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) return 0;  // stdin closed: done
      if (c == '\n') break;
      if (line.size() >= kMaxCommandBytes) return 1;
      line += c;
    }
    std::vector<std::string> argv{"agent-child"};
    for (size_t i = 0; i < line.size();) {
      const size_t j = line.find(' ', i);
      const size_t end = j == std::string::npos ? line.size() : j;
      if (end > i) argv.push_back(line.substr(i, end - i));
      i = end + 1;
    }
    if (argv.size() < 2) continue;
    if (argv[1] == "agent") {
      std::printf("{\"error\":\"no nested agent\"}\n{\"done\":2}\n");
      std::fflush(stdout);
      continue;
    }
    std::fflush(stdout);
    const pid_t pid = ::fork();
    if (pid < 0) return 1;
    if (pid == 0) {
      // A measurement stops at once when the agent is told to stop.
      std::signal(SIGTERM, SIG_DFL);
      std::signal(SIGINT, SIG_DFL);
      int rc = 1;
      try {
        rc = runRole(argv);
      } catch (const std::exception& e) {
        std::printf("{\"error\":\"%s: %s\"}\n", argv[1].c_str(), jsonEscape(e.what()).c_str());
      }
      std::fflush(stdout);
      ::_exit(rc);
    }
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      if (g_stop != 0) ::kill(pid, SIGTERM);  // the child stops too (it exits on g_stop)
    }
    const int rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    std::printf("{\"done\":%d}\n", rc);
    std::fflush(stdout);
  }
}

int runRole(const std::vector<std::string>& argv) {
  const std::string& role = argv[1];
  const Args args(argv, 2);
  if (role == "serve") return runServe(args);
  if (role == "latency") return runLatency(args);
  if (role == "throughput") return runThroughput(args);
  if (role == "hold") return runHold(args);
  throw std::invalid_argument("unknown role " + role);
}

void raiseFileLimit() {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &rl);
  }
}

void onSignal(int) { g_stop = 1; }

}  // namespace

int main(int argc, char** argv) {
  std::signal(SIGPIPE, SIG_IGN);
  struct sigaction sa {};
  sa.sa_handler = onSignal;
  ::sigaction(SIGTERM, &sa, nullptr);
  ::sigaction(SIGINT, &sa, nullptr);
  raiseFileLimit();
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s serve|latency|throughput|hold|agent --key value ...\n",
                 argv[0]);
    return 2;
  }
  const std::vector<std::string> args(argv, argv + argc);
  try {
    if (args[1] == "agent") return runAgent();
    return runRole(args);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "nano-init-bench-load %s: %s\n", args[1].c_str(), e.what());
    return 1;
  }
}
