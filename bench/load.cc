// sam-box-bench-load: the data plane of bench/sam_box_bench.py. One binary, five roles:
//   serve       the upstream: a single-threaded epoll server on 127.0.0.1
//   latency     sequential tunnel set-ups (connect → CONNECT → 200 → one byte echoed), timed
//   throughput  one tunnel, N bytes up and M bytes down at the same time, timed
//   hold        opens N tunnels, reports, keeps them open until stdin closes
//   relay       the floor: the least a separate-process CONNECT relay can do (see runRelay)
// Python cannot drive a loopback link at GB/s, and its per-call overhead would dilute the
// cost of the proxy being measured; so the bytes are moved here and Python only orchestrates.
//
// Loopback only: every TCP address this tool dials or binds must be in 127.0.0.0/8.
//
// Wire protocol between client and upstream: see load_common.h (shared with nano_load.cc).
// Results go to stdout as one JSON object per line; errors to stderr, exit status 1.

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <system_error>
#include <unordered_map>
#include <vector>

#include "load_common.h"

namespace {

using namespace benchload;

constexpr size_t kMaxResponseHeadBytes = 16 * 1024;  // a proxy's 200 must fit in this

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

/// A Unix socket path → sockaddr_un; a path too long for sun_path is refused.
sockaddr_un unixAddress(const std::string& path) {
  sockaddr_un sun{};
  if (path.empty() || path.size() >= sizeof(sun.sun_path)) {
    throw std::invalid_argument("bad Unix socket path: " + path);
  }
  sun.sun_family = AF_UNIX;
  std::memcpy(sun.sun_path, path.c_str(), path.size() + 1);
  return sun;
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
    via.unix_addr = unixAddress(spec.substr(5));
    via.authority = args.str("authority");
  } else {
    throw std::invalid_argument("--via: want direct, tcp:HOST:PORT or unix:PATH");
  }
  return via;
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
  echoOnce(fd.get());
  return fd;
}

int runLatency(const Args& args) {
  const Via via = parseVia(args);
  const uint64_t count = args.num("count", 500);
  const uint64_t warmup = args.num("warmup", 20);
  const std::vector<double> us = latencySamplesUs(warmup, count, [&] { return openEchoed(via); });
  std::printf("{\"samples_us\":");
  printSamplesUs(us);
  std::printf("}\n");
  return 0;
}

int runThroughput(const Args& args) {
  const Via via = parseVia(args);
  const uint64_t up = args.num("up", 0);
  const uint64_t down = args.num("down", 0);
  Fd fd = openStream(via);
  return runThroughputOn(fd.get(), up, down);
}

int runHold(const Args& args) {
  const Via via = parseVia(args);
  const uint64_t count = args.num("count", 1000);
  return runHoldWith(count, [&] { return openEchoed(via); });
}

int runServe(const Args& args) {
  return runServeOn(loopbackAddress(args.str("listen", "127.0.0.1:0")));
}

// ---------------------------------------------------------------------------------------
// Relay: the floor of what a CONNECT boundary costs. sam-box's data plane (a second process,
// a Unix socket in, a loopback TCP connect out, splice(2) both ways through pipes of the same
// size, the same send buffer towards the client) with none of its control plane: no policy,
// no name lookup, no metrics, logs or timers. Run beside sam-box in the same bench, the two
// ratios to direct tell the architecture's share from sam-box's.
//
// One thread, level-triggered epoll, non-blocking sockets. A thread per tunnel with blocking
// calls up to the 200 was tried first and cost more on this 2-core host (alternating runs of
// 1,000 set-ups: 170–250 µs of the relay's CPU per set-up against 130–190, and a higher median
// in most runs): a thread start, a wake-up on the other CPU and a thread exit per tunnel.
// A set-up here takes accept4, two epoll_ctl, recv, socket, setsockopt, two connects (the
// second reports a loopback handshake already done, as sam-box does), send and setsockopt.

constexpr size_t kMaxRequestHeadBytes = 16 * 1024;
// As sam-box's kRelayPipeBytes and kAgentSendBufferBytes (src/sam-box/limits.h): the floor
// should not be slower than sam-box for a reason sam-box has already dealt with.
constexpr size_t kRelayPipeBytes = size_t{256} * 1024;
constexpr int kClientSendBufferBytes = 1024 * 1024;
constexpr size_t kRelayIdlePipes = 8;   // empty pipes kept for later tunnels, as sam-box
constexpr int kRelayRoundsPerTurn = 2;  // pipefuls a direction moves before others' turn
constexpr int kRelayWakeMillis = 200;   // the loop looks at stopRequested() this often
constexpr char kEstablished[] = "HTTP/1.1 200 Connection established\r\n\r\n";

struct Pipe {
  Fd read_end;
  Fd write_end;
};

