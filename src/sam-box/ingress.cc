// Ingress (seed 003, "Agents that serve"): the node's a2a target_url points at
// --ingress-listen; each connection is carried into the sandbox over --agent-ingress-socket,
// which nano-init --ingress-socket serves from inside. The boundary cannot dial the agent's
// 127.0.0.1 itself: that address is inside a namespace the boundary is not in. On that
// socket the boundary speaks the tunnel protocol in reverse: "CONNECT 127.0.0.1:<serves.port>"
// and, on "200", raw bytes. The port comes from the bundle, so nothing else can be asked for.

#include "common/log.h"
#include "sam-box/limits.h"
#include "sam-box/relay.h"
#include "sam-box/server_internal.h"

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/read_until.hpp>
#include <asio/redirect_error.hpp>
#include <asio/write.hpp>

namespace sambox {

using asio::use_awaitable;
using asio::experimental::awaitable_operators::operator||;

asio::awaitable<void> Server::acceptIngress() {
  while (ingress_acceptor_->is_open()) {
    asio::error_code ec;
    TcpSocket client =
        co_await ingress_acceptor_->async_accept(asio::redirect_error(use_awaitable, ec));
    if (ec == asio::error::operation_aborted) co_return;
    if (ec) {
      co_await acceptBackoff("--ingress-listen", ec);
      continue;
    }
    asio::co_spawn(io_, serveIngress(std::move(client)), asio::detached);
  }
}

asio::awaitable<void> Server::serveIngress(TcpSocket client) {
  const auto& serves = *config_.bundle->serves;
  asio::error_code ec;
  if (ingress_connections_ >= kMaxIngressConnections) {
    // Callers beyond the cap are told so at once, and cannot take the descriptors the
    // agent's own egress needs.
    metrics_.limitHit(kLimitMaxIngressConnections);
    metrics_.ingress(kReasonTooManyFlows);
    common::log::warn("ingress: refused", {{"service", serves.name},
                                           {"reason", kReasonTooManyFlows},
                                           {"limit", kMaxIngressConnections}});
    const std::string response = proto::errorResponse(503, kReasonTooManyFlows);
    co_await asio::async_write(client, asio::buffer(response),
                               asio::redirect_error(use_awaitable, ec));
    co_return;
  }
  const CountedPlace place(ingress_connections_);
  const std::string target = "127.0.0.1:" + std::to_string(serves.port);
  UnixSocket agent(io_);
  asio::steady_timer deadline(io_, kConnectTimeout);
  co_await agent.async_connect(
      asio::local::stream_protocol::endpoint(config_.flags.agent_ingress_socket),
      asio::redirect_error(use_awaitable, ec));
  std::string head;
  if (!ec) {
    const std::string request = "CONNECT " + target + " HTTP/1.1\r\nHost: " + target + "\r\n\r\n";
    co_await asio::async_write(agent, asio::buffer(request),
                               asio::redirect_error(use_awaitable, ec));
  }
  size_t head_len = 0;
  if (!ec) {
    auto result = co_await (
        asio::async_read_until(agent, asio::dynamic_buffer(head, proto::kMaxRequestHeadBytes),
                               "\r\n\r\n", asio::redirect_error(use_awaitable, ec)) ||
        deadline.async_wait(use_awaitable));
    if (result.index() == 1) ec = asio::error::timed_out;
    if (!ec) head_len = std::get<0>(result);
  }
  const bool accepted = !ec && head.rfind("HTTP/1.1 200", 0) == 0;
  if (!accepted) {
    metrics_.ingress("agent-unavailable");
    common::log::warn("ingress: agent not reachable",
                      {{"service", serves.name},
                       {"agent_ingress_socket", config_.flags.agent_ingress_socket},
                       {"error", ec ? ec.message() : head.substr(0, head.find('\r'))}});
    const std::string response = proto::errorResponse(502, "agent-unavailable");
    co_await asio::async_write(client, asio::buffer(response),
                               asio::redirect_error(use_awaitable, ec));
    co_return;
  }
  metrics_.ingress("delivered");
  if (head.size() > head_len) {
    co_await asio::async_write(client, asio::buffer(head.data() + head_len, head.size() - head_len),
                               asio::redirect_error(use_awaitable, ec));
  }
  // Ended by stop() like a tunnel; its line is written all the same.
  const OpenFlows::Entry open(open_flows_, [&client, &agent] {
    asio::error_code ignored;
    client.close(ignored);
    agent.close(ignored);
  });
  uint64_t in = 0;
  uint64_t out = 0;
  countRelayEnd(co_await spliceBothWays(client, agent, in, out, pipes_, config_.tcp_timeouts));
  common::log::info("ingress", {{"service", serves.name}, {"bytes_in", in}, {"bytes_out", out}});
}

}  // namespace sambox
