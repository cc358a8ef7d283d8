// /a2a: agents that serve (seed 003, "Agents that serve"). A service is advertised only while
// its card probe succeeds: readiness is observed, never assumed.

#include <algorithm>
#include <atomic>
#include <cctype>
#include <condition_variable>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "common/log.h"
#include "sam-node/json_limits.h"
#include "sam-node/node.h"
#include "sam-node/proxy.h"

namespace samnode {
namespace {

constexpr std::string_view kRoute = "a2a";
constexpr std::string_view kCardPath = ".well-known/agent-card.json";
// The card's name before A2A 0.3; servers may still serve it there.
constexpr std::string_view kLegacyCardPath = ".well-known/agent.json";

// `path` as servers that normalise before routing see it (RFC 3986 §6.2.2): percent-encoded
// unreserved characters decoded ("%2Ewell-known" is ".well-known"), empty segments and
// ";parameters" dropped ("a//b;x" is "a/b"), lower case. Only used to recognise the agent card
// under any spelling: every one of them is answered rewritten, never with the served agent's own
// addresses.
std::string normalisedPath(std::string_view path) {
  const std::string decoded = percentDecode(path, /*unreserved_only=*/true);
  std::string out;
  for (size_t at = 0; at <= decoded.size();) {
    const size_t slash = std::min(decoded.find('/', at), decoded.size());
    // A segment's ";parameters" are dropped (servers that strip them route without them).
    const size_t end = std::min(decoded.find(';', at), slash);
    if (end > at) out += (out.empty() ? "" : "/") + decoded.substr(at, end - at);
    at = slash + 1;
  }
  // Case-insensitive servers route ".Well-Known/AGENT-CARD.JSON" to the card too.
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}
constexpr std::string_view kMeshBase = "http://mesh.sam.alt/a2a/";
// Agent cards are small; a larger answer is not a card.
constexpr size_t kMaxCardBytes = size_t{1} << 20;

// `url` as the caller must see it: scheme, host and port become the node's mesh address of
// the service, the rest (path below the service's target_url, query) is kept, so an agent
// serving below "/" keeps working. "http://127.0.0.1:8080/" -> "<mesh_base>/"; a URL whose
// path lies under the target_url's own path loses that prefix (the proxy adds it back). A
// value that is not an absolute URL is left as the agent wrote it.
std::string meshUrl(std::string_view url, std::string_view target_path,
                    const std::string& mesh_base) {
  const auto scheme_end = url.find("://");
  if (scheme_end == std::string_view::npos) return std::string(url);
  const auto rest_at = url.find_first_of("/?#", scheme_end + 3);
  std::string_view rest = rest_at == std::string_view::npos ? "" : url.substr(rest_at);
  if (!target_path.empty() && rest.starts_with(target_path) &&
      (rest.size() == target_path.size() || rest[target_path.size()] == '/' ||
       rest[target_path.size()] == '?' || rest[target_path.size()] == '#'))
    rest.remove_prefix(target_path.size());
  return mesh_base + std::string(rest);
}

// The path of a target_url ("http://h:1/base/" -> "/base"), without a trailing '/'.
std::string_view targetPath(std::string_view target_url) {
  const auto scheme_end = target_url.find("://");
  if (scheme_end == std::string_view::npos) return {};
  const auto path_at = target_url.find('/', scheme_end + 3);
  if (path_at == std::string_view::npos) return {};
  std::string_view path = target_url.substr(path_at);
  while (!path.empty() && path.back() == '/') path.remove_suffix(1);
  return path;
}

// The card as the caller must see it: every address it advertises points back through the
// node. Pre-1.0 cards carry `url` and `additionalInterfaces[].url`; A2A v1.0 cards (what
// @a2a-js/sdk 1.x serves) carry `supportedInterfaces[].url`. Other URLs in the card
// (provider, documentation, icons) are not addresses of the agent and stay as they are.
void rewriteCard(nlohmann::json& card, std::string_view target_url, const std::string& mesh_base) {
  const std::string_view target_path = targetPath(target_url);
  auto rewrite = [&](nlohmann::json& holder) {
    if (holder.is_object() && holder.contains("url") && holder["url"].is_string())
      holder["url"] = meshUrl(holder["url"].get_ref<const std::string&>(), target_path, mesh_base);
  };
  rewrite(card);
  for (const char* list : {"additionalInterfaces", "supportedInterfaces"})
    if (card.contains(list) && card[list].is_array())
      for (auto& iface : card[list]) rewrite(iface);
}

}  // namespace

struct A2aDirectory::Impl {
  explicit Impl(Node& n) : node(n) {}
  Node& node;
  mutable std::mutex mu;
  std::condition_variable wake;
  std::map<std::string, bool, std::less<>> ready;
  bool stopping = false;
  std::atomic<bool> cancel{false};  // set with `stopping`: abandons a probe in flight
  std::thread thread;

