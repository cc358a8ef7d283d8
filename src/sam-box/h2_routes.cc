// The routes of an HTTP/2 stream: the request checks, then the same decision (classify()),
// address checks (Server::resolvePermitted) and flow record as an HTTP/1.1 tunnel, and the
// three ways out (external TCP, external UDP, the mesh entrypoint) relayed through the
// stream's flow-controlled buffers (h2_session.h).

#include "common/log.h"
#include "proto/capsule.h"
#include "proto/request_rewriter.h"
#include "proto/tunnel_request.h"
#include "sam-box/h2_session.h"
#include "sam-box/limits.h"
#include "sam-box/server_internal.h"

#include <asio/experimental/awaitable_operators.hpp>
#include <asio/ip/udp.hpp>
#include <asio/redirect_error.hpp>
#include <asio/write.hpp>

#include <algorithm>
#include <array>
#include <vector>

namespace sambox {

using asio::use_awaitable;
using asio::experimental::awaitable_operators::operator||;
using asio::experimental::awaitable_operators::operator&&;

namespace {

/// Clears a stream's cancel hook when the route's sockets go out of scope.
struct CancelHook {
  H2Stream& s;
  ~CancelHook() { s.cancel = nullptr; }
};

/// The request of an HTTP/2 stream as an HTTP/1.1 tunnel head would have given it.
struct StreamRequest {
  int status = 0;  ///< 0: a tunnel request; else the refusal (400 or 405)
  const char* reason = nullptr;
  std::string detail;
  proto::TunnelKind kind = proto::TunnelKind::kConnectTcp;
  std::string target;  ///< host:port
};

StreamRequest checkRequest(const H2Stream& s) {
  StreamRequest r;
  auto malformed = [&r](std::string why) {
    r.status = 400;
    r.reason = kReasonMalformed;
    r.detail = std::move(why);
    return r;
  };
  if (!s.bad.empty()) return malformed(s.bad);
  if (s.method.empty()) return malformed(":method missing");
  if (s.method != "CONNECT") {
    r.status = 405;
    r.reason = kReasonMethodNotAllowed;
    return r;
  }
  if (s.authority.empty()) return malformed(":authority missing");
  if (s.protocol.empty()) {
    // RFC 9113 §8.5: a plain CONNECT has neither :scheme nor :path.
    if (!s.scheme.empty() || !s.path.empty()) return malformed(":scheme or :path on CONNECT");
    r.target = s.authority;
    return r;
  }
  if (s.protocol != "connect-udp") {
    r.status = 405;
    r.reason = kReasonMethodNotAllowed;
    return r;
  }
  // RFC 8441 §4 / RFC 9298 §3.4: extended CONNECT carries :scheme and :path.
  if (s.scheme.empty() || s.path.empty()) return malformed(":scheme or :path missing");
  std::string why;
  if (!proto::connectUdpAuthority(s.path, &r.target, &why)) return malformed(why);
  r.kind = proto::TunnelKind::kConnectUdp;
  return r;
}

int resolveFailureStatus(const char* reason) {
  if (reason == kReasonForbiddenAddress) return 403;
  return reason == kReasonConnectTimeout ? 504 : 502;
}

}  // namespace

asio::awaitable<void> H2Session::refuseStream(H2Stream& s, FlowRecord& record, int status,
                                              const char* reason, bool is_error) {
  if (is_error) {
    record.fail(reason);
  } else {
    record.refuse(reason);
  }
  respond(s, status, reason, false, false);
  finishStream(record);
  co_return;
}

void H2Session::finishStream(FlowRecord& record) {
  if (stopped_) record.stoppedByBoundary();
  finishFlow(record, server_.metrics_);
}

// A stream that nghttp2 has closed (the agent's RST_STREAM, or the connection's end) before
// its route opened the upstream: cancel hooks are set only once there is an upstream socket,
// so each step that can take time (the co_spawn hand-off, resolving, connecting) checks this
// after it, or an agent could make the box hold an upstream connection and a flow place per
// reset stream (the rapid-reset pattern, CVE-2023-44487). The boundary's stop closes every
// stream too: `stopped` says so.
namespace {
bool abandonedBeforeOpen(H2Stream& s, FlowRecord& record, Metrics& metrics, bool stopped) {
  if (!s.closed) return false;
  record.fail(stopped ? kReasonBoundaryStopped : kReasonStreamReset);
  finishFlow(record, metrics);
  return true;
}
}  // namespace

template <class Socket>
asio::awaitable<void> H2Session::relayToAgent(H2Stream& s, Socket& from, uint64_t& bytes_down) {
  std::array<char, kReadBufferBytes> buf{};
  for (;;) {
    asio::error_code ec;
    const size_t n =
        co_await from.async_read_some(asio::buffer(buf), asio::redirect_error(use_awaitable, ec));
    if (ec == asio::error::eof) {
      endToAgent(s);
      co_return;
    }
    if (ec) {
      reset(s, NGHTTP2_CONNECT_ERROR);
      co_return;
    }
    if (!co_await sendToAgent(s, std::string_view(buf.data(), n))) co_return;
    bytes_down += n;
  }
}

asio::awaitable<void> H2Session::serveStream(std::shared_ptr<H2Stream> stream) {
  auto self = shared_from_this();
  H2Stream& s = *stream;
  FlowRecord record;
  record.agent = server_.config_.agentId();
  if (server_.active_flows_ >= kMaxConcurrentFlows) {
    server_.metrics_.limitHit(kLimitMaxConcurrentFlows);
    co_await refuseStream(s, record, 503, kReasonTooManyFlows, true);
  } else {
    const CountedPlace place(server_.active_flows_);
    const StreamRequest request = checkRequest(s);
    if (abandonedBeforeOpen(s, record, server_.metrics_, stopped_)) {
      // reset before it was served: nothing was opened for it
    } else if (s.too_large) {
      server_.metrics_.limitHit(kLimitMaxHeaderBytes);
      co_await refuseStream(s, record, 431, kReasonHeaderTooLarge, false);
    } else if (request.status != 0) {
      record.detail = request.detail;
      co_await refuseStream(s, record, request.status, request.reason, false);
    } else {
      record.kind = request.kind == proto::TunnelKind::kConnectUdp ? "udp" : "tcp";
      record.decision =
          classify(server_.config_, request.kind, request.target, server_.identity_lapsed_);
      if (!record.decision.allowed) {
        co_await refuseStream(s, record, record.decision.status, record.decision.reason.c_str(),
                              false);
      } else if (record.decision.route == Route::kMeshEntrypoint) {
        co_await streamMesh(s, record);
      } else if (request.kind == proto::TunnelKind::kConnectUdp) {
        co_await streamUdp(s, record);
      } else {
        co_await streamTcp(s, record);
      }
    }
  }
  // Whatever the agent still sends on this stream is credited and dropped.
  s.finished = true;
  consumed(s, s.in.size());
  s.in.clear();
}

asio::awaitable<void> H2Session::idleWatch(const H2Stream& s, std::chrono::milliseconds timeout,
                                           const char* limit, bool half_close) {
  const TcpTimeouts& timeouts = server_.config_.tcp_timeouts;
  asio::steady_timer timer(agent_.get_executor());
  for (;;) {
    const bool half_closed = half_close && (s.in_eof || s.out_eof);
    const auto due = s.last_activity + (half_closed ? timeouts.half_closed : timeout);
    const auto now = std::chrono::steady_clock::now();
    if (now >= due) {
      server_.metrics_.limitHit(half_closed ? kLimitHalfClosedTimeout : limit);
      co_return;
    }
    // Wake at the due time, or sooner to notice a direction ending (which shortens it).
    timer.expires_after(
        std::min<std::chrono::steady_clock::duration>(due - now, timeouts.check_interval));
    asio::error_code ec;
    co_await timer.async_wait(asio::redirect_error(use_awaitable, ec));
    if (ec) co_return;  // cancelled: the flow ended another way
  }
}

asio::awaitable<void> H2Session::streamTcp(H2Stream& s, FlowRecord& record) {
  const auto deadline = asio::steady_timer::clock_type::now() + kConnectTimeout;
  const char* reason = nullptr;
  const auto addresses =
      co_await server_.resolvePermitted(record.decision, deadline, &reason, record);
  if (abandonedBeforeOpen(s, record, server_.metrics_, stopped_)) co_return;
  if (addresses.empty()) {
    co_await refuseStream(s, record, resolveFailureStatus(reason), reason,
                          reason != kReasonForbiddenAddress);
    co_return;
  }
  asio::steady_timer connect_deadline(agent_.get_executor(), deadline);
  TcpSocket upstream(agent_.get_executor());
  CancelHook hook{s};
  s.cancel = [&upstream] {
    asio::error_code ignored;
    upstream.close(ignored);
  };
  bool connected = false;
  bool timed_out = false;
  for (const auto& addr : addresses) {
    const asio::ip::tcp::endpoint ep(addr, record.decision.port);
    record.address = addressText(ep.address());  // the one connected, or the last that failed
    upstream = TcpSocket(agent_.get_executor());
    const asio::error_code ec =
        co_await server_.connectUpstream(upstream, ep, connect_deadline, &timed_out);
    if (!ec) {
      connected = true;
      record.detail.clear();  // an earlier address's failure is not this flow's
      break;
    }
    if (!timed_out) record.detail = ec.message();
    if (timed_out || s.closed) break;
  }
  if (abandonedBeforeOpen(s, record, server_.metrics_, stopped_)) co_return;  // closes `upstream`
  if (!connected) {
    if (timed_out) server_.metrics_.limitHit(kLimitConnectTimeout);
    co_await refuseStream(s, record, timed_out ? 504 : 502,
                          timed_out ? kReasonConnectTimeout : kReasonConnectFailed, true);
    co_return;
  }
  asio::error_code ignored;
  upstream.set_option(asio::ip::tcp::no_delay(true), ignored);
  respond(s, 200, nullptr, true, false);
  record.outcome = "allowed";
  InProgress guard(server_.metrics_, routeLabel(record.decision.route));

  auto up = [&]() -> asio::awaitable<void> {
    std::string chunk;
    while (co_await agentData(s)) {
      chunk.clear();
      chunk.swap(s.in);  // the agent's next DATA may arrive while this is written
      asio::error_code ec;
      co_await asio::async_write(upstream, asio::buffer(chunk),
                                 asio::redirect_error(use_awaitable, ec));
      consumed(s, chunk.size());
      if (ec) {
        reset(s, NGHTTP2_CONNECT_ERROR);  // RFC 9113 §8.5: the TCP connection failed
        co_return;
      }
      record.bytes_up += chunk.size();
      s.last_activity = std::chrono::steady_clock::now();
    }
    asio::error_code ec;
    if (s.in_eof && !s.closed) upstream.shutdown(asio::socket_base::shutdown_send, ec);
  };
  co_await ((up() && relayToAgent(s, upstream, record.bytes_down)) ||
            idleWatch(s, server_.config_.tcp_timeouts.idle, kLimitTcpIdleTimeout, true));
  if (!s.out_eof) reset(s, NGHTTP2_CANCEL);
  finishStream(record);
}

asio::awaitable<void> H2Session::streamUdp(H2Stream& s, FlowRecord& record) {
  const auto deadline = asio::steady_timer::clock_type::now() + kConnectTimeout;
  const char* reason = nullptr;
  const auto addresses =
      co_await server_.resolvePermitted(record.decision, deadline, &reason, record);
  if (abandonedBeforeOpen(s, record, server_.metrics_, stopped_)) co_return;
  if (addresses.empty()) {
    co_await refuseStream(s, record, resolveFailureStatus(reason), reason,
                          reason != kReasonForbiddenAddress);
    co_return;
  }
  const asio::ip::udp::endpoint target(addresses.front(), record.decision.port);
  asio::ip::udp::socket upstream(agent_.get_executor());
  asio::error_code ec;
  upstream.connect(target, ec);
  if (ec) {
    co_await refuseStream(s, record, 502, kReasonConnectFailed, true);
    co_return;
  }
  CancelHook hook{s};
  s.cancel = [&upstream] {
    asio::error_code ignored;
    upstream.close(ignored);
  };
  record.address = target.address().to_string();
  respond(s, 200, nullptr, true, true);
  record.outcome = "allowed";
  InProgress guard(server_.metrics_, routeLabel(record.decision.route));

  auto toUpstream = [&]() -> asio::awaitable<void> {
    proto::CapsuleReader reader;
    while (co_await agentData(s)) {
      const size_t n = s.in.size();
      reader.append(s.in);
      s.in.clear();
      consumed(s, n);  // bounded by the reader: one capsule plus what just came
      for (auto st = reader.next(); st != proto::CapsuleReader::Status::kNeedMore;
           st = reader.next()) {
        if (st == proto::CapsuleReader::Status::kTooLarge) {
          reset(s, NGHTTP2_PROTOCOL_ERROR);
          co_return;
        }
        asio::error_code send_ec;
        co_await upstream.async_send(asio::buffer(reader.payload().data(), reader.payload().size()),
                                     asio::redirect_error(use_awaitable, send_ec));
        if (!send_ec) record.bytes_up += reader.payload().size();
        s.last_activity = std::chrono::steady_clock::now();
      }
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
      if (!co_await sendToAgent(s, capsule)) co_return;
      record.bytes_down += n;
    }
  };
  co_await (toUpstream() || toAgent() ||
            idleWatch(s, kUdpIdleTimeout, kLimitUdpIdleTimeout, false));
  endToAgent(s);
  finishStream(record);
}

asio::awaitable<void> H2Session::streamMesh(H2Stream& s, FlowRecord& record) {
  asio::local::stream_protocol::socket node(agent_.get_executor());
  asio::error_code ec;
  const std::string& sidecar = server_.config_.flags.sidecar_socket;
  if (sidecar.empty()) {
    ec = asio::error::not_found;
  } else {
    co_await node.async_connect(asio::local::stream_protocol::endpoint(sidecar),
                                asio::redirect_error(use_awaitable, ec));
  }
  if (abandonedBeforeOpen(s, record, server_.metrics_, stopped_)) co_return;  // closes `node`
  if (ec) {
    common::log::warn("node API socket unreachable",
                      {{"sidecar_socket", sidecar}, {"error", ec.message()}});
    co_await refuseStream(s, record, 502, kReasonNodeUnavailable, true);
    co_return;
  }
  CancelHook hook{s};
  s.cancel = [&node] {
    asio::error_code ignored;
    node.close(ignored);
  };
  respond(s, 200, nullptr, true, false);
  record.outcome = "allowed";
  InProgress guard(server_.metrics_, routeLabel(record.decision.route));

  // Requests are rewritten (the sandbox never chooses its own X-Sam-Agent); responses are
  // relayed untouched.
  auto toNode = [&]() -> asio::awaitable<void> {
    proto::RequestStreamRewriter rewriter("X-Sam-Agent", server_.config_.agentId());
    std::string chunk;
    std::string out;
    while (co_await agentData(s)) {
      chunk.clear();
      chunk.swap(s.in);
      // A request the node must not see: the identity lapsed (credential_watch.h), or the
      // stream is no HTTP/1.1 the rewriter can vouch for.
      asio::error_code write_ec;
      MeshRefusal refusal;
      if (server_.identity_lapsed_ && !chunk.empty()) {
        refusal = credentialExpiredRefusal();
      } else {
        out.clear();
        const auto status = rewriter.feed(chunk, &out);
        if (!out.empty()) {
          co_await asio::async_write(node, asio::buffer(out),
                                     asio::redirect_error(use_awaitable, write_ec));
          if (!write_ec) record.bytes_up += out.size();
          s.last_activity = std::chrono::steady_clock::now();
        }
        refusal = rewriterRefusal(status, rewriter);
      }
      consumed(s, chunk.size());
      if (refusal.status != 0) {
        reportMeshRefusal(server_.metrics_, server_.config_.agentId(), refusal);
        if (rewriter.requests() != 0 || record.bytes_up != 0 || write_ec) {
          // Answers to earlier requests may still be on their way back: nothing can be put
          // between them, so the stream is reset.
          reset(s, refusal.status == 403 ? NGHTTP2_CANCEL : NGHTTP2_PROTOCOL_ERROR);
          node.close(write_ec);
          co_return;
        }
        // Nothing reached the node, so nothing of its is on the way back: a readable 403, 431
        // or 400 on the stream, then the node's end of stream ends it (relayToAgent).
        if (co_await sendToAgent(s, proto::errorResponse(refusal.status, refusal.reason))) {
          node.shutdown(asio::socket_base::shutdown_send, write_ec);
        } else {
          node.close(write_ec);
        }
        co_return;
      }
      if (write_ec) {
        reset(s, NGHTTP2_CONNECT_ERROR);
        co_return;
      }
    }
    asio::error_code ignored;
    if (s.in_eof && !s.closed) node.shutdown(asio::socket_base::shutdown_send, ignored);
  };
  co_await ((toNode() && relayToAgent(s, node, record.bytes_down)) ||
            idleWatch(s, server_.config_.tcp_timeouts.idle, kLimitTcpIdleTimeout, true));
  if (!s.out_eof) reset(s, NGHTTP2_CANCEL);
  finishStream(record);
}

}  // namespace sambox
