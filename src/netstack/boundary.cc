#include "netstack/boundary.h"

#include "netstack/h2_mux.h"
#include "netstack/limits.h"
#include "netstack/log.h"
#include "netstack/packet.h"

#include <linux/vm_sockets.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
#include <climits>

#include <asio/experimental/as_tuple.hpp>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/read_until.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/write.hpp>
#include <charconv>
#include <cstring>

namespace netstack {
namespace {

constexpr std::string_view kVsockScheme = "vsock://";
constexpr std::string_view kH2UnixScheme = "h2+unix://";
constexpr std::string_view kH2DevScheme = "h2+dev://";

/// A Unix socket path: what the plain form and h2+unix:// accept. `what` prefixes errors.
bool checkSocketPath(std::string_view path, const std::string& what, std::string* error) {
  if (path.empty()) {
    *error = what + ": empty Unix socket path";
    return false;
  }
  if (path.size() >= sizeof(sockaddr_un::sun_path)) {
    *error = what + ": Unix socket path longer than " +
             std::to_string(sizeof(sockaddr_un::sun_path) - 1) + " bytes";
    return false;
  }
  if (path.find('\0') != std::string_view::npos) {
    *error = what + ": Unix socket path contains a NUL byte";
    return false;
  }
  return true;
}

bool parseU32(std::string_view text, uint32_t* out) {
  if (text.empty() || text.size() > 10) return false;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
  }
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), *out);
  return ec == std::errc() && end == text.data() + text.size();
}

std::string hostOf(const Endpoint& dst, const std::optional<std::string>& name) {
  if (name) return *name;
  return dst.address().to_string();
}

bool iequalsPrefix(std::string_view line, std::string_view prefix) {
  if (line.size() < prefix.size()) return false;
  for (size_t i = 0; i < prefix.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(line[i])) !=
        std::tolower(static_cast<unsigned char>(prefix[i]))) {
      return false;
    }
  }
  return true;
}

std::string headerValue(std::string_view head, std::string_view name) {
  size_t pos = head.find("\r\n");
  while (pos != std::string_view::npos && pos + 2 < head.size()) {
    const size_t start = pos + 2;
    const size_t end = head.find("\r\n", start);
    std::string_view line = head.substr(start, end == std::string_view::npos ? end : end - start);
    if (iequalsPrefix(line, name) && line.size() > name.size() && line[name.size()] == ':') {
      line.remove_prefix(name.size() + 1);
      while (!line.empty() && (line.front() == ' ' || line.front() == '\t')) line.remove_prefix(1);
      return std::string(line.substr(0, 64));  // a reason for logs only: bounded
    }
    pos = end;
  }
  return {};
}

}  // namespace

std::optional<BoundaryAddress> parseBoundary(std::string_view text, std::string* error) {
  BoundaryAddress out;
  if (text.starts_with(kVsockScheme)) {
    std::string_view rest = text.substr(kVsockScheme.size());
    const size_t colon = rest.find(':');
    if (colon == std::string_view::npos || !parseU32(rest.substr(0, colon), &out.cid) ||
        !parseU32(rest.substr(colon + 1), &out.port)) {
      *error = "boundary " + std::string(text) + ": want vsock://CID:PORT with decimal numbers";
      return std::nullopt;
    }
    out.kind = BoundaryAddress::Kind::kVsock;
    return out;
  }
  if (text.starts_with(kH2UnixScheme)) {
    const std::string_view path = text.substr(kH2UnixScheme.size());
    if (!checkSocketPath(path, "boundary " + std::string(text), error)) return std::nullopt;
    out.kind = BoundaryAddress::Kind::kH2Unix;
    out.path = std::string(path);
    return out;
  }
  if (text.starts_with(kH2DevScheme)) {
    const std::string_view path = text.substr(kH2DevScheme.size());
    const std::string what = "boundary " + std::string(text);
    if (path.empty() || path.front() != '/') {
      *error = what + ": want h2+dev:///absolute/device/path";
      return std::nullopt;
    }
    if (path.size() >= PATH_MAX || path.find('\0') != std::string_view::npos) {
      *error = what + ": device path too long or contains a NUL byte";
      return std::nullopt;
    }
    out.kind = BoundaryAddress::Kind::kH2Dev;
    out.path = std::string(path);
    return out;
  }
  if (!checkSocketPath(text, "boundary", error)) return std::nullopt;
  out.path = std::string(text);
  return out;
}

asio::generic::stream_protocol::endpoint boundaryEndpoint(const BoundaryAddress& address) {
  if (address.kind == BoundaryAddress::Kind::kVsock) {
    sockaddr_vm vm{};
    vm.svm_family = AF_VSOCK;
    vm.svm_cid = address.cid;
    vm.svm_port = address.port;
    return {&vm, sizeof vm, 0};
  }
  sockaddr_un un{};
  un.sun_family = AF_UNIX;
  std::memcpy(un.sun_path, address.path.data(), address.path.size());
  return {&un, offsetof(sockaddr_un, sun_path) + address.path.size() + 1, 0};
}

