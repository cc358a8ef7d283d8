#include "sam-node/upstream.h"
#include "proto/http_syntax.h"

#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <future>
#include <thread>
#include <vector>

#include "common/unique_fd.h"
#include "sam-node/http.h"

namespace samnode {
namespace {

using ::testing::HasSubstr;
using namespace std::string_literals;

// Generous: only keeps a broken build from hanging the test run; never a timed assertion.
constexpr auto kDeadline = std::chrono::seconds(60);

// Listens on the IPv4 address `ip` (127.0.0.0/8) and `port` (0: any free one, written back).
// An invalid fd if the port is taken.
common::UniqueFd listenOn(const char* ip, uint16_t& port) {
  common::UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  ::inet_pton(AF_INET, ip, &addr.sin_addr);
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) return {};
  EXPECT_EQ(::listen(fd.get(), 16), 0);
  socklen_t len = sizeof addr;
  ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&addr), &len);
  port = ntohs(addr.sin_port);
  return fd;
}

common::UniqueFd listenLoopback(uint16_t& port) {
  port = 0;
  auto fd = listenOn("127.0.0.1", port);
  EXPECT_TRUE(fd.valid());
  return fd;
}

// A real HTTP/1.1 upstream on loopback that answers every GET "ok" on keep-alive connections
// and counts the connections it accepted.
class KeepAliveUpstream {
 public:
  KeepAliveUpstream() : listener_(listenLoopback(port_)) {
    thread_ = std::thread([this] { run(); });
  }
  /// On `listener` (already listening), answering every request with `body`.
  KeepAliveUpstream(common::UniqueFd listener, uint16_t port, std::string body)
      : port_(port), listener_(std::move(listener)), body_(std::move(body)) {
    thread_ = std::thread([this] { run(); });
  }
  ~KeepAliveUpstream() {
    stop_ = true;
    thread_.join();
  }
  [[nodiscard]] std::string url() const {
    return "http://127.0.0.1:" + std::to_string(port_) + "/x";
  }
  [[nodiscard]] int accepted() const { return accepted_.load(); }

 private:
  void run() {
    std::vector<common::UniqueFd> conns;
    std::vector<std::string> pending;
    while (!stop_) {
      std::vector<pollfd> fds{{listener_.get(), POLLIN, 0}};
      for (const auto& c : conns) fds.push_back({c.get(), POLLIN, 0});
      if (::poll(fds.data(), fds.size(), 50) <= 0) continue;
      if ((fds[0].revents & POLLIN) != 0) {
        conns.emplace_back(::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
        pending.emplace_back();
        ++accepted_;
      }
      for (size_t i = 1; i < fds.size(); ++i) {
        if ((fds[i].revents & (POLLIN | POLLHUP)) == 0) continue;
        char buf[4096];
        const ssize_t n = ::recv(fds[i].fd, buf, sizeof buf, 0);
        if (n <= 0) continue;  // closed: stays in the list, polled as HUP, harmless here
        std::string& got = pending[i - 1];
        got.append(buf, static_cast<size_t>(n));
        for (auto end = got.find("\r\n\r\n"); end != std::string::npos;
             end = got.find("\r\n\r\n")) {
          got.erase(0, end + 4);
          const std::string answer =
              "HTTP/1.1 200 OK\r\nContent-Length: " + std::to_string(body_.size()) + "\r\n\r\n" +
              body_;
          ::send(fds[i].fd, answer.data(), answer.size(), MSG_NOSIGNAL);
        }
      }
    }
  }

  uint16_t port_ = 0;
  common::UniqueFd listener_;
  std::string body_ = "ok";
  std::atomic<bool> stop_{false};
  std::atomic<int> accepted_{0};
  std::thread thread_;
};

// A real upstream on loopback that answers one request with `response` (raw bytes, so it can
// be as malformed as a hostile server makes it) and keeps the request head it received.
class OneShotUpstream {
 public:
  explicit OneShotUpstream(std::string response)
      : listener_(listenLoopback(port_)), response_(std::move(response)) {
    thread_ = std::thread([this] { run(); });
  }
  ~OneShotUpstream() { thread_.join(); }
  [[nodiscard]] std::string origin() const { return "http://127.0.0.1:" + std::to_string(port_); }
  /// The request head as received; call after the transfer ended.
  [[nodiscard]] std::string head() const { return head_; }

