#pragma once
// What every route of the node shares, and the routes themselves (docs/sam-node.md, "The API
// the agent sees"). The router (router.cc) checks X-Sam-Agent and dispatches by path; each
// route checks its own grants.

#include "sam-node/config.h"
#include "sam-node/grants.h"
#include "sam-node/http.h"
#include "sam-node/metrics.h"
#include "sam-node/secrets.h"

#include <memory>
#include <string>
#include <string_view>

namespace samnode {

/// The node's state, built once at start; routes get a reference.
struct Node {
  Config config;
  Grants grants{config};
  SecretStore secrets;
  Metrics metrics;
  explicit Node(Config c, SecretStore s) : config(std::move(c)), secrets(std::move(s)) {}
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;
};

/// Answers a refusal: `status` (401/403/404/...), header Sam-Node-Reason: `reason`
/// (kebab-case), JSON body {"error":{"message","type":"sam_node_refusal","code":reason}};
/// logs caller, route, reason and message at warn; counts sam_node_refusals_total{reason} and
/// sam_node_requests_total{route,"denied"}.
void refuse(Node& node, const Request& req, ResponseWriter& out, std::string_view route, int status,
            std::string_view reason, std::string_view message);

/// Adds to the access log line of the request the calling thread serves, which dispatch()
/// writes once the route returns: `service`, the configured service the request is about
/// (empty: leave as is), and `outcome` ("allowed", "denied", "error"; empty: leave as is)
/// with its kebab-case `reason`. refuse(), proxyStream() and upstreamFailed() call it; a
/// route calls it when it settles on a service. No-op on a thread outside dispatch().
void noteAccess(std::string_view service, std::string_view outcome = {},
                std::string_view reason = {});

/// /v1/... (openai.cc). A path that could leave the service's base (pathProblem(), proxy.h)
/// is refused 400 bad-path before anything else.
void serveOpenai(Node& node, const Request& req, ResponseWriter& out);

/// POST /mcp (mcp.cc). Holds upstream MCP sessions; thread-safe.
class McpAggregator {
 public:
  explicit McpAggregator(Node& node);
  ~McpAggregator();
  McpAggregator(const McpAggregator&) = delete;
  McpAggregator& operator=(const McpAggregator&) = delete;
  void serve(const Request& req, ResponseWriter& out);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// GET /a2a and /a2a/<name>/... (a2a.cc). Owns the probe thread (started by start()). After
/// the grant check, a <rest> that could leave the agent's base is refused 400 bad-path.
class A2aDirectory {
 public:
  explicit A2aDirectory(Node& node);
  ~A2aDirectory();  ///< stops and joins the probe thread
  A2aDirectory(const A2aDirectory&) = delete;
  A2aDirectory& operator=(const A2aDirectory&) = delete;
  void start();
  /// True while the last card probe of service `name` succeeded.
  [[nodiscard]] bool ready(std::string_view name) const;
  void serve(const Request& req, ResponseWriter& out);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// POST /ops/spawn and /ops/secret-use (ops.cc). Owns spawned runner processes.
class Operations {
 public:
  explicit Operations(Node& node);
  ~Operations();  ///< stops (SIGTERM) spawned runners still running
  Operations(const Operations&) = delete;
  Operations& operator=(const Operations&) = delete;
  void serve(const Request& req, ResponseWriter& out);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// The node's whole API (router.cc): refuses a request without X-Sam-Agent (401
/// missing-agent-identity) or with more than one (400 ambiguous-agent-identity; names compared
/// ignoring case with '_' read as '-', as sam-box does), then dispatches by path: /v1/... to
/// serveOpenai, /mcp to `mcp`, /a2a and /a2a/... to `a2a`, /ops/... to `ops`; anything else is
/// 404 unknown-route. Every request, whatever the route did, ends with one info line "request"
/// in the log: caller, method, path (without the query), route, service (when noted),
/// outcome, reason (when refused or failed), status and duration_ms. Never a field value,
/// the query or the body: they may carry secrets.
void dispatch(Node& node, McpAggregator& mcp, A2aDirectory& a2a, Operations& ops,
              const Request& req, ResponseWriter& out);

}  // namespace samnode