  bool probe(const Service& s) const {
    UpstreamRequest up;
    up.url = s.target_url + "/" + std::string(kCardPath);
    up.headers = {{"Accept", "application/json"}};
    const auto interval = node.config.probe_interval;
    up.connect_timeout = std::min(interval, std::chrono::milliseconds(2000));
    up.total_timeout = std::max(interval, std::chrono::milliseconds(1000));
    up.cancel = &cancel;
    up.fresh_connection = true;  // readiness is whether the agent accepts a connection now
    try {
      const UpstreamResponse r = fetch(up, kMaxCardBytes);
      if (r.status != 200) return false;
      const UntrustedJson card = parseUntrustedJson(r.body);
      if (!card.ok())
        common::log::debug("a2a card probe: not a card", {{"service", s.name}, {"why", card.why}});
      return card.ok() && card.value.is_object();
    } catch (const UpstreamError&) {
      return false;
    }
  }

  void run() {
    std::unique_lock lock(mu);
    while (!stopping) {
      lock.unlock();
      for (const auto& s : node.config.services) {
        if (s.type != ServiceType::kA2a) continue;
        const bool ok = probe(s);
        std::lock_guard guard(mu);
        const auto it = ready.find(s.name);
        const bool was = it != ready.end() && it->second;
        if (ok != was || it == ready.end())
          common::log::info(ok ? "a2a service ready" : "a2a service not ready",
                            {{"service", s.name}});
        ready[s.name] = ok;
        node.metrics.a2aReady(s.name, ok);
      }
      lock.lock();
      wake.wait_for(lock, node.config.probe_interval, [&] { return stopping; });
    }
  }
};

A2aDirectory::A2aDirectory(Node& node) : impl_(std::make_unique<Impl>(node)) {
  for (const auto& s : node.config.services)
    if (s.type == ServiceType::kA2a) node.metrics.a2aReady(s.name, false);
}

A2aDirectory::~A2aDirectory() {
  {
    std::lock_guard lock(impl_->mu);
    impl_->stopping = true;
  }
  impl_->cancel = true;
  impl_->wake.notify_all();
  if (impl_->thread.joinable()) impl_->thread.join();
}

void A2aDirectory::start() {
  if (!impl_->thread.joinable()) impl_->thread = std::thread([this] { impl_->run(); });
}

bool A2aDirectory::ready(std::string_view name) const {
  std::lock_guard lock(impl_->mu);
  const auto it = impl_->ready.find(name);
  return it != impl_->ready.end() && it->second;
}

void A2aDirectory::serve(const Request& req, ResponseWriter& out) {
  Node& node = impl_->node;
  if (req.path == "/a2a" || req.path == "/a2a/") {
    if (req.method != "GET") {
      refuse(node, req, out, kRoute, 405, "method-not-allowed", "GET /a2a lists agents");
      return;
    }
    nlohmann::json agents = nlohmann::json::array();
    for (const auto& s : node.config.services)
      if (s.type == ServiceType::kA2a && node.grants.mayUseService(req.agent, s.name) &&
          ready(s.name))
        agents.push_back(
            {{"name", s.name},
             {"card_url", std::string(kMeshBase) + s.name + "/" + std::string(kCardPath)}});
    node.metrics.request(kRoute, "allowed");
    sendJson(out, 200, nlohmann::json{{"agents", agents}}.dump());
    return;
  }
  // /a2a/<name>[/<rest>]
  const std::string_view tail = std::string_view(req.path).substr(5);
  const auto slash = tail.find('/');
  const std::string name(tail.substr(0, slash));
  const std::string rest =
      slash == std::string_view::npos ? "" : std::string(tail.substr(slash + 1));
  const Service* service = node.config.service(name);
  // An undeclared name and a declared one the caller may not use answer alike: the caller
  // learns nothing about services outside its grants.
  if (service == nullptr || service->type != ServiceType::kA2a ||
      !node.grants.mayUseService(req.agent, name)) {
    refuse(node, req, out, kRoute, 403, "not-granted",
           "no a2a service \"" + name + "\" is granted to agent " + req.agent);
    return;
  }
  noteAccess(name);
  // The name was matched exactly above; the rest goes below the agent's base URL, where a dot
  // segment would reach another agent on the same host.
  if (const std::string_view why = pathProblem(rest); !why.empty()) {
    refuse(node, req, out, kRoute, 400, "bad-path",
           "the path has " + std::string(why) + ": it could name something outside /a2a/" + name);
    return;
  }
  if (!ready(name)) {
    refuse(node, req, out, kRoute, 503, "service-not-ready",
           "a2a service \"" + name + "\" does not answer its card probe");
    return;
  }
  UpstreamRequest up;
  up.method = req.method;
  up.url = service->target_url + "/" + rest;
  if (!req.query.empty()) up.url += "?" + req.query;
  up.headers = forwardableHeaders(req.headers);
  up.headers.emplace_back("X-Sam-Caller", req.agent);
  up.body = req.body;
  // An agent's task may stream (message/stream) for long: only silence ends it.
  up.total_timeout = std::chrono::milliseconds(0);
  up.idle_timeout = node.config.upstream_idle_timeout;
  const std::string normalised = normalisedPath(rest);
  if (normalised == kCardPath || normalised == kLegacyCardPath) {
    // Only read: another method's answer would be the card unrewritten, if the agent gave it.
    if (req.method != "GET") {
      refuse(node, req, out, kRoute, 405, "method-not-allowed",
             "the agent card at /a2a/" + name + "/" + normalised + " is read with GET");
      return;
    }
    up.url = service->target_url + "/" + normalised;
    up.total_timeout = UpstreamRequest{}.total_timeout;  // a card is small: the usual bound
    up.idle_timeout = std::chrono::milliseconds(0);
    UpstreamResponse r;
    try {
      r = fetch(up, kMaxCardBytes);
    } catch (const UpstreamError& e) {
      upstreamFailed(node, req, out, kRoute, name, "upstream-unreachable", e.what());
      return;
    }
    if (r.status == 200) {
      // Depth-capped (json_limits.h): rewriting and dump() recurse once per level.
      UntrustedJson card = parseUntrustedJson(r.body);
      if (!card.ok() || !card.value.is_object()) {
        // Relayed as it came, it would hand the caller addresses that bypass the node.
        upstreamFailed(node, req, out, kRoute, name, "bad-agent-card",
                       card.ok() ? "the agent card is not a JSON object" : card.why);
        return;
      }
      rewriteCard(card.value, service->target_url, std::string(kMeshBase) + name);
      r.body = card.value.dump();
      node.metrics.request(kRoute, "allowed");
      out.send(200, r.headers, r.body);  // the writer sets the new length
      return;
    }
    node.metrics.request(kRoute, "allowed");
    out.send(r.status, r.headers, r.body);
    return;
  }
  proxyStream(node, req, out, kRoute, name, up);
}

}  // namespace samnode
