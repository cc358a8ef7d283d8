#pragma once
// One tunnel's record: what was asked, what was decided, what moved. finish() writes the one
// JSON log line per outcome and the metrics, so every path through the server reports the
// same way.

#include "sam-box/classify.h"
#include "sam-box/metrics.h"

#include <chrono>
#include <cstdint>
#include <string>

namespace sambox {

// Failure reasons decided after classification (Boundary-Reason values).
inline constexpr const char* kReasonForbiddenAddress = "forbidden-address";
inline constexpr const char* kReasonResolveFailed = "resolve-failed";
inline constexpr const char* kReasonConnectFailed = "connect-failed";
inline constexpr const char* kReasonConnectTimeout = "connect-timeout";
inline constexpr const char* kReasonNodeUnavailable = "node-unavailable";
inline constexpr const char* kReasonHeaderTooLarge = "header-too-large";
inline constexpr const char* kReasonHeaderTimeout = "header-timeout";
inline constexpr const char* kReasonMethodNotAllowed = "method-not-allowed";
inline constexpr const char* kReasonTooManyFlows = "too-many-flows";
/// An HTTP/2 stream the agent reset (or whose connection ended) before its tunnel was open.
inline constexpr const char* kReasonStreamReset = "stream-reset";
/// sam-box was stopped (SIGTERM/SIGINT) while the flow was open (outcome stays "allowed") or
/// being set up (outcome "error").
inline constexpr const char* kReasonBoundaryStopped = "boundary-stopped";

struct FlowRecord {
  std::string agent;
  std::string kind = "tcp";  ///< "tcp" or "udp"
  Decision decision;
  std::string outcome;  ///< "allowed", "denied" or "error"
  std::string reason;   ///< empty when allowed, unless boundary-stopped ended the flow
  std::string address;  ///< upstream address connected to, if any
  std::string detail;   ///< why a request was malformed (parser's words) or a lookup failed,
                        ///< for the log only
  uint64_t bytes_up = 0;
  uint64_t bytes_down = 0;
  std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();

  /// Marks the flow refused (outcome "denied") or failed ("error") with `why`.
  void refuse(std::string why) {
    outcome = "denied";
    reason = std::move(why);
  }
  void fail(std::string why) {
    outcome = "error";
    reason = std::move(why);
  }
  /// The boundary's stop ended this flow: an open one stays allowed and says why it ended;
  /// one still being set up failed. A reason decided before the stop is kept.
  void stoppedByBoundary() {
    if (outcome == "allowed") {
      reason = kReasonBoundaryStopped;
    } else if (reason.empty()) {
      fail(kReasonBoundaryStopped);
    }
  }
};

/// Logs the flow's one JSON line (msg "flow": agent, kind, name, port, route, outcome, reason,
/// address, detail if any, bytes_up, bytes_down, duration_ms) and updates flows, refusals and bytes
/// metrics. The reason of an allowed flow (boundary-stopped) is no refusal and is not counted
/// as one.
void finishFlow(const FlowRecord& flow, Metrics& metrics);

}  // namespace sambox
