// The relays as the Server runs them, over real Unix sockets (the tunnel socket and a stand-in
// for the node's API socket, which never reads): the mesh route's half-closed timeout
// (shortened through Config::tcp_timeouts) and Server::stop() ending an open flow, with its
// count, promptly, while its upstream never reads.

#include "sam-box/server.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
#include <asio/io_context.hpp>
#include <asio/post.hpp>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <future>
#include <string>
#include <thread>

namespace sambox {
namespace {

using std::chrono::milliseconds;

int unixSocket() { return ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0); }

sockaddr_un unixAddress(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  path.copy(addr.sun_path, sizeof addr.sun_path - 1);
  return addr;
}

/// Whether `fd` becomes readable (data or EOF) within `timeout`.
bool readable(int fd, milliseconds timeout) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, static_cast<int>(timeout.count())) == 1;
}

/// An io_context whose parked handlers can be destroyed before the Server (main.cc's IoContext).
class TestIo : public asio::io_context {
 public:
  using asio::io_context::io_context;
  void destroyPendingWork() { shutdown(); }
};

/// A box with an agent identity and a "node" socket that accepts and never reads.
class RelayServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/relay_server_test.XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    config_.flags.socket = dir_ + "/agent.sock";
    config_.flags.sidecar_socket = dir_ + "/node.sock";
    policy::Bundle bundle;
    bundle.agent_id = "researcher-1.prod.acme.example";
    config_.bundle = bundle;

    node_listener_ = unixSocket();
    const sockaddr_un addr = unixAddress(config_.flags.sidecar_socket);
    ASSERT_EQ(::bind(node_listener_, reinterpret_cast<const sockaddr*>(&addr), sizeof addr), 0);
    ASSERT_EQ(::listen(node_listener_, 8), 0);
  }

  void TearDown() override {
    if (server_ && !stopped_) stop();
    if (loop_.joinable()) loop_.join();
    // As sam-box's main() does: the flows' coroutine frames refer to the Server, so they go
    // first.
    io_.destroyPendingWork();
    server_.reset();
    for (int fd : {agent_, node_, node_listener_}) {
      if (fd >= 0) ::close(fd);
    }
    std::filesystem::remove_all(dir_);
  }

  void startServer() {
    server_ = std::make_unique<Server>(io_, config_);
    server_->start();
    loop_ = std::thread([this] { io_.run(); });
  }

  /// Server::stop() on the loop's thread; returns how long until its `done` ran.
  milliseconds stop() {
    stopped_ = true;
    std::promise<void> done;
    const auto started = std::chrono::steady_clock::now();
    asio::post(io_, [&] {
      server_->stop([&] {
        done.set_value();
        io_.stop();
      });
    });
    EXPECT_EQ(done.get_future().wait_for(std::chrono::seconds(10)), std::future_status::ready);
    return std::chrono::duration_cast<milliseconds>(std::chrono::steady_clock::now() - started);
  }

  /// The metrics text, rendered on the loop's thread.
  std::string metrics() {
    std::promise<std::string> text;
    auto got = text.get_future();
    asio::post(io_, [&] { text.set_value(server_->metrics().render()); });
    EXPECT_EQ(got.wait_for(std::chrono::seconds(5)), std::future_status::ready);
    return got.get();
  }

  /// Polls the metrics until they contain `line` (a whole series line), for up to 5 s.
  bool waitForMetric(const std::string& line) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (std::chrono::steady_clock::now() < deadline) {
      if (metrics().find(line + "\n") != std::string::npos) return true;
      std::this_thread::sleep_for(milliseconds(10));
    }
    ADD_FAILURE() << "no \"" << line << "\" in:\n" << metrics();
    return false;
  }

  /// Opens a mesh tunnel, sends `request`, and accepts the node's side of it (never read).
  void openMeshTunnel(const std::string& request) {
    agent_ = unixSocket();
    const sockaddr_un addr = unixAddress(config_.flags.socket);
    ASSERT_EQ(::connect(agent_, reinterpret_cast<const sockaddr*>(&addr), sizeof addr), 0);
    const std::string head = "CONNECT mesh.sam.alt:80 HTTP/1.1\r\nHost: mesh.sam.alt:80\r\n\r\n";
    ASSERT_EQ(::send(agent_, head.data(), head.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(head.size()));
    std::string answer;
    while (answer.find("\r\n\r\n") == std::string::npos) {
      ASSERT_TRUE(readable(agent_, milliseconds(5000)));
      char buf[512];
      const ssize_t n = ::recv(agent_, buf, sizeof buf, 0);
      ASSERT_GT(n, 0);
      answer.append(buf, static_cast<size_t>(n));
    }
    ASSERT_EQ(answer.rfind("HTTP/1.1 200", 0), 0U) << answer;
    ASSERT_TRUE(readable(node_listener_, milliseconds(5000)));
    node_ = ::accept4(node_listener_, nullptr, nullptr, SOCK_CLOEXEC);
    ASSERT_GE(node_, 0);
    ASSERT_EQ(::send(agent_, request.data(), request.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(request.size()));
  }

  /// Bytes the node's socket holds unread (what sam-box delivered to it).
  size_t nodeUnread() {
    int n = 0;
    return ::ioctl(node_, FIONREAD, &n) == 0 ? static_cast<size_t>(n) : 0;
  }

  std::string dir_;
  Config config_;
  TestIo io_{1};
  std::unique_ptr<Server> server_;
  std::thread loop_;
  bool stopped_ = false;
  int node_listener_ = -1;
  int node_ = -1;
  int agent_ = -1;
};

const std::string kRequest = "GET /v1/models HTTP/1.1\r\nHost: mesh.sam.alt\r\n\r\n";

TEST_F(RelayServerTest, MeshFlowHalfClosedWhileTheNodeNeverAnswersIsClosed) {
  config_.tcp_timeouts.half_closed = milliseconds(300);
  config_.tcp_timeouts.check_interval = milliseconds(20);
  startServer();
  openMeshTunnel(kRequest);
  ::shutdown(agent_, SHUT_WR);
  const auto started = std::chrono::steady_clock::now();
  // The node never reads nor answers: the flow is closed after the half-closed timeout (it
  // was held until the agent left, with no timeout at all, before).
  ASSERT_TRUE(readable(agent_, milliseconds(5000)));
  char c;
  EXPECT_EQ(::recv(agent_, &c, 1, 0), 0);  // EOF
  EXPECT_GE(std::chrono::steady_clock::now() - started, milliseconds(300));
  EXPECT_TRUE(waitForMetric("sam_box_limit_hits_total{limit=\"half-closed-timeout\"} 1"));
  EXPECT_TRUE(
      waitForMetric("sam_box_flows_total{outcome=\"allowed\",route=\"mesh-entrypoint\"} 1"));
  EXPECT_NE(metrics().find("sam_box_limit_hits_total{limit=\"tcp-idle-timeout\"} 0\n"),
            std::string::npos);
  EXPECT_NE(metrics().find("sam_box_flows_in_progress{route=\"mesh-entrypoint\"} 0\n"),
            std::string::npos);
}

TEST_F(RelayServerTest, StopEndsAnOpenFlowPromptlyAndCountsIt) {
  startServer();  // default timeouts: only the stop can end this flow
  openMeshTunnel(kRequest);
  // Wait until the rewritten request sits in the node's socket: its bytes are counted then.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (nodeUnread() == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(5));
  }
  const size_t delivered = nodeUnread();
  ASSERT_GT(delivered, kRequest.size());  // X-Sam-Agent was added
  EXPECT_LT(stop(), milliseconds(1000));  // not kStopGrace: nothing waited for the node
  loop_.join();
  // The flow was counted before the loop stopped (metrics are read here with the loop idle).
  const std::string text = server_->metrics().render();
  EXPECT_NE(text.find("sam_box_flows_total{outcome=\"allowed\",route=\"mesh-entrypoint\"} 1\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("sam_box_bytes_total{direction=\"upstream\",route=\"mesh-entrypoint\"} " +
                      std::to_string(delivered) + "\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("sam_box_flows_in_progress{route=\"mesh-entrypoint\"} 0\n"),
            std::string::npos);
  // Allowed flows cut by the stop are no refusals.
  EXPECT_NE(text.find("sam_box_refusals_total{reason=\"boundary-stopped\"} 0\n"),
            std::string::npos);
  EXPECT_EQ(server_->openFlows(), 0U);
  // The agent's side was closed, and the tunnel socket removed.
  ASSERT_TRUE(readable(agent_, milliseconds(1000)));
  char c;
  EXPECT_LE(::recv(agent_, &c, 1, 0), 0);
  EXPECT_FALSE(std::filesystem::exists(config_.flags.socket));
}

TEST_F(RelayServerTest, StopWithNoFlowOpenIsDoneAtOnce) {
  startServer();
  EXPECT_LT(stop(), milliseconds(1000));
}

}  // namespace
}  // namespace sambox
