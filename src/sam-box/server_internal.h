#pragma once
// Pieces shared by the server's translation units (server.cc, routes.cc, ingress.cc).

#include "sam-box/flow.h"
#include "sam-box/server.h"

#include <asio/steady_timer.hpp>

#include <string>

namespace sambox {

struct Server::Flow {
  FlowRecord record;
  proto::TunnelKind kind = proto::TunnelKind::kConnectTcp;
  std::string early_data;  ///< bytes the agent sent after the request head, before our answer
};

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
