// POST /mcp: one MCP endpoint (Streamable HTTP, JSON responses) over the tools of every `mcp`
// service, answering each agent according to its grants (seed 003: "Two agents behind the same
// node can see different tool lists"). Upstream sessions are MCP client sessions of the node.

#include "common/log.h"
#include "sam-node/json_limits.h"
#include "sam-node/mcp_wire.h"
#include "sam-node/node.h"
#include "sam-node/upstream.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <utility>
#include <vector>

namespace samnode {

namespace log = common::log;
using nlohmann::json;

namespace {

/// Largest upstream MCP response buffered (bytes): a tools/list or a tool result.
constexpr size_t kMaxUpstreamBody = size_t{16} * 1024 * 1024;
/// tools/list pages followed per service; a server that keeps returning a cursor is cut off.
constexpr int kMaxListPages = 100;
constexpr std::chrono::milliseconds kListTimeout{30000};
constexpr std::chrono::milliseconds kCallTimeout{300000};
/// The metrics label for a tool no service offers to the caller (never a configured name:
/// service names are RFC 1123 labels).
constexpr std::string_view kNoService = "(none)";

/// Upstream MCP answers buffered at once, all requests together (bytes). Each answer byte is
/// counted kAnswerMemoryFactor times: the raw body, its parsed JSON and the reply's
/// serialization are alive at once. Past it a tool call gets a node-busy error result.
constexpr size_t kAnswersHeldLimit = size_t{256} * 1024 * 1024;
constexpr size_t kAnswerMemoryFactor = 3;

/// A failure talking to an upstream MCP server; what() names the service and the reason.
class McpUpstreamError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// The answer would take the node past kAnswersHeldLimit: nothing is wrong with the upstream.
class McpNodeBusy : public McpUpstreamError {
 public:
  using McpUpstreamError::McpUpstreamError;
};

/// The memory of upstream answers held by every request (`held`), and this thread's share of
/// it: one thread serves one request at a time (http.h), and gives its share back when the
/// request is answered (AnswerRelease).
class AnswerBudget {
 public:
  /// Counts `bytes` of answer more for this thread's request; false (nothing counted) if that
  /// would pass kAnswersHeldLimit.
  bool take(size_t bytes) {
    const size_t cost = bytes * kAnswerMemoryFactor;
    if (held_.fetch_add(cost) + cost > kAnswersHeldLimit) {
      held_.fetch_sub(cost);
      return false;
    }
    tl_held_ += cost;
    return true;
  }
  /// Gives back `bytes` of answer this thread's request counted and no longer holds.
  void give(size_t bytes) {
    const size_t cost = std::min(bytes * kAnswerMemoryFactor, tl_held_);
    held_.fetch_sub(cost);
    tl_held_ -= cost;
  }
  /// Gives back what this thread's request took.
  void releaseThread() {
    held_.fetch_sub(tl_held_);
    tl_held_ = 0;
  }

 private:
  std::atomic<size_t> held_{0};
  static thread_local size_t tl_held_;
};
thread_local size_t AnswerBudget::tl_held_ = 0;

struct Session {
  std::string id;       ///< Mcp-Session-Id the upstream assigned; empty = none
  std::string version;  ///< negotiated protocol revision
  bool ready = false;
};

/// What came back for one POST.
struct Exchange {
  int status = 0;
  std::string session_id;
  std::optional<json> response;  ///< the JSON-RPC response with our id, if any
  std::string detail;            ///< why there is none, for errors
  bool busy = false;             ///< abandoned: the answer would pass kAnswersHeldLimit
};

std::string randomHex(size_t bytes) {
  std::random_device rd;  // getrandom(2) on Linux
  std::string out;
  char buf[3];
  for (size_t i = 0; i < bytes; ++i) {
    (void)std::snprintf(buf, sizeof buf, "%02x", static_cast<unsigned>(rd() & 0xff));
    out += buf;
  }
  return out;
}

/// The node as an MCP client of one upstream server (MCP "Lifecycle": initialize, then
/// notifications/initialized, then requests with the session id).
class UpstreamClient {
 public:
  UpstreamClient(const Service& service, AnswerBudget& budget)
      : service_(service), budget_(budget) {}

