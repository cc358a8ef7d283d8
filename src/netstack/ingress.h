#pragma once
// Ingress (seed 003, "Agents that serve"): sam-box --agent-ingress-socket dials this Unix
// socket for each request from the host; each connection asks "CONNECT 127.0.0.1:<port>",
// and is relayed to that port on the sandbox's own loopback (nano-init runs in the sandbox's
// netns, so this is a plain kernel socket). Any other target is refused with 403: the
// boundary chose the port from the bundle, and nothing else inside may be reached this way.

#include "netstack/limits.h"

#include <asio/awaitable.hpp>
#include <asio/io_context.hpp>
#include <asio/local/stream_protocol.hpp>

#include <optional>
#include <string>
#include <string_view>

namespace netstack {

/// The port of an ingress target "127.0.0.1:<port>" (port 1..65535, decimal), or nullopt.
std::optional<uint16_t> ingressPort(std::string_view authority);

class Ingress {
 public:
  Ingress(asio::io_context& io, std::string path, Counters& counters);
  ~Ingress();
  Ingress(const Ingress&) = delete;
  Ingress& operator=(const Ingress&) = delete;

  /// Binds and listens (a stale socket file at `path` is replaced). Throws on failure.
  void start();
  void stop();

 private:
  asio::awaitable<void> acceptLoop();
  asio::awaitable<void> serve(asio::local::stream_protocol::socket conn);

  asio::io_context& io_;
  std::string path_;
  Counters& counters_;
  asio::local::stream_protocol::acceptor acceptor_;
  size_t active_ = 0;
};

}  // namespace netstack
