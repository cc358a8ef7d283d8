#pragma once
// The streaming reverse proxy that /v1/... and /a2a/<name>/... share: the request goes
// upstream as the route prepared it, the response comes back as it arrives (RFC 9110 §7.6:
// hop-by-hop fields are the writers' own on each side).

#include <string_view>

#include "sam-node/node.h"
#include "sam-node/upstream.h"

namespace samnode {

/// The caller's fields that may go upstream: all but Host, Authorization, every X-Sam-* field
/// (the boundary's and any the agent invented) and hop-by-hop fields. The route adds its own
/// (Authorization from a secret, X-Sam-Caller).
Headers forwardableHeaders(const Headers& headers);

/// Sends `up` and streams the response to `out` as it arrives: with the upstream's
/// Content-Length when it announced one, else chunked. Before the response head: an
/// unreachable upstream is answered 502 {"error": {"type": "sam_node_upstream", ...}}, logged
/// and counted as sam_node_requests_total{route, "error"}; otherwise counted "allowed". After
/// the head, a failure ends the body early and the connection is closed (the client sees a
/// truncated body).
void proxyStream(Node& node, const Request& req, ResponseWriter& out, std::string_view route,
                 std::string_view service, const UpstreamRequest& up);

/// 502 for an upstream failure (or a secret that cannot be read): logged with caller,
/// service and reason, counted as an error of `route`.
void upstreamFailed(Node& node, const Request& req, ResponseWriter& out, std::string_view route,
                    std::string_view service, std::string_view reason, std::string_view detail);

}  // namespace samnode
