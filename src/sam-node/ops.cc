// POST /ops/spawn and /ops/secret-use: privileged operations performed by the node for the
// agent, which holds no server credential (seed 000). Each is checked against the caller's
// grants, logged with caller and decision, and counted.

#include "common/log.h"
#include "common/resolve.h"
#include "common/unique_fd.h"
#include "policy/address.h"
#include "policy/name.h"
#include "proto/http_syntax.h"
#include "sam-node/json_limits.h"
#include "sam-node/node.h"
#include "sam-node/spawn_child.h"
#include "sam-node/upstream.h"

#include <unistd.h>

#include <arpa/inet.h>
#include <curl/curl.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <memory>

namespace samnode {

namespace log = common::log;
using nlohmann::json;

namespace {

/// Largest response body a secret-use request brings back (bytes).
constexpr size_t kMaxSecretUseBody = size_t{1} * 1024 * 1024;
constexpr std::chrono::milliseconds kSecretUseTimeout{60000};
constexpr std::string_view kRedacted = "[redacted]";

/// Fields the agent may not set on a secret-use request: the node frames the message itself,
/// and a Host other than the URL's would send the secret to another site behind the same
/// address (domain fronting), past the destination grant.
constexpr std::array<std::string_view, 11> kReservedHeaders = {
    "host",    "content-length",      "transfer-encoding", "connection", "upgrade", "te",
    "trailer", "proxy-authorization", "proxy-connection",  "keep-alive", "expect"};

bool hasLineBreakOrNul(std::string_view s) {
  return s.find_first_of(std::string_view("\r\n\0", 3)) != std::string_view::npos;
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

void replaceAll(std::string& text, std::string_view needle, std::string_view with) {
  if (needle.empty()) return;
  for (size_t pos = text.find(needle); pos != std::string::npos;
       pos = text.find(needle, pos + with.size())) {
    text.replace(pos, needle.size(), with);
  }
}

/// A bad request body: the message names the field.
class BadField : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct Destination {
  std::string url;     ///< as curl normalized it
  bool https = false;  ///< false: http
  std::string host;    ///< normalized name
  uint16_t port = 0;
};

struct CurluFree {
  void operator()(CURLU* u) const { curl_url_cleanup(u); }
};
struct CurlStrFree {
  void operator()(char* p) const { curl_free(p); }
};

/// Parses request.url: http or https, a host name (not an address: grants hold names), no
/// userinfo. Throws BadField.
Destination parseDestination(const std::string& url) {
  std::unique_ptr<CURLU, CurluFree> u(curl_url());
  if (!u) throw std::bad_alloc();
  if (curl_url_set(u.get(), CURLUPART_URL, url.c_str(), 0) != CURLUE_OK) {
    throw BadField("request.url: not an absolute http:// or https:// URL");
  }
  auto part = [&](CURLUPart which, unsigned flags) -> std::optional<std::string> {
    char* raw = nullptr;
    if (curl_url_get(u.get(), which, &raw, flags) != CURLUE_OK) return std::nullopt;
    std::unique_ptr<char, CurlStrFree> owned(raw);
    return std::string(raw);
  };
  auto scheme = part(CURLUPART_SCHEME, 0);
  if (!scheme || (*scheme != "http" && *scheme != "https")) {
    throw BadField("request.url: the scheme must be http or https");
  }
  if (part(CURLUPART_USER, 0) || part(CURLUPART_PASSWORD, 0)) {
    throw BadField("request.url: credentials in the URL are refused");
  }
  auto host = part(CURLUPART_HOST, 0);
  if (!host || host->empty()) throw BadField("request.url: no host");
  if (policy::isIpLiteral(*host)) {
    throw BadField("request.url: the host must be a name; address literals are never granted");
  }
  std::string why;
  auto name = policy::normalizeName(*host, &why);
  if (!name) throw BadField("request.url: host " + *host + ": " + why);
  auto port = part(CURLUPART_PORT, CURLU_DEFAULT_PORT);
  int port_number = port ? std::atoi(port->c_str()) : 0;
  if (port_number < 1 || port_number > 65535) throw BadField("request.url: bad port");
  curl_url_set(u.get(), CURLUPART_FRAGMENT, nullptr, 0);  // never sent on the wire
  // The URL carries the name as checked (lower case, no trailing dot): the name the grant
  // matched, the name resolved and judged below, and the name the pin is set for (a pin for
  // "api.example" would not steer a URL host "API.example." in every libcurl version).
  if (curl_url_set(u.get(), CURLUPART_HOST, name->c_str(), 0) != CURLUE_OK) {
    throw BadField("request.url: host " + *host + " cannot be rebuilt");
  }
  auto full = part(CURLUPART_URL, 0);
  if (!full) throw BadField("request.url: cannot be rebuilt");
  return {*full, *scheme == "https", *name, static_cast<uint16_t>(port_number)};
}

/// The A and AAAA addresses of `host` (a normalized name), as nsswitch.conf says (/etc/hosts,
/// then DNS), de-duplicated in resolver order, without zone ids (they are pinned as text).
/// Empty, with *why set, if it does not resolve.
std::vector<asio::ip::address> resolveName(const std::string& host, std::string* why) {
  const common::AddressLookup found = common::lookupAddresses(host);
  if (found.gai_error != 0) {
    *why = ::gai_strerror(found.gai_error);
    return {};
  }
  std::vector<asio::ip::address> out;
  for (auto addr : found.addresses) {
    if (addr.is_v6()) addr = asio::ip::address_v6(addr.to_v6().to_bytes());
    if (std::find(out.begin(), out.end(), addr) == out.end()) out.push_back(addr);
  }
  if (out.empty()) *why = "no IPv4 or IPv6 address";
  return out;
}

/// True if `addr` is assigned to an interface of this host (getifaddrs(3), read per call:
/// secret-use is rare next to the cost of a lookup). A service bound to 0.0.0.0 on the
/// node's host is reachable through any of them, which the fixed forbidden ranges do not
/// cover. If the list cannot be read, every address counts as the host's own (fail closed).
bool isOwnAddress(const asio::ip::address& addr) {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return true;
  const auto wanted = policy::canonicalAddress(addr);
  bool found = false;
  for (const ifaddrs* ifa = list; ifa != nullptr && !found; ifa = ifa->ifa_next) {
    if (ifa->ifa_addr == nullptr) continue;
    if (ifa->ifa_addr->sa_family == AF_INET) {
      asio::ip::address_v4::bytes_type b{};
      std::memcpy(b.data(), &reinterpret_cast<const sockaddr_in*>(ifa->ifa_addr)->sin_addr,
                  b.size());
      found = wanted == asio::ip::address(asio::ip::address_v4(b));
    } else if (ifa->ifa_addr->sa_family == AF_INET6) {
      asio::ip::address_v6::bytes_type b{};
      std::memcpy(b.data(), &reinterpret_cast<const sockaddr_in6*>(ifa->ifa_addr)->sin6_addr,
                  b.size());
      found = wanted == policy::canonicalAddress(asio::ip::address_v6(b));
    }
  }
  ::freeifaddrs(list);
  return found;
}

/// Where a granted destination may be reached: every address `host` resolves to must be
/// permitted (sam-box's rule, docs/sam-box.md "forbidden-address": a name with one address in
/// forbidden space or on this host is refused outright, since no public name legitimately
/// points there and trying "the other ones" would let a hostile resolver choose). Each is
/// judged as policy::canonicalAddress() reads it (an IPv4-mapped, IPv4-compatible or NAT64
/// address as its IPv4 address) and pinned as the resolver gave it. Returns the addresses to
/// pin the request to; empty with *offending set to the refused address, or with *why set if
/// the name does not resolve.
std::vector<std::string> permittedAddresses(const std::string& host,
                                            const policy::DestinationPolicy& destinations,
                                            std::string* offending, std::string* why) {
  std::vector<std::string> pinned;
  for (const auto& addr : resolveName(host, why)) {
    const bool own = isOwnAddress(addr);
    if (!destinations.permits(addr) || (own && !destinations.allowsExplicitly(addr))) {
      *offending = addr.to_string();
      return {};
    }
    pinned.push_back(addr.to_string());  // resolveName() gives each address once, no zone
  }
  return pinned;
}

const json& member(const json& object, std::string_view key, std::string_view field) {
  auto it = object.find(key);
  if (it == object.end()) throw BadField(std::string(field) + ": missing");
  return *it;
}

// The environment variables the node's secrets and API keys are read from (env://VAR, and
// bare names when COMPASS_SECRET_PROVIDER=env), as the secret store maps them.
std::set<std::string, std::less<>> secretVariables(const Node& node) {
  std::set<std::string, std::less<>> out;
  auto add = [&](std::string_view ref) {
    if (std::string var = node.secrets.variableOf(ref); !var.empty()) out.insert(std::move(var));
  };
  for (const auto& s : node.config.services)
    if (!s.api_key.empty()) add(s.api_key);
  for (const auto& s : node.config.secrets) add(s.ref);
  return out;
}

}  // namespace

struct Operations::Impl {
  explicit Impl(Node& n) : node(n), runners(runnerEnvironment(environ, secretVariables(n))) {}
  Node& node;
  PendingSpawns pending;
  SpawnedRunners runners;

