#pragma once
// The streaming reverse proxy that /v1/... and /a2a/<name>/... share: the request goes
// upstream as the route prepared it, the response comes back as it arrives (RFC 9110 §7.6:
// hop-by-hop fields are the writers' own on each side).

#include <string>
#include <string_view>

#include "sam-node/node.h"
#include "sam-node/upstream.h"

namespace samnode {

/// The caller's fields that may go upstream: all but Host, Authorization, every X-Sam-* field
/// (the boundary's and any the agent invented) and hop-by-hop fields. Names are compared
/// case-insensitively with '_' read as '-' ("X_Sam_Caller" is dropped too): CGI/WSGI-style
/// servers read both spellings as the same variable (HTTP_X_SAM_CALLER), and sam-box treats
/// them alike for X-Sam-Agent (proto/request_rewriter.h). The route adds its own fields
/// (Authorization from a secret, X-Sam-Caller).
Headers forwardableHeaders(const Headers& headers);

/// Why the request path `path` (as sent: origin-form without the query, percent-decoding not
/// applied) may not be appended to a service's base URL; empty if it may. A path is refused
/// when it could name something outside the base once an upstream (or a library on the way)
/// normalises it (RFC 3986 §5.2.4, and servers that decode before normalising):
///  - a segment that is "." or "..", spelt raw or percent-encoded in any case ("%2e%2E"), also
///    when encoded more than once ("%252e") or followed by ";params" ("..;");
///  - '/', '\' or NUL percent-encoded in a segment ("%2f", "%5C", "%00", "%252f");
///  - a raw backslash (some servers read it as '/');
///  - a '%' not followed by two hex digits (RFC 3986 §2.1).
/// Empty segments ("//") are allowed: they name nothing above the base. The returned text
/// names the problem ("a dot segment", ...), for the refusal message; it never quotes input.
std::string_view pathProblem(std::string_view path);

/// Decodes the well-formed percent-escapes of `text` once (RFC 3986 §2.1); a '%' without two
/// hex digits after it is kept as it is. With `unreserved_only`, only escapes of unreserved
/// characters (§2.3: ALPHA, DIGIT, '-', '.', '_', '~') are decoded, the normalisation §6.2.2.2
/// calls equivalent; the others stay escaped.
std::string percentDecode(std::string_view text, bool unreserved_only = false);

/// Sends `up` and streams the response to `out` as it arrives: with the upstream's
/// Content-Length when it announced one, else chunked. Before the response head: an
/// unreachable upstream is answered 502 {"error": {"type": "sam_node_error", ...}}, logged
/// and counted as sam_node_requests_total{route, "error"}; otherwise counted "allowed". After
/// the head, a failure ends the body early and the connection is closed (the client sees a
/// truncated body).
void proxyStream(Node& node, const Request& req, ResponseWriter& out, std::string_view route,
                 std::string_view service, const UpstreamRequest& up);

/// 502 for an upstream failure (or a secret that cannot be read): logged with caller,
/// service, reason and `detail`, counted as an error of `route`. The answer's message is
/// "<service>: <shown>", or "<service>: its upstream failed (<reason>; ...)" when `shown` is
/// empty: `detail` (libcurl's text names the upstream's address and port; a secret's reference
/// names a path on the node) stays in the node's log.
void upstreamFailed(Node& node, const Request& req, ResponseWriter& out, std::string_view route,
                    std::string_view service, std::string_view reason, std::string_view detail,
                    std::string_view shown = {});

}  // namespace samnode
