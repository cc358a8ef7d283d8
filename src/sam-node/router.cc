#include <chrono>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>

#include "common/log.h"
#include "proto/http_syntax.h"
#include "sam-node/node.h"

namespace samnode {
namespace {

// What the routes noted about the request this thread serves (noteAccess()).
struct AccessNote {
  std::string service;
  std::string outcome;
  std::string reason;
};

thread_local AccessNote* tl_note = nullptr;

// Longest path written to the access log; the rest is cut (a path may be up to the 64 KiB
// head limit, and the line is for reading).
constexpr size_t kMaxLoggedPath = 512;

// `name` is X-Sam-Agent ignoring case, with '_' read as '-' (proto/request_rewriter.h).
bool isAgentField(std::string_view name) { return proto::sameFieldName(name, "x-sam-agent"); }

// Writes the access log line when dispatch() ends, by return or by exception (the server
// then answers 500 itself, which is what the line says).
class AccessLog {
 public:
  AccessLog(const Request& req, const ResponseWriter& out, std::string_view route)
      : req_(req), out_(out), route_(route), start_(std::chrono::steady_clock::now()) {
    tl_note = &note_;
  }
  ~AccessLog() {
    tl_note = nullptr;
    try {
      const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                          std::chrono::steady_clock::now() - start_)
                          .count();
      const int status = out_.status() != 0 ? out_.status() : 500;
      nlohmann::json fields = {
          {"caller", req_.agent},
          {"method", req_.method},
          {"path", std::string_view(req_.path).substr(0, kMaxLoggedPath)},
          {"route", route_},
          // An upstream's own 4xx/5xx relayed is still a request the node allowed.
          {"outcome", !note_.outcome.empty() ? note_.outcome
                      : out_.status() == 0   ? "error"
                                             : "allowed"},
          {"status", status},
          {"duration_ms", ms}};
      if (!note_.service.empty()) fields["service"] = note_.service;
      if (!note_.reason.empty()) fields["reason"] = note_.reason;
      common::log::info("request", fields);
    } catch (...) {  // NOLINT(bugprone-empty-catch): a log line must not end the process
    }
  }
  AccessLog(const AccessLog&) = delete;
  AccessLog& operator=(const AccessLog&) = delete;

 private:
  const Request& req_;
  const ResponseWriter& out_;
  std::string_view route_;
  std::chrono::steady_clock::time_point start_;
  AccessNote note_;
};

}  // namespace

void noteAccess(std::string_view service, std::string_view outcome, std::string_view reason) {
  if (tl_note == nullptr) return;
  if (!service.empty()) tl_note->service = service;
  if (!outcome.empty()) {
    tl_note->outcome = outcome;
    tl_note->reason = reason;
  }
}

void refuse(Node& node, const Request& req, ResponseWriter& out, std::string_view route, int status,
            std::string_view reason, std::string_view message) {
  common::log::warn("request refused", {{"caller", req.agent},
                                        {"route", route},
                                        {"method", req.method},
                                        {"path", req.path},
                                        {"decision", "denied"},
                                        {"reason", reason},
                                        {"message", message}});
  node.metrics.refusal(reason);
  node.metrics.request(route, "denied");
  noteAccess({}, "denied", reason);
  sendProblem(out, status, "sam_node_refusal", reason, message);
}

namespace {

// An id that matches no role gets nothing from any route, which looks like an empty model or
// tool list to the agent; the usual cause is a typo in the bundle's agent.id or in
// allowed_agents. Said once per id (up to kMaxNoRoleIdsRemembered ids) so the log names it.
constexpr size_t kMaxNoRoleIdsRemembered = 1024;

void warnOnceIfNoRole(const Node& node, const std::string& agent) {
  static std::mutex mu;
  static std::set<std::string, std::less<>> seen;
  if (!node.grants.roles(agent).empty()) return;
  {
    std::lock_guard lock(mu);
    if (seen.size() >= kMaxNoRoleIdsRemembered || !seen.insert(agent).second) return;
  }
  common::log::warn("agent matches no role: every request from it is refused or answered empty",
                    {{"caller", agent},
                     {"hint",
                      "check the bundle's agent.id and the roles' "
                      "allowed_agents"}});
}

}  // namespace

void dispatch(Node& node, McpAggregator& mcp, A2aDirectory& a2a, Operations& ops,
              const Request& req, ResponseWriter& out) {
  const std::string_view path = req.path;
  auto under = [&](std::string_view prefix) {
    return path == prefix || (path.starts_with(prefix) && path[prefix.size()] == '/');
  };
  const std::string_view route = under("/v1")    ? "openai"
                                 : under("/mcp") ? "mcp"
                                 : under("/a2a") ? "a2a"
                                 : under("/ops") ? "ops"
                                                 : "other";
  const AccessLog access(req, out, route);
  // Identity first. sam-box sets exactly one X-Sam-Agent. Two (in any spelling, even if one
  // is empty) mean the request did not come as sam-box sent it; taking either one would be a
  // guess about who is asking.
  size_t agent_fields = 0;
  for (const auto& h : req.headers)
    if (isAgentField(h.first)) ++agent_fields;
  if (agent_fields > 1) {
    refuse(node, req, out, route, 400, "ambiguous-agent-identity",
           "more than one X-Sam-Agent field: requests carry exactly one, set by sam-box");
    return;
  }
  // sam-box always sets it, so a request without one did not come through a boundary (or came
  // from an egress-only box), and no route may answer it.
  if (req.agent.empty()) {
    refuse(node, req, out, route, 401, "missing-agent-identity",
           "no X-Sam-Agent: requests reach the node through the agent's sam-box");
    return;
  }
  warnOnceIfNoRole(node, req.agent);
  if (route == "openai") {
    serveOpenai(node, req, out);
  } else if (route == "mcp" && path == "/mcp") {
    mcp.serve(req, out);
  } else if (route == "a2a") {
    a2a.serve(req, out);
  } else if (route == "ops") {
    ops.serve(req, out);
  } else {
    refuse(node, req, out, route, 404, "unknown-route", "no such route: " + std::string(path));
  }
}

}  // namespace samnode