std::string tunnelAuthority(const Endpoint& dst, const std::optional<std::string>& name) {
  std::string host = hostOf(dst, name);
  if (!name && dst.v6) host = "[" + host + "]";
  return host + ":" + std::to_string(dst.port);
}

std::string connectRequest(std::string_view authority) {
  std::string out = "CONNECT ";
  out.append(authority).append(" HTTP/1.1\r\nHost: ").append(authority).append("\r\n\r\n");
  return out;
}

std::string connectUdpRequest(const Endpoint& dst, const std::optional<std::string>& name) {
  std::string path_host;
  for (char c : hostOf(dst, name)) {
    if (c == ':') {
      path_host += "%3A";
    } else {
      path_host.push_back(c);
    }
  }
  const std::string port = std::to_string(dst.port);
  return "GET /.well-known/masque/udp/" + path_host + "/" + port +
         "/ HTTP/1.1\r\nHost: " + tunnelAuthority(dst, name) +
         "\r\nConnection: Upgrade\r\nUpgrade: connect-udp\r\nCapsule-Protocol: ?1\r\n\r\n";
}

int responseStatus(std::string_view head) {
  // "HTTP/1.1 NNN" followed by a space or the end of the line.
  if (!head.starts_with("HTTP/1.1 ") && !head.starts_with("HTTP/1.0 ")) return -1;
  if (head.size() < 12) return -1;
  int status = 0;
  for (size_t i = 9; i < 12; ++i) {
    if (head[i] < '0' || head[i] > '9') return -1;
    status = status * 10 + (head[i] - '0');
  }
  if (head.size() > 12 && head[12] != ' ' && head[12] != '\r') return -1;
  return status;
}

void logRefusedFlow(std::string_view what, const std::string& target, int status,
                    const std::string& detail) {
  if (status < 0) {
    log::info(what, {{"target", target},
                     {"status", status},
                     {"reason", kReasonBoundaryUnreachable},
                     {"error", detail}});
  } else {
    log::info(what, {{"target", target}, {"status", status}, {"reason", detail}});
  }
}

asio::awaitable<TunnelResult> openTunnel(asio::generic::stream_protocol::socket& socket,
                                         const BoundaryAddress& boundary, std::string request) {
  using asio::experimental::awaitable_operators::operator||;
  constexpr auto kTuple = asio::experimental::as_tuple(asio::use_awaitable);
  TunnelResult result;
  asio::steady_timer deadline(socket.get_executor(), kTunnelOpenTimeout);
  if (boundary.mux) {
    // One HTTP/2 stream on the shared byte stream: the mux hands over a socketpair end that
    // speaks the same HTTP/1.1 exchange as a boundary connection (h2_mux.h).
    std::string error;
    const int fd = boundary.mux->openStream(&error);
    asio::error_code ec;
    if (fd >= 0) socket.assign(asio::generic::stream_protocol(AF_UNIX, 0), fd, ec);
    if (fd < 0 || ec) {
      if (fd >= 0 && !socket.is_open()) ::close(fd);
      result.detail = fd < 0 ? error : ec.message();
      co_return result;
    }
  }
  auto exchange = [&]() -> asio::awaitable<asio::error_code> {
    asio::error_code ec;
    if (!boundary.mux) {  // an HTTP/2 stream's socket is connected already
      std::tie(ec) = co_await socket.async_connect(boundaryEndpoint(boundary), kTuple);
      if (ec) co_return ec;
    }
    std::tie(ec, std::ignore) = co_await asio::async_write(socket, asio::buffer(request), kTuple);
    if (ec) co_return ec;
    std::string head;
    size_t head_len = 0;
    std::tie(ec, head_len) = co_await asio::async_read_until(
        socket, asio::dynamic_buffer(head, kMaxResponseHeadBytes), "\r\n\r\n", kTuple);
    if (ec) co_return ec;
    result.status = responseStatus(head);
    result.detail = headerValue(std::string_view(head).substr(0, head_len), "Boundary-Reason");
    if (result.status < 0) result.detail = "malformed response head";
    result.leftover = head.substr(head_len);
    co_return asio::error_code{};
  };
  auto outcome = co_await (exchange() || deadline.async_wait(kTuple));
  if (outcome.index() == 1) {
    result.status = -1;
    result.detail = "boundary did not answer in time";
  } else if (auto ec = std::get<0>(outcome); ec) {
    result.status = -1;
    result.detail = ec.message();
  }
  co_return result;
}

}  // namespace netstack
