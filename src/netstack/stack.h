#pragma once
// The sandbox's userspace TCP/IP (issue 3 "Network"): lwIP terminates every TCP and UDP flow
// that arrives on tun0 and hands it to a FlowHandler, which knows nothing of lwIP. The stack
// knows nothing of policy: the handler turns each flow into a named tunnel to sam-box.
// Single-threaded: everything runs on one asio::io_context.

#include <asio/io_context.hpp>

#include <functional>
#include <memory>
#include <string>

namespace vdns {
class VirtualDns;
}

namespace netstack {

struct Options {
  int tun_fd = -1;       ///< an open tun0 (IFF_TUN | IFF_NO_PI); ownership passes to the stack
  std::string boundary;  ///< sam-box: a Unix socket path, or "vsock://CID:PORT"
  vdns::VirtualDns* dns = nullptr;  ///< answers 100.127.255.253:53 and names synthetic addresses
  std::string ingress_socket;  ///< if set: serve it, connecting each arrival to 127.0.0.1:<port>
};

class Stack {
 public:
  Stack(asio::io_context& io, Options options);
  ~Stack();
  /// Starts reading tun0 and serving. Throws std::runtime_error naming the failing step.
  void start();
  /// Stops accepting new flows and closes the tun fd; open flows are dropped.
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace netstack
