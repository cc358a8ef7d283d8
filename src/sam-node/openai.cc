// /v1/...: the OpenAI-compatible API of the services the caller may use (docs/sam-node.md).
// The agent's SDK is configured with base_url http://mesh.sam.alt/v1 and a placeholder key;
// the node picks the service, drops the placeholder and attaches the operator's key.

#include <nlohmann/json.hpp>

#include "common/log.h"
#include "sam-node/json_limits.h"
#include "sam-node/node.h"
#include "sam-node/proxy.h"
#include "sam-node/secrets.h"

namespace samnode {
namespace {

constexpr std::string_view kRoute = "openai";

std::vector<const Service*> grantedModels(const Node& node, std::string_view agent) {
  std::vector<const Service*> out;
  for (const auto& s : node.config.services)
    if (s.type == ServiceType::kOpenai && node.grants.mayUseService(agent, s.name))
      out.push_back(&s);
  return out;
}

void listModels(Node& node, const Request& req, ResponseWriter& out) {
  nlohmann::json data = nlohmann::json::array();
  for (const Service* s : grantedModels(node, req.agent))
    data.push_back(
        {{"id", s->name}, {"object", "model"}, {"created", 0}, {"owned_by", "sam-node"}});
  node.metrics.request(kRoute, "allowed");
  sendJson(out, 200, nlohmann::json{{"object", "list"}, {"data", data}}.dump());
}

// The body's "model" when it names a granted service; else the only granted service. A body
// that is not JSON, or nested too deep to be a request (json_limits.h), names no model; it
// still goes to the only granted service, which answers it as it sees fit. Only "model" is
// kept from the body: the rest may be large (an embeddings request's token ids) and is the
// upstream's to read.
const Service* chooseService(const std::vector<const Service*>& granted, const Request& req) {
  if (!req.body.empty()) {
    if (const auto model = topLevelString(req.body, "model")) {
      for (const Service* s : granted)
        if (s->name == *model) return s;
    } else {
      common::log::debug("request body names no model", {{"caller", req.agent}, {"route", kRoute}});
    }
  }
  return granted.size() == 1 ? granted.front() : nullptr;
}

}  // namespace

void serveOpenai(Node& node, const Request& req, ResponseWriter& out) {
  // Checked first: the rest of the path is appended to the service's base URL, and a dot
  // segment would take the operator's api_key to another path of the model host.
  if (const std::string_view why = pathProblem(req.path); !why.empty()) {
    refuse(node, req, out, kRoute, 400, "bad-path",
           "the path has " + std::string(why) + ": it could name something outside /v1");
    return;
  }
  if (req.path == "/v1/models" && req.method == "GET") {
    listModels(node, req, out);
    return;
  }
  const auto granted = grantedModels(node, req.agent);
  if (granted.empty()) {
    refuse(node, req, out, kRoute, 403, "not-granted",
           "no model service is granted to agent " + req.agent);
    return;
  }
  const Service* service = chooseService(granted, req);
  if (service == nullptr) {
    refuse(node, req, out, kRoute, 403, "model-not-granted",
           "the request's \"model\" names no granted model service (see GET /v1/models)");
    return;
  }
  noteAccess(service->name);
  UpstreamRequest up;
  up.method = req.method;
  // target_url is the service's /v1 base: /v1/<rest> goes to <target_url>/<rest>.
  std::string_view rest = std::string_view(req.path).substr(3);  // after "/v1"
  up.url = service->target_url + std::string(rest);
  if (!req.query.empty()) up.url += "?" + req.query;
  up.headers = forwardableHeaders(req.headers);
  up.body = req.body;
  // A completion may stream (or think) for longer than any fixed limit: only silence ends it.
  up.total_timeout = std::chrono::milliseconds(0);
  up.idle_timeout = node.config.upstream_idle_timeout;
  if (!service->api_key.empty()) {
    try {
      up.headers.emplace_back("Authorization", "Bearer " + node.secrets.read(service->api_key));
    } catch (const SecretError& e) {
      // The agent is not told the reference or the path (an operator may have written the
      // key itself where its reference belongs): those go to the node's log only.
      upstreamFailed(node, req, out, kRoute, service->name, "secret-unavailable", e.what(),
                     "the service's API key cannot be read (see the node's log)");
      return;
    }
  }
  proxyStream(node, req, out, kRoute, service->name, up);
}

}  // namespace samnode
