#pragma once
// The boundary (sam-box) as nano-init reaches it: a Unix socket path, or "vsock://CID:PORT"
// for a microVM guest (seed 003, "Firecracker microVM"), and the tunnel requests sent on it:
// CONNECT for TCP, connect-udp (RFC 9298) for UDP. The response head is read here; what
// follows it belongs to the flow.

#include <asio/awaitable.hpp>
#include <asio/generic/stream_protocol.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace netstack {

struct Endpoint;

struct BoundaryAddress {
  enum class Kind { kUnix, kVsock };
  Kind kind = Kind::kUnix;
  std::string path;   ///< kUnix
  uint32_t cid = 0;   ///< kVsock
  uint32_t port = 0;  ///< kVsock
};

/// Parses a BOUNDARY argument. "vsock://" followed by two decimal 32-bit numbers is a vsock
/// address; anything else is a Unix socket path, which must be non-empty and fit sun_path.
/// On error returns std::nullopt with `*error` saying why.
std::optional<BoundaryAddress> parseBoundary(std::string_view text, std::string* error);

/// The socket address to connect to (AF_UNIX or AF_VSOCK).
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

/// Connects `socket` to the boundary, sends `request` and reads the response head (bounded
/// by kMaxResponseHeadBytes, timed out by kTunnelOpenTimeout). Never throws for network
/// errors: they come back as status -1 with a detail.
asio::awaitable<TunnelResult> openTunnel(asio::generic::stream_protocol::socket& socket,
                                         const BoundaryAddress& boundary, std::string request);

}  // namespace netstack