  /// Sends one request; returns the JSON-RPC response message (result or error). Starts a
  /// session first if there is none, and once more if the upstream forgot ours (404).
  json request(const std::string& method, const json& params, std::chrono::milliseconds timeout) {
    for (int attempt = 0;; ++attempt) {
      Session session = ensureSession();
      json id = next_id_++;
      json message = {{"jsonrpc", "2.0"}, {"id", id}, {"method", method}};
      if (!params.is_null()) message["params"] = params;
      Exchange ex = exchange(message, session, timeout);
      if (ex.status == 404 && !session.id.empty() && attempt == 0) {
        // MCP "Session Management": 404 means the session expired; start a new one.
        log::info("mcp upstream session expired; re-initializing", {{"service", service_.name}});
        invalidate(session.id);
        continue;
      }
      return checked(std::move(ex), method);
    }
  }

  /// Forgets the session (after an upstream failure) so the next request starts afresh.
  void reset() {
    std::lock_guard lock(mu_);
    session_ = Session{};
  }

 private:
  json checked(Exchange ex, const std::string& method) {
    if (ex.status != 200) {
      throw McpUpstreamError("mcp service " + service_.name + " answered " + method +
                             " with HTTP " + std::to_string(ex.status) +
                             (ex.detail.empty() ? "" : ": " + ex.detail));
    }
    if (!ex.response) {
      throw McpUpstreamError("mcp service " + service_.name + " sent no response to " + method +
                             (ex.detail.empty() ? "" : ": " + ex.detail));
    }
    return std::move(*ex.response);
  }

  Session ensureSession() {
    std::lock_guard lock(mu_);
    if (session_.ready) return session_;
    Session fresh;
    json id = next_id_++;
    json init = {{"jsonrpc", "2.0"},
                 {"id", id},
                 {"method", "initialize"},
                 {"params",
                  {{"protocolVersion", mcp::kLatestProtocolVersion},
                   {"capabilities", json::object()},
                   {"clientInfo", {{"name", "sam-node"}, {"version", COMPASS_VERSION}}}}}};
    Exchange ex = exchange(init, fresh, kListTimeout);
    fresh.id = ex.session_id;  // before checked() takes `ex` apart
    json response = checked(std::move(ex), "initialize");
    if (response.contains("error")) {
      throw McpUpstreamError("mcp service " + service_.name +
                             " refused initialize: " + response["error"].dump());
    }
    const json& result = response["result"];
    auto version = result.find("protocolVersion");
    if (version == result.end() || !version->is_string() ||
        !mcp::knownProtocolVersion(version->get<std::string>())) {
      throw McpUpstreamError("mcp service " + service_.name +
                             " answered initialize with an unsupported protocolVersion " +
                             (version == result.end() ? std::string("(none)") : version->dump()));
    }
    fresh.version = version->get<std::string>();
    json initialized = {{"jsonrpc", "2.0"}, {"method", "notifications/initialized"}};
    Exchange note = exchange(initialized, fresh, kListTimeout);
    if (note.status != 202 && note.status != 200) {
      throw McpUpstreamError("mcp service " + service_.name +
                             " answered notifications/initialized with HTTP " +
                             std::to_string(note.status));
    }
    fresh.ready = true;
    session_ = fresh;
    log::info("mcp upstream session started",
              {{"service", service_.name}, {"protocol_version", fresh.version}});
    return session_;
  }

  void invalidate(const std::string& old_id) {
    std::lock_guard lock(mu_);
    if (session_.id == old_id) session_ = Session{};
  }

