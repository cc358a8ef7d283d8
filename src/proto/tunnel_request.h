#pragma once
// The request head that opens a tunnel on the boundary's Unix socket: HTTP/1.1 CONNECT for
// TCP (RFC 9110 §9.3.6) or an HTTP/1.1 Upgrade to connect-udp for UDP (RFC 9298 §3.2,
// default URI template "/.well-known/masque/udp/{target_host}/{target_port}/"). Parsed with
// llhttp. Input is untrusted: the head is bounded, nothing after it is looked at, and every
// malformation is reported as a status, never an exception or an abort.

#include "proto/request_head.h"

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace proto {

enum class TunnelKind { kConnectTcp, kConnectUdp };

struct TunnelRequest {
  TunnelKind kind = TunnelKind::kConnectTcp;
  /// "host:port" as the client wrote it (CONNECT), or rebuilt from the connect-udp path with
  /// percent-decoding applied and IPv6 in brackets. Validate with policy::parseAuthority().
  std::string authority;
  /// Header fields in order, names as sent (compare case-insensitively).
  std::vector<std::pair<std::string, std::string>> headers;
};

/// Incremental parser for one tunnel request head.
class TunnelRequestParser {
 public:
  enum class Status {
    kNeedMore,          ///< feed more bytes
    kComplete,          ///< request() is valid; consumed() bytes of the last feed were head
    kMalformed,         ///< answer 400; error() says why
    kTooLarge,          ///< answer 431
    kMethodNotAllowed,  ///< not CONNECT nor a connect-udp upgrade; answer 405
  };

  TunnelRequestParser();
  ~TunnelRequestParser();
  TunnelRequestParser(const TunnelRequestParser&) = delete;
  TunnelRequestParser& operator=(const TunnelRequestParser&) = delete;

  /// Feeds the next bytes received. Once a status other than kNeedMore is returned, further
  /// calls return it again without reading `data`.
  Status feed(std::string_view data);
  /// After kComplete: how many bytes of the last feed() belonged to the head; the rest are
  /// the start of the tunnelled stream.
  [[nodiscard]] size_t consumed() const { return consumed_; }
  [[nodiscard]] const TunnelRequest& request() const { return request_; }
  /// After an error status: a short reason for logs and the 400 body.
  [[nodiscard]] const std::string& error() const { return error_; }

 private:
  struct Llhttp;
  friend struct Llhttp;
  Status finish();

  std::unique_ptr<Llhttp> llhttp_;
  Status status_ = Status::kNeedMore;
  size_t head_bytes_ = 0;
  size_t consumed_ = 0;
  bool headers_done_ = false;
  RequestHead head_;
  TunnelRequest request_;
  std::string error_;
};

/// Decodes the connect-udp path "/.well-known/masque/udp/{host}/{port}/" (RFC 9298 §2) into
/// "host:port" (IPv6 hosts bracketed). Returns false with `*reason` set if the path does
/// not follow the template or its percent-encoding is invalid.
bool connectUdpAuthority(std::string_view path, std::string* authority, std::string* reason);

/// The reason phrase for an HTTP status `status` (RFC 9110 §15), for the statuses the
/// boundary and the sandbox's stack answer with: 400, 403, 405, 408, 421, 431, 502, 503 and
/// 504. Returns an empty view for any other status; the caller picks its own fallback.
std::string_view reasonPhrase(int status);

/// A response head the boundary sends: status line, `Boundary-Reason` when `reason` is
/// non-empty, Connection: close for errors, and an empty or short text body.
/// `code` is an HTTP status (RFC 9110 §15).
std::string errorResponse(int code, std::string_view reason);

/// "HTTP/1.1 200 Connection Established" (CONNECT) or "101 Switching Protocols" with
/// Upgrade: connect-udp and Capsule-Protocol: ?1 (connect-udp, RFC 9298 §3.2).
std::string successResponse(TunnelKind kind);

}  // namespace proto
