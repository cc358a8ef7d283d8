#pragma once
// HTTP client for the node's upstreams (model endpoints, MCP servers, a2a boundaries, secret-use
// destinations), on libcurl: http and https, chunked decoding, redirects never followed.

#include "sam-node/http.h"

#include <chrono>
#include <functional>
#include <stdexcept>
#include <string>
#include <string_view>

namespace samnode {

/// An upstream that could not be reached or answered outside HTTP; what() says why.
class UpstreamError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct UpstreamRequest {
  std::string method = "GET";
  std::string url;  ///< absolute http:// or https:// URL
  Headers headers;
  std::string body;
  std::chrono::milliseconds connect_timeout{5000};
  std::chrono::milliseconds total_timeout{300000};  ///< whole exchange; 0 = none
};

struct UpstreamResponse {
  int status = 0;
  Headers headers;  ///< final response's fields (names as sent)
  std::string body;
};

/// Performs the request and buffers the body, refusing (UpstreamError) bodies over
/// `max_body` bytes.
UpstreamResponse fetch(const UpstreamRequest& request, size_t max_body);

/// Performs the request, calling `on_head(status, headers)` once the response head is in and
/// `on_data(bytes)` for each piece of (de-chunked) body as it arrives. Either callback
/// returning false aborts the transfer (no exception). Throws UpstreamError if the
/// upstream fails before on_head was called; after that, a failure ends the stream early
/// and returns false. Returns true if the whole body arrived.
bool stream(const UpstreamRequest& request, const std::function<bool(int, const Headers&)>& on_head,
            const std::function<bool(std::string_view)>& on_data);

}  // namespace samnode
