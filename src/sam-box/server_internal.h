#pragma once
// Pieces shared by the server's translation units (server.cc, routes.cc, ingress.cc).

#include "proto/request_rewriter.h"
#include "sam-box/flow.h"
#include "sam-box/server.h"

#include <asio/ip/address.hpp>
#include <asio/steady_timer.hpp>

#include <functional>
#include <string>
#include <string_view>

namespace sambox {

struct Server::Flow {
  FlowRecord record;
  proto::TunnelKind kind = proto::TunnelKind::kConnectTcp;
  std::string early_data;  ///< bytes the agent sent after the request head, before our answer
  bool stopped = false;    ///< the boundary's stop ended it (its sockets are closed)
  /// Closes the route's upstream socket (set while the route has one; see ScopedCloser).
  std::function<void()> close_upstream;
};

/// Takes one place of a count (Server::active_flows_, ingress_connections_) for as long as it
/// lives; the caller checks the cap first.
class CountedPlace {
 public:
  explicit CountedPlace(size_t& count) : count_(count) { ++count_; }
  ~CountedPlace() { --count_; }
  CountedPlace(const CountedPlace&) = delete;
  CountedPlace& operator=(const CountedPlace&) = delete;

 private:
  size_t& count_;
};

/// Sets `slot` to close `socket` for as long as this lives (a route's upstream socket, for
/// stop()).
class ScopedCloser {
 public:
  template <typename Socket>
  ScopedCloser(std::function<void()>& slot, Socket& socket) : slot_(slot) {
    slot_ = [&socket] {
      asio::error_code ignored;
      socket.close(ignored);
    };
  }
  ~ScopedCloser() { slot_ = nullptr; }
  ScopedCloser(const ScopedCloser&) = delete;
  ScopedCloser& operator=(const ScopedCloser&) = delete;

 private:
  std::function<void()>& slot_;
};

/// As much of `data` as `socket` takes at once, without waiting (0 if none; `ec` set on an
/// error, not on a full socket). The answer to a tunnel request is small and the agent's
/// socket empty, so it nearly always goes whole, without a trip through the reactor.
size_t sendNow(asio::local::stream_protocol::socket& socket, std::string_view data,
               asio::error_code& ec);

/// `addr` as asio's to_string() writes it (inet_ntop(3)), an IPv4 address without the
/// printf(3) that inet_ntop spends on it: it is formatted for every flow's log line.
std::string addressText(const asio::ip::address& addr);

/// Why an open mesh tunnel or stream (HTTP/1.1 or HTTP/2) stops passing requests to the node:
/// status 0 while it goes on.
struct MeshRefusal {
  int status = 0;  ///< 403, 431 or 400: what the agent reads when nothing reached the node yet
  const char* reason = nullptr;  ///< Boundary-Reason
  std::string error;             ///< for the log line
};

/// 403 credential-expired: the identity lapsed (asked before a chunk is fed, so nothing of it
/// reaches the node).
MeshRefusal credentialExpiredRefusal();

/// What `status`, the rewriter's answer to a chunk, means: 431 header-too-large, 400
/// malformed-request, or nothing (status 0).
MeshRefusal rewriterRefusal(proto::RequestStreamRewriter::Status status,
                            const proto::RequestStreamRewriter& rewriter);

/// Logs `refusal` ("mesh request refused mid-stream", with agent and reason) and counts it in
/// sam_box_refusals_total (and a too-large head in sam_box_limit_hits_total).
void reportMeshRefusal(Metrics& metrics, const std::string& agent, const MeshRefusal& refusal);

/// Counts a flow in sam_box_flows_in_progress for its lifetime.
class InProgress {
 public:
  InProgress(Metrics& metrics, const char* route) : metrics_(metrics), route_(route) {
    metrics_.inProgress(route_, +1);
  }
  ~InProgress() { metrics_.inProgress(route_, -1); }
  InProgress(const InProgress&) = delete;
  InProgress& operator=(const InProgress&) = delete;

 private:
  Metrics& metrics_;
  const char* route_;
};

}  // namespace sambox
