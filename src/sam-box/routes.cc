// The three ways an accepted tunnel leaves the boundary: external TCP (splice relay),
// external UDP (connect-udp capsules <-> datagrams), and the mesh entrypoint (HTTP to the
// node's API socket with the agent's identity asserted in X-Sam-Agent).

#include "common/log.h"
#include "policy/address.h"
#include "proto/capsule.h"
#include "proto/request_rewriter.h"
#include "sam-box/limits.h"
#include "sam-box/relay.h"
#include "sam-box/server_internal.h"

#include <sys/socket.h>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/ip/udp.hpp>
#include <asio/redirect_error.hpp>
#include <asio/write.hpp>

#include <array>
#include <optional>
#include <vector>

namespace sambox {

using asio::use_awaitable;
using asio::experimental::awaitable_operators::operator||;

namespace {

/// The HTTP status for a failed resolvePermitted(): a policy refusal or an upstream failure.
int resolveFailureStatus(const char* reason) {
  if (reason == kReasonForbiddenAddress) return 403;
  return reason == kReasonConnectTimeout ? 504 : 502;
}

}  // namespace

size_t sendNow(asio::local::stream_protocol::socket& socket, std::string_view data,
               asio::error_code& ec) {
  for (;;) {
    const ssize_t n =
        ::send(socket.native_handle(), data.data(), data.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n >= 0) return static_cast<size_t>(n);
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) ec.assign(errno, asio::system_category());
    return 0;
  }
}

std::string addressText(const asio::ip::address& addr) {
  if (!addr.is_v4()) return addr.to_string();
  const auto bytes = addr.to_v4().to_bytes();
  char text[16];  // "255.255.255.255"
  size_t n = 0;
  for (size_t i = 0; i < bytes.size(); ++i) {
    if (i > 0) text[n++] = '.';
    const unsigned v = bytes[i];
    if (v >= 100) text[n++] = static_cast<char>('0' + v / 100);
    if (v >= 10) text[n++] = static_cast<char>('0' + v / 10 % 10);
    text[n++] = static_cast<char>('0' + v % 10);
  }
  return std::string(text, n);
}

/// Every address must be permitted: a name with one address in forbidden space, or on one
/// of this host's own interfaces, is refused outright, since no legitimate public name points
/// there and trying "the other ones" would let a hostile resolver choose.
const char* Server::judgeAddresses(const std::vector<asio::ip::address>& addresses,
                                   std::string* offending) {
  for (const auto& addr : addresses) {
    const bool local = local_addresses_.contains(addr);
    if (!config_.destinations.permits(addr) ||
        (local && !config_.destinations.allowsExplicitly(addr))) {
      *offending = addr.to_string();
      return kReasonForbiddenAddress;
    }
  }
  return nullptr;
}

asio::awaitable<std::vector<asio::ip::address>> Server::resolvePermitted(
    const Decision& d, asio::steady_timer::time_point deadline, const char** reason,
    FlowRecord& record) {
  ResolveResult result = co_await resolver_.resolve(d.name, deadline);
  if (result.timed_out) {
    *reason = kReasonConnectTimeout;
    metrics_.limitHit(kLimitConnectTimeout);
    co_return std::vector<asio::ip::address>{};
  }
  if (result.gai_error != 0 || result.addresses.empty()) {
    *reason = kReasonResolveFailed;
    // Out of descriptors reads "System error: Too many open files", not a name problem.
    record.detail = result.error;
    co_return std::vector<asio::ip::address>{};
  }
  if (const char* why = judgeAddresses(result.addresses, &record.address)) {
    *reason = why;
    co_return std::vector<asio::ip::address>{};
  }
  co_return std::move(result.addresses);
}

bool Server::resolveCached(Flow& flow, std::vector<asio::ip::address>* addresses,
                           const char** reason) {
  // Only answers are cached (never failures), so the cached path fails only by an address.
  if (!resolver_.cached(flow.record.decision.name, addresses)) return false;
  if (const char* why = judgeAddresses(*addresses, &flow.record.address)) {
    *reason = why;
    addresses->clear();
  }
  return true;
}

asio::awaitable<std::vector<asio::ip::address>> Server::resolveOrRefuse(
    UnixSocket& agent, Flow& flow, asio::steady_timer::time_point deadline) {
  std::vector<asio::ip::address> addresses;
  const char* reason = nullptr;
  if (!resolveCached(flow, &addresses, &reason)) {
    addresses = co_await resolvePermitted(flow.record.decision, deadline, &reason, flow.record);
  }
  if (addresses.empty()) {
    co_await refuse(agent, flow, resolveFailureStatus(reason), reason,
                    reason != kReasonForbiddenAddress);
  }
  co_return addresses;
}