 private:
  void run() {
    pollfd p{listener_.get(), POLLIN, 0};
    if (::poll(&p, 1, 60000) <= 0) return;
    const common::UniqueFd c(::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
    std::string got;
    char buf[4096];
    while (got.find("\r\n\r\n") == std::string::npos) {
      pollfd q{c.get(), POLLIN, 0};
      if (::poll(&q, 1, 60000) <= 0) return;
      const ssize_t n = ::recv(c.get(), buf, sizeof buf, 0);
      if (n <= 0) return;
      got.append(buf, static_cast<size_t>(n));
    }
    head_ = got.substr(0, got.find("\r\n\r\n"));
    ::send(c.get(), response_.data(), response_.size(), MSG_NOSIGNAL);
  }

  uint16_t port_ = 0;
  common::UniqueFd listener_;
  std::string response_;
  std::string head_;
  std::thread thread_;
};

TEST(UpstreamTest, InvalidResponseFieldsAreDroppedAndObsFoldIsUnfolded) {
  const uint64_t dropped_before = droppedResponseFields();
  UpstreamResponse r;
  {
    OneShotUpstream upstream(
        "HTTP/1.1 200 OK\r\n"
        "X-Evil: a\rInjected: b\r\n"  // bare CR: a line break to some parsers
        "Bad Name: v\r\n"             // a name that is not a token
        " folded: x\r\n"              // continues the dropped field: dropped with it
        "X-Long: one\r\n"
        "\t two\r\n"  // obs-fold of a kept field: joined with one SP
        "X-Fine: yes\r\n"
        "Content-Length: 2\r\nConnection: close\r\n\r\nok");
    UpstreamRequest req;
    req.url = upstream.origin() + "/";
    r = fetch(req, 1024);
  }
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "ok");
  EXPECT_EQ(findHeader(r.headers, "x-long"), "one two");
  EXPECT_EQ(findHeader(r.headers, "x-fine"), "yes");
  for (const auto& [name, value] : r.headers) {
    EXPECT_TRUE(proto::isToken(name)) << name;
    EXPECT_TRUE(proto::isFieldValue(value)) << name;
    EXPECT_THAT(name, testing::Not(HasSubstr("Evil")));
    EXPECT_THAT(value, testing::Not(HasSubstr("folded")));
  }
  EXPECT_EQ(droppedResponseFields() - dropped_before, 3U);
}

TEST(UpstreamTest, NulInTheResponseHeadFailsTheTransfer) {
  // libcurl refuses it itself ("Nul byte in header"): nothing of such a head is relayed.
  OneShotUpstream upstream("HTTP/1.1 200 OK\r\nX-Nul: a\0b\r\nContent-Length: 0\r\n\r\n"s);
  UpstreamRequest req;
  req.url = upstream.origin() + "/";
  EXPECT_THROW(fetch(req, 1024), UpstreamError);
}

TEST(UpstreamTest, PathGoesOutAsGivenWithoutDotSegmentResolution) {
  std::string head;
  {
    OneShotUpstream upstream("HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n");
    UpstreamRequest req;
    req.url = upstream.origin() + "/base/../admin/./x%2e%2E?q=/../";
    EXPECT_EQ(fetch(req, 1024).status, 204);
    head = upstream.head();
  }
  EXPECT_THAT(head, testing::StartsWith("GET /base/../admin/./x%2e%2E?q=/../ HTTP/1.1\r\n"));
}

TEST(UpstreamTest, ConnectionIsKeptAliveAcrossRequestsAndThreads) {
  KeepAliveUpstream upstream;
  UpstreamRequest req;
  req.url = upstream.url();
  EXPECT_EQ(fetch(req, 1024).body, "ok");
  EXPECT_EQ(fetch(req, 1024).body, "ok");
  // A later transfer on another thread takes the pooled handle, and its connection, too.
  std::thread([&] { EXPECT_EQ(fetch(req, 1024).body, "ok"); }).join();
  EXPECT_EQ(upstream.accepted(), 1);
}

// Two upstreams on one port: "plain" on 127.0.0.1 (where "localhost" resolves) and "pinned"
// on 127.0.0.2 (where no resolver sends "localhost").
struct TwoAddresses {
  uint16_t port = 0;
  std::unique_ptr<KeepAliveUpstream> plain, pinned;

