#include <nlohmann/json.hpp>

#include "common/log.h"
#include "sam-node/node.h"

namespace samnode {

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
  const nlohmann::json body = {
      {"error", {{"message", message}, {"type", "sam_node_refusal"}, {"code", reason}}}};
  out.send(status, {{"Content-Type", "application/json"}, {"Sam-Node-Reason", std::string(reason)}},
           body.dump());
}

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
  // Identity first: sam-box always sets it, so a request without one did not come through a
  // boundary (or came from an egress-only box), and no route may answer it.
  if (req.agent.empty()) {
    refuse(node, req, out, route, 401, "missing-agent-identity",
           "no X-Sam-Agent: requests reach the node through the agent's sam-box");
    return;
  }
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