  /// One POST. Reads a JSON body, or an SSE stream until the response with our id arrives
  /// (the stream may carry the server's notifications and requests first; they are skipped).
  Exchange exchange(const json& message, const Session& session,
                    std::chrono::milliseconds timeout) {
    UpstreamRequest req;
    req.method = "POST";
    req.url = service_.target_url;
    req.headers = {{"Content-Type", "application/json"},
                   {"Accept", "application/json, text/event-stream"}};
    if (!session.id.empty()) req.headers.emplace_back("Mcp-Session-Id", session.id);
    if (!session.version.empty()) req.headers.emplace_back("MCP-Protocol-Version", session.version);
    req.body = message.dump();
    req.total_timeout = timeout;
    json id = message.contains("id") ? message["id"] : json(nullptr);

    Exchange ex;
    bool sse = false;
    std::string body;
    mcp::SseParser parser(kMaxUpstreamBody);
    std::vector<mcp::SseEvent> events;
    auto on_head = [&](int status, const Headers& headers) {
      ex.status = status;
      ex.session_id = findHeader(headers, "Mcp-Session-Id").value_or("");
      std::string type = findHeader(headers, "Content-Type").value_or("");
      sse = type.starts_with("text/event-stream");
      return true;
    };
    size_t counted = 0;  // answer bytes of this exchange counted in budget_
    auto on_data = [&](std::string_view data) {
      // Counted as it arrives; a plain body is given back when the request that asked is
      // answered, an event stream's bytes as soon as their events are judged and dropped.
      if (!budget_.take(data.size())) {
        ex.busy = true;
        return false;
      }
      counted += data.size();
      if (!sse || ex.status != 200) {
        if (body.size() + data.size() > kMaxUpstreamBody) {
          ex.detail = "response larger than 16 MiB";
          return false;
        }
        body.append(data);
        return true;
      }
      if (!parser.feed(data, events)) {
        ex.detail = "SSE event larger than 16 MiB";
        return false;
      }
      for (auto& event : events) {
        if (!event.type.empty() && event.type != "message") continue;
        UntrustedJson parsed = parseUntrustedJson(event.data);
        if (parsed.overLimit()) {
          ex.detail = "an SSE event is " + parsed.why;
          return false;  // a hostile server: its answer is not used
        }
        if (parsed.ok() && mcp::isResponseTo(parsed.value, id)) {
          ex.response = std::move(parsed.value);
          return false;  // ours is in: no need to wait for the server to close the stream
        }
      }
      events.clear();
      // What the parser still holds (an event not yet ended) stays counted; the rest is gone.
      if (const size_t keep = parser.held(); counted > keep) {
        budget_.give(counted - keep);
        counted = keep;
      }
      return true;
    };
    try {
      stream(req, on_head, on_data);
    } catch (const UpstreamError& e) {
      throw McpUpstreamError("mcp service " + service_.name + " unreachable: " + e.what());
    }
    if (ex.busy) {
      throw McpNodeBusy("the node already holds " + std::to_string(kAnswersHeldLimit >> 20) +
                        " MiB of tool answers (each counted at " +
                        std::to_string(kAnswerMemoryFactor) + "x its size)");
    }
    if (ex.status == 200 && !sse && !id.is_null()) {
      UntrustedJson parsed = parseUntrustedJson(body);
      if (!parsed.ok()) {
        ex.detail = "response body is " + parsed.why;
      } else if (mcp::isResponseTo(parsed.value, id)) {
        ex.response = std::move(parsed.value);
      } else {
        ex.detail = "response is not the JSON-RPC response to our request";
      }
    } else if (ex.status != 200 && ex.detail.empty()) {
      ex.detail = body.substr(0, 200);
    } else if (sse && !ex.response && ex.detail.empty()) {
      ex.detail = "the event stream ended without the response";
    }
    return ex;
  }

  const Service& service_;
  AnswerBudget& budget_;
  std::mutex mu_;  ///< guards session_, held while a session starts
  Session session_;
  std::atomic<int64_t> next_id_{1};
};

}  // namespace

struct McpAggregator::Impl {
  explicit Impl(Node& n) : node(n) {
    for (const auto& service : node.config.services) {
      if (service.type == ServiceType::kMcp) {
        clients.emplace(service.name, std::make_unique<UpstreamClient>(service, answers));
      }
    }
  }

  Node& node;
  AnswerBudget answers;  ///< before `clients`, which refer to it
  /// One client per mcp service; built once, so the map itself needs no lock.
  std::map<std::string, std::unique_ptr<UpstreamClient>, std::less<>> clients;
  std::mutex cache_mu;
  std::map<std::string, std::vector<json>, std::less<>> tool_cache;  ///< by service
  std::set<std::string> logged_collisions;

  struct Offer {
    std::string service;
    json tool;
  };