  TwoAddresses() {
    for (int attempt = 0; attempt < 50 && !pinned; ++attempt) {
      port = 0;
      auto a = listenOn("127.0.0.1", port);
      auto b = listenOn("127.0.0.2", port);
      if (!a.valid() || !b.valid()) continue;  // the port is taken on 127.0.0.2: next one
      plain = std::make_unique<KeepAliveUpstream>(std::move(a), port, "plain");
      pinned = std::make_unique<KeepAliveUpstream>(std::move(b), port, "pinned");
    }
  }
  [[nodiscard]] std::string url() const {
    return "http://localhost:" + std::to_string(port) + "/x";
  }
};

TEST(UpstreamTest, PinnedRequestGoesToThePinnedAddressNotWhereTheNameResolves) {
  TwoAddresses up;
  ASSERT_TRUE(up.pinned) << "no port free on both 127.0.0.1 and 127.0.0.2";
  UpstreamRequest req;
  req.url = up.url();
  req.pinned_addresses = {"127.0.0.2"};
  EXPECT_EQ(fetch(req, 1024).body, "pinned");
  // Several addresses: each is a candidate (libcurl tries them in turn).
  req.pinned_addresses = {"127.0.0.2", "::1"};
  EXPECT_EQ(fetch(req, 1024).body, "pinned");
}

TEST(UpstreamTest, PinDoesNotLeakToTheNextRequestOnAPooledHandle) {
  TwoAddresses up;
  ASSERT_TRUE(up.pinned) << "no port free on both 127.0.0.1 and 127.0.0.2";
  UpstreamRequest plain;
  plain.url = up.url();
  UpstreamRequest pinned = plain;
  pinned.pinned_addresses = {"127.0.0.2"};
  // A plain request first: its handle, with a kept-alive connection to localhost:port on
  // 127.0.0.1, goes back to the pool. The pinned request must not ride that connection.
  EXPECT_EQ(fetch(plain, 1024).body, "plain");
  EXPECT_EQ(fetch(pinned, 1024).body, "pinned");
  // Nor may the pin (a CURLOPT_RESOLVE entry lives in a handle's DNS cache past
  // curl_easy_reset) or its connection steer the next plain request to the same host:port,
  // on this thread (the most recently pooled handle) or another.
  EXPECT_EQ(fetch(plain, 1024).body, "plain");
  EXPECT_EQ(fetch(pinned, 1024).body, "pinned");
  EXPECT_EQ(fetch(plain, 1024).body, "plain");
  std::thread([&] { EXPECT_EQ(fetch(plain, 1024).body, "plain"); }).join();
  EXPECT_EQ(up.plain->accepted(), 1);   // plain requests still share one kept-alive connection
  EXPECT_EQ(up.pinned->accepted(), 2);  // each pinned request on a connection of its own
}

TEST(UpstreamTest, PinnedRequestConnectsNowhereElse) {
  TwoAddresses up;
  ASSERT_TRUE(up.pinned) << "no port free on both 127.0.0.1 and 127.0.0.2";
  // Pinned to an address nothing listens on (127.0.0.3): refused, never the resolved one.
  UpstreamRequest req;
  req.url = up.url();
  req.pinned_addresses = {"127.0.0.3"};
  EXPECT_THROW(fetch(req, 1024), UpstreamError);
  EXPECT_EQ(up.plain->accepted(), 0);
  EXPECT_EQ(up.pinned->accepted(), 0);
  // However the URL spells the host (a trailing dot, an address literal), the pin decides:
  // still 127.0.0.3, still refused, never the address the spelling would resolve to.
  for (const std::string host : {"localhost.", "LOCALHOST", "127.0.0.1"}) {
    SCOPED_TRACE(host);
    req.url = "http://" + host + ":" + std::to_string(up.port) + "/x";
    EXPECT_THROW(fetch(req, 1024), UpstreamError);
  }
  EXPECT_EQ(up.plain->accepted(), 0);
  // A malformed pin is an error before anything is sent, never a silent "resolve it yourself".
  for (const char* bad : {"localhost", "[::1]", "127.0.0.1:80", "fe80::1%lo", ""}) {
    SCOPED_TRACE(bad);
    req.url = up.url();
    req.pinned_addresses = {bad};
    EXPECT_THROW(fetch(req, 1024), UpstreamError);
  }
  EXPECT_EQ(up.plain->accepted(), 0);
  EXPECT_EQ(up.pinned->accepted(), 0);
}

TEST(UpstreamTest, CancelFlagAbandonsATransferToASilentUpstream) {
  uint16_t port = 0;
  const auto silent = listenLoopback(port);  // accepts (the kernel does) and never answers
  std::atomic<bool> cancel{false};
  UpstreamRequest req;
  req.url = "http://127.0.0.1:" + std::to_string(port) + "/";
  req.cancel = &cancel;
  auto done = std::async(std::launch::async, [&] { return fetch(req, 1024); });
  cancel = true;
  ASSERT_EQ(done.wait_for(kDeadline), std::future_status::ready);
  try {
    done.get();
    FAIL() << "a silent upstream answered";
  } catch (const UpstreamError& e) {
    EXPECT_THAT(e.what(), HasSubstr("cancelled"));
  }
}

TEST(UpstreamTest, ServerStopAbandonsAHandlerWaitingOnASilentUpstream) {
  uint16_t port = 0;
  const auto silent = listenLoopback(port);
  const auto dir =
      std::filesystem::temp_directory_path() / ("sam-node-upstream-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "api.sock").string();
  std::promise<void> waiting;
  std::promise<std::string> outcome;
  HttpServer server(path, [&](const Request&, ResponseWriter& out) {
    UpstreamRequest req;
    req.url = "http://127.0.0.1:" + std::to_string(port) + "/";  // 300 s total timeout
    waiting.set_value();
    try {
      fetch(req, 1024);
      outcome.set_value("answered");
    } catch (const UpstreamError& e) {
      outcome.set_value(e.what());
    }
    sendJson(out, 502, "{}");
  });
  auto serving = std::async(std::launch::async, [&] { server.serve(); });

  common::UniqueFd client(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size());
  ASSERT_EQ(::connect(client.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  const std::string request = "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n";
  ASSERT_EQ(::send(client.get(), request.data(), request.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(request.size()));
  ASSERT_EQ(waiting.get_future().wait_for(kDeadline), std::future_status::ready);

  server.stop();
  ASSERT_EQ(serving.wait_for(kDeadline), std::future_status::ready)
      << "serve() still waits for the handler";
  EXPECT_THAT(outcome.get_future().get(), HasSubstr("cancelled"));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace samnode
