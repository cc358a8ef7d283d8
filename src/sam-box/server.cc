#include "sam-box/server.h"

#include "common/log.h"
#include "proto/tunnel_request.h"
#include "sam-box/classify.h"
#include "sam-box/h2_session.h"
#include "sam-box/limits.h"
#include "sam-box/server_internal.h"

#include <sys/stat.h>
#include <unistd.h>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/read_until.hpp>
#include <asio/redirect_error.hpp>
#include <asio/write.hpp>

#include <array>
#include <cstring>
#include <stdexcept>
#include <utility>

namespace sambox {

using asio::use_awaitable;
using asio::experimental::awaitable_operators::operator||;

asio::local::stream_protocol::acceptor bindUnixListener(asio::io_context& io,
                                                        const std::string& flag,
                                                        const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      throw std::runtime_error(flag + " " + path + ": exists and is not a socket");
    }
    asio::local::stream_protocol::socket probe(io);
    asio::error_code ec;
    probe.connect(asio::local::stream_protocol::endpoint(path), ec);
    if (!ec) throw std::runtime_error(flag + " " + path + ": in use by another process");
    ::unlink(path.c_str());  // stale: its owner is gone
  }
  asio::local::stream_protocol::acceptor acceptor(io);
  asio::error_code ec;
  acceptor.open(asio::local::stream_protocol(), ec);
  // 0600 from the first instant: umask is process-wide, but start-up is single-threaded.
  const mode_t old_mask = ::umask(0177);
  if (!ec) acceptor.bind(asio::local::stream_protocol::endpoint(path), ec);
  ::umask(old_mask);
  if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) throw std::runtime_error(flag + " " + path + ": " + ec.message());
  return acceptor;
}

namespace {

std::unique_ptr<asio::ip::tcp::acceptor> bindTcpListener(asio::io_context& io,
                                                         const std::string& flag,
                                                         const ListenAddress& addr) {
  auto acceptor = std::make_unique<asio::ip::tcp::acceptor>(io);
  const asio::ip::tcp::endpoint ep(asio::ip::make_address(addr.host), addr.port);
  asio::error_code ec;
  acceptor->open(ep.protocol(), ec);
  if (!ec) acceptor->set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) acceptor->bind(ep, ec);
  if (!ec) acceptor->listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    throw std::runtime_error(flag + " " + addr.host + ":" + std::to_string(addr.port) + ": " +
                             ec.message());
  }
  return acceptor;
}

}  // namespace

Server::Server(asio::io_context& io, const Config& config)
    : io_(io),
      config_(config),
      resolver_(io, kResolverThreads, config.resolve_cache_ttl, kResolveCacheEntries),
      h2_room_(io, asio::steady_timer::time_point::max()),
      stop_grace_(io) {}

void Server::start() {
  if (config_.metrics) metrics_acceptor_ = bindTcpListener(io_, "--metrics-addr", *config_.metrics);
  if (config_.ingress) {
    ingress_acceptor_ = bindTcpListener(io_, "--ingress-listen", *config_.ingress);
  }
  tunnel_acceptor_ = std::make_unique<asio::local::stream_protocol::acceptor>(
      bindUnixListener(io_, "--socket", config_.flags.socket));
  asio::co_spawn(io_, acceptTunnels(), asio::detached);
  if (metrics_acceptor_) asio::co_spawn(io_, acceptMetrics(), asio::detached);
  if (ingress_acceptor_) asio::co_spawn(io_, acceptIngress(), asio::detached);
}

void Server::stop(std::function<void()> done) {
  asio::error_code ignored;
  if (tunnel_acceptor_ && tunnel_acceptor_->is_open()) {
    tunnel_acceptor_->close(ignored);
    ::unlink(config_.flags.socket.c_str());
  }
  if (metrics_acceptor_) metrics_acceptor_->close(ignored);
  if (ingress_acceptor_) ingress_acceptor_->close(ignored);
  if (open_flows_.stopping()) return;
  on_stopped_ = std::move(done);
  // Armed first: the flows may all be gone at once (then stopped() cancels it).
  stop_grace_.expires_after(kStopGrace);
  stop_grace_.async_wait([this](const asio::error_code& ec) {
    if (ec) return;
    common::log::warn("stopping: flows still being served after the grace period are dropped",
                      {{"flows", open_flows_.size()}, {"grace_ms", kStopGrace.count()}});
    stopped();
  });
  open_flows_.stopAll([this] { stopped(); });
}

void Server::stopped() {
  stop_grace_.cancel();
  if (auto done = std::exchange(on_stopped_, nullptr)) done();
}

void Server::finish(Flow& flow) {
  if (flow.stopped) flow.record.stoppedByBoundary();
  finishFlow(flow.record, metrics_);
}

