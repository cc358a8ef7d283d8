#pragma once
// One HTTP/1.1 request head as llhttp reports it: its data callbacks may split the method,
// the target, any field name or value across calls, so pieces are appended, and a new field
// starts when a name follows a value. Shared by the tunnel request parser and the mesh
// request rewriter, with the caps both enforce.

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace proto {

/// Most bytes of request head (request line + headers + blank line) read before answering
/// 431 Request Header Fields Too Large (RFC 6585 §5).
inline constexpr size_t kMaxRequestHeadBytes = size_t{8} * 1024;
/// Most header fields accepted in one head.
inline constexpr size_t kMaxHeaderFields = 64;

struct RequestHead {
  std::string method;
  std::string target;
  /// Header fields in order, names as sent (compare case-insensitively).
  std::vector<std::pair<std::string, std::string>> headers;
  bool last_was_value = false;

  void clear() { *this = RequestHead{}; }
  void appendMethod(const char* at, size_t n) { method.append(at, n); }
  void appendTarget(const char* at, size_t n) { target.append(at, n); }
  /// Appends to the current field name, or starts a new field after a value. Returns false
  /// (appending nothing) if that would exceed kMaxHeaderFields.
  bool appendFieldName(const char* at, size_t n) {
    if (last_was_value || headers.empty()) {
      if (headers.size() >= kMaxHeaderFields) return false;
      headers.emplace_back();
      last_was_value = false;
    }
    headers.back().first.append(at, n);
    return true;
  }
  void appendFieldValue(const char* at, size_t n) {
    last_was_value = true;
    headers.back().second.append(at, n);
  }
};

}  // namespace proto
