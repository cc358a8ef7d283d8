// nano-init-bench-load: the data plane of bench/nano_init_bench.py. One binary, five roles:
//   serve       the upstream: a single-threaded epoll server (in the bench's "up" netns)
//   latency     sequential connects (connect → 'e' → 'e' echoed), timed
//   throughput  one connection, N bytes up and M bytes down, timed
//   hold        opens N connections, reports, keeps them open until stdin closes or sends '\n'
//   agent       reads one command per line on stdin and runs it in a forked child, so one
//               long-lived process inside a sandbox (nano-init's agent, a pasta or
//               slirp4netns netns) can run every measurement there
//
// Same upstream, wire protocol and timed loops as bench/load.cc (sam_box_bench.py's load
// generator; both come from bench/load_common.h), but this client dials a plain TCP target by
// NAME, resolved once with getaddrinfo() in the namespace it runs in (inside nano-init: through
// the virtual DNS), and the upstream listens on the bench's veth instead of loopback. load.cc
// refuses anything outside 127.0.0.0/8, so it cannot be reused as is.
//
// Addresses: every address this tool binds or dials must be in 127.0.0.0/8, 198.18.0.0/15
// (RFC 2544 benchmarking space: the bench's own veth between its netns) or 100.64.0.0/10
// (nano-init's synthetic addresses, which exist only inside a sandbox and lead to its tun0).
// Anything else is refused before a packet is sent.
//
// Wire protocol between client and upstream: see bench/load_common.h, shared with load.cc.
// Results go to stdout as one JSON object per line. A role that fails prints
// {"error":"..."} (agent children) or a line on stderr (direct runs) and exits 1.

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "load_common.h"

namespace {

using namespace benchload;

constexpr size_t kMaxCommandBytes = 4096;  // one agent command line

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
  echoOnce(fd.get());
  return fd;
}

int runLatency(const Args& args) {
  double resolve_s = 0;
  const sockaddr_in target = resolve(args.str("target"), &resolve_s);
  const uint64_t count = args.num("count", 500);
  const uint64_t warmup = args.num("warmup", 20);
  const std::vector<double> us =
      latencySamplesUs(warmup, count, [&] { return openEchoed(target); });
  std::printf("{\"address\":\"%s\",\"resolve_us\":%.1f,\"samples_us\":",
              addressText(target).c_str(), resolve_s * 1e6);
  printSamplesUs(us);
  std::printf("}\n");
  return 0;
}

int runThroughput(const Args& args) {
  const sockaddr_in target = resolve(args.str("target"));
  const uint64_t up = args.num("up", 0);
  const uint64_t down = args.num("down", 0);
  Fd fd = openStream(target);
  return runThroughputOn(fd.get(), up, down);
}

int runHold(const Args& args) {
  const sockaddr_in target = resolve(args.str("target"));
  const uint64_t count = args.num("count", 1000);
  return runHoldWith(count, [&] { return openEchoed(target); });
}

int runServe(const Args& args) { return runServeOn(resolve(args.str("listen"))); }

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
      if (stopRequested()) return 0;  // SIGTERM/SIGINT (nano-init forwards them): done
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
      if (stopRequested()) ::kill(pid, SIGTERM);  // the child stops too (it exits on g_stop)
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

}  // namespace

int main(int argc, char** argv) {
  setUpProcess();
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
