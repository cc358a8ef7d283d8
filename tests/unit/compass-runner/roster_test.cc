#include "compass-runner/roster.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <thread>

#include "common/unique_fd.h"

namespace runner {
namespace {

// What sam-box's Metrics::render() writes (docs/sam-box.md), abridged.
constexpr const char* kSamBoxMetrics =
    "# HELP sam_box_flows_total Tunnels by outcome and route.\n"
    "# TYPE sam_box_flows_total counter\n"
    "sam_box_flows_total{outcome=\"allowed\",route=\"external\"} 3\n"
    "sam_box_flows_total{outcome=\"allowed\",route=\"mesh-entrypoint\"} 2\n"
    "sam_box_flows_total{outcome=\"denied\",route=\"unresolved\"} 4\n"
    "sam_box_flows_total{outcome=\"denied\",route=\"malformed\"} 1\n"
    "sam_box_flows_total{outcome=\"error\",route=\"external\"} 7\n"
    "# TYPE sam_box_refusals_total counter\n"
    "sam_box_refusals_total{reason=\"not-allowed\"} 100\n"
    "sam_box_flows_in_progress{route=\"external\"} 1\n";

TEST(ParseFlowCountsTest, SumsByOutcomeOverRoutes) {
  const FlowCounts c = parseFlowCounts(kSamBoxMetrics);
  EXPECT_EQ(c.allowed, 5U);
  EXPECT_EQ(c.denied, 5U);
}

TEST(ParseFlowCountsTest, NoSeriesIsZeroAndJunkIsSkipped) {
  EXPECT_EQ(parseFlowCounts("").allowed, 0U);
  const FlowCounts c = parseFlowCounts(
      "sam_box_flows_total_other{outcome=\"allowed\"} 9\n"
      "sam_box_flows_total{outcome=\"allowed\"\n"
      "sam_box_flows_total{outcome=\"allowed\"} nope\n"
      "sam_box_flows_total{outcome=\"allowed\"} -3\n"
      "sam_box_flows_total{route=\"x\",xoutcome=\"allowed\"} 8\n"
      "sam_box_flows_total{route=\"x\",outcome=\"denied\"} 2\r\n"
      "sam_box_flows_total{outcome=\"allowed\"} 1e3\n");
  EXPECT_EQ(c.allowed, 1000U);
  EXPECT_EQ(c.denied, 2U);
}

TEST(HttpBodyTest, StatusAndLength) {
  EXPECT_EQ(httpBody("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"), "hello");
  EXPECT_EQ(httpBody("HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nhello"), "he");
  EXPECT_EQ(httpBody("HTTP/1.0 200 OK\r\n\r\nuntil close"), "until close");
  EXPECT_FALSE(httpBody("HTTP/1.1 404 Not Found\r\n\r\nx"));
  EXPECT_FALSE(httpBody("HTTP/1.1 2000 OK\r\n\r\nx"));
  EXPECT_FALSE(httpBody("HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\nshort"));
  EXPECT_FALSE(httpBody("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello"));
  EXPECT_FALSE(httpBody("HTTP/1.1 200 OK\r\n"));
  EXPECT_FALSE(httpBody("SSH-2.0-OpenSSH\r\n\r\n"));
}

// A one-shot HTTP server on 127.0.0.1 that answers with `response` (or, if empty, accepts
// and never answers).
class OneShotServer {
 public:
  explicit OneShotServer(std::string response) : response_(std::move(response)) {
    fd_.reset(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(fd_.get(), reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    EXPECT_EQ(::listen(fd_.get(), 4), 0);
    socklen_t len = sizeof a;
    ::getsockname(fd_.get(), reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] {
      common::UniqueFd c(::accept4(fd_.get(), nullptr, nullptr, SOCK_CLOEXEC));
      if (!c.valid()) return;
      char buf[4096];
      const ssize_t n = ::recv(c.get(), buf, sizeof buf, 0);
      if (n > 0) request_.assign(buf, static_cast<size_t>(n));
      if (response_.empty()) {
        ::recv(c.get(), buf, sizeof buf, 0);  // until the client gives up
        return;
      }
      ::send(c.get(), response_.data(), response_.size(), MSG_NOSIGNAL);
    });
  }
  ~OneShotServer() {
    ::shutdown(fd_.get(), SHUT_RDWR);
    thread_.join();
  }
  [[nodiscard]] std::string addr() const { return "127.0.0.1:" + std::to_string(port_); }
  [[nodiscard]] const std::string& request() const { return request_; }

 private:
  std::string response_;
  common::UniqueFd fd_;
  uint16_t port_ = 0;
  std::thread thread_;
  std::string request_;
};

TEST(ScrapeFlowCountsTest, ReadsARealHttpServer) {
  const std::string body = kSamBoxMetrics;
  OneShotServer server(
      "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n"
      "Content-Length: " +
      std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body);
  const auto c = scrapeFlowCounts(server.addr());
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->allowed, 5U);
  EXPECT_EQ(c->denied, 5U);
}

TEST(ScrapeFlowCountsTest, ASilentServerIsGivenUpOnAfterTheTimeout) {
  OneShotServer server("");
  EXPECT_FALSE(scrapeFlowCounts(server.addr(), std::chrono::milliseconds(200)).has_value());
}

TEST(ScrapeFlowCountsTest, OnlyLoopbackLiterals) {
  for (const char* addr : {"10.0.0.1:9600", "example.com:80", "localhost:9600", "[2001:db8::1]:1",
                           "127.0.0.1", "garbage"}) {
    EXPECT_FALSE(scrapeFlowCounts(addr, std::chrono::milliseconds(100)).has_value()) << addr;
  }
}

TEST(FormatTest, Uptime) {
  EXPECT_EQ(formatUptime(-4), "0s");
  EXPECT_EQ(formatUptime(45), "45s");
  EXPECT_EQ(formatUptime(187), "3m07s");
  EXPECT_EQ(formatUptime(7500), "2h05m");
  EXPECT_EQ(formatUptime(273600), "3d04h");
}

RosterEntry entry(const std::string& id, const std::string& tier, const std::string& posture,
                  std::optional<FlowCounts> flows) {
  RosterEntry e;
  e.rec.id = id;
  e.rec.tier = tier;
  e.rec.posture = posture;
  e.rec.pid = 4321;
  e.rec.runner_pid = 1234;
  e.rec.command = {"sh", "-c", "echo it's"};
  e.uptime_s = 65;
  e.flows = flows;
  return e;
}

TEST(FormatTest, TableHasTheColumnsAndDashesWithoutASamBox) {
  const std::string table =
      formatTable({entry("a0000000001", "host", "unenforced", std::nullopt),
                   entry("a0000000002", "podman", "boundary", FlowCounts{12, 3})});
  std::istringstream lines(table);
  std::string header, host, podman;
  std::getline(lines, header);
  std::getline(lines, host);
  std::getline(lines, podman);
  EXPECT_EQ(header.substr(0, 2), "ID");
  for (const char* col : {"TIER", "EGRESS", "PID", "UPTIME", "ALLOWED", "DENIED", "COMMAND"}) {
    EXPECT_NE(header.find(col), std::string::npos) << col;
  }
  // Columns line up: each value starts where its header does.
  EXPECT_EQ(host.find("unenforced"), header.find("EGRESS"));
  EXPECT_EQ(podman.find("12"), header.find("ALLOWED"));
  EXPECT_EQ(podman.find(" 3 ") + 1, header.find("DENIED"));
  EXPECT_EQ(host.find('-', header.find("ALLOWED")), header.find("ALLOWED"));
  EXPECT_NE(host.find("1m05s"), std::string::npos);
  EXPECT_NE(host.find("sh -c 'echo it'\\''s'"), std::string::npos) << host;
  // No agents: the header alone.
  const std::string empty = formatTable({});
  EXPECT_EQ(std::count(empty.begin(), empty.end(), '\n'), 1);
}

TEST(FormatTest, JsonHasNumbersAsNumbersAndNullWithoutASamBox) {
  const auto j = nlohmann::json::parse(
      formatJson({entry("a0000000001", "host", "unenforced", std::nullopt),
                  entry("a0000000002", "podman", "firewall", FlowCounts{12, 3})}));
  ASSERT_TRUE(j.is_array());
  ASSERT_EQ(j.size(), 2U);
  EXPECT_EQ(j[0]["id"], "a0000000001");
  EXPECT_EQ(j[0]["tier"], "host");
  EXPECT_EQ(j[0]["egress"], "unenforced");
  EXPECT_EQ(j[0]["pid"], 4321);
  EXPECT_EQ(j[0]["uptime_s"], 65);
  EXPECT_TRUE(j[0]["allowed"].is_null());
  EXPECT_TRUE(j[0]["denied"].is_null());
  EXPECT_EQ(j[0]["command"], nlohmann::json({"sh", "-c", "echo it's"}));
  EXPECT_EQ(j[1]["allowed"], 12);
  EXPECT_EQ(j[1]["denied"], 3);
  EXPECT_EQ(nlohmann::json::parse(formatJson({})), nlohmann::json::array());
}

}  // namespace
}  // namespace runner
