#pragma once
// The response side of one connection of the node's HTTP/1.1 server (http.h, RFC 9112 §6):
// status line, fields (hop-by-hop ones are the writer's own; invalid ones are dropped),
// Content-Length or chunked framing, HEAD and 1xx/204/304 without a body, HTTP/1.0 clients
// read to the close. Internal to http_server.cc; a header of its own so that file stays short.

#include <cstddef>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>

#include "sam-node/http.h"

namespace samnode {

/// Writes all of `data` to the socket `fd` (blocking; MSG_NOSIGNAL, EINTR retried). False if
/// the peer is gone or the write failed.
bool writeAll(int fd, std::string_view data);

/// The ResponseWriter of one request on connection `fd` (blocking writes; the fd stays the
/// caller's). Every write returns false once the client is gone or the writer was misused
/// (more body than announced, a second begin()); reusable() then says the connection is done.
class ConnWriter : public ResponseWriter {
 public:
  /// `keep_alive`: the request allows another one on this connection; `http10`: the client
  /// spoke HTTP/1.0 (no chunked bodies); `head`: a HEAD request (no body sent). `refusals`
  /// (may be null) counts fields begin() refuses to write ("bad-response-field").
  ConnWriter(int fd, bool keep_alive, bool http10, bool head,
             const RefusalCounter* refusals = nullptr)
      : fd_(fd), keep_alive_(keep_alive), http10_(http10), head_(head), refusals_(refusals) {}

  bool send(int status, const Headers& headers, std::string_view body) override;
  /// A head with a length goes out with the first body bytes; a chunked one at once.
  bool begin(int status, const Headers& headers, std::optional<size_t> content_length) override;
  bool write(std::string_view data) override;
  bool finish() override;
  [[nodiscard]] bool started() const override { return started_; }
  [[nodiscard]] int status() const override { return status_; }
  /// True if the connection may carry another request after this response.
  [[nodiscard]] bool reusable() const { return ok_ && finished_ && keep_alive_; }

 private:
  // Sends the head if it is still held back, followed by `parts`, in one go.
  bool send(std::initializer_list<std::string_view> parts);
  bool flushHead() { return pending_head_.empty() ? ok_ : send({}); }

  int fd_;
  bool keep_alive_, http10_, head_;
  const RefusalCounter* refusals_;
  int status_ = 0;
  bool started_ = false, finished_ = false, ok_ = true, chunked_ = false, no_body_ = false;
  std::optional<size_t> remaining_;
  std::string pending_head_;  // the head, until the first body bytes go with it
};

}  // namespace samnode
