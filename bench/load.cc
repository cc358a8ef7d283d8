// sam-box-bench-load: the data plane of bench/sam_box_bench.py. One binary, four roles:
//   serve       the upstream: a single-threaded epoll server on 127.0.0.1
//   latency     sequential tunnel set-ups (connect → CONNECT → 200 → one byte echoed), timed
//   throughput  one tunnel, N bytes up and M bytes down at the same time, timed
//   hold        opens N tunnels, reports, keeps them open until stdin closes
// Python cannot drive a loopback link at GB/s, and its per-call overhead would dilute the
// cost of the proxy being measured; so the bytes are moved here and Python only orchestrates.
//
// Loopback only: every TCP address this tool dials or binds must be in 127.0.0.0/8.
//
// Wire protocol between client and upstream (after the tunnel, if any, is up):
//   'e'                      upstream answers 'e', then echoes every byte until EOF
//   't' u64be up u64be down  client sends `up` bytes; upstream sends `down` bytes and then,
//                            once it has received all `up` and sent all `down`, the 8-byte
//                            big-endian count of bytes it received
// Results go to stdout as one JSON object per line; errors to stderr, exit status 1.

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
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

constexpr size_t kIoChunkBytes = 1 << 20;            // per read/write call on bulk data
constexpr size_t kMaxEchoBacklogBytes = 1 << 20;     // upstream stops reading past this
constexpr size_t kMaxResponseHeadBytes = 16 * 1024;  // a proxy's 200 must fit in this
constexpr int kSocketTimeoutSeconds = 30;            // every blocking client call
constexpr int kHoldMaxSeconds = 300;                 // `hold` gives up waiting for stdin
constexpr int kListenBacklog = 4096;

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
  Args(int argc, char** argv, int first) {
    for (int i = first; i < argc; i += 2) {
      const std::string key = argv[i];
      if (key.rfind("--", 0) != 0 || i + 1 >= argc) {
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

/// "127.x.y.z:port" → sockaddr_in; anything outside 127.0.0.0/8 is refused.
sockaddr_in loopbackAddress(const std::string& text) {
  const auto colon = text.rfind(':');
  if (colon == std::string::npos) throw std::invalid_argument("want host:port, got " + text);
  sockaddr_in sin{};
  sin.sin_family = AF_INET;
  if (::inet_pton(AF_INET, text.substr(0, colon).c_str(), &sin.sin_addr) != 1) {
    throw std::invalid_argument("want a dotted IPv4 address, got " + text);
  }
  if ((ntohl(sin.sin_addr.s_addr) >> 24) != 127) {
    throw std::invalid_argument("refusing non-loopback address " + text);
  }
  const unsigned long port = std::stoul(text.substr(colon + 1));
  if (port > 65535) throw std::invalid_argument("bad port in " + text);
  sin.sin_port = htons(static_cast<uint16_t>(port));
  return sin;
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

/// How the client reaches the upstream: directly, or through a proxy that speaks CONNECT.
struct Via {
  enum class Kind { kDirect, kTcpProxy, kUnixProxy } kind = Kind::kDirect;
  sockaddr_in tcp{};  // the upstream (direct) or the proxy (tcp)
  sockaddr_un unix_addr{};
  std::string authority;  // CONNECT target, proxies only
};

Via parseVia(const Args& args) {
  Via via;
  const std::string spec = args.str("via");
  if (spec == "direct") {
    via.tcp = loopbackAddress(args.str("target"));
  } else if (spec.rfind("tcp:", 0) == 0) {
    via.kind = Via::Kind::kTcpProxy;
    via.tcp = loopbackAddress(spec.substr(4));
    via.authority = args.str("authority");
  } else if (spec.rfind("unix:", 0) == 0) {
    via.kind = Via::Kind::kUnixProxy;
    const std::string path = spec.substr(5);
    if (path.size() >= sizeof(via.unix_addr.sun_path)) {
      throw std::invalid_argument("socket path too long");
    }
    via.unix_addr.sun_family = AF_UNIX;
    std::memcpy(via.unix_addr.sun_path, path.c_str(), path.size() + 1);
    via.authority = args.str("authority");
  } else {
    throw std::invalid_argument("--via: want direct, tcp:HOST:PORT or unix:PATH");
  }
  return via;
}

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

/// Sends the CONNECT and reads the response head. Returns the status code; a proxy sends
/// nothing after a 200 until we do, so bytes past the head are a protocol error.
int connectRequest(int fd, const std::string& authority) {
  const std::string req = "CONNECT " + authority + " HTTP/1.1\r\nHost: " + authority + "\r\n\r\n";
  sendAll(fd, req.data(), req.size());
  std::string head;
  std::array<char, 4096> buf{};
  for (;;) {
    const auto end = head.find("\r\n\r\n");
    if (end != std::string::npos) {
      if (end + 4 != head.size()) throw std::runtime_error("bytes after the 200 head");
      break;
    }
    if (head.size() > kMaxResponseHeadBytes) throw std::runtime_error("response head too big");
    const ssize_t r = ::recv(fd, buf.data(), buf.size(), 0);
    if (r == 0) throw std::runtime_error("proxy closed before a response head: " + head);
    if (r < 0) {
      if (errno == EINTR) continue;
      sysFail("recv response head");
    }
    head.append(buf.data(), static_cast<size_t>(r));
  }
  // "HTTP/1.x NNN ..."
  if (head.size() < 12 || head.rfind("HTTP/1.", 0) != 0) {
    throw std::runtime_error("bad response head: " + head.substr(0, 80));
  }
  return std::stoi(head.substr(9, 3));
}

/// A connected stream to the upstream: directly, or a tunnel that answered 200.
Fd openStream(const Via& via) {
  const bool unix_socket = via.kind == Via::Kind::kUnixProxy;
  Fd fd(::socket(unix_socket ? AF_UNIX : AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (fd.get() < 0) sysFail("socket");
  setTimeouts(fd.get());
  int rc;
  if (unix_socket) {
    rc = ::connect(fd.get(), reinterpret_cast<const sockaddr*>(&via.unix_addr),
                   sizeof via.unix_addr);
  } else {
    const int one = 1;
    ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    rc = ::connect(fd.get(), reinterpret_cast<const sockaddr*>(&via.tcp), sizeof via.tcp);
  }
  if (rc != 0) sysFail("connect");
  if (via.kind != Via::Kind::kDirect) {
    const int status = connectRequest(fd.get(), via.authority);
    if (status != 200) {
      throw std::runtime_error("CONNECT " + via.authority + ": status " + std::to_string(status));
    }
  }
  return fd;
}

/// openStream, then one byte echoed: the tunnel carries data end to end.
Fd openEchoed(const Via& via) {
  Fd fd = openStream(via);
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
  const Via via = parseVia(args);
  const uint64_t count = args.num("count", 500);
  const uint64_t warmup = args.num("warmup", 20);
  std::vector<double> us;
  us.reserve(count);
  for (uint64_t i = 0; i < warmup + count; ++i) {
    const auto t0 = Clock::now();
    Fd fd = openEchoed(via);
    const double s = secondsSince(t0);
    fd.reset();
    if (i >= warmup) us.push_back(s * 1e6);
  }
  std::printf("{\"samples_us\":[");
  for (size_t i = 0; i < us.size(); ++i) std::printf("%s%.2f", i ? "," : "", us[i]);
  std::printf("]}\n");
  return 0;
}

int runThroughput(const Args& args) {
  const Via via = parseVia(args);
  const uint64_t up = args.num("up", 0);
  const uint64_t down = args.num("down", 0);
  Fd fd = openStream(via);
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
      // Copy whatever part of [down, down + 8) this chunk covers into the ack.
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
  const Via via = parseVia(args);
  const uint64_t count = args.num("count", 1000);
  std::vector<Fd> open;
  open.reserve(count);
  const auto t0 = Clock::now();
  for (uint64_t i = 0; i < count; ++i) open.push_back(openEchoed(via));
  std::printf("{\"open\":%zu,\"seconds\":%.6f}\n", open.size(), secondsSince(t0));
  std::fflush(stdout);
  // Hold until the orchestrator closes our stdin (or gives up on it).
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
  Upstream upstream(loopbackAddress(args.str("listen", "127.0.0.1:0")));
  std::printf("{\"port\":%u}\n", static_cast<unsigned>(upstream.port()));
  std::fflush(stdout);
  upstream.run();
  return 0;
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
    std::fprintf(stderr, "usage: %s serve|latency|throughput|hold --key value ...\n", argv[0]);
    return 2;
  }
  const std::string role = argv[1];
  try {
    const Args args(argc, argv, 2);
    if (role == "serve") return runServe(args);
    if (role == "latency") return runLatency(args);
    if (role == "throughput") return runThroughput(args);
    if (role == "hold") return runHold(args);
    std::fprintf(stderr, "unknown role %s\n", role.c_str());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sam-box-bench-load %s: %s\n", role.c_str(), e.what());
    return 1;
  }
}
