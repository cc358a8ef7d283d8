#pragma once
// The boundary's counters, exposed in the Prometheus text format (version 0.0.4) on
// --metrics-addr. Seed 003: "Refusals do not show up as latency, so counting them is the only
// way to see them." Every label value comes from a fixed set (routes, outcomes, reasons,
// limits, directions): never a host name, so cardinality stays bounded whatever the agent does.
// Debian ships no prometheus-cpp, and the format is a few lines of text, so it is written here.
// Single-threaded: called only from the io_context thread.

#include <cstdint>
#include <map>
#include <string>
#include <string_view>

namespace sambox {

class Metrics {
 public:
  Metrics();
  /// sam_box_flows_total{outcome,route}: outcome "allowed", "denied" or "error".
  void flow(std::string_view outcome, std::string_view route);
  /// sam_box_refusals_total{reason}: every refusal and upstream failure, by reason.
  void refusal(std::string_view reason);
  /// sam_box_bytes_total{direction,route}: direction "upstream" (from the sandbox) or
  /// "downstream" (to the sandbox); `bytes` in bytes.
  void bytes(std::string_view direction, std::string_view route, uint64_t bytes);
  /// sam_box_flows_in_progress{route} += delta.
  void inProgress(std::string_view route, int delta);
  /// sam_box_limit_hits_total{limit}.
  void limitHit(std::string_view limit);
  /// sam_box_ingress_requests_total{outcome}: connections delivered into the sandbox.
  void ingress(std::string_view outcome);
  /// Current value of sam_box_flows_in_progress summed over routes.
  [[nodiscard]] int64_t flowsInProgress() const;

  /// The whole exposition, HELP and TYPE lines included.
  [[nodiscard]] std::string render() const;

 private:
  using Series = std::map<std::string, int64_t>;  // rendered label set -> value
  /// The value of `family`'s series {key1="value1"[,key2="value2"]}, created at 0 if new.
  int64_t& series(Series& family, std::string_view key1, std::string_view value1,
                  std::string_view key2 = {}, std::string_view value2 = {});
  Series flows_, refusals_, bytes_, in_progress_, limits_, ingress_;
  std::string scratch_;  ///< series()'s label set, reused
};

}  // namespace sambox
