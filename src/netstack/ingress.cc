#include "netstack/ingress.h"

#include "netstack/log.h"
#include "proto/tunnel_request.h"

#include <unistd.h>

#include <array>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/write.hpp>
#include <charconv>

namespace netstack {
namespace {

using asio::experimental::awaitable_operators::operator||;
using asio::experimental::awaitable_operators::operator&&;
constexpr auto kTuple = asio::experimental::as_tuple(asio::use_awaitable);
constexpr std::string_view kLoopbackPrefix = "127.0.0.1:";
constexpr size_t kRelayBuffer = 16 * 1024;
constexpr std::string_view kEstablished = "HTTP/1.1 200 Connection Established\r\n\r\n";

template <typename From, typename To>
asio::awaitable<void> pipe(From& from, To& to) {
  std::array<char, kRelayBuffer> buf;
  for (;;) {
    auto [ec, n] = co_await from.async_read_some(asio::buffer(buf), kTuple);
    if (ec) break;
    auto [wec, written] = co_await asio::async_write(to, asio::buffer(buf.data(), n), kTuple);
    if (wec) break;
  }
  asio::error_code ignored;
  to.shutdown(asio::socket_base::shutdown_send, ignored);  // half-close travels on
}

}  // namespace

std::optional<uint16_t> ingressPort(std::string_view authority) {
  if (!authority.starts_with(kLoopbackPrefix)) return std::nullopt;
  std::string_view digits = authority.substr(kLoopbackPrefix.size());
  if (digits.empty() || digits.size() > 5 || digits[0] == '0') return std::nullopt;
  unsigned port = 0;
  auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), port);
  if (ec != std::errc() || end != digits.data() + digits.size() || port == 0 || port > 65535) {
    return std::nullopt;
  }
  return static_cast<uint16_t>(port);
}

Ingress::Ingress(asio::io_context& io, std::string path, Counters& counters)
    : io_(io), path_(std::move(path)), counters_(counters), acceptor_(io) {}

Ingress::~Ingress() { stop(); }

void Ingress::start() {
  ::unlink(path_.c_str());
  asio::error_code ec;
  asio::local::stream_protocol::endpoint endpoint(path_);
  acceptor_.open(endpoint.protocol(), ec);
  if (!ec) acceptor_.bind(endpoint, ec);
  if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) throw std::runtime_error("ingress: listen on " + path_ + ": " + ec.message());
  asio::co_spawn(io_, acceptLoop(), asio::detached);
}

void Ingress::stop() {
  if (!acceptor_.is_open()) return;
  asio::error_code ignored;
  acceptor_.close(ignored);
  ::unlink(path_.c_str());
}

asio::awaitable<void> Ingress::acceptLoop() {
  while (acceptor_.is_open()) {
    auto [ec, conn] = co_await acceptor_.async_accept(kTuple);
    if (ec == asio::error::operation_aborted) co_return;
    if (ec) continue;
    if (active_ >= kMaxIngressConnections) {
      ++counters_.ingress_refused;
      continue;  // closing it tells the boundary at once
    }
    asio::co_spawn(io_, serve(std::move(conn)), asio::detached);
  }
}

asio::awaitable<void> Ingress::serve(asio::local::stream_protocol::socket conn) {
  ++active_;
  struct Done {
    size_t& n;
    ~Done() { --n; }
  } done{active_};

  proto::TunnelRequestParser parser;
  std::array<char, 1024> buf;
  auto status = proto::TunnelRequestParser::Status::kNeedMore;
  std::string_view rest;
  asio::steady_timer deadline(io_, kTunnelOpenTimeout);
  while (status == proto::TunnelRequestParser::Status::kNeedMore) {
    auto result =
        co_await (conn.async_read_some(asio::buffer(buf), kTuple) || deadline.async_wait(kTuple));
    if (result.index() != 0) co_return;
    auto [ec, n] = std::get<0>(result);
    if (ec) co_return;
    status = parser.feed({buf.data(), n});
    if (status == proto::TunnelRequestParser::Status::kComplete) {
      rest = std::string_view(buf.data(), n).substr(parser.consumed());
    }
  }
  std::optional<uint16_t> port;
  if (status == proto::TunnelRequestParser::Status::kComplete &&
      parser.request().kind == proto::TunnelKind::kConnectTcp) {
    port = ingressPort(parser.request().authority);
  }
  if (!port) {
    ++counters_.ingress_refused;
    log::warn("ingress refused", {{"target", parser.request().authority}});
    const std::string response = proto::errorResponse(403, "ingress-target-not-allowed");
    co_await asio::async_write(conn, asio::buffer(response), kTuple);
    co_return;
  }
  asio::ip::tcp::socket local(io_);
  auto [cec] = co_await local.async_connect(
      asio::ip::tcp::endpoint(asio::ip::address_v4::loopback(), *port), kTuple);
  if (cec) {
    ++counters_.ingress_refused;
    log::warn("ingress: agent port not reachable", {{"port", *port}, {"error", cec.message()}});
    const std::string response = proto::errorResponse(502, "agent-unavailable");
    co_await asio::async_write(conn, asio::buffer(response), kTuple);
    co_return;
  }
  std::string early(rest);  // bytes the boundary sent right after the head
  co_await asio::async_write(conn, asio::buffer(kEstablished), kTuple);
  if (!early.empty()) co_await asio::async_write(local, asio::buffer(early), kTuple);
  co_await (pipe(conn, local) && pipe(local, conn));
}

}  // namespace netstack
