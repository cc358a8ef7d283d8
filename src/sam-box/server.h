#pragma once
// The boundary's listeners: the tunnel socket (--socket), the metrics endpoint
// (--metrics-addr) and the ingress listener (--ingress-listen). One io_context thread runs
// them all; each connection is one coroutine, and no flow has a thread of its own.

#include "sam-box/classify.h"
#include "sam-box/flow.h"
#include "sam-box/limits.h"
#include "sam-box/local_addresses.h"
#include "sam-box/metrics.h"
#include "sam-box/open_flows.h"
#include "sam-box/options.h"
#include "sam-box/relay.h"
#include "sam-box/resolver.h"

#include <asio/awaitable.hpp>
#include <asio/io_context.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/local/stream_protocol.hpp>
#include <asio/steady_timer.hpp>

#include <array>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace sambox {

class H2Session;

/// Binds a Unix stream listener at `path` with mode 0600. A stale socket file (nobody
/// accepting) is replaced; a live one, or a path that is not a socket, is refused.
/// Throws std::runtime_error naming `flag`, the path and the errno text.
asio::local::stream_protocol::acceptor bindUnixListener(asio::io_context& io,
                                                        const std::string& flag,
                                                        const std::string& path);

class Server {
  // An HTTP/2 connection's streams take the same decisions as HTTP/1.1 tunnels.
  friend class H2Session;

 public:
  Server(asio::io_context& io, const Config& config);
  /// Binds every listener and starts accepting. Throws std::runtime_error naming the flag
  /// of a listener that cannot be bound; nothing is left listening in that case.
  void start();
  /// Closes the listeners, removes the socket files it created, and ends every open flow:
  /// their sockets are closed, so each one writes its flow line (reason boundary-stopped) and
  /// is counted as it unwinds. `done` runs once they all have, or after kStopGrace (tunnels
  /// still being set up, e.g. waiting for a name lookup, may take that long), whichever is
  /// first. Nothing waits for a peer: an upstream that never reads does not delay it.
  void stop(std::function<void()> done = {});
  /// Connections being served (tunnels, HTTP/2 connections, ingress), set-up included.
  [[nodiscard]] size_t openFlows() const { return open_flows_.size(); }
  [[nodiscard]] Metrics& metrics() { return metrics_; }
  /// Whether the agent's identity has lapsed (credential_watch.h): while it has, a new mesh
  /// tunnel or stream is refused 403 credential-expired, and an open one ends at the agent's
  /// next bytes instead of passing them to the node.
  void setIdentityLapsed(bool lapsed) { identity_lapsed_ = lapsed; }
  [[nodiscard]] bool identityLapsed() const { return identity_lapsed_; }

 private:
  using UnixSocket = asio::local::stream_protocol::socket;
  using TcpSocket = asio::ip::tcp::socket;

  asio::awaitable<void> acceptTunnels();
  asio::awaitable<void> acceptMetrics();
  asio::awaitable<void> acceptIngress();
  /// After a failed accept(2) on `listener` (its flag, for the log): logs it and waits
  /// kAcceptBackoff (EMFILE and the like would fail again at once).
  asio::awaitable<void> acceptBackoff(const char* listener, asio::error_code error);
  /// A tunnel request head as read from the agent.
  struct Head {
    bool closed = false;     ///< the agent went away (or errored) before a complete head
    bool timed_out = false;  ///< kHeadReadTimeout passed first
    proto::TunnelRequestParser::Status status = proto::TunnelRequestParser::Status::kNeedMore;
    proto::TunnelKind kind = proto::TunnelKind::kConnectTcp;
    std::string authority;
    std::string early_data;  ///< bytes after the head, in the same read
    std::string error;       ///< the parser's reason for a malformed head
    bool h2 = false;         ///< the HTTP/2 preface arrived; early_data holds every byte read
  };
  asio::awaitable<Head> readHead(UnixSocket& agent);
  asio::awaitable<void> serveTunnel(UnixSocket agent);
  asio::awaitable<void> serveMetrics(TcpSocket client);
  asio::awaitable<void> serveIngress(TcpSocket client);