asio::error_code Server::startConnect(TcpSocket& upstream, const asio::ip::tcp::endpoint& ep,
                                      bool* pending) {
  *pending = false;
  asio::error_code ec;
  upstream.open(ep.protocol(), ec);
  if (!ec) upstream.native_non_blocking(true, ec);
  if (ec) return ec;
  const int fd = upstream.native_handle();
  // A second connect(2) reports how the first one went without waiting: 0 once the handshake
  // is done (on loopback or a near host it is, by the time the first call returns), EALREADY
  // while it is still on its way. Only then is the reactor, and the deadline, needed.
  int rc = ::connect(fd, ep.data(), static_cast<socklen_t>(ep.size()));
  if (rc != 0 && errno == EINPROGRESS)
    rc = ::connect(fd, ep.data(), static_cast<socklen_t>(ep.size()));
  if (rc == 0 || errno == EISCONN) return {};
  if (errno != EALREADY && errno != EINPROGRESS) return {errno, asio::system_category()};
  *pending = true;
  return {};
}

asio::awaitable<asio::error_code> Server::finishConnect(TcpSocket& upstream,
                                                        asio::steady_timer& deadline,
                                                        bool* timed_out) {
  asio::error_code ec;
  asio::error_code timer_ec;
  auto result = co_await (
      upstream.async_wait(asio::socket_base::wait_write, asio::redirect_error(use_awaitable, ec)) ||
      deadline.async_wait(asio::redirect_error(use_awaitable, timer_ec)));
  if (result.index() == 1) {
    *timed_out = true;
    co_return asio::error::timed_out;
  }
  if (ec) co_return ec;
  int err = 0;
  socklen_t len = sizeof err;
  if (::getsockopt(upstream.native_handle(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
  co_return err == 0 ? asio::error_code() : asio::error_code(err, asio::system_category());
}

asio::awaitable<asio::error_code> Server::connectUpstream(TcpSocket& upstream,
                                                          const asio::ip::tcp::endpoint& ep,
                                                          asio::steady_timer& deadline,
                                                          bool* timed_out) {
  bool pending = false;
  const asio::error_code ec = startConnect(upstream, ep, &pending);
  if (!pending) co_return ec;
  co_return co_await finishConnect(upstream, deadline, timed_out);
}

asio::awaitable<void> Server::externalTcp(UnixSocket& agent, Flow& flow) {
  // The usual flow (a cached name, an upstream that accepts at once, an agent socket with
  // room for the answer) waits for nothing and arms no timer: the waiting parts are entered
  // only when there is something to wait for.
  const auto deadline = asio::steady_timer::clock_type::now() + kConnectTimeout;
  const std::vector<asio::ip::address> addresses = co_await resolveOrRefuse(agent, flow, deadline);
  if (addresses.empty() || stoppedInSetUp(flow)) co_return;
  std::optional<asio::steady_timer> connect_deadline;
  TcpSocket upstream(io_);
  const ScopedCloser closer(flow.close_upstream, upstream);
  bool connected = false;
  bool timed_out = false;
  for (const auto& addr : addresses) {
    const asio::ip::tcp::endpoint ep(addr, flow.record.decision.port);
    // The address tried last is the flow's: the one connected, or the last that failed.
    flow.record.address = addressText(ep.address());
    upstream = TcpSocket(io_);
    bool pending = false;
    asio::error_code connect_ec = startConnect(upstream, ep, &pending);
    if (pending) {
      if (!connect_deadline) connect_deadline.emplace(io_, deadline);
      connect_ec = co_await finishConnect(upstream, *connect_deadline, &timed_out);
    }
    if (!connect_ec) {
      connected = true;
      flow.record.detail.clear();  // an earlier address's failure is not this flow's
      break;
    }
    if (!timed_out) flow.record.detail = connect_ec.message();
    if (timed_out || flow.stopped) break;
  }
  if (stoppedInSetUp(flow)) co_return;
  if (!connected) {
    if (timed_out) metrics_.limitHit(kLimitConnectTimeout);
    co_await refuse(agent, flow, timed_out ? 504 : 502,
                    timed_out ? kReasonConnectTimeout : kReasonConnectFailed, true);
    co_return;
  }
  // Best effort both: a deeper queue towards the agent means more moved per wake-up, for
  // sam-box and for the agent's reads (the kernel caps it at net.core.wmem_max).
  asio::error_code ignored;
  upstream.set_option(asio::ip::tcp::no_delay(true), ignored);
  agent.set_option(asio::socket_base::send_buffer_size(kAgentSendBufferBytes), ignored);

  asio::error_code ec;
  const std::string response = proto::successResponse(flow.kind);
  const size_t sent = sendNow(agent, response, ec);
  if (!ec && sent < response.size()) {
    co_await asio::async_write(agent, asio::buffer(response.data() + sent, response.size() - sent),
                               asio::redirect_error(use_awaitable, ec));
  }
  if (!ec && !flow.early_data.empty()) {
    co_await asio::async_write(upstream, asio::buffer(flow.early_data),
                               asio::redirect_error(use_awaitable, ec));
    flow.record.bytes_up += flow.early_data.size();
  }
  flow.record.outcome = "allowed";
  if (!ec) {
    InProgress guard(metrics_, routeLabel(flow.record.decision.route));
    countRelayEnd(co_await spliceBothWays(agent, upstream, flow.record.bytes_up,
                                          flow.record.bytes_down, pipes_, config_.tcp_timeouts));
  }
  finish(flow);
}

asio::awaitable<void> Server::externalUdp(UnixSocket& agent, Flow& flow) {
  const auto deadline = asio::steady_timer::clock_type::now() + kConnectTimeout;
  const std::vector<asio::ip::address> addresses = co_await resolveOrRefuse(agent, flow, deadline);
  if (addresses.empty() || stoppedInSetUp(flow)) co_return;
  const asio::ip::udp::endpoint target(addresses.front(), flow.record.decision.port);
  asio::ip::udp::socket upstream(io_);
  const ScopedCloser closer(flow.close_upstream, upstream);
  asio::error_code ec;
  upstream.connect(target, ec);
  if (ec) {
    co_await refuse(agent, flow, 502, kReasonConnectFailed, true);
    co_return;
  }
  flow.record.address = target.address().to_string();
  co_await asio::async_write(agent, asio::buffer(proto::successResponse(flow.kind)),
                             asio::redirect_error(use_awaitable, ec));
  flow.record.outcome = "allowed";
  if (ec) {
    finish(flow);
    co_return;
  }
  InProgress guard(metrics_, routeLabel(flow.record.decision.route));
  auto last_activity = std::chrono::steady_clock::now();

  auto toUpstream = [&]() -> asio::awaitable<void> {
    proto::CapsuleReader reader;
    reader.append(flow.early_data);
    std::array<char, kReadBufferBytes> buf{};
    for (;;) {
      for (auto s = reader.next(); s != proto::CapsuleReader::Status::kNeedMore;
           s = reader.next()) {
        if (s == proto::CapsuleReader::Status::kTooLarge) co_return;
        asio::error_code send_ec;
        co_await upstream.async_send(asio::buffer(reader.payload().data(), reader.payload().size()),
                                     asio::redirect_error(use_awaitable, send_ec));
        if (!send_ec) flow.record.bytes_up += reader.payload().size();
        last_activity = std::chrono::steady_clock::now();
      }
      asio::error_code read_ec;
      const size_t n = co_await agent.async_read_some(asio::buffer(buf),
                                                      asio::redirect_error(use_awaitable, read_ec));
      if (read_ec) co_return;
      reader.append(std::string_view(buf.data(), n));
    }
  };
  auto toAgent = [&]() -> asio::awaitable<void> {
    std::vector<char> datagram(65536);
    std::string capsule;
    for (;;) {
      asio::error_code recv_ec;
      const size_t n = co_await upstream.async_receive(
          asio::buffer(datagram), asio::redirect_error(use_awaitable, recv_ec));
      if (recv_ec == asio::error::connection_refused) continue;  // ICMP unreachable: keep going
      if (recv_ec) co_return;
      capsule.clear();
      proto::appendDatagramCapsule(std::string_view(datagram.data(), n), &capsule);
      asio::error_code write_ec;
      co_await asio::async_write(agent, asio::buffer(capsule),
                                 asio::redirect_error(use_awaitable, write_ec));
      if (write_ec) co_return;
      flow.record.bytes_down += n;
      last_activity = std::chrono::steady_clock::now();
    }
  };
  auto idle = [&]() -> asio::awaitable<void> {
    asio::steady_timer timer(io_);
    for (;;) {
      timer.expires_at(last_activity + kUdpIdleTimeout);
      asio::error_code ec;
      co_await timer.async_wait(asio::redirect_error(use_awaitable, ec));
      if (ec) co_return;  // cancelled: the flow ended another way
      if (std::chrono::steady_clock::now() >= last_activity + kUdpIdleTimeout) {
        metrics_.limitHit(kLimitUdpIdleTimeout);
        co_return;
      }
    }
  };
  co_await (toUpstream() || toAgent() || idle());
  finish(flow);
}

MeshRefusal credentialExpiredRefusal() {
  return {403, kReasonCredentialExpired, "the credential expired"};
}

MeshRefusal rewriterRefusal(proto::RequestStreamRewriter::Status status,
                            const proto::RequestStreamRewriter& rewriter) {
  using Status = proto::RequestStreamRewriter::Status;
  if (status == Status::kTooLarge) return {431, kReasonHeaderTooLarge, rewriter.error()};
  if (status != Status::kOk) return {400, kReasonMalformed, rewriter.error()};
  return {};
}

void reportMeshRefusal(Metrics& metrics, const std::string& agent, const MeshRefusal& refusal) {
  common::log::warn("mesh request refused mid-stream",
                    {{"agent", agent}, {"reason", refusal.reason}, {"error", refusal.error}});
  metrics.refusal(refusal.reason);
  if (refusal.status == 431) metrics.limitHit(kLimitMaxHeaderBytes);
}

asio::awaitable<void> Server::meshEntrypoint(UnixSocket& agent, Flow& flow) {
  UnixSocket node(io_);
  const ScopedCloser closer(flow.close_upstream, node);
  asio::error_code ec;
  if (config_.flags.sidecar_socket.empty()) {
    ec = asio::error::not_found;
  } else {
    co_await node.async_connect(
        asio::local::stream_protocol::endpoint(config_.flags.sidecar_socket),
        asio::redirect_error(use_awaitable, ec));
  }
  if (stoppedInSetUp(flow)) co_return;
  if (ec) {
    common::log::warn("node API socket unreachable",
                      {{"sidecar_socket", config_.flags.sidecar_socket}, {"error", ec.message()}});
    co_await refuse(agent, flow, 502, kReasonNodeUnavailable, true);
    co_return;
  }
  co_await asio::async_write(agent, asio::buffer(proto::successResponse(flow.kind)),
                             asio::redirect_error(use_awaitable, ec));
  flow.record.outcome = "allowed";
  if (ec) {
    finish(flow);
    co_return;
  }
  InProgress guard(metrics_, routeLabel(flow.record.decision.route));

  // Requests are rewritten (the sandbox never chooses its own X-Sam-Agent); responses are
  // spliced untouched. The relay (relay.h) runs this coroutine as the agent-to-node direction:
  // it ends at the agent's EOF (carried as a half-close) and throws on anything else.
  auto toNode = [&]() -> asio::awaitable<void> {
    proto::RequestStreamRewriter rewriter("X-Sam-Agent", config_.agentId());
    std::string out;
    std::string_view pending = flow.early_data;
    std::array<char, kReadBufferBytes> buf{};
    for (;;) {
      // A request the node must not see: the identity lapsed (credential_watch.h), or the
      // stream is no HTTP/1.1 the rewriter can vouch for.
      MeshRefusal refusal;
      if (identity_lapsed_ && !pending.empty()) {
        refusal = credentialExpiredRefusal();
      } else {
        out.clear();
        const auto status = rewriter.feed(pending, &out);
        if (!out.empty()) {
          co_await asio::async_write(node, asio::buffer(out), use_awaitable);
          flow.record.bytes_up += out.size();
        }
        refusal = rewriterRefusal(status, rewriter);
      }
      if (refusal.status != 0) {
        reportMeshRefusal(metrics_, config_.agentId(), refusal);
        if (rewriter.requests() != 0 || flow.record.bytes_up != 0) {
          // Answers to earlier requests may still be on their way back: nothing can be put
          // between them, so the tunnel just ends.
          throw asio::system_error(asio::error::connection_aborted, "mesh request refused");
        }
        // Nothing of this tunnel reached the node, so nothing of the node's is on its way
        // back: the agent gets a status it can read (403, 431 or 400) instead of a bare
        // close, and the node an end of stream before any request.
        co_await asio::async_write(
            agent, asio::buffer(proto::errorResponse(refusal.status, refusal.reason)),
            use_awaitable);
        asio::error_code ignored;
        node.shutdown(asio::socket_base::shutdown_send, ignored);
        co_return;
      }
      asio::error_code read_ec;
      const size_t n = co_await agent.async_read_some(asio::buffer(buf),
                                                      asio::redirect_error(use_awaitable, read_ec));
      if (read_ec == asio::error::eof) {
        asio::error_code ignored;
        node.shutdown(asio::socket_base::shutdown_send, ignored);
        co_return;
      }
      if (read_ec) throw asio::system_error(read_ec);
      pending = std::string_view(buf.data(), n);
    }
  };
  countRelayEnd(co_await spliceBackWith(toNode(), agent, node, flow.record.bytes_up,
                                        flow.record.bytes_down, pipes_, config_.tcp_timeouts));
  finish(flow);
}

}  // namespace sambox
