#include "netstack/h2_mux.h"

#include "netstack/h2_connection.h"
#include "netstack/log.h"
#include "proto/http_syntax.h"
#include "proto/tunnel_request.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <termios.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace netstack {
namespace {

std::string errnoText(const std::string& call) { return call + ": " + std::strerror(errno); }

}  // namespace

std::optional<H2Request> h1RequestToH2(std::string_view head, std::string* error) {
  proto::TunnelRequestParser parser;
  const auto status = parser.feed(head);
  if (status != proto::TunnelRequestParser::Status::kComplete) {
    *error = parser.error().empty() ? "incomplete or refused request head" : parser.error();
    return std::nullopt;
  }
  if (parser.consumed() != head.size()) {
    *error = "bytes after the request head";
    return std::nullopt;
  }
  const proto::TunnelRequest& req = parser.request();
  H2Request out;
  if (req.kind == proto::TunnelKind::kConnectTcp) {
    out.fields = {{":method", "CONNECT"}, {":authority", req.authority}};
    return out;
  }
  // connect-udp: the request target as sent, so sam-box decodes exactly what we encoded.
  const size_t sp1 = head.find(' ');
  const size_t sp2 = sp1 == std::string_view::npos ? sp1 : head.find(' ', sp1 + 1);
  if (sp2 == std::string_view::npos) {
    *error = "connect-udp request line without a target";
    return std::nullopt;
  }
  std::string host;
  for (const auto& [name, value] : req.headers) {
    if (proto::equalsIgnoreCase(name, "host")) host = value;
  }
  if (host.empty()) host = req.authority;
  out.udp = true;
  out.fields = {{":method", "CONNECT"}, {":protocol", "connect-udp"},
                {":scheme", "https"},   {":path", std::string(head.substr(sp1 + 1, sp2 - sp1 - 1))},
                {":authority", host},   {"capsule-protocol", "?1"}};
  return out;
}

std::string h2ResponseToH1(int status, std::string_view reason, bool udp) {
  if (status >= 200 && status < 300) {
    if (udp) {
      return "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\n"
             "Upgrade: connect-udp\r\nCapsule-Protocol: ?1\r\n\r\n";
    }
    return "HTTP/1.1 200 Connection Established\r\n\r\n";
  }
  if (status < 100 || status > 599) status = 502;
  const std::string_view phrase = proto::reasonPhrase(status);
  std::string out = "HTTP/1.1 " + std::to_string(status) + " " +
                    std::string(phrase.empty() ? "Refused" : phrase) + "\r\n";
  if (!reason.empty()) {
    out += "Boundary-Reason: ";
    for (char c : reason.substr(0, 64)) out.push_back(c >= 0x20 && c < 0x7f ? c : '?');
    out += "\r\n";
  }
  out += "\r\n";
  return out;
}

int openH2Upstream(const BoundaryAddress& address, std::string* error) {
  if (address.kind == BoundaryAddress::Kind::kH2Unix) {
    const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      *error = errnoText("socket(AF_UNIX)");
      return -1;
    }
    // A blocking connect: a Unix socket connects at once or fails (ENOENT, ECONNREFUSED).
    const auto ep = boundaryEndpoint(address);
    if (::connect(fd, static_cast<const sockaddr*>(ep.data()), ep.size()) != 0) {
      *error = errnoText("connect(" + address.path + ")");
      ::close(fd);
      return -1;
    }
    const int flags = ::fcntl(fd, F_GETFL);
    if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0) {
      *error = errnoText("fcntl(" + address.path + ", O_NONBLOCK)");
      ::close(fd);
      return -1;
    }
    return fd;
  }
  if (address.kind != BoundaryAddress::Kind::kH2Dev) {
    *error = "boundary is not an HTTP/2 boundary (want h2+unix:// or h2+dev://)";
    return -1;
  }
  const int fd = ::open(address.path.c_str(), O_RDWR | O_NOCTTY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    *error = errnoText("open(" + address.path + ", O_RDWR)");
    return -1;
  }
  if (::isatty(fd) == 1) {
    // A tty (a pty in tests; some serial ports): without raw mode its line discipline would
    // echo, translate CR/LF and treat ^C, ^D as signals, corrupting the HTTP/2 frames.
    termios tio{};
    if (::tcgetattr(fd, &tio) != 0) {
      *error = errnoText("tcgetattr(" + address.path + ")");
      ::close(fd);
      return -1;
    }
    ::cfmakeraw(&tio);
    if (::tcsetattr(fd, TCSANOW, &tio) != 0) {
      *error = errnoText("tcsetattr(" + address.path + ", raw)");
      ::close(fd);
      return -1;
    }
  }
  return fd;
}

H2Mux::H2Mux(asio::io_context& io, BoundaryAddress address)
    : io_(io), address_(std::move(address)) {
  address_.mux.reset();  // the mux does not own itself
}

H2Mux::~H2Mux() { stop(); }

uint64_t H2Mux::upstreamFailures() const { return *failures_; }

bool H2Mux::ensureConnection(std::string* error) {
  if (current_ && current_->usable()) return true;
  // A device is reopened only once the old fd is closed: two fds on one tty would each read
  // part of the bytes. A Unix socket is a new, separate connection.
  if (current_ && address_.kind == BoundaryAddress::Kind::kH2Dev && !current_->dead()) {
    *error = "h2 boundary " + address_.path + " is draining (GOAWAY); try again later";
    return false;
  }
  const int fd = openH2Upstream(address_, error);
  if (fd < 0) return false;
  auto connection = std::make_shared<H2Connection>(io_, fd, failures_);
  if (!connection->init(error)) return false;
  connection->run();
  if (current_) {
    ++reconnects_;
    log::info("h2 boundary reopened", {{"path", address_.path}, {"reconnects", reconnects_}});
  }
  current_ = std::move(connection);
  return true;
}

void H2Mux::start() {
  std::string error;
  if (!ensureConnection(&error)) throw std::runtime_error("h2 boundary: " + error);
  log::info("h2 boundary open",
            {{"path", address_.path},
             {"kind", address_.kind == BoundaryAddress::Kind::kH2Dev ? "device" : "unix"}});
}

int H2Mux::openStream(std::string* error) {
  if (stopped_) {
    *error = "h2 boundary stopped";
  } else if (ensureConnection(error)) {
    int fds[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, fds) == 0) {
      current_->addStream(fds[0]);
      ++streams_opened_;
      return fds[1];
    }
    *error = errnoText("socketpair");
  }
  ++streams_unopened_;
  log::info("h2 stream not opened", {{"error", *error}, {"unopened", streams_unopened_}});
  return -1;
}

void H2Mux::stop() {
  stopped_ = true;
  if (current_) current_->fail("stopped", false);
  current_.reset();
}

}  // namespace netstack
