#include "sam-box/metrics.h"

#include <gtest/gtest.h>

namespace sambox {
namespace {

TEST(MetricsTest, SeedSeriesAreExposedAndCount) {
  Metrics m;
  m.flow("allowed", "external");
  m.flow("allowed", "mesh-entrypoint");
  m.flow("allowed", "mesh-entrypoint");
  m.flow("denied", "unresolved");
  m.refusal("unresolved-address");
  const std::string text = m.render();
  EXPECT_NE(text.find("sam_box_flows_total{outcome=\"allowed\",route=\"external\"} 1\n"),
            std::string::npos);
  EXPECT_NE(text.find("sam_box_flows_total{outcome=\"allowed\",route=\"mesh-entrypoint\"} 2\n"),
            std::string::npos);
  EXPECT_NE(text.find("sam_box_flows_total{outcome=\"denied\",route=\"unresolved\"} 1\n"),
            std::string::npos);
  EXPECT_NE(text.find("sam_box_refusals_total{reason=\"unresolved-address\"} 1\n"),
            std::string::npos);
  EXPECT_NE(text.find("# TYPE sam_box_flows_total counter\n"), std::string::npos);
}

TEST(MetricsTest, RefusalAndLimitSeriesExistAtZeroBeforeTraffic) {
  // rate()/increase() need a sample before the first increment, or they miss it.
  Metrics m;
  const std::string before = m.render();
  EXPECT_NE(before.find("sam_box_refusals_total{reason=\"not-allowlisted\"} 0\n"),
            std::string::npos);
  EXPECT_NE(before.find("sam_box_refusals_total{reason=\"forbidden-address\"} 0\n"),
            std::string::npos);
  EXPECT_NE(before.find("sam_box_limit_hits_total{limit=\"max-concurrent-flows\"} 0\n"),
            std::string::npos);
  m.refusal("not-allowlisted");
  EXPECT_NE(m.render().find("sam_box_refusals_total{reason=\"not-allowlisted\"} 1\n"),
            std::string::npos);
}

TEST(MetricsTest, InProgressGaugeGoesUpAndDown) {
  Metrics m;
  m.inProgress("external", +1);
  m.inProgress("external", +1);
  m.inProgress("external", -1);
  EXPECT_EQ(m.flowsInProgress(), 1);
  EXPECT_NE(m.render().find("sam_box_flows_in_progress{route=\"external\"} 1\n"),
            std::string::npos);
}

TEST(MetricsTest, BytesAccumulate) {
  Metrics m;
  m.bytes("upstream", "external", 100);
  m.bytes("upstream", "external", 23);
  EXPECT_NE(m.render().find("sam_box_bytes_total{direction=\"upstream\",route=\"external\"} 123\n"),
            std::string::npos);
}

}  // namespace
}  // namespace sambox