  /// All tools of `service`, following nextCursor. Throws McpUpstreamError.
  std::vector<json> listTools(const std::string& service) {
    UpstreamClient& client = *clients.at(service);
    std::vector<json> tools;
    json params = nullptr;
    for (int page = 0; page < kMaxListPages; ++page) {
      json response = client.request("tools/list", params, kListTimeout);
      if (response.contains("error")) {
        throw McpUpstreamError("mcp service " + service +
                               " refused tools/list: " + response["error"].dump());
      }
      const json& result = response["result"];
      if (!result.is_object() || !result.contains("tools") || !result["tools"].is_array()) {
        throw McpUpstreamError("mcp service " + service +
                               " sent a tools/list result without "
                               "a \"tools\" array");
      }
      for (const auto& tool : result["tools"]) {
        if (tool.is_object() && tool.contains("name") && tool["name"].is_string()) {
          tools.push_back(tool);
        }
      }
      auto cursor = result.find("nextCursor");
      if (cursor == result.end() || !cursor->is_string() || cursor->get<std::string>().empty()) {
        std::lock_guard lock(cache_mu);
        tool_cache[service] = tools;
        return tools;
      }
      params = {{"cursor", *cursor}};
    }
    throw McpUpstreamError("mcp service " + service + " returned more than 100 tools/list pages");
  }

  /// The tools `agent` may use, in config order; a name offered by two services goes to the
  /// first (the collision is logged once). `fresh`: ask every upstream rather than the cache.
  std::vector<Offer> visibleTools(const std::string& agent, bool fresh) {
    std::vector<Offer> out;
    std::map<std::string, std::string> owner;
    for (const auto& service : node.config.services) {
      if (service.type != ServiceType::kMcp) continue;
      if (!node.grants.mayUseService(agent, service.name)) continue;
      std::vector<json> tools;
      bool cached = false;
      if (!fresh) {
        std::lock_guard lock(cache_mu);
        if (auto it = tool_cache.find(service.name); it != tool_cache.end()) {
          tools = it->second;
          cached = true;
        }
      }
      if (!cached) {
        try {
          tools = listTools(service.name);
        } catch (const McpNodeBusy& e) {
          // Nothing is wrong with the server (its session stays): its tools are left out of
          // this answer only, and said so.
          log::warn("mcp tools/list left a service out", {{"caller", agent},
                                                          {"service", service.name},
                                                          {"reason", "node-busy"},
                                                          {"detail", e.what()}});
          node.metrics.refusal("node-busy");
          continue;
        } catch (const McpUpstreamError& e) {
          // One broken server must not hide the others' tools.
          log::error("mcp tools/list failed",
                     {{"caller", agent}, {"service", service.name}, {"error", e.what()}});
          node.metrics.toolCall(service.name, "error");
          clients.at(service.name)->reset();
          continue;
        }
      }
      for (auto& tool : tools) {
        std::string name = tool["name"].get<std::string>();
        if (!node.grants.mayUseTool(agent, service.name, name)) continue;
        if (auto it = owner.find(name); it != owner.end()) {
          noteCollision(name, it->second, service.name);
          continue;
        }
        owner.emplace(name, service.name);
        out.push_back({service.name, std::move(tool)});
      }
    }
    return out;
  }

  void noteCollision(const std::string& tool, const std::string& winner, const std::string& loser) {
    std::lock_guard lock(cache_mu);
    if (!logged_collisions.insert(tool + "\n" + loser).second) return;
    log::warn("mcp tool offered by two services; the first in config order wins",
              {{"tool", tool}, {"service", winner}, {"shadowed_service", loser}});
  }

  /// The granted service (by cache) that offers `tool` but does not grant it, if any.
  std::optional<std::string> offeredButNotGranted(const std::string& agent,
                                                  const std::string& tool) {
    std::lock_guard lock(cache_mu);
    for (const auto& service : node.config.services) {
      if (service.type != ServiceType::kMcp) continue;
      if (!node.grants.mayUseService(agent, service.name)) continue;
      auto it = tool_cache.find(service.name);
      if (it == tool_cache.end()) continue;
      for (const auto& t : it->second) {
        if (t["name"] == tool) return service.name;
      }
    }
    return std::nullopt;
  }

  json toolsList(const Request& req) {
    std::vector<Offer> offers = visibleTools(req.agent, true);
    json tools = json::array();
    for (auto& offer : offers) tools.push_back(std::move(offer.tool));
    log::debug("mcp tools/list", {{"caller", req.agent}, {"tools", tools.size()}});
    return {{"tools", std::move(tools)}};
  }

