#include "sam-box/metrics.h"

#include "sam-box/classify.h"
#include "sam-box/flow.h"
#include "sam-box/limits.h"

namespace sambox {
namespace {

void renderFamily(std::string* out, const char* name, const char* type, const char* help,
                  const std::map<std::string, int64_t>& series) {
  out->append("# HELP ").append(name).append(" ").append(help).append("\n");
  out->append("# TYPE ").append(name).append(" ").append(type).append("\n");
  for (const auto& [label_set, value] : series) {
    out->append(name).append(label_set).append(" ").append(std::to_string(value)).append("\n");
  }
}

}  // namespace

Metrics::Metrics() {
  // Pre-declare the common series at zero so dashboards and alerts see them before traffic.
  for (const char* route : {"external", "mesh-entrypoint", "unresolved"}) {
    for (const char* outcome : {"allowed", "denied", "error"}) {
      series(flows_, "outcome", outcome, "route", route) = 0;
    }
    series(in_progress_, "route", route) = 0;
  }
  // Every reason and limit too: a counter born at its first increment loses that increment to
  // rate() and increase(), so a one-off refusal would never show on a dashboard.
  for (const char* reason :
       {kReasonNotAllowlisted, kReasonUnresolved, kReasonInvalidName, kReasonNoIdentity,
        kReasonMeshUdp, kReasonMeshPort, kReasonMalformed, kReasonForbiddenAddress,
        kReasonResolveFailed, kReasonConnectFailed, kReasonConnectTimeout, kReasonNodeUnavailable,
        kReasonHeaderTooLarge, kReasonHeaderTimeout, kReasonMethodNotAllowed, kReasonTooManyFlows,
        kReasonStreamReset, kReasonBoundaryStopped, kReasonCredentialExpired}) {
    series(refusals_, "reason", reason) = 0;
  }
  for (const char* limit :
       {kLimitMaxHeaderBytes, kLimitMaxConcurrentFlows, kLimitMaxIngressConnections,
        kLimitConnectTimeout, kLimitHeadReadTimeout, kLimitUdpIdleTimeout, kLimitTcpIdleTimeout,
        kLimitHalfClosedTimeout}) {
    series(limits_, "limit", limit) = 0;
  }
}

int64_t& Metrics::series(Series& family, std::string_view key1, std::string_view value1,
                         std::string_view key2, std::string_view value2) {
  // The label set is built in a reused buffer and looked up; a string is allocated only for a
  // series seen for the first time (a flow costs five lookups, and this is on its path).
  scratch_.assign("{").append(key1).append("=\"").append(value1).append("\"");
  if (!key2.empty()) scratch_.append(",").append(key2).append("=\"").append(value2).append("\"");
  scratch_.append("}");
  auto it = family.find(scratch_);
  if (it == family.end()) it = family.emplace(scratch_, 0).first;
  return it->second;
}

void Metrics::flow(std::string_view outcome, std::string_view route) {
  ++series(flows_, "outcome", outcome, "route", route);
}
void Metrics::refusal(std::string_view reason) { ++series(refusals_, "reason", reason); }
void Metrics::bytes(std::string_view direction, std::string_view route, uint64_t n) {
  series(bytes_, "direction", direction, "route", route) += static_cast<int64_t>(n);
}
void Metrics::inProgress(std::string_view route, int delta) {
  series(in_progress_, "route", route) += delta;
}
void Metrics::limitHit(std::string_view limit) { ++series(limits_, "limit", limit); }
void Metrics::ingress(std::string_view outcome) { ++series(ingress_, "outcome", outcome); }

int64_t Metrics::flowsInProgress() const {
  int64_t total = 0;
  for (const auto& [k, v] : in_progress_) total += v;
  return total;
}

std::string Metrics::render() const {
  std::string out;
  renderFamily(&out, "sam_box_flows_total", "counter",
               "Tunnels decided, by outcome (allowed, denied, error) and route.", flows_);
  renderFamily(&out, "sam_box_refusals_total", "counter",
               "Refused or failed tunnels, by stable reason (the Boundary-Reason header).",
               refusals_);
  renderFamily(&out, "sam_box_bytes_total", "counter",
               "Bytes relayed, by direction (upstream = from the sandbox) and route.", bytes_);
  renderFamily(&out, "sam_box_flows_in_progress", "gauge", "Tunnels open now, by route.",
               in_progress_);
  renderFamily(&out, "sam_box_limit_hits_total", "counter",
               "Times a named limit of the boundary was hit.", limits_);
  renderFamily(&out, "sam_box_ingress_requests_total", "counter",
               "Inbound connections carried into the sandbox, by outcome.", ingress_);
  return out;
}

}  // namespace sambox
