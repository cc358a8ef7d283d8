// A test driver for netstack: creates tun0 in the current network namespace (run it under
// `ip netns exec NS`), gives it the sandbox's addresses and default routes, and serves it
// with netstack::Stack and the real virtual DNS until SIGINT/SIGTERM. nano-init does the same
// as PID 1; this driver exists so the stack can be tried against a real sam-box on its own.
//
//   netstack_driver BOUNDARY [--ingress-socket PATH]

#include "netstack/stack.h"
#include "vdns/virtual_dns.h"

#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <sys/ioctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <asio/io_context.hpp>
#include <asio/signal_set.hpp>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace {

int run(std::vector<std::string> argv) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    ::execvp(args[0], args.data());
    _exit(127);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

int openTun(const char* name) {
  const int fd = ::open("/dev/net/tun", O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    std::perror("open /dev/net/tun");
    return -1;
  }
  ifreq ifr{};
  ifr.ifr_flags = IFF_TUN | IFF_NO_PI;
  std::strncpy(ifr.ifr_name, name, IFNAMSIZ - 1);
  if (::ioctl(fd, TUNSETIFF, &ifr) != 0) {
    std::perror("TUNSETIFF");
    ::close(fd);
    return -1;
  }
  return fd;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s BOUNDARY [--ingress-socket PATH]\n", argv[0]);
    return 2;
  }
  netstack::Options options;
  options.boundary = argv[1];
  for (int i = 2; i + 1 < argc; i += 2) {
    if (std::string(argv[i]) == "--ingress-socket") options.ingress_socket = argv[i + 1];
  }
  options.tun_fd = openTun("tun0");
  if (options.tun_fd < 0) return 1;
  const std::vector<std::vector<std::string>> setup = {
      {"ip", "link", "set", "lo", "up"},
      {"ip", "addr", "add", "100.64.0.1/10", "dev", "tun0"},
      {"ip", "-6", "addr", "add", "100::1/64", "dev", "tun0", "nodad"},
      {"ip", "link", "set", "tun0", "mtu", "9000", "up"},
      {"ip", "route", "add", "default", "dev", "tun0"},
      {"ip", "-6", "route", "add", "default", "dev", "tun0"},
  };
  for (const auto& cmd : setup) {
    if (run(cmd) != 0) {
      std::fprintf(stderr, "netstack_driver: setup step failed: %s ...\n", cmd[1].c_str());
      return 1;
    }
  }
  vdns::VirtualDns dns;
  options.dns = &dns;
  asio::io_context io;
  netstack::Stack stack(io, options);
  try {
    stack.start();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "netstack_driver: %s\n", e.what());
    return 1;
  }
  asio::signal_set signals(io, SIGINT, SIGTERM);
  signals.async_wait([&](const asio::error_code&, int) {
    stack.stop();
    io.stop();
  });
  std::fprintf(stderr, "netstack_driver: ready\n");
  io.run();
  return 0;
}
