#pragma once
// Rewrites a stream of HTTP/1.1 requests (RFC 9112) on its way from the sandbox to the node:
// every copy of one header field the sandbox sent, in any letter case, is removed, and the
// boundary's own value is set instead (seed 003: sam-box "names the agent to the node in the
// X-Sam-Agent header, replacing anything that the sandbox tried to set"). Framing comes from
// llhttp, so the node sees exactly the message boundaries the boundary saw; bodies (plain or
// chunked) pass through byte for byte. What could not be rewritten is refused instead:
// Upgrade and CONNECT (the stream after them is opaque), trailer fields (they travel inside
// the raw body), and any head whose syntax another parser might read differently (field
// names that are not tokens, control characters, targets not in origin-form, HTTP/2+).
// "X_Sam_Agent" counts as the same field as "X-Sam-Agent".

#include "proto/request_head.h"

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace proto {

class RequestStreamRewriter {
 public:
  enum class Status {
    kOk,         ///< everything fed so far was valid; output appended
    kMalformed,  ///< not HTTP/1.x: stop forwarding; error() says why
    kTooLarge,   ///< one request head exceeded kMaxRequestHeadBytes or kMaxHeaderFields
  };

  /// `header_name`: the field to strip and set (e.g. "X-Sam-Agent"). `header_value`: the value
  /// to set on every request; empty means strip only and set nothing.
  RequestStreamRewriter(std::string header_name, std::string header_value);
  ~RequestStreamRewriter();
  RequestStreamRewriter(const RequestStreamRewriter&) = delete;
  RequestStreamRewriter& operator=(const RequestStreamRewriter&) = delete;

  /// Consumes the next bytes from the sandbox and appends what to send upstream to `*out`.
  /// After an error status, further calls return it again and append nothing.
  Status feed(std::string_view data, std::string* out);
  [[nodiscard]] const std::string& error() const { return error_; }
  /// Requests whose head has been forwarded so far.
  [[nodiscard]] size_t requests() const { return requests_; }

 private:
  struct Llhttp;
  friend struct Llhttp;
  void emitHead(std::string* out);

  std::unique_ptr<Llhttp> llhttp_;
  std::string header_name_;
  std::string header_value_;
  Status status_ = Status::kOk;
  std::string error_;
  bool in_head_ = true;
  bool head_done_ = false;     // paused at the end of a head
  bool message_done_ = false;  // paused at the end of a message
  size_t head_bytes_ = 0;
  size_t requests_ = 0;
  RequestHead head_;
};

}  // namespace proto
