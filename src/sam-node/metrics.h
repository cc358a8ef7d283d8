#pragma once
// sam-node's counters in the Prometheus text format (0.0.4), served on --metrics-addr.
// Label values come from fixed sets (routes, outcomes, reasons, service names from the
// config): never an agent id or a URL. Thread-safe.

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>

#include "common/unique_fd.h"

namespace samnode {

class Metrics {
 public:
  /// sam_node_requests_total{route,outcome}: route "openai", "mcp", "a2a", "ops", "other";
  /// outcome "allowed", "denied", "error".
  void request(std::string_view route, std::string_view outcome);
  /// sam_node_refusals_total{reason}: every refusal, by its kebab-case reason.
  void refusal(std::string_view reason);
  /// sam_node_tool_calls_total{service,outcome}: outcome "allowed", "denied", "error".
  void toolCall(std::string_view service, std::string_view outcome);
  /// sam_node_a2a_ready{service}: 1 while the card probe succeeds, else 0.
  void a2aReady(std::string_view service, bool ready);
  /// sam_node_operations_total{operation,outcome}: operation "spawn", "secret-use".
  void operation(std::string_view operation, std::string_view outcome);

  /// Every family above, plus sam_node_upstream_fields_dropped_total (invalid response header
  /// fields dropped from upstream answers, upstream.h droppedResponseFields()).
  [[nodiscard]] std::string render() const;

 private:
  using Series = std::map<std::string, int64_t>;
  mutable std::mutex mu_;
  Series requests_, refusals_, tool_calls_, a2a_ready_, operations_;
};

/// Serves `GET /metrics` (text/plain; version=0.0.4) from `metrics` on a loopback TCP address,
/// from its own thread, one short request per connection. Anything but GET /metrics is 404.
class MetricsListener {
 public:
  /// `address`: "HOST:PORT" with HOST a loopback address (127.0.0.0/8, [::1]) or "localhost";
  /// port 0 picks a free one. Throws std::invalid_argument for a malformed or non-loopback
  /// address, std::runtime_error (with errno) if it cannot listen.
  MetricsListener(const Metrics& metrics, std::string_view address);
  ~MetricsListener();  ///< stops and joins the thread
  MetricsListener(const MetricsListener&) = delete;
  MetricsListener& operator=(const MetricsListener&) = delete;
  /// The bound port (useful with port 0).
  [[nodiscard]] uint16_t port() const { return port_; }

 private:
  void run();
  const Metrics& metrics_;
  common::UniqueFd listener_, wake_read_, wake_write_;
  uint16_t port_ = 0;
  std::thread thread_;
};

}  // namespace samnode
