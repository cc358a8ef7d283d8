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
// Wire protocol between client and upstream: see load_common.h (shared with nano_load.cc).
// Results go to stdout as one JSON object per line; errors to stderr, exit status 1.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <array>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
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

}  // namespace

int main(int argc, char** argv) {
  setUpProcess();
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s serve|latency|throughput|hold --key value ...\n", argv[0]);
    return 2;
  }
  const std::string role = argv[1];
  try {
    const Args args(std::vector<std::string>(argv, argv + argc), 2);
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
