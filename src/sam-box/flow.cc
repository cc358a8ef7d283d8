#include "sam-box/flow.h"

#include "common/log.h"

namespace sambox {

void finishFlow(const FlowRecord& flow, Metrics& metrics) {
  const char* route = routeLabel(flow.decision.route);
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                      std::chrono::steady_clock::now() - flow.started)
                      .count();
  metrics.flow(flow.outcome, route);
  if (!flow.reason.empty() && flow.outcome != "allowed") metrics.refusal(flow.reason);
  if (flow.bytes_up > 0) metrics.bytes("upstream", route, flow.bytes_up);
  if (flow.bytes_down > 0) metrics.bytes("downstream", route, flow.bytes_down);
  nlohmann::json fields = {
      {"agent", flow.agent},           {"kind", flow.kind},       {"name", flow.decision.name},
      {"port", flow.decision.port},    {"route", route},          {"outcome", flow.outcome},
      {"reason", flow.reason},         {"address", flow.address}, {"bytes_up", flow.bytes_up},
      {"bytes_down", flow.bytes_down}, {"duration_ms", ms}};
  if (!flow.detail.empty()) fields["detail"] = flow.detail;
  if (flow.outcome == "allowed") {
    common::log::info("flow", fields);
  } else {
    common::log::warn("flow", fields);
  }
}

}  // namespace sambox