  void denied(const Request& req, ResponseWriter& out, std::string_view op, int status,
              std::string_view reason, const std::string& message) {
    node.metrics.operation(op, "denied");
    refuse(node, req, out, "ops", status, reason, message);
  }

  /// An operation that was allowed but could not be carried out (runner, secret or
  /// destination failed): same body shape as a refusal, type "sam_node_error".
  void failed(const Request& req, ResponseWriter& out, std::string_view op, int status,
              std::string_view reason, const std::string& message, json fields) {
    fields["caller"] = req.agent;
    fields["operation"] = op;
    fields["decision"] = "allowed";
    fields["outcome"] = "error";
    fields["reason"] = reason;
    fields["message"] = message;
    log::error("operation failed", fields);
    node.metrics.operation(op, "error");
    node.metrics.request("ops", "error");
    sendProblem(out, status, "sam_node_error", reason, message);
  }

  void spawn(const Request& req, ResponseWriter& out, const json& body) {
    const json& tmpl_value = member(body, "template", "template");
    if (!tmpl_value.is_string()) throw BadField("template: must be a string");
    std::string name = tmpl_value.get<std::string>();
    if (!node.grants.maySpawn(req.agent, name)) {
      log::warn("spawn refused",
                {{"caller", req.agent}, {"template", name}, {"decision", "denied"}});
      denied(req, out, "spawn", 403, "spawn-not-granted",
             "agent " + req.agent + " may not spawn template \"" + name + "\"");
      return;
    }
    std::string busy;
    std::optional<PendingSpawns::Slot> slot = pending.tryAcquire(req.agent, &busy);
    if (!slot) {
      log::warn("spawn refused",
                {{"caller", req.agent}, {"template", name}, {"decision", "denied"}});
      denied(req, out, "spawn", 429, "spawn-busy", busy + "; try again once one has answered");
      return;
    }
    const SpawnTemplate& tmpl = *node.config.spawnTemplate(name);
    std::vector<std::string> argv = {node.config.runner, "run",       "--backend", tmpl.backend,
                                     "--bundle",         tmpl.bundle, "--"};
    argv.insert(argv.end(), tmpl.command.begin(), tmpl.command.end());
    SpawnOutcome outcome = runners.start(argv, name, req.agent);
    switch (outcome.kind) {
      case SpawnOutcome::kRunning:
        log::info("spawn", {{"caller", req.agent},
                            {"template", name},
                            {"decision", "allowed"},
                            {"agent_id", outcome.id},
                            {"pid", outcome.pid}});
        node.metrics.operation("spawn", "allowed");
        node.metrics.request("ops", "allowed");
        sendJson(out, 200, json{{"id", outcome.id}, {"template", name}}.dump());
        return;
      case SpawnOutcome::kCannotStart:
        failed(req, out, "spawn", 502, "spawn-failed",
               "cannot start the runner " + node.config.runner + ": " + outcome.detail,
               {{"template", name}});
        return;
      case SpawnOutcome::kExited:
        failed(req, out, "spawn", 502, "spawn-failed",
               "the runner exited before the agent ran: " + outcome.detail, {{"template", name}});
        return;
      case SpawnOutcome::kTimeout:
        failed(req, out, "spawn", 504, "spawn-timeout",
               "the runner did not report the agent running within 60 s; it was stopped",
               {{"template", name}});
        return;
    }
  }

