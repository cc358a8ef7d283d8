// See conn_writer.h.

#include "sam-node/conn_writer.h"

#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <span>
#include <utility>

#include "common/log.h"
#include "proto/http_syntax.h"

namespace samnode {
namespace {

std::string_view reasonPhrase(int status) {
  static constexpr std::pair<int, std::string_view> kPhrases[] = {
      {100, "Continue"},
      {200, "OK"},
      {201, "Created"},
      {202, "Accepted"},
      {204, "No Content"},
      {206, "Partial Content"},
      {301, "Moved Permanently"},
      {302, "Found"},
      {304, "Not Modified"},
      {307, "Temporary Redirect"},
      {308, "Permanent Redirect"},
      {400, "Bad Request"},
      {401, "Unauthorized"},
      {403, "Forbidden"},
      {404, "Not Found"},
      {405, "Method Not Allowed"},
      {408, "Request Timeout"},
      {409, "Conflict"},
      {413, "Content Too Large"},
      {415, "Unsupported Media Type"},
      {422, "Unprocessable Content"},
      {429, "Too Many Requests"},
      {431, "Request Header Fields Too Large"},
      {500, "Internal Server Error"},
      {501, "Not Implemented"},
      {502, "Bad Gateway"},
      {503, "Service Unavailable"},
      {504, "Gateway Timeout"}};
  for (const auto& [code, phrase] : kPhrases)
    if (code == status) return phrase;
  return "Status";
}

// Fields the writer owns (RFC 9110 §7.6.1 connection-specific fields and framing).
bool isHopByHop(std::string_view name) {
  for (std::string_view h : {"connection", "transfer-encoding", "content-length", "keep-alive",
                             "proxy-connection", "te", "trailer", "upgrade"})
    if (proto::equalsIgnoreCase(name, h)) return true;
  return false;
}

// Sends every byte of `parts` in as few syscalls as the socket takes (one, for a response
// that fits its buffer): the client wakes once per response instead of once per piece.
constexpr size_t kMaxParts = 4;

bool writeAll(int fd, std::span<const std::string_view> parts) {
  iovec iov[kMaxParts];
  size_t count = 0;
  for (std::string_view p : parts.first(std::min(parts.size(), kMaxParts)))
    if (!p.empty()) iov[count++] = {const_cast<char*>(p.data()), p.size()};  // NOLINT: C API
  size_t first = 0;
  while (first < count) {
    msghdr msg{};
    msg.msg_iov = iov + first;
    msg.msg_iovlen = count - first;
    ssize_t n = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    while (first < count && static_cast<size_t>(n) >= iov[first].iov_len) {
      n -= static_cast<ssize_t>(iov[first].iov_len);
      ++first;
    }
    if (first < count) {
      iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + n;
      iov[first].iov_len -= static_cast<size_t>(n);
    }
  }
  return true;
}

}  // namespace

bool writeAll(int fd, std::string_view data) { return writeAll(fd, std::span(&data, 1)); }

bool ConnWriter::send(int status, const Headers& headers, std::string_view body) {
  if (!begin(status, headers, body.size())) return false;
  if (!write(body)) return false;
  return finish();
}

bool ConnWriter::begin(int status, const Headers& headers, std::optional<size_t> content_length) {
  if (started_) return false;
  started_ = true;
  status_ = status;
  no_body_ = head_ || status == 204 || status == 304 || (status >= 100 && status < 200);
  std::string out = "HTTP/1.1 " + std::to_string(status) + " ";
  out += reasonPhrase(status);
  out += "\r\n";
  size_t refused = 0;
  for (const auto& [name, value] : headers) {
    if (isHopByHop(name)) continue;
    if (!proto::isToken(name) || !proto::isFieldValue(value)) {
      // Written as is, a CR or LF would end the line early: the client would read a field
      // (or a body) nobody sent.
      ++refused;
      continue;
    }
    out += name + ": " + value + "\r\n";
  }
  if (refused > 0) {
    common::log::warn("response field refused",
                      {{"reason", "bad-response-field"}, {"status", status}, {"fields", refused}});
    if (refusals_ != nullptr && *refusals_) (*refusals_)("bad-response-field");
  }
  if (content_length) {
    remaining_ = *content_length;
    if (status != 204 && status != 304)
      out += "Content-Length: " + std::to_string(*content_length) + "\r\n";
  } else if (!no_body_) {
    // An HTTP/1.0 client cannot read chunks: the body ends when the connection closes.
    chunked_ = !http10_;
    if (!chunked_) keep_alive_ = false;
    if (chunked_) out += "Transfer-Encoding: chunked\r\n";
  }
  out += keep_alive_ ? (http10_ ? "Connection: keep-alive\r\n" : "") : "Connection: close\r\n";
  out += "\r\n";
  // A head announcing a length goes out with the first body bytes (one wake-up of the client
  // per response); a streamed (chunked) head goes now, so the client sees the answer start
  // even if the first event takes a while.
  pending_head_ = std::move(out);
  if (!content_length || *content_length == 0 || no_body_) return flushHead();
  return true;
}

bool ConnWriter::write(std::string_view data) {
  if (!started_ || finished_ || !ok_) return false;
  if (data.empty() || no_body_) return flushHead();
  if (remaining_) {
    if (data.size() > *remaining_) return ok_ = false;  // more than announced: a bug upstream
    *remaining_ -= data.size();
    return send({data});
  }
  if (chunked_) {
    char size[32];
    const int n = std::snprintf(size, sizeof size, "%zx\r\n", data.size());
    return send({std::string_view(size, static_cast<size_t>(n)), data, "\r\n"});
  }
  return send({data});
}

bool ConnWriter::finish() {
  if (!started_ || finished_ || !ok_) return false;
  finished_ = true;
  if (remaining_ && *remaining_ != 0 && !no_body_) return ok_ = false;
  if (chunked_) return send({"0\r\n\r\n"});
  return flushHead();
}

bool ConnWriter::send(std::initializer_list<std::string_view> parts) {
  if (!ok_) return false;
  std::string_view pieces[kMaxParts];
  size_t n = 0;
  if (!pending_head_.empty()) pieces[n++] = pending_head_;
  for (std::string_view p : parts)
    if (n < kMaxParts) pieces[n++] = p;
  ok_ = writeAll(fd_, std::span<const std::string_view>(pieces, n));
  if (!ok_ && (errno == EAGAIN || errno == EWOULDBLOCK)) {
    // SO_SNDTIMEO (ServerLimits::send_timeout) passed with nothing taken: a client that does
    // not read its answers must not hold a connection (and a thread) for ever.
    common::log::warn("response abandoned", {{"reason", "send-timeout"}, {"status", status_}});
    if (refusals_ != nullptr && *refusals_) (*refusals_)("send-timeout");
  }
  pending_head_.clear();
  return ok_;
}

}  // namespace samnode
