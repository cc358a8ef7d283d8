#include "sam-node/proxy.h"
#include "proto/http_syntax.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <nlohmann/json.hpp>
#include <optional>

#include "common/log.h"

namespace samnode {
namespace {

// `text` starts with `prefix` (lower case, '-' for a dash), ignoring case and reading '_' as
// '-': the spellings a CGI-style upstream folds together.
bool startsWithFolded(std::string_view text, std::string_view prefix) {
  return text.size() >= prefix.size() &&
         proto::sameFieldName(text.substr(0, prefix.size()), prefix);
}

// Rounds of percent-decoding a path segment may take before it is refused as obfuscated.
constexpr int kMaxDecodeRounds = 3;

int hexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

bool wellFormedEscapes(std::string_view text) {
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '%' &&
        (i + 2 >= text.size() || hexValue(text[i + 1]) < 0 || hexValue(text[i + 2]) < 0)) {
      return false;
    }
  }
  return true;
}

// One path segment (between two '/'): what is wrong with it, or empty.
std::string_view segmentProblem(std::string_view raw) {
  // Decoded until nothing changes: an upstream (or a chain of them) may decode more than
  // once. Real paths are encoded once ("%2525..." is someone hiding something), so a few
  // rounds decide; an unbounded loop would cost a long segment quadratic time.
  std::string decoded(raw);
  for (int round = 0;; ++round) {
    std::string next = percentDecode(decoded);
    if (next == decoded) break;
    if (round == kMaxDecodeRounds) return "percent-encoding nested more than 3 deep";
    decoded = std::move(next);
  }
  if (decoded.find_first_of(std::string_view("/\\\0", 3)) != std::string::npos)
    return "an encoded '/', '\\' or NUL";
  // "..;x" is ".." to servers that strip path parameters before normalising, and "..%20" or
  // ".%09" to servers that trim white space from a segment.
  std::string_view name = std::string_view(decoded).substr(0, decoded.find(';'));
  constexpr std::string_view kSpace = " \t\r\n\v\f";
  name.remove_prefix(std::min(name.size(), name.find_first_not_of(kSpace)));
  name.remove_suffix(name.size() - std::min(name.size(), name.find_last_not_of(kSpace) + 1));
  if (name == "." || name == "..") return "a dot segment";
  return {};
}

bool dropped(std::string_view name) {
  for (std::string_view h : {"host", "authorization", "proxy-authorization", "connection",
                             "keep-alive", "transfer-encoding", "content-length", "te", "trailer",
                             "upgrade", "proxy-connection", "expect"})
    if (name.size() == h.size() && startsWithFolded(name, h)) return true;
  return startsWithFolded(name, "x-sam-");
}

// The body length the upstream announced, when its framing is a plain Content-Length (RFC 9112
// §6.3): the client then gets the same framing, and the head goes out together with the body.
// A chunked or close-delimited answer (event streams), or a length that is not one decimal
// number, is re-framed chunked.
std::optional<size_t> announcedLength(const Headers& headers) {
  if (findHeader(headers, "transfer-encoding")) return std::nullopt;
  const auto value = findHeader(headers, "content-length");
  if (!value || value->empty()) return std::nullopt;
  size_t length = 0;
  const char* end = value->data() + value->size();
  const auto [at, ec] = std::from_chars(value->data(), end, length);
  if (ec != std::errc() || at != end) return std::nullopt;
  return length;
}

}  // namespace

std::string percentDecode(std::string_view text, bool unreserved_only) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '%' && i + 2 < text.size() && hexValue(text[i + 1]) >= 0 &&
        hexValue(text[i + 2]) >= 0) {
      const char c = static_cast<char>(hexValue(text[i + 1]) * 16 + hexValue(text[i + 2]));
      const bool unreserved = std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '-' ||
                              c == '.' || c == '_' || c == '~';
      if (!unreserved_only || unreserved) {
        out.push_back(c);
        i += 2;
        continue;
      }
    }
    out.push_back(text[i]);
  }
  return out;
}

Headers forwardableHeaders(const Headers& headers) {
  Headers out;
  for (const auto& h : headers)
    if (!dropped(h.first)) out.push_back(h);
  return out;
}

std::string_view pathProblem(std::string_view path) {
  if (path.find('\\') != std::string_view::npos) return "a backslash";
  // Never part of a request target (RFC 9112 §3.2); libcurl would drop it, so the upstream
  // would see another path than the one checked.
  if (path.find('#') != std::string_view::npos) return "a '#'";
  if (!wellFormedEscapes(path)) return "a '%' not followed by two hex digits";
  while (!path.empty()) {
    const size_t slash = path.find('/');
    const std::string_view segment = path.substr(0, slash);
    if (const std::string_view why = segmentProblem(segment); !why.empty()) return why;
    if (slash == std::string_view::npos) break;
    path.remove_prefix(slash + 1);
  }
  return {};
}

void upstreamFailed(Node& node, const Request& req, ResponseWriter& out, std::string_view route,
                    std::string_view service, std::string_view reason, std::string_view detail,
                    std::string_view shown) {
  common::log::error("upstream failed", {{"caller", req.agent},
                                         {"route", route},
                                         {"service", service},
                                         {"reason", reason},
                                         {"detail", detail}});
  node.metrics.request(route, "error");
  noteAccess(service, "error", reason);
  if (out.started()) return;
  // The detail (libcurl's text: the upstream's address and port) is for the operator's log
  // only: the agent is not told which peer serves a name (seed 003).
  const std::string said = shown.empty() ? "its upstream failed (" + std::string(reason) +
                                               "; the node's log has the detail)"
                                         : std::string(shown);
  sendProblem(out, 502, "sam_node_error", reason, std::string(service) + ": " + said);
}

void proxyStream(Node& node, const Request& req, ResponseWriter& out, std::string_view route,
                 std::string_view service, const UpstreamRequest& up) {
  noteAccess(service);
  bool complete = false;
  try {
    complete = stream(
        up,
        [&](int status, const Headers& headers) {
          return out.begin(status, headers, announcedLength(headers));
        },
        [&](std::string_view data) { return out.write(data); });
  } catch (const UpstreamCancelled& e) {
    upstreamFailed(node, req, out, route, service, "node-stopping", e.what());
    return;
  } catch (const UpstreamError& e) {
    upstreamFailed(node, req, out, route, service, "upstream-unreachable", e.what());
    return;
  }
  if (complete) {
    out.finish();
    node.metrics.request(route, "allowed");
    common::log::debug("proxied", {{"caller", req.agent}, {"route", route}, {"service", service}});
  } else {
    // The client went away, or the upstream broke off mid-body: the writer is left
    // unfinished, so the server closes the connection rather than reusing it.
    node.metrics.request(route, "error");
    noteAccess(service, "error", "ended-early");
    common::log::warn("proxied response ended early",
                      {{"caller", req.agent}, {"route", route}, {"service", service}});
  }
}

}  // namespace samnode
