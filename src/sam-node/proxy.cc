#include "sam-node/proxy.h"

#include <charconv>
#include <nlohmann/json.hpp>
#include <optional>

#include "common/log.h"

namespace samnode {
namespace {

bool startsWithIgnoreCase(std::string_view text, std::string_view prefix) {
  if (text.size() < prefix.size()) return false;
  for (size_t i = 0; i < prefix.size(); ++i) {
    char c = text[i];
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    if (c != prefix[i]) return false;
  }
  return true;
}

bool dropped(std::string_view name) {
  for (std::string_view h : {"host", "authorization", "proxy-authorization", "connection",
                             "keep-alive", "transfer-encoding", "content-length", "te", "trailer",
                             "upgrade", "proxy-connection", "expect"})
    if (name.size() == h.size() && startsWithIgnoreCase(name, h)) return true;
  return startsWithIgnoreCase(name, "x-sam-");
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

Headers forwardableHeaders(const Headers& headers) {
  Headers out;
  for (const auto& h : headers)
    if (!dropped(h.first)) out.push_back(h);
  return out;
}

void upstreamFailed(Node& node, const Request& req, ResponseWriter& out, std::string_view route,
                    std::string_view service, std::string_view reason, std::string_view detail) {
  common::log::error("upstream failed", {{"caller", req.agent},
                                         {"route", route},
                                         {"service", service},
                                         {"reason", reason},
                                         {"detail", detail}});
  node.metrics.request(route, "error");
  if (out.started()) return;
  const nlohmann::json body = {{"error",
                                {{"message", std::string(service) + ": " + std::string(detail)},
                                 {"type", "sam_node_upstream"},
                                 {"code", reason}}}};
  out.send(502, {{"Content-Type", "application/json"}, {"Sam-Node-Reason", std::string(reason)}},
           body.dump());
}

void proxyStream(Node& node, const Request& req, ResponseWriter& out, std::string_view route,
                 std::string_view service, const UpstreamRequest& up) {
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
    common::log::warn("proxied response ended early",
                      {{"caller", req.agent}, {"route", route}, {"service", service}});
  }
}

}  // namespace samnode