bool Server::stoppedInSetUp(Flow& flow) {
  if (!flow.stopped) return false;
  finish(flow);
  return true;
}

void Server::countRelayEnd(RelayEnd end) {
  if (const char* limit = limitHit(end)) metrics_.limitHit(limit);
}

asio::awaitable<void> Server::acceptTunnels() {
  while (tunnel_acceptor_->is_open()) {
    asio::error_code ec;
    UnixSocket agent =
        co_await tunnel_acceptor_->async_accept(asio::redirect_error(use_awaitable, ec));
    if (ec == asio::error::operation_aborted) co_return;
    if (ec) {
      co_await acceptBackoff("--socket", ec);
      continue;
    }
    asio::co_spawn(io_, serveTunnel(std::move(agent)), asio::detached);
  }
}

asio::awaitable<void> Server::acceptBackoff(const char* listener, asio::error_code error) {
  // EMFILE/ENFILE/ENOBUFS repeat at once: back off instead of spinning on the listener.
  common::log::warn(std::string("accept failed on ") + listener, {{"error", error.message()}});
  asio::steady_timer backoff(io_, kAcceptBackoff);
  asio::error_code ignored;
  co_await backoff.async_wait(asio::redirect_error(use_awaitable, ignored));
}

asio::awaitable<void> Server::refuse(UnixSocket& agent, Flow& flow, int status, const char* reason,
                                     bool is_error) {
  if (is_error) {
    flow.record.fail(reason);
  } else {
    flow.record.refuse(reason);
  }
  asio::error_code ec;
  co_await asio::async_write(agent, asio::buffer(proto::errorResponse(status, reason)),
                             asio::redirect_error(use_awaitable, ec));
  // Whatever the agent sent after the request head is dropped unread.
  agent.close(ec);
  finishFlow(flow.record, metrics_);
}

asio::awaitable<Server::Head> Server::readHead(UnixSocket& agent) {
  // Its own coroutine, so that the parser and the read buffer are freed once the head is
  // read instead of living as long as the flow.
  Head head;
  proto::TunnelRequestParser parser;
  using Status = proto::TunnelRequestParser::Status;
  auto status = Status::kNeedMore;
  // The bytes of the last feed(), for the early data after the head.
  std::string_view last_fed;
  // Bytes held back while they may still be the HTTP/2 preface (h2_session.h). An HTTP/1.1
  // head differs from it at its first byte, so for HTTP/1.1 this stays empty.
  std::string sniff;
  bool sniffing = true;
  // Takes read bytes: either detects HTTP/2 (head.h2) or feeds the HTTP/1.1 parser.
  auto take = [&](std::string_view data) {
    if (sniffing) {
      const std::string_view held = sniff.empty() ? data : sniff.append(data);
      const PrefaceMatch match = matchH2Preface(held);
      if (match == PrefaceMatch::kMaybe) {
        if (sniff.empty()) sniff.assign(data);
        return;
      }
      if (match == PrefaceMatch::kYes) {
        head.h2 = true;
        head.early_data.assign(held);
        return;
      }
      sniffing = false;
      data = held;
    }
    last_fed = data;
    status = parser.feed(data);
  };
  // The client writes its request right after connecting, so it is usually here already:
  // read it without arming the head timer at all, into the server's buffer (this read
  // does not wait, so flows never share it across a wait).
  asio::error_code ec;
  agent.non_blocking(true, ec);
  size_t first = 0;
  if (!ec) first = agent.read_some(asio::buffer(head_buffer_), ec);
  if (!ec) {
    take(std::string_view(head_buffer_.data(), first));
  } else if (ec != asio::error::would_block && ec != asio::error::try_again) {
    head.closed = true;
    co_return head;
  }
  if (head.h2) co_return head;
  // This flow's own buffer for reads that wait; it lives as long as `last_fed` may point into
  // it (the early data after the head is copied out of it below).
  std::vector<char> buf;
  if (status == Status::kNeedMore) {
    buf.resize(kReadBufferBytes);
    asio::steady_timer deadline(io_, kHeadReadTimeout);
    while (status == Status::kNeedMore) {
      asio::error_code timer_ec;
      auto result = co_await (
          agent.async_read_some(asio::buffer(buf), asio::redirect_error(use_awaitable, ec)) ||
          deadline.async_wait(asio::redirect_error(use_awaitable, timer_ec)));
      if (result.index() == 1) {
        head.timed_out = true;
        co_return head;
      }
      if (ec) {
        common::log::debug("agent closed before a complete request head",
                           {{"error", ec.message()}});
        head.closed = true;
        co_return head;
      }
      take(std::string_view(buf.data(), std::get<0>(result)));
      if (head.h2) co_return head;
    }
  }
  head.status = status;
  if (status == Status::kComplete) {
    head.kind = parser.request().kind;
    head.authority = parser.request().authority;
    head.early_data.assign(last_fed.substr(parser.consumed()));
  } else if (status == Status::kMalformed) {
    head.error = parser.error();
  }
  co_return head;
}