/// One direction of a tunnel: src → pipe → dst, both sockets non-blocking.
struct Direction {
  int src = -1;
  int dst = -1;
  Pipe pipe;
  size_t in_pipe = 0;
  bool eof = false;  // src ended; dst was half-closed

  /// Drains the pipe, then (if `readable` and the pipe is empty) reads at most
  /// kRelayRoundsPerTurn pipefuls; epoll (level-triggered) reports what is left. False on a
  /// socket error.
  bool step(bool readable) {
    if (!drain()) return false;
    if (in_pipe > 0 || eof || !readable) return true;
    for (int round = 0; round < kRelayRoundsPerTurn; ++round) {
      const ssize_t in = ::splice(src, nullptr, pipe.write_end.get(), nullptr, kRelayPipeBytes,
                                  SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
      if (in == 0) {
        eof = true;
        ::shutdown(dst, SHUT_WR);
        return true;
      }
      if (in < 0) return errno == EAGAIN;
      in_pipe = static_cast<size_t>(in);
      if (!drain()) return false;
      // dst is full, or a short read (probably) emptied src: wait for epoll, not for EAGAIN.
      if (in_pipe > 0 || static_cast<size_t>(in) < kRelayPipeBytes) return true;
    }
    return true;
  }

  [[nodiscard]] bool wantsRead() const { return !eof && in_pipe == 0; }
  [[nodiscard]] bool wantsWrite() const { return in_pipe > 0; }
  [[nodiscard]] bool done() const { return eof && in_pipe == 0; }

 private:
  /// Splices the pipe's bytes to dst until it is empty or dst is full. False on an error.
  bool drain() {
    while (in_pipe > 0) {
      const ssize_t out = ::splice(pipe.read_end.get(), nullptr, dst, nullptr, in_pipe,
                                   SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
      if (out < 0) return errno == EAGAIN;
      in_pipe -= static_cast<size_t>(out);
    }
    return true;
  }
};

class Relay {
 public:
  Relay(const sockaddr_un& listen, const sockaddr_in& to) : listen_(listen), to_(to) {
    listener_.reset(::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (listener_.get() < 0) sysFail("socket");
    if (::bind(listener_.get(), reinterpret_cast<const sockaddr*>(&listen_), sizeof listen_) != 0) {
      sysFail(std::string("bind ") + listen_.sun_path);
    }
    if (::listen(listener_.get(), 4096) != 0) sysFail("listen");
    epoll_.reset(::epoll_create1(EPOLL_CLOEXEC));
    if (epoll_.get() < 0) sysFail("epoll_create1");
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.ptr = nullptr;  // the listener; every other entry points at a Side
    if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, listener_.get(), &ev) != 0) sysFail("epoll_ctl");
  }

  ~Relay() { ::unlink(listen_.sun_path); }
  Relay(const Relay&) = delete;
  Relay& operator=(const Relay&) = delete;

  void run() {
    std::array<epoll_event, 256> events{};
    while (!stopRequested()) {
      const int n = ::epoll_wait(epoll_.get(), events.data(), events.size(), kRelayWakeMillis);
      if (n < 0) {
        if (errno == EINTR) continue;
        sysFail("epoll_wait");
      }
      for (int i = 0; i < n; ++i) {
        auto* side = static_cast<Side*>(events[i].data.ptr);
        if (side == nullptr) {
          acceptOne();
        } else if (!side->tunnel->dead) {
          onEvent(*side->tunnel, side->upstream, events[i].events);
        }
      }
      dead_.clear();  // after the batch: a later event in it may name a tunnel that ended
    }
  }

 private:
  struct Tunnel;
  struct Side {
    Tunnel* tunnel;
    bool upstream;
  };
  struct Tunnel {
    enum class State { kHead, kConnecting, kRelay };
    State state = State::kHead;
    Fd client;
    Fd upstream;
    std::string head;            // the request head as read so far
    Direction up, down;          // client → upstream, upstream → client
    uint32_t client_events = 0;  // as registered with epoll; 0: not registered
    uint32_t upstream_events = 0;
    Side client_side{this, false};
    Side upstream_side{this, true};
    bool dead = false;
  };

  void acceptOne() {
    Fd fd(::accept4(listener_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (fd.get() < 0) {
      if (errno == EAGAIN || errno == EINTR || errno == ECONNABORTED) return;
      std::fprintf(stderr, "sam-box-bench-load relay: accept: %s\n", std::strerror(errno));
      ::usleep(50 * 1000);  // EMFILE and the like: the backlog keeps the client
      return;
    }
    auto owned = std::make_unique<Tunnel>();
    Tunnel& t = *owned;
    t.client = std::move(fd);
    live_.emplace(&t, std::move(owned));
    if (!watch(t, false, EPOLLIN)) return fail(t, sysWhy("epoll_ctl"));
    readHead(t);  // a client sends its head at once: it is usually there already
  }

  void onEvent(Tunnel& t, bool upstream, uint32_t events) {
    switch (t.state) {
      case Tunnel::State::kHead:
        if (!upstream) readHead(t);
        return;
      case Tunnel::State::kConnecting:
        if (upstream) connected(t);
        return;
      case Tunnel::State::kRelay:
        break;
    }
    const bool in = (events & (EPOLLIN | EPOLLHUP | EPOLLERR)) != 0;
    const bool out = (events & (EPOLLOUT | EPOLLHUP | EPOLLERR)) != 0;
    Direction& from = upstream ? t.down : t.up;  // reads this socket
    Direction& to = upstream ? t.up : t.down;    // writes it
    if ((in && !from.step(true)) || (out && !to.step(false))) return fail(t, sysWhy("splice"));
    if (t.up.done() && t.down.done()) return finish(t);
    updateInterest(t);
  }

  /// Reads what the client sent; once the head is complete, connects upstream.
  void readHead(Tunnel& t) {
    std::array<char, 4096> buf{};
    for (;;) {
      const ssize_t r = ::recv(t.client.get(), buf.data(), buf.size(), 0);
      if (r == 0) return finish(t);  // closed before a head: the bench's readiness probe
      if (r < 0) {
        if (errno == EAGAIN) return;
        return fail(t, sysWhy("recv request head"));
      }
      const size_t from = t.head.size() < 3 ? 0 : t.head.size() - 3;
      t.head.append(buf.data(), static_cast<size_t>(r));
      if (t.head.find("\r\n\r\n", from) != std::string::npos) break;
      if (t.head.size() > kMaxRequestHeadBytes) {
        return refuse(t, "431 Request Header Fields Too Large", "request head too big");
      }
      if (static_cast<size_t>(r) < buf.size()) return;  // read all there was: wait for more
    }
    if (t.head.rfind("CONNECT ", 0) != 0) {
      return refuse(t, "405 Method Not Allowed", "not a CONNECT request");
    }
    // The authority is ignored: every tunnel goes to --to.
    t.upstream.reset(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (t.upstream.get() < 0) return refuse(t, "502 Bad Gateway", sysWhy("socket"));
    const int one = 1;
    ::setsockopt(t.upstream.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    const auto* to = reinterpret_cast<const sockaddr*>(&to_);
    int rc = ::connect(t.upstream.get(), to, sizeof to_);
    // A second connect reports without waiting how the first went: on loopback the handshake
    // is done by the time the first returns.
    if (rc != 0 && errno == EINPROGRESS) rc = ::connect(t.upstream.get(), to, sizeof to_);
    if (rc == 0 || errno == EISCONN) return established(t);
    if (errno != EALREADY && errno != EINPROGRESS) {
      return refuse(t, "502 Bad Gateway", sysWhy("connect upstream"));
    }
    t.state = Tunnel::State::kConnecting;
    if (!watch(t, false, EPOLLET) || !watch(t, true, EPOLLOUT)) return fail(t, sysWhy("epoll_ctl"));
  }

  void connected(Tunnel& t) {
    int err = 0;
    socklen_t len = sizeof err;
    ::getsockopt(t.upstream.get(), SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) {
      errno = err;
      return refuse(t, "502 Bad Gateway", sysWhy("connect upstream"));
    }
    established(t);
  }

  /// The 200, then relaying. Bytes the client sent after its head go upstream first.
  void established(Tunnel& t) {
    const size_t end = t.head.find("\r\n\r\n") + 4;
    constexpr size_t n = sizeof kEstablished - 1;
    if (::send(t.client.get(), kEstablished, n, MSG_NOSIGNAL) != static_cast<ssize_t>(n)) {
      return fail(t, sysWhy("send 200"));
    }
    if (end < t.head.size()) {
      const size_t extra = t.head.size() - end;
      if (::send(t.upstream.get(), t.head.data() + end, extra, MSG_NOSIGNAL) !=
          static_cast<ssize_t>(extra)) {
        return fail(t, sysWhy("send to upstream"));
      }
    }
    t.head = std::string();
    const int sndbuf = kClientSendBufferBytes;
    ::setsockopt(t.client.get(), SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof sndbuf);
    t.state = Tunnel::State::kRelay;
    t.up.src = t.down.dst = t.client.get();
    t.down.src = t.up.dst = t.upstream.get();
    try {
      t.up.pipe = acquirePipe();
      t.down.pipe = acquirePipe();
    } catch (const std::system_error& e) {
      return fail(t, e.what());
    }
    updateInterest(t);
  }

  /// Waits for what the two directions need next. A socket that needs nothing is left in
  /// epoll edge-triggered: its hang-up is reported once, not on every turn of the loop.
  void updateInterest(Tunnel& t) {
    const uint32_t client =
        (t.up.wantsRead() ? EPOLLIN : 0u) | (t.down.wantsWrite() ? EPOLLOUT : 0u);
    const uint32_t upstream =
        (t.down.wantsRead() ? EPOLLIN : 0u) | (t.up.wantsWrite() ? EPOLLOUT : 0u);
    if (!watch(t, false, client != 0 ? client : EPOLLET) ||
        !watch(t, true, upstream != 0 ? upstream : EPOLLET)) {
      fail(t, sysWhy("epoll_ctl"));
    }
  }

  /// Registers one of t's sockets for `events` unless it is already (EPOLLET alone: for
  /// nothing, but a hang-up or error is still reported, once). False if epoll_ctl failed.
  bool watch(Tunnel& t, bool upstream, uint32_t events) {
    uint32_t& current = upstream ? t.upstream_events : t.client_events;
    if (events == current) return true;
    epoll_event ev{};
    ev.events = events;
    ev.data.ptr = upstream ? &t.upstream_side : &t.client_side;
    const int fd = upstream ? t.upstream.get() : t.client.get();
    const int op = current == 0 ? EPOLL_CTL_ADD : EPOLL_CTL_MOD;
    if (::epoll_ctl(epoll_.get(), op, fd, &ev) != 0) return false;
    current = events;
    return true;
  }

  Pipe acquirePipe() {
    if (!idle_pipes_.empty()) {
      Pipe pipe = std::move(idle_pipes_.back());
      idle_pipes_.pop_back();
      return pipe;
    }
    int fds[2];
    if (::pipe2(fds, O_NONBLOCK | O_CLOEXEC) != 0) sysFail("pipe2");
    Pipe pipe{Fd(fds[0]), Fd(fds[1])};
    (void)::fcntl(fds[1], F_SETPIPE_SZ, static_cast<int>(kRelayPipeBytes));  // best effort
    return pipe;
  }

  void refuse(Tunnel& t, const char* status, const std::string& why) {
    const std::string head = std::string("HTTP/1.1 ") + status + "\r\n\r\n";
    (void)::send(t.client.get(), head.data(), head.size(), MSG_NOSIGNAL);
    fail(t, why);
  }

  /// `what`: the failing call, followed by errno's text.
  static std::string sysWhy(const char* what) {
    return std::string(what) + ": " + std::strerror(errno);
  }

  void fail(Tunnel& t, const std::string& why) {
    std::fprintf(stderr, "sam-box-bench-load relay: %s\n", why.c_str());
    t.up.in_pipe = t.down.in_pipe = 0;
    t.up.pipe = Pipe{};  // may hold bytes: not reused
    t.down.pipe = Pipe{};
    finish(t);
  }

  /// Closes both sockets (which takes them out of epoll) and frees t after this batch.
  void finish(Tunnel& t) {
    t.dead = true;
    for (Direction* d : {&t.up, &t.down}) {
      if (d->pipe.read_end.get() >= 0 && idle_pipes_.size() < kRelayIdlePipes) {
        idle_pipes_.push_back(std::move(d->pipe));
      }
    }
    t.client.reset();
    t.upstream.reset();
    auto it = live_.find(&t);
    dead_.push_back(std::move(it->second));
    live_.erase(it);
  }

  sockaddr_un listen_;
  sockaddr_in to_;
  Fd listener_;
  Fd epoll_;
  std::vector<Pipe> idle_pipes_;
  std::unordered_map<Tunnel*, std::unique_ptr<Tunnel>> live_;
  std::vector<std::unique_ptr<Tunnel>> dead_;
};

/// The `relay` role: --listen unix:PATH --to 127.0.0.1:PORT. Prints nothing: the bench waits
/// until the socket accepts, as it does for sam-box. Serves until a stop is requested.
int runRelay(const Args& args) {
  const sockaddr_in to = loopbackAddress(args.str("to"));
  const std::string listen = args.str("listen");
  if (listen.rfind("unix:", 0) != 0) throw std::invalid_argument("--listen: want unix:PATH");
  Relay relay(unixAddress(listen.substr(5)), to);
  relay.run();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  setUpProcess();
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s serve|latency|throughput|hold|relay --key value ...\n",
                 argv[0]);
    return 2;
  }
  const std::string role = argv[1];
  try {
    const Args args(std::vector<std::string>(argv, argv + argc), 2);
    if (role == "serve") return runServe(args);
    if (role == "latency") return runLatency(args);
    if (role == "throughput") return runThroughput(args);
    if (role == "hold") return runHold(args);
    if (role == "relay") return runRelay(args);
    std::fprintf(stderr, "unknown role %s\n", role.c_str());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sam-box-bench-load %s: %s\n", role.c_str(), e.what());
    return 1;
  }
}