  struct Flow;
  /// Resolves the flow's name and checks every address (see routes.cc). Empty on failure,
  /// with `*reason` set to resolve-failed (and `record.detail` to the lookup's error in
  /// words), connect-timeout or forbidden-address (and `record.address` to the address
  /// refused), for the flow's log line.
  asio::awaitable<std::vector<asio::ip::address>> resolvePermitted(
      const Decision& d, asio::steady_timer::time_point deadline, const char** reason,
      FlowRecord& record);
  /// nullptr if every address may be connected to; else forbidden-address, with `*offending`
  /// set to the first one refused.
  [[nodiscard]] const char* judgeAddresses(const std::vector<asio::ip::address>& addresses,
                                           std::string* offending);
  /// resolvePermitted() for the flow's target when its answer is cached (no waiting): false
  /// if it is not. Else true, with the permitted addresses, or none and `*reason`.
  bool resolveCached(Flow& flow, std::vector<asio::ip::address>* addresses, const char** reason);
  /// The flow's permitted addresses: the cached answer (resolveCached()) without waiting, else
  /// resolvePermitted(); on failure answers the agent (403/502/504), records the flow, and
  /// returns an empty list.
  asio::awaitable<std::vector<asio::ip::address>> resolveOrRefuse(
      UnixSocket& agent, Flow& flow, asio::steady_timer::time_point deadline);
  /// Opens `upstream` and connects it to `ep` by `deadline` (then `*timed_out` is set).
  asio::awaitable<asio::error_code> connectUpstream(TcpSocket& upstream,
                                                    const asio::ip::tcp::endpoint& ep,
                                                    asio::steady_timer& deadline, bool* timed_out);
  /// connectUpstream() in two parts: what needs no waiting (opening, and the connect(2)s,
  /// which on a near host already finish the handshake), then, only if `*pending`, the wait.
  asio::error_code startConnect(TcpSocket& upstream, const asio::ip::tcp::endpoint& ep,
                                bool* pending);
  asio::awaitable<asio::error_code> finishConnect(TcpSocket& upstream, asio::steady_timer& deadline,
                                                  bool* timed_out);
  asio::awaitable<void> externalTcp(UnixSocket& agent, Flow& flow);
  asio::awaitable<void> externalUdp(UnixSocket& agent, Flow& flow);
  asio::awaitable<void> meshEntrypoint(UnixSocket& agent, Flow& flow);
  /// Sends the refusal (status + Boundary-Reason) and records the flow as denied/failed.
  asio::awaitable<void> refuse(UnixSocket& agent, Flow& flow, int status, const char* reason,
                               bool is_error);
  /// Writes the flow's line and metrics; a flow the boundary's stop ended says so (reason
  /// boundary-stopped).
  void finish(Flow& flow);
  /// If the boundary's stop came while `flow` was being set up: records it failed
  /// (boundary-stopped), finishes it and returns true.
  bool stoppedInSetUp(Flow& flow);
  /// Counts the limit (if any) that ended a relay.
  void countRelayEnd(RelayEnd end);
  /// The end of stop(): runs its `done` once.
  void stopped();

  asio::io_context& io_;
  const Config& config_;
  Metrics metrics_;
  Resolver resolver_;
  LocalAddresses local_addresses_;
  PipePool pipes_{kRelayPipeBytes, kRelayIdlePipes};
  size_t active_flows_ = 0;
  /// HTTP/2 streams alive over every connection (limits.h kMaxH2Streams), and how many
  /// connections wait for room. h2_room_'s expiry stays at max: cancel() wakes every waiter.
  size_t h2_streams_ = 0;
  /// Ingress connections being served (limits.h kMaxIngressConnections).
  size_t ingress_connections_ = 0;
  size_t h2_waiting_ = 0;
  asio::steady_timer h2_room_;
  bool identity_lapsed_ = false;
  /// Every connection being served, so that stop() can end each one.
  OpenFlows open_flows_;
  asio::steady_timer stop_grace_;
  std::function<void()> on_stopped_;
  /// readHead()'s first read, which never waits: one buffer for every flow instead of a
  /// 16 KiB allocation per flow.
  std::array<char, kReadBufferBytes> head_buffer_{};
  std::unique_ptr<asio::local::stream_protocol::acceptor> tunnel_acceptor_;
  std::unique_ptr<asio::ip::tcp::acceptor> metrics_acceptor_;
  std::unique_ptr<asio::ip::tcp::acceptor> ingress_acceptor_;
};

}  // namespace sambox