  /// The JSON-RPC response to tools/call `id`: the upstream's result, its JSON-RPC error passed
  /// through, or a result with isError for a refusal or an upstream failure.
  json toolsCall(const Request& req, const json& id, const json& params) {
    std::string tool = params["name"].get<std::string>();
    std::optional<std::string> service;
    for (bool fresh : {false, true}) {
      for (const auto& offer : visibleTools(req.agent, fresh)) {
        if (offer.tool["name"] == tool) service = offer.service;
      }
      if (service) break;
    }
    if (!service) {
      std::optional<std::string> holder = offeredButNotGranted(req.agent, tool);
      std::string reason = holder ? "tool-not-granted" : "unknown-tool";
      std::string why = holder ? "tool \"" + tool + "\" of service " + *holder +
                                     " is not granted to agent " + req.agent
                               : "unknown tool \"" + tool +
                                     "\": no service this agent may use "
                                     "offers it";
      log::warn("mcp tool call refused", {{"caller", req.agent},
                                          {"tool", tool},
                                          {"service", holder.value_or("")},
                                          {"decision", "denied"},
                                          {"reason", reason}});
      node.metrics.toolCall(holder ? *holder : std::string(kNoService), "denied");
      node.metrics.refusal(reason);
      node.metrics.request("mcp", "denied");
      return mcp::rpcResult(id, mcp::toolErrorResult(why));
    }
    try {
      json response = clients.at(*service)->request("tools/call", params, kCallTimeout);
      log::info("mcp tool call", {{"caller", req.agent},
                                  {"tool", tool},
                                  {"service", *service},
                                  {"decision", "allowed"},
                                  {"upstream_error", response.contains("error")}});
      node.metrics.toolCall(*service, response.contains("error") ? "error" : "allowed");
      node.metrics.request("mcp", "allowed");
      response["id"] = id;  // the upstream answered our id; the caller gets its own back
      return response;
    } catch (const McpNodeBusy& e) {
      log::warn("mcp tool call refused", {{"caller", req.agent},
                                          {"tool", tool},
                                          {"service", *service},
                                          {"decision", "denied"},
                                          {"reason", "node-busy"},
                                          {"detail", e.what()}});
      node.metrics.toolCall(*service, "denied");
      node.metrics.refusal("node-busy");
      node.metrics.request("mcp", "denied");
      return mcp::rpcResult(
          id, mcp::toolErrorResult("tool \"" + tool +
                                   "\" not answered: the node holds as many "
                                   "tool results as it may at once (node-busy); retry later"));
    } catch (const McpUpstreamError& e) {
      log::error("mcp tool call failed", {{"caller", req.agent},
                                          {"tool", tool},
                                          {"service", *service},
                                          {"decision", "allowed"},
                                          {"error", e.what()}});
      node.metrics.toolCall(*service, "error");
      node.metrics.request("mcp", "error");
      clients.at(*service)->reset();
      // e.what() names the server's address: for the log above, not for the agent.
      return mcp::rpcResult(id, mcp::toolErrorResult("tool \"" + tool +
                                                     "\" failed: its server could not be reached "
                                                     "or did not answer properly"));
    }
  }

  /// Answers one JSON-RPC request with a full JSON-RPC response message.
  json dispatch(const Request& req, const mcp::Message& msg, Headers& extra) {
    if (msg.method == "initialize") {
      std::string requested;
      if (msg.params.is_object() && msg.params.contains("protocolVersion") &&
          msg.params["protocolVersion"].is_string()) {
        requested = msg.params["protocolVersion"].get<std::string>();
      }
      extra.emplace_back("Mcp-Session-Id", randomHex(16));
      node.metrics.request("mcp", "allowed");
      log::info("mcp initialize", {{"caller", req.agent}, {"protocol_version", requested}});
      return mcp::rpcResult(msg.id,
                            {{"protocolVersion", mcp::negotiateProtocolVersion(requested)},
                             {"capabilities", {{"tools", {{"listChanged", false}}}}},
                             {"serverInfo", {{"name", "sam-node"}, {"version", COMPASS_VERSION}}}});
    }
    if (msg.method == "ping") {
      node.metrics.request("mcp", "allowed");
      return mcp::rpcResult(msg.id, json::object());
    }
    if (msg.method == "tools/list") {
      json result = toolsList(req);
      node.metrics.request("mcp", "allowed");
      return mcp::rpcResult(msg.id, std::move(result));
    }
    if (msg.method == "tools/call") {
      if (!msg.params.is_object() || !msg.params.contains("name") ||
          !msg.params["name"].is_string()) {
        node.metrics.request("mcp", "error");
        return mcp::rpcError(msg.id, mcp::kInvalidParams,
                             "tools/call: params.name must be a string naming the tool");
      }
      if (msg.params.contains("arguments") && !msg.params["arguments"].is_object()) {
        node.metrics.request("mcp", "error");
        return mcp::rpcError(msg.id, mcp::kInvalidParams,
                             "tools/call: params.arguments must be an object");
      }
      return toolsCall(req, msg.id, msg.params);
    }
    node.metrics.request("mcp", "error");
    return mcp::rpcError(msg.id, mcp::kMethodNotFound,
                         "method \"" + msg.method +
                             "\" is not supported by sam-node (tools only: initialize, ping, "
                             "tools/list, tools/call)");
  }