asio::awaitable<void> Server::serveTunnel(UnixSocket agent) {
  Flow flow;
  flow.record.agent = config_.agentId();
  if (active_flows_ >= kMaxConcurrentFlows) {
    metrics_.limitHit(kLimitMaxConcurrentFlows);
    co_await refuse(agent, flow, 503, kReasonTooManyFlows, true);
    co_return;
  }
  const CountedPlace place(active_flows_);
  // Ended by stop(): closing the agent's socket (and the upstream's, once there is one) ends
  // every wait of the flow, wherever it is; it then finishes as usual, saying why.
  OpenFlows::Entry open(open_flows_, [&agent, &flow] {
    flow.stopped = true;
    asio::error_code ignored;
    agent.close(ignored);
    if (flow.close_upstream) flow.close_upstream();
  });

  Head head = co_await readHead(agent);
  if (head.closed) co_return;
  if (head.h2) {
    // The connection keeps its place under the flow cap; each stream takes one more.
    co_await serveH2Connection(*this, std::move(agent), std::move(head.early_data));
    co_return;
  }
  if (head.timed_out) {
    metrics_.limitHit(kLimitHeadReadTimeout);
    co_await refuse(agent, flow, 408, kReasonHeaderTimeout, false);
    co_return;
  }
  using Status = proto::TunnelRequestParser::Status;
  if (head.status == Status::kTooLarge) {
    metrics_.limitHit(kLimitMaxHeaderBytes);
    co_await refuse(agent, flow, 431, kReasonHeaderTooLarge, false);
    co_return;
  }
  if (head.status == Status::kMalformed) {
    flow.record.detail = std::move(head.error);
    co_await refuse(agent, flow, 400, kReasonMalformed, false);
    co_return;
  }
  if (head.status == Status::kMethodNotAllowed) {
    co_await refuse(agent, flow, 405, kReasonMethodNotAllowed, false);
    co_return;
  }

  flow.kind = head.kind;
  flow.record.kind = flow.kind == proto::TunnelKind::kConnectUdp ? "udp" : "tcp";
  flow.record.decision = classify(config_, flow.kind, head.authority, identity_lapsed_);
  if (!flow.record.decision.allowed) {
    co_await refuse(agent, flow, flow.record.decision.status, flow.record.decision.reason.c_str(),
                    false);
    co_return;
  }
  flow.early_data = std::move(head.early_data);
  if (flow.record.decision.route == Route::kMeshEntrypoint) {
    co_await meshEntrypoint(agent, flow);
  } else if (flow.kind == proto::TunnelKind::kConnectUdp) {
    co_await externalUdp(agent, flow);
  } else {
    co_await externalTcp(agent, flow);
  }
}

asio::awaitable<void> Server::acceptMetrics() {
  while (metrics_acceptor_->is_open()) {
    asio::error_code ec;
    TcpSocket client =
        co_await metrics_acceptor_->async_accept(asio::redirect_error(use_awaitable, ec));
    if (ec == asio::error::operation_aborted) co_return;
    if (ec) {
      co_await acceptBackoff("--metrics-addr", ec);
      continue;
    }
    asio::co_spawn(io_, serveMetrics(std::move(client)), asio::detached);
  }
}

asio::awaitable<void> Server::serveMetrics(TcpSocket client) {
  std::string head;
  asio::error_code ec;
  asio::steady_timer deadline(io_, kHeadReadTimeout);
  asio::error_code timer_ec;
  auto result =
      co_await (asio::async_read_until(client, asio::dynamic_buffer(head, 8192), "\r\n\r\n",
                                       asio::redirect_error(use_awaitable, ec)) ||
                deadline.async_wait(asio::redirect_error(use_awaitable, timer_ec)));
  if (result.index() == 1 || ec) co_return;
  std::string response;
  if (head.rfind("GET /metrics ", 0) == 0 || head.rfind("GET /metrics?", 0) == 0) {
    const std::string body = metrics_.render();
    response =
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
        "Content-Length: " +
        std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
  } else {
    response =
        "HTTP/1.1 404 Not Found\r\nContent-Length: 22\r\nConnection: close\r\n\r\n"
        "only /metrics is here\n";
  }
  co_await asio::async_write(client, asio::buffer(response),
                             asio::redirect_error(use_awaitable, ec));
  client.shutdown(asio::socket_base::shutdown_both, ec);
}

}  // namespace sambox
