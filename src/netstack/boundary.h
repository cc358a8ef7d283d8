#pragma once
// The boundary (sam-box) as nano-init reaches it: a Unix socket path, or "vsock://CID:PORT"
// for a microVM guest (seed 003, "Firecracker microVM"), one connection per flow; or one byte
// stream carrying every flow as an HTTP/2 stream (issue 5, h2_mux.h): "h2+unix://PATH" (a
// Unix stream socket) or "h2+dev://PATH" (a character device such as a virtio-serial port).
// The tunnel requests sent: CONNECT for TCP, connect-udp (RFC 9298) for UDP, as HTTP/1.1
// heads (the mux translates them for HTTP/2). The response head is read here; what follows
// it belongs to the flow.

#include <asio/awaitable.hpp>
#include <asio/generic/stream_protocol.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace netstack {

struct Endpoint;
class H2Mux;

struct BoundaryAddress {
  enum class Kind {
    kUnix,    ///< one Unix socket connection per flow
    kVsock,   ///< one vsock connection per flow
    kH2Unix,  ///< "h2+unix://PATH": one Unix socket connection, HTTP/2 streams
    kH2Dev,   ///< "h2+dev://PATH": one character device opened O_RDWR, HTTP/2 streams
  };
  Kind kind = Kind::kUnix;
  std::string path;   ///< kUnix, kH2Unix (socket path), kH2Dev (device path)
  uint32_t cid = 0;   ///< kVsock
  uint32_t port = 0;  ///< kVsock
  /// kH2Unix, kH2Dev once the stack started: the multiplexer every flow's tunnel goes
  /// through. Null for the other kinds (and before start).
  std::shared_ptr<H2Mux> mux;

  [[nodiscard]] bool isH2() const { return kind == Kind::kH2Unix || kind == Kind::kH2Dev; }
};

/// Parses a BOUNDARY argument:
///   - "vsock://CID:PORT", two decimal 32-bit numbers;
///   - "h2+unix://PATH", PATH a Unix socket path (non-empty, fits sun_path, no NUL);
///   - "h2+dev://PATH", PATH an absolute device path (no NUL, at most PATH_MAX-1 bytes);
///   - anything else: a Unix socket path (non-empty, fits sun_path, no NUL).
/// On error returns std::nullopt with `*error` naming the boundary and saying why.
std::optional<BoundaryAddress> parseBoundary(std::string_view text, std::string* error);

/// The socket address to connect to (AF_UNIX or AF_VSOCK); for kH2Unix the socket path.
/// Not meaningful for kH2Dev.
asio::generic::stream_protocol::endpoint boundaryEndpoint(const BoundaryAddress& address);

/// The authority a flow asks the boundary for: the name the agent resolved when there is
/// one, otherwise the literal address ("[v6]:port" bracketed) so that the boundary refuses
/// it and counts it as unresolved.
std::string tunnelAuthority(const Endpoint& dst, const std::optional<std::string>& name);

/// "CONNECT <authority> HTTP/1.1" with its Host header (RFC 9110 §9.3.6).
std::string connectRequest(std::string_view authority);

/// The connect-udp request head (RFC 9298 §3.2, §3.4 over HTTP/1.1), default URI template;
/// the host is percent-encoded in the path (':' of an IPv6 literal becomes %3A).
std::string connectUdpRequest(const Endpoint& dst, const std::optional<std::string>& name);

/// The status code of an HTTP/1.1 response head, or -1 if the status line is malformed.
int responseStatus(std::string_view head);

struct TunnelResult {
  int status = -1;       ///< the boundary's status, -1 when it could not be reached
  std::string detail;    ///< Boundary-Reason, or the error that prevented an answer
  std::string leftover;  ///< bytes received after the response head (tunnelled data)
};

/// The reason logged for a flow the boundary never answered (TunnelResult status -1: its
/// socket is gone, it did not answer within kTunnelOpenTimeout, the byte stream failed): a
/// stable value beside sam-box's Boundary-Reason values (docs/sam-box.md), the error itself
/// in the line's `error` field.
inline constexpr const char* kReasonBoundaryUnreachable = "boundary-unreachable";

/// Logs a refused flow at info: `what` ("tcp flow refused" or "udp flow refused"), with
/// `target` (host:port), the boundary's `status` and `detail` as reason; status -1 is logged
/// as reason kReasonBoundaryUnreachable with `detail` as its error.
void logRefusedFlow(std::string_view what, const std::string& target, int status,
                    const std::string& detail);

/// Connects `socket` to the boundary (for an HTTP/2 boundary: takes a new stream from
/// `boundary.mux`, a socketpair end), sends `request` and reads the response head (bounded
/// by kMaxResponseHeadBytes, timed out by kTunnelOpenTimeout). Never throws for network
/// errors: they come back as status -1 with a detail.
asio::awaitable<TunnelResult> openTunnel(asio::generic::stream_protocol::socket& socket,
                                         const BoundaryAddress& boundary, std::string request);

}  // namespace netstack