  /// A message we cannot take: HTTP 400 with a JSON-RPC error (MCP Streamable HTTP: "the
  /// HTTP response body MAY comprise a JSON-RPC error response").
  void badMessage(const Request& req, ResponseWriter& out, const json& id, int code,
                  const std::string& why) {
    log::warn("mcp message refused", {{"caller", req.agent},
                                      {"decision", "denied"},
                                      {"reason", "bad-mcp-message"},
                                      {"message", why}});
    node.metrics.refusal("bad-mcp-message");
    node.metrics.request("mcp", "denied");
    out.send(400, {{"Content-Type", "application/json"}, {"Sam-Node-Reason", "bad-mcp-message"}},
             mcp::rpcError(id, code, why).dump());
  }

  void serve(const Request& req, ResponseWriter& out) {
    // Whatever this request took of the answer budget is given back once it is answered.
    struct Release {
      AnswerBudget& budget;
      ~Release() { budget.releaseThread(); }
    } const release{answers};
    if (req.agent.empty()) {
      refuse(node, req, out, "mcp", 401, "missing-agent-identity",
             "X-Sam-Agent is missing: requests reach sam-node through sam-box");
      return;
    }
    if (req.method == "DELETE") {  // the client ends its session; we keep no state for it
      out.send(200, {}, "");
      return;
    }
    if (req.method != "POST") {
      // No server-initiated stream (GET) is offered: the spec's answer is 405. MCP clients
      // ask once per session, so it is counted like any refusal but logged at info only.
      log::info("mcp method not allowed", {{"caller", req.agent}, {"method", req.method}});
      node.metrics.refusal("method-not-allowed");
      node.metrics.request("mcp", "denied");
      const nlohmann::json body = {{"error",
                                    {{"message", "/mcp takes POST (and DELETE); no GET stream"},
                                     {"type", "sam_node_refusal"},
                                     {"code", "method-not-allowed"}}}};
      out.send(405,
               {{"Allow", "POST, DELETE"},
                {"Content-Type", "application/json"},
                {"Sam-Node-Reason", "method-not-allowed"}},
               body.dump());
      return;
    }
    if (auto version = findHeader(req.headers, "MCP-Protocol-Version");
        version && !mcp::knownProtocolVersion(*version)) {
      badMessage(req, out, nullptr, mcp::kInvalidRequest,
                 "unsupported MCP-Protocol-Version \"" + *version + "\"");
      return;
    }
    UntrustedJson parsed = parseUntrustedJson(req.body);
    if (parsed.failure == UntrustedJson::kSyntax) {
      badMessage(req, out, nullptr, mcp::kParseError, "the body is not valid JSON");
      return;
    }
    if (parsed.overLimit()) {
      badMessage(req, out, nullptr, mcp::kInvalidRequest, "the body is " + parsed.why);
      return;
    }
    mcp::Message msg = mcp::classify(std::move(parsed.value));
    if (msg.kind == mcp::MessageKind::kInvalid) {
      badMessage(req, out, msg.id, mcp::kInvalidRequest, msg.why);
      return;
    }
    if (msg.kind != mcp::MessageKind::kRequest) {
      // Notifications and responses: accepted, nothing to answer (Streamable HTTP: 202).
      out.send(202, {}, "");
      return;
    }
    Headers headers = {{"Content-Type", "application/json"}};
    json response = dispatch(req, msg, headers);
    out.send(200, headers, response.dump(-1, ' ', false, json::error_handler_t::replace));
  }
};

McpAggregator::McpAggregator(Node& node) : impl_(std::make_unique<Impl>(node)) {}
McpAggregator::~McpAggregator() = default;
void McpAggregator::serve(const Request& req, ResponseWriter& out) { impl_->serve(req, out); }

}  // namespace samnode
