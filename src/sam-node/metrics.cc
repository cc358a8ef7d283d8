#include "sam-node/metrics.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "policy/name.h"
#include "sam-node/upstream.h"

namespace samnode {
namespace {

// Prometheus text format label value escaping (backslash, quote, newline).
std::string escape(std::string_view value) {
  std::string out;
  for (char c : value) {
    if (c == '\\' || c == '"') out.push_back('\\');
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out.push_back(c);
  }
  return out;
}

std::string labels(std::string_view k1, std::string_view v1, std::string_view k2 = {},
                   std::string_view v2 = {}) {
  std::string out = std::string(k1) + "=\"" + escape(v1) + "\"";
  if (!k2.empty()) out += "," + std::string(k2) + "=\"" + escape(v2) + "\"";
  return out;
}

void renderFamily(std::string& out, const char* name, const char* type, const char* help,
                  const std::map<std::string, int64_t>& series) {
  out += std::string("# HELP ") + name + " " + help + "\n";
  out += std::string("# TYPE ") + name + " " + type + "\n";
  for (const auto& [label, value] : series)
    out += std::string(name) + "{" + label + "} " + std::to_string(value) + "\n";
}

bool sendAll(int fd, std::string_view data) {
  while (!data.empty()) {
    const ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

}  // namespace

void Metrics::request(std::string_view route, std::string_view outcome) {
  std::lock_guard lock(mu_);
  ++requests_[labels("route", route, "outcome", outcome)];
}

void Metrics::refusal(std::string_view reason) {
  std::lock_guard lock(mu_);
  ++refusals_[labels("reason", reason)];
}

void Metrics::toolCall(std::string_view service, std::string_view outcome) {
  std::lock_guard lock(mu_);
  ++tool_calls_[labels("service", service, "outcome", outcome)];
}

void Metrics::a2aReady(std::string_view service, bool ready) {
  std::lock_guard lock(mu_);
  a2a_ready_[labels("service", service)] = ready ? 1 : 0;
}

void Metrics::operation(std::string_view operation, std::string_view outcome) {
  std::lock_guard lock(mu_);
  ++operations_[labels("operation", operation, "outcome", outcome)];
}

std::string Metrics::render() const {
  std::lock_guard lock(mu_);
  std::string out;
  renderFamily(out, "sam_node_requests_total", "counter", "Requests by route and outcome.",
               requests_);
  renderFamily(out, "sam_node_refusals_total", "counter", "Refused requests by reason.", refusals_);
  renderFamily(out, "sam_node_tool_calls_total", "counter", "MCP tool calls by service.",
               tool_calls_);
  renderFamily(out, "sam_node_a2a_ready", "gauge", "1 while the a2a card probe succeeds.",
               a2a_ready_);
  renderFamily(out, "sam_node_operations_total", "counter", "Relayed privileged operations.",
               operations_);
  // Kept by upstream.cc, which sanitises every response head whatever route asked for it.
  out +=
      "# HELP sam_node_upstream_fields_dropped_total Invalid response header fields dropped "
      "from upstream answers.\n"
      "# TYPE sam_node_upstream_fields_dropped_total counter\n"
      "sam_node_upstream_fields_dropped_total " +
      std::to_string(droppedResponseFields()) + "\n";
  return out;
}

MetricsListener::MetricsListener(const Metrics& metrics, std::string_view address)
    : metrics_(metrics) {
  std::string reason;
  const auto authority = policy::parseAuthority(address, &reason);
  if (!authority)
    throw std::invalid_argument("--metrics-addr: " + std::string(address) + ": " + reason);
  std::string host = authority->host == "localhost" ? "127.0.0.1" : authority->host;
  sockaddr_storage ss{};
  socklen_t len = 0;
  auto* v4 = reinterpret_cast<sockaddr_in*>(&ss);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&ss);
  if (::inet_pton(AF_INET, host.c_str(), &v4->sin_addr) == 1) {
    if ((ntohl(v4->sin_addr.s_addr) >> 24) != 127)
      throw std::invalid_argument("--metrics-addr: " + host + " is not a loopback address");
    v4->sin_family = AF_INET;
    v4->sin_port = htons(authority->port);
    len = sizeof *v4;
  } else if (::inet_pton(AF_INET6, host.c_str(), &v6->sin6_addr) == 1) {
    if (!IN6_IS_ADDR_LOOPBACK(&v6->sin6_addr))
      throw std::invalid_argument("--metrics-addr: " + host + " is not a loopback address");
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(authority->port);
    len = sizeof *v6;
  } else {
    throw std::invalid_argument("--metrics-addr: " + host +
                                " is not a loopback address (127.0.0.1, [::1] or localhost)");
  }
  auto fail = [&](const char* what) {
    throw std::runtime_error("--metrics-addr " + std::string(address) + ": " + what + ": " +
                             std::strerror(errno));
  };
  listener_.reset(::socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!listener_.valid()) fail("socket");
  const int one = 1;
  ::setsockopt(listener_.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(listener_.get(), reinterpret_cast<sockaddr*>(&ss), len) != 0) fail("bind");
  if (::listen(listener_.get(), 16) != 0) fail("listen");
  sockaddr_storage bound{};
  socklen_t blen = sizeof bound;
  ::getsockname(listener_.get(), reinterpret_cast<sockaddr*>(&bound), &blen);
  port_ = ntohs(bound.ss_family == AF_INET ? reinterpret_cast<sockaddr_in*>(&bound)->sin_port
                                           : reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port);
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) fail("pipe");
  wake_read_.reset(fds[0]);
  wake_write_.reset(fds[1]);
  thread_ = std::thread([this] { run(); });
}

MetricsListener::~MetricsListener() {
  const char byte = 1;
  [[maybe_unused]] const ssize_t n = ::write(wake_write_.get(), &byte, 1);
  if (thread_.joinable()) thread_.join();
}

void MetricsListener::run() {
  for (;;) {
    pollfd fds[2] = {{listener_.get(), POLLIN, 0}, {wake_read_.get(), POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents != 0) return;
    common::UniqueFd conn(::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!conn.valid()) continue;
    // One scrape per connection, read with a deadline so a silent client cannot stall the
    // (single) metrics thread for long.
    const timeval tv{2, 0};
    ::setsockopt(conn.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    std::string head;
    char buf[2048];
    while (head.find("\r\n\r\n") == std::string::npos && head.size() < 8192) {
      const ssize_t n = ::recv(conn.get(), buf, sizeof buf, 0);
      if (n <= 0) break;
      head.append(buf, static_cast<size_t>(n));
    }
    const bool ok = head.starts_with("GET /metrics ") || head.starts_with("GET /metrics?");
    const std::string body = ok ? metrics_.render() : "not found\n";
    const std::string response =
        std::string(ok ? "HTTP/1.1 200 OK\r\n" : "HTTP/1.1 404 Not Found\r\n") +
        "Content-Type: " + (ok ? "text/plain; version=0.0.4" : "text/plain") +
        "\r\nContent-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" +
        body;
    sendAll(conn.get(), response);
  }
}

}  // namespace samnode
