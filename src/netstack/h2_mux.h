#pragma once
// The HTTP/2 multiplexer (issue 5): a microVM guest reaches sam-box over ONE byte stream (a
// virtio-serial port, i.e. a character device; or, without a VM, a Unix socket), so every
// flow of the sandbox travels as one HTTP/2 stream on it: h2c with prior knowledge (RFC 9113
// §3.3), libnghttp2 doing framing, HPACK and flow control.
//   - TCP: CONNECT (RFC 9113 §8.5): :method CONNECT and :authority host:port, nothing else.
//   - UDP: extended CONNECT (RFC 8441, RFC 9220) with :protocol connect-udp, :scheme https,
//     :path /.well-known/masque/udp/{host}/{port}/, :authority and capsule-protocol ?1
//     (RFC 9298); capsules (RFC 9297) travel unchanged in the stream's DATA frames.
// The flows (tcp_flow.cc, udp_flow.cc) are unchanged: each still speaks its HTTP/1.1 tunnel
// exchange, on a socketpair end the mux hands out (openTunnel() in boundary.cc). The mux reads
// the request head on the other end, sends it as HEADERS, answers the flow with an HTTP/1.1
// head made from the response HEADERS (Boundary-Reason kept), then copies bytes both ways as
// DATA. END_STREAM from sam-box becomes shutdown(SHUT_WR) towards the flow; the flow's EOF
// becomes END_STREAM; RST_STREAM closes the flow's socket.
//
// Memory is bounded both ways: sam-box's DATA is credited back to its stream (WINDOW_UPDATE)
// only once the flow's socket took it (kH2MuxStreamWindow per stream; the connection's window
// as it arrives, so one stalled flow never holds back the others), and a flow's socket is
// read only while fewer than kH2MuxStreamBuffer bytes wait to be framed.
//
// Failure never hangs: if the byte stream fails (read/write error, EOF, a protocol error,
// GOAWAY), every open stream's socket is closed, so each flow fails (TCP: RST or reset), and
// a new flow first reopens the byte stream; if that fails the flow is refused at once.
// A Unix socket is reconnected as soon as the old connection is unusable; a device only once
// the old one is closed (two opens of one tty would split its bytes between two readers).
// Single-threaded: everything runs on the stack's io_context.

#include "netstack/boundary.h"

#include <asio/io_context.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace netstack {

/// SETTINGS_INITIAL_WINDOW_SIZE nano-init advertises: the most bytes sam-box may send on one
/// stream that its flow has not yet taken.
inline constexpr int32_t kH2MuxStreamWindow = 256 * 1024;
/// The connection window nano-init advertises: the most bytes in flight from sam-box at once.
/// Credited back as DATA arrives (a stream's window only as its flow takes the bytes), so a
/// flow the agent does not read holds back its own stream alone.
inline constexpr int32_t kH2MuxConnectionWindow = 16 * 1024 * 1024;
/// Most bytes read from one flow's socket and not yet framed as DATA.
inline constexpr size_t kH2MuxStreamBuffer = 256 * 1024;
/// A PING goes out this often, so sam-box does not end an idle connection (it ends one with
/// no stream and no byte for 30 minutes) and a dead byte stream is noticed by a write error.
inline constexpr std::chrono::minutes kH2MuxPingInterval{5};

/// An HTTP/2 request: header fields in order, pseudo-header fields first.
struct H2Request {
  bool udp = false;  ///< connect-udp (extended CONNECT) rather than CONNECT
  std::vector<std::pair<std::string, std::string>> fields;
};

/// Translates a flow's HTTP/1.1 tunnel request head (connectRequest() or connectUdpRequest()
/// output: request line, headers, empty line) into HTTP/2 fields. Parsed with proto's
/// TunnelRequestParser (llhttp), so the head must be complete and nothing may follow it.
/// CONNECT → {:method CONNECT, :authority}; a connect-udp upgrade → {:method CONNECT,
/// :protocol connect-udp, :scheme https, :path (the request target as sent), :authority (the
/// Host field), capsule-protocol ?1}. Returns std::nullopt with `*error` saying why otherwise.
std::optional<H2Request> h1RequestToH2(std::string_view head, std::string* error);

/// The HTTP/1.1 response head a flow expects, made from sam-box's HTTP/2 response: a 2xx to
/// CONNECT is "200 Connection Established"; a 2xx to connect-udp is "101 Switching Protocols"
/// with Upgrade: connect-udp and Capsule-Protocol: ?1 (RFC 9298 §3.2); any other status is
/// passed through with `reason` as Boundary-Reason (bytes outside printable ASCII become '?',
/// at most 64 kept). A status outside 100..599 becomes 502.
std::string h2ResponseToH1(int status, std::string_view reason, bool udp);

/// Opens the byte stream of an HTTP/2 boundary, non-blocking and close-on-exec: kH2Unix
/// connects a Unix stream socket; kH2Dev opens the device O_RDWR|O_NOCTTY and, if it is a
/// tty, puts it in raw mode (cfmakeraw: no echo, no line discipline, 8 bits). Returns the fd,
/// or -1 with `*error` naming the call, the path and errno.
int openH2Upstream(const BoundaryAddress& address, std::string* error);

class H2Connection;

/// Owns the byte stream to sam-box and hands out one HTTP/2 stream per flow.
class H2Mux {
 public:
  /// `address` must be kH2Unix or kH2Dev.
  H2Mux(asio::io_context& io, BoundaryAddress address);
  ~H2Mux();
  H2Mux(const H2Mux&) = delete;
  H2Mux& operator=(const H2Mux&) = delete;

  /// Opens the byte stream and sends the client preface and SETTINGS. Throws
  /// std::runtime_error naming the failing call (the sandbox then does not start).
  void start();
  /// A new stream: returns one end of a socketpair (non-blocking, close-on-exec, owned by the
  /// caller) on which the caller sends one HTTP/1.1 tunnel request head and reads the answer
  /// (see h2ResponseToH1), then tunnelled bytes. Reopens the byte stream first if it failed.
  /// Returns -1 with `*error` saying why if no stream can be had (logged and counted).
  int openStream(std::string* error);
  /// Closes the byte stream and every stream's socket; openStream() refuses from then on.
  void stop();

  /// Counters for tests and the exit log: streams opened (a tunnel sam-box then refused
  /// with 403 counts here too: its refusal is an answer on an open stream), and openStream()
  /// calls that got no stream (the byte stream down or stopped).
  [[nodiscard]] uint64_t streamsOpened() const { return streams_opened_; }
  [[nodiscard]] uint64_t streamsUnopened() const { return streams_unopened_; }
  [[nodiscard]] uint64_t upstreamFailures() const;

 private:
  bool ensureConnection(std::string* error);

  asio::io_context& io_;
  BoundaryAddress address_;
  std::shared_ptr<H2Connection> current_;
  bool stopped_ = false;
  uint64_t streams_opened_ = 0;
  uint64_t streams_unopened_ = 0;
  uint64_t reconnects_ = 0;
  std::shared_ptr<uint64_t> failures_ = std::make_shared<uint64_t>(0);
};

}  // namespace netstack