  void secretUse(const Request& req, ResponseWriter& out, const json& body) {
    const json& secret_value = member(body, "secret", "secret");
    if (!secret_value.is_string()) throw BadField("secret: must be a string");
    std::string secret = secret_value.get<std::string>();
    const json& request = member(body, "request", "request");
    if (!request.is_object()) throw BadField("request: must be an object");

    UpstreamRequest up;
    if (auto m = request.find("method"); m != request.end()) {
      if (!m->is_string() || !proto::isToken(m->get<std::string>())) {
        throw BadField("request.method: must be an HTTP method token (RFC 9110)");
      }
      up.method = m->get<std::string>();
    }
    const json& url = member(request, "url", "request.url");
    if (!url.is_string()) throw BadField("request.url: must be a string");
    Destination dest = parseDestination(url.get<std::string>());
    up.url = dest.url;

    // Only the agent's own input is checked before the grant: nothing refused here may depend
    // on the secret's declaration, or an agent without the grant learns which secrets exist.
    if (auto h = request.find("headers"); h != request.end() && !h->is_null()) {
      if (!h->is_object()) throw BadField("request.headers: must be an object of strings");
      for (const auto& [key, value] : h->items()) {
        std::string field = "request.headers[\"" + key + "\"]";
        if (!proto::isToken(key)) throw BadField(field + ": not a valid field name");
        if (!value.is_string()) throw BadField(field + ": must be a string");
        std::string text = value.get<std::string>();
        if (hasLineBreakOrNul(text)) throw BadField(field + ": contains CR, LF or NUL");
        std::string name = lower(key);
        if (std::find(kReservedHeaders.begin(), kReservedHeaders.end(), name) !=
            kReservedHeaders.end()) {
          throw BadField(field + ": set by the node, not by the agent");
        }
        up.headers.emplace_back(key, std::move(text));
      }
    }
    if (auto b = request.find("body"); b != request.end() && !b->is_null()) {
      if (!b->is_string()) throw BadField("request.body: must be a string");
      up.body = b->get<std::string>();
    }

    json log_fields = {{"caller", req.agent},
                       {"secret", secret},
                       {"destination", dest.host + ":" + std::to_string(dest.port)},
                       {"method", up.method}};
    const SecretDecl* decl = node.config.secret(secret);
    if (decl == nullptr || !node.grants.mayUseSecret(req.agent, secret, dest.host, dest.port)) {
      log_fields["decision"] = "denied";
      log::warn("secret-use refused", log_fields);
      denied(req, out, "secret-use", 403, "secret-not-granted",
             "agent " + req.agent + " may not use secret \"" + secret + "\" with " + dest.host +
                 ":" + std::to_string(dest.port));
      return;
    }
    for (const auto& [key, unused] : up.headers) {
      if (lower(key) == lower(decl->header)) {
        throw BadField("request.headers[\"" + key +
                       "\"]: this is the field the node fills with the secret");
      }
    }
    if (!dest.https && !decl->allow_http) {
      // Over http the secret crosses the network in clear text, readable by anyone on the
      // path or answering for the name; the operator opts in per secret (allow_http).
      log_fields["decision"] = "denied";
      log::warn("secret-use refused", log_fields);
      denied(req, out, "secret-use", 403, "secret-requires-https",
             "secret \"" + secret + "\" is only sent over https:// (its declaration does not " +
                 "set allow_http)");
      return;
    }

    // The name is resolved here, once, and the request pinned to what was judged: libcurl
    // resolving it again could get another answer (DNS rebinding). Before the secret is read,
    // so a refused destination never causes a secret read.
    std::string offending, why;
    up.pinned_addresses = permittedAddresses(dest.host, node.config.destinations, &offending, &why);
    if (!offending.empty()) {
      log_fields["decision"] = "denied";
      log_fields["address"] = offending;
      log_fields["reason"] = "forbidden-address";
      log::warn("secret-use refused", log_fields);
      denied(req, out, "secret-use", 403, "forbidden-address",
             "secret \"" + secret + "\" was not sent: " + dest.host +
                 " resolves to an address secret-use may not reach (loopback, link-local, " +
                 "multicast or this host's own; allow_destinations in the node's config lifts " +
                 "this for a prefix)");
      return;
    }
    if (up.pinned_addresses.empty()) {
      failed(req, out, "secret-use", 502, "destination-failed",
             "the request to " + dest.host + ":" + std::to_string(dest.port) +
                 " failed: cannot resolve " + dest.host + ": " + why,
             log_fields);
      return;
    }
    log_fields["addresses"] = up.pinned_addresses;

    std::string value;
    try {
      value = node.secrets.read(decl->ref);
    } catch (const SecretError& e) {
      failed(req, out, "secret-use", 500, "secret-unavailable",
             "secret \"" + secret + "\" cannot be read (see the node's log)",
             {{"secret", secret}, {"error", e.what()}});
      return;
    }
    if (hasLineBreakOrNul(value)) {
      failed(req, out, "secret-use", 500, "secret-unavailable",
             "secret \"" + secret + "\" contains a line break and cannot go in a header field",
             {{"secret", secret}});
      return;
    }
    std::string header_value = decl->format;
    replaceAll(header_value, "{}", value);
    up.headers.emplace_back(decl->header, header_value);
    up.total_timeout = kSecretUseTimeout;

    UpstreamResponse response;
    try {
      response = fetch(up, kMaxSecretUseBody);
    } catch (const UpstreamError& e) {
      std::string why = e.what();
      replaceAll(why, value, kRedacted);
      failed(req, out, "secret-use", 502, "destination-failed",
             "the request to " + dest.host + ":" + std::to_string(dest.port) + " failed: " + why,
             log_fields);
      return;
    }
    json headers = json::object();
    for (auto [name, field_value] : response.headers) {
      replaceAll(name, value, kRedacted);
      replaceAll(field_value, value, kRedacted);
      std::string key = lower(name);
      if (headers.contains(key)) {
        headers[key] = headers[key].get<std::string>() + ", " + field_value;
      } else {
        headers[key] = field_value;
      }
    }
    replaceAll(response.body, value, kRedacted);
    log_fields["decision"] = "allowed";
    log_fields["status"] = response.status;
    log::info("secret-use", log_fields);
    node.metrics.operation("secret-use", "allowed");
    node.metrics.request("ops", "allowed");
    json reply = {{"status", response.status}, {"headers", headers}, {"body", response.body}};
    // A body that is not UTF-8 comes back with U+FFFD in place of bad bytes: secret-use is
    // for API calls, whose bodies are text.
    sendJson(out, 200, reply.dump(-1, ' ', false, json::error_handler_t::replace));
  }

