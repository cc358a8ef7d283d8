#pragma once
// HTTP client for the node's upstreams (model endpoints, MCP servers, a2a boundaries, secret-use
// destinations), on libcurl: http and https, chunked decoding, redirects never followed.
//
// Connections are kept alive between requests: finished transfers return their libcurl easy
// handle (and with it the handle's open connections) to a small process-wide pool of at most
// kMaxIdleHandles, and the next transfer takes the most recently used one. A pooled handle is
// used by one thread at a time (libcurl does not support sharing one connection cache between
// concurrent threads, CURLSHOPT_SHARE(3)); an idle connection the upstream closed is noticed
// by libcurl before reuse, and a request on a reused connection that dies before any answer is
// retried once on a fresh one.
//
// Response heads are sanitised before anyone sees them: a field whose name is not a token or
// whose value holds CR, LF, NUL or another control character is dropped (counted, and logged
// once per response), and an obs-fold continuation line is unfolded into its field with one SP
// (RFC 9112 §5.2), or dropped with a field that was dropped. A hostile upstream cannot make
// the node write a field the agent's parser would split differently.
//
// Request paths go out as given (CURLOPT_PATH_AS_IS): libcurl does not resolve dot segments.
//
// A request with `pinned_addresses` connects only there: the caller resolved the name and
// judged each address (secret-use, ops.cc), and libcurl must not resolve it again (a second
// answer could differ: DNS rebinding). Such a request runs on an easy handle of its own that
// is never pooled, because a handle keeps both its DNS cache (CURLOPT_RESOLVE entries outlive
// curl_easy_reset) and its open connections: pooled, the pin would steer a later request for
// the same host:port, and an earlier connection to an unchecked address could carry the
// pinned one. No proxy is used for it.
//
// A transfer is given up within about a second (libcurl calls the progress callback at least
// once a second) when the thread serves a request of a stopping HttpServer (stopRequested(),
// http.h) or when the request's `cancel` flag is set.

#include "sam-node/http.h"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace samnode {

/// An upstream that could not be reached or answered outside HTTP; what() says why.
class UpstreamError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// The transfer was abandoned before the response head because the node is stopping
/// (stopRequested()) or the request's `cancel` flag was set.
class UpstreamCancelled : public UpstreamError {
 public:
  using UpstreamError::UpstreamError;
};

struct UpstreamRequest {
  std::string method = "GET";
  std::string url;  ///< absolute http:// or https:// URL
  Headers headers;
  std::string body;
  std::chrono::milliseconds connect_timeout{5000};
  std::chrono::milliseconds total_timeout{300000};  ///< whole exchange; 0 = none
  /// Longest wait for the next byte from the upstream (head or body), counted from the
  /// request's start; 0 = none. Past it, as past total_timeout: UpstreamError before the
  /// head, an early end after it. Checked about once a second.
  std::chrono::milliseconds idle_timeout{0};
  /// Optional: once it reads true the transfer is abandoned (UpstreamCancelled before the
  /// response head, an early end after it). Must outlive the call.
  const std::atomic<bool>* cancel = nullptr;
  /// A new connection for this request, closed after it: for readiness probes, where a
  /// kept-alive connection could outlive the listener it was opened to.
  bool fresh_connection = false;
  /// When not empty, the only addresses this request may connect to: numeric IPv4 or IPv6
  /// ("192.0.2.7", "2001:db8::7", no brackets, no zone), already checked by the caller. The
  /// URL's host is resolved to them alone (CURLOPT_RESOLVE "host:port:addr,..."), a connect
  /// to any other address is refused (CURLOPT_OPENSOCKETFUNCTION) and the request uses a
  /// fresh, unpooled easy handle (see above). A malformed entry throws UpstreamError before
  /// anything is sent.
  std::vector<std::string> pinned_addresses;
};

/// Most idle libcurl handles (each with its open upstream connections) kept for reuse; one
/// more finished transfer than this closes its handle and connections.
inline constexpr size_t kMaxIdleHandles = 32;

struct UpstreamResponse {
  int status = 0;
  Headers headers;  ///< final response's valid fields (names as sent), obs-folds unfolded
  std::string body;
};

/// Response header fields dropped as invalid since the process started (all threads); the node
/// exposes it as sam_node_upstream_fields_dropped_total.
uint64_t droppedResponseFields();

/// Performs the request and buffers the body, refusing (UpstreamError) bodies over
/// `max_body` bytes.
UpstreamResponse fetch(const UpstreamRequest& request, size_t max_body);

/// Performs the request, calling `on_head(status, headers)` once the response head is in and
/// `on_data(bytes)` for each piece of (de-chunked) body as it arrives. Either callback
/// returning false aborts the transfer (no exception). Throws UpstreamError if the
/// upstream fails before on_head was called (UpstreamCancelled if it was abandoned); after that, a
/// failure ends the stream early and returns false. Returns true if the whole body arrived.
bool stream(const UpstreamRequest& request, const std::function<bool(int, const Headers&)>& on_head,
            const std::function<bool(std::string_view)>& on_data);

}  // namespace samnode