  void serve(const Request& req, ResponseWriter& out) {
    std::string_view op;
    if (req.path == "/ops/spawn") {
      op = "spawn";
    } else if (req.path == "/ops/secret-use") {
      op = "secret-use";
    } else {
      refuse(node, req, out, "ops", 404, "unknown-operation",
             "no operation at " + req.path + " (there are /ops/spawn and /ops/secret-use)");
      return;
    }
    if (req.agent.empty()) {
      denied(req, out, op, 401, "missing-agent-identity",
             "X-Sam-Agent is missing: requests reach sam-node through sam-box");
      return;
    }
    if (req.method != "POST") {
      denied(req, out, op, 405, "method-not-allowed", std::string(op) + " takes POST");
      return;
    }
    UntrustedJson parsed = parseUntrustedJson(req.body);
    const json& body = parsed.value;
    try {
      if (!parsed.ok()) throw BadField("body: " + parsed.why);
      if (!body.is_object()) throw BadField("body: must be a JSON object");
      if (op == "spawn") {
        spawn(req, out, body);
      } else {
        secretUse(req, out, body);
      }
    } catch (const BadField& e) {
      denied(req, out, op, 400, "bad-operation-request", e.what());
    }
  }
};

Operations::Operations(Node& node) : impl_(std::make_unique<Impl>(node)) {}
Operations::~Operations() = default;
void Operations::serve(const Request& req, ResponseWriter& out) { impl_->serve(req, out); }

}  // namespace samnode
