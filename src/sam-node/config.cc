#include "sam-node/config.h"
#include "proto/http_syntax.h"

#include <curl/curl.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <utility>

#include "common/read_file.h"
#include "policy/name.h"

namespace samnode {
namespace {

// Values quoted back in errors are cut here: an error line is no place to replay a file.
constexpr size_t kMaxQuoted = 64;

std::string quote(std::string_view text) {
  std::string out = "\"";
  for (size_t i = 0; i < text.size() && i < kMaxQuoted; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    out.push_back(c >= 0x20 && c < 0x7f && c != '"' ? static_cast<char>(c) : '?');
  }
  if (text.size() > kMaxQuoted) out += "...";
  return out + "\"";
}

[[noreturn]] void fail(const std::string& field, const std::string& reason) {
  throw ConfigError(field, reason);
}

// The node a field path ("services[1].target_url") names in `root`, or the deepest node of
// the path that is there (the mapping a required key is missing from); `root` for "config".
YAML::Node nodeAt(const YAML::Node& root, std::string_view path) {
  YAML::Node node = root;
  size_t i = 0;
  while (i < path.size()) {
    YAML::Node next;
    if (path[i] == '[') {
      const size_t close = path.find(']', i);
      if (close == std::string_view::npos || !node.IsSequence()) break;
      size_t index = 0;
      const auto digits = path.substr(i + 1, close - i - 1);
      if (std::from_chars(digits.data(), digits.data() + digits.size(), index).ec != std::errc{} ||
          index >= node.size()) {
        break;
      }
      next = std::as_const(node)[index];
      i = close + 1;
    } else {
      if (path[i] == '.') ++i;
      const size_t end = path.find_first_of(".[", i);
      const std::string key(
          path.substr(i, end == std::string_view::npos ? path.size() - i : end - i));
      // Looked up through a const node: a non-const operator[] may add the key it is asked for.
      if (!node.IsMap() || !std::as_const(node)[key]) break;
      next = std::as_const(node)[key];
      i = end == std::string_view::npos ? path.size() : end;
    }
    node.reset(next);
  }
  return node;
}

// Refuses keys outside `allowed` and duplicate keys (yaml-cpp keeps both pairs of a
// duplicated key in the map; silently using one would hide an operator's mistake).
void checkKeys(const YAML::Node& map, const std::string& field,
               std::initializer_list<std::string_view> allowed) {
  if (!map.IsMap()) fail(field.empty() ? "config" : field, "must be a mapping");
  std::set<std::string> seen;
  for (const auto& kv : map) {
    if (!kv.first.IsScalar()) fail(field.empty() ? "config" : field, "keys must be strings");
    const std::string key = kv.first.Scalar();
    const std::string path = field.empty() ? key : field + "." + key;
    bool known = false;
    for (auto a : allowed) known = known || a == key;
    if (!known) fail(path, "unknown key");
    if (!seen.insert(key).second) fail(path, "duplicate key");
  }
}

std::string scalar(const YAML::Node& node, const std::string& field) {
  if (!node.IsScalar()) fail(field, "must be a string");
  return node.Scalar();
}

// Only the two YAML 1.2 core spellings: yaml-cpp would also take "yes", "on", "y"..., and a
// security switch should read the same to every reader of the file.
bool boolean(const YAML::Node& node, const std::string& field) {
  if (node.IsScalar() && node.Tag() != "!" && (node.Scalar() == "true" || node.Scalar() == "false"))
    return node.Scalar() == "true";
  fail(field, "must be true or false");
}

std::string requiredString(const YAML::Node& map, const char* key, const std::string& field) {
  const YAML::Node node = map[key];
  if (!node) fail(field + "." + key, "is required");
  std::string value = scalar(node, field + "." + key);
  if (value.empty()) fail(field + "." + key, "must not be empty");
  return value;
}

std::vector<std::string> stringList(const YAML::Node& node, const std::string& field) {
  std::vector<std::string> out;
  if (!node || node.IsNull()) return out;
  if (!node.IsSequence()) fail(field, "must be a sequence");
  for (size_t i = 0; i < node.size(); ++i) {
    std::string value = scalar(node[i], field + "[" + std::to_string(i) + "]");
    if (value.empty()) fail(field + "[" + std::to_string(i) + "]", "must not be empty");
    out.push_back(std::move(value));
  }
  return out;
}

const YAML::Node sequence(const YAML::Node& root, const char* key) {
  const YAML::Node node = root[key];
  if (node && !node.IsNull() && !node.IsSequence()) fail(key, "must be a sequence");
  return node;
}

// Names of services, secrets, spawn templates and roles: one RFC 1123 label, so they read
// the same in URLs (/a2a/<name>), tool names (<service>/<tool>) and logs.
std::string label(const YAML::Node& map, const std::string& field) {
  std::string name = requiredString(map, "name", field);
  std::string reason;
  auto normalized = policy::normalizeName(name, &reason);
  if (!normalized || normalized->find('.') != std::string::npos || *normalized != name)
    fail(field + ".name", quote(name) + " is not a lower-case RFC 1123 label");
  return name;
}

// http(s)://host[:port][/path] through libcurl's own URL parser (the one that later uses
// it), refusing user info, queries and fragments a base URL has no use for.
std::string targetUrl(const std::string& raw, const std::string& field) {
  const std::string reason = "must be an http:// or https:// URL with a host, got " + quote(raw);
  std::unique_ptr<CURLU, decltype(&curl_url_cleanup)> url(curl_url(), curl_url_cleanup);
  if (!url) fail(field, reason);
  if (const CURLUcode rc = curl_url_set(url.get(), CURLUPART_URL, raw.c_str(), 0);
      rc != CURLUE_OK) {
    fail(field, rc == CURLUE_BAD_PORT_NUMBER ? "port is not a number in 1..65535, got " + quote(raw)
                                             : reason);
  }
  auto part = [&](CURLUPart which) -> std::optional<std::string> {
    char* value = nullptr;
    if (curl_url_get(url.get(), which, &value, 0) != CURLUE_OK || value == nullptr)
      return std::nullopt;
    std::string out(value);
    curl_free(value);
    return out;
  };
  const auto scheme = part(CURLUPART_SCHEME);
  if (!scheme || (*scheme != "http" && *scheme != "https")) fail(field, reason);
  const auto host = part(CURLUPART_HOST);
  if (!host || host->empty()) fail(field, reason);
  if (part(CURLUPART_USER) || part(CURLUPART_QUERY) || part(CURLUPART_FRAGMENT))
    fail(field, "must not carry user info, a query or a fragment, got " + quote(raw));
  // No "http:host" shorthand, and no "http:///v1": libcurl reads a third slash as nothing and
  // takes the path for the host.
  if (raw.rfind(*scheme + "://", 0) != 0 || raw.compare(scheme->size() + 3, 1, "/") == 0)
    fail(field, reason);
  std::string out = raw;
  while (out.size() > scheme->size() + 3 && out.back() == '/') out.pop_back();
  return out;
}

Service parseService(const YAML::Node& node, const std::string& field) {
  checkKeys(node, field, {"name", "type", "target_url", "api_key"});
  Service s;
  s.name = label(node, field);
  const std::string type = requiredString(node, "type", field);
  if (type == "openai") {
    s.type = ServiceType::kOpenai;
  } else if (type == "mcp") {
    s.type = ServiceType::kMcp;
  } else if (type == "a2a") {
    s.type = ServiceType::kA2a;
  } else {
    fail(field + ".type", "must be openai, mcp or a2a, got " + quote(type));
  }
  s.target_url = targetUrl(requiredString(node, "target_url", field), field + ".target_url");
  if (node["api_key"]) {
    if (s.type != ServiceType::kOpenai) fail(field + ".api_key", "only an openai service has one");
    s.api_key = requiredString(node, "api_key", field);
  }
  return s;
}

SecretDecl parseSecret(const YAML::Node& node, const std::string& field) {
  checkKeys(node, field, {"name", "ref", "header", "format", "allow_http"});
  SecretDecl s;
  s.name = label(node, field);
  s.ref = requiredString(node, "ref", field);
  if (node["header"]) {
    s.header = requiredString(node, "header", field);
    if (!proto::isToken(s.header))
      fail(field + ".header", quote(s.header) + " is not a field name");
  }
  if (node["format"]) {
    s.format = requiredString(node, "format", field);
    const auto at = s.format.find("{}");
    if (at == std::string::npos || s.format.find("{}", at + 2) != std::string::npos)
      fail(field + ".format", "must contain \"{}\" exactly once");
    for (char c : s.format)
      if (c == '\r' || c == '\n' || c == '\0') fail(field + ".format", "must be one line");
  }
  if (node["allow_http"]) s.allow_http = boolean(node["allow_http"], field + ".allow_http");
  return s;
}

SpawnTemplate parseSpawn(const YAML::Node& node, const std::string& field) {
  checkKeys(node, field, {"name", "bundle", "backend", "command"});
  SpawnTemplate t;
  t.name = label(node, field);
  t.bundle = requiredString(node, "bundle", field);
  if (t.bundle.front() != '/') fail(field + ".bundle", "must be an absolute path");
  t.backend = requiredString(node, "backend", field);
  // compass-runner's Linux tiers (seed 002 SelectBackend); apple-container needs macOS.
  if (t.backend != "podman" && t.backend != "microvm" && t.backend != "host") {
    fail(field + ".backend", "must be podman, microvm or host, got " + quote(t.backend));
  }
  if (!node["command"]) fail(field + ".command", "is required");
  t.command = stringList(node["command"], field + ".command");
  if (t.command.empty()) fail(field + ".command", "must not be empty");
  return t;
}

AgentPattern parseAgentPattern(const std::string& raw, const std::string& field) {
  AgentPattern p;
  std::string_view name = raw;
  if (name.starts_with("*.")) {
    p.wildcard = true;
    name.remove_prefix(2);
  }
  std::string reason;
  auto normalized = policy::normalizeName(name, &reason);
  if (!normalized || name.find('*') != std::string_view::npos)
    fail(field, quote(raw) + " is not an agent id or \"*.<namespace>\"" +
                    (reason.empty() ? "" : " (" + reason + ")"));
  p.name = *normalized;
  return p;
}

Role parseRole(const YAML::Node& node, const std::string& field, const Config& config) {
  checkKeys(node, field, {"name", "allowed_agents", "services", "tools", "spawn", "secrets"});
  Role r;
  r.name = label(node, field);
  const auto agents = stringList(node["allowed_agents"], field + ".allowed_agents");
  if (agents.empty()) {
    fail(field + ".allowed_agents",
         "must name at least one agent id or \"*.<namespace>\" (a role without one grants "
         "nothing)");
  }
  for (size_t i = 0; i < agents.size(); ++i)
    r.allowed_agents.push_back(
        parseAgentPattern(agents[i], field + ".allowed_agents[" + std::to_string(i) + "]"));
  r.services = stringList(node["services"], field + ".services");
  for (size_t i = 0; i < r.services.size(); ++i)
    if (config.service(r.services[i]) == nullptr)
      fail(field + ".services[" + std::to_string(i) + "]",
           "no service named " + quote(r.services[i]));
  const auto tools = stringList(node["tools"], field + ".tools");
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string f = field + ".tools[" + std::to_string(i) + "]";
    const auto slash = tools[i].find('/');
    if (slash == std::string::npos || slash == 0 || slash + 1 == tools[i].size())
      fail(f, quote(tools[i]) + " is not \"<service>/<tool>\" or \"<service>/*\"");
    ToolGrant g{tools[i].substr(0, slash), tools[i].substr(slash + 1)};
    const Service* s = config.service(g.service);
    if (s == nullptr) fail(f, "no service named " + quote(g.service));
    if (s->type != ServiceType::kMcp) fail(f, quote(g.service) + " is not an mcp service");
    // A tool is named exactly, or "*" for all of the service's: "read*" would grant only a
    // tool literally called "read*", never what it appears to.
    if (g.tool != "*" && g.tool.find_first_of("* \t") != std::string::npos) {
      fail(f, quote(tools[i]) + ": a tool is one exact name or \"*\" (no patterns, no spaces)");
    }
    // A tool is usable only with its service (Grants::mayUseTool); a role that grants the
    // tool but not the service would grant nothing to an agent that has no other role.
    if (std::find(r.services.begin(), r.services.end(), g.service) == r.services.end()) {
      fail(f, quote(g.service) +
                  " is not in this role's services (a tool grant needs its "
                  "service granted in the same role)");
    }
    r.tools.push_back(std::move(g));
  }
  r.spawn = stringList(node["spawn"], field + ".spawn");
  for (size_t i = 0; i < r.spawn.size(); ++i)
    if (config.spawnTemplate(r.spawn[i]) == nullptr)
      fail(field + ".spawn[" + std::to_string(i) + "]",
           "no spawn template named " + quote(r.spawn[i]));
  const YAML::Node secrets = node["secrets"];
  if (secrets && !secrets.IsNull()) {
    if (!secrets.IsSequence()) fail(field + ".secrets", "must be a sequence");
    for (size_t i = 0; i < secrets.size(); ++i) {
      const std::string f = field + ".secrets[" + std::to_string(i) + "]";
      checkKeys(secrets[i], f, {"name", "destinations"});
      SecretGrant g;
      g.name = requiredString(secrets[i], "name", f);
      if (config.secret(g.name) == nullptr) fail(f + ".name", "no secret named " + quote(g.name));
      const auto dests = stringList(secrets[i]["destinations"], f + ".destinations");
      if (dests.empty()) fail(f + ".destinations", "must name at least one destination");
      for (size_t j = 0; j < dests.size(); ++j) {
        try {
          g.destinations.add(policy::parseAllowRule(dests[j]));
        } catch (const policy::AllowRuleError& e) {
          fail(f + ".destinations[" + std::to_string(j) + "]", quote(dests[j]) + ": " + e.what());
        }
      }
      r.secrets.push_back(std::move(g));
    }
  }
  return r;
}

template <typename T>
void checkUnique(const std::vector<T>& items, const char* field) {
  std::set<std::string> seen;
  for (size_t i = 0; i < items.size(); ++i)
    if (!seen.insert(items[i].name).second)
      fail(std::string(field) + "[" + std::to_string(i) + "].name",
           "duplicate name " + quote(items[i].name));
}

Config parseRoot(const YAML::Node& root) {
  if (!root.IsMap()) fail("config", "must be a YAML mapping");
  checkKeys(root, "",
            {"version", "services", "secrets", "spawn", "runner", "probe_interval_ms",
             "upstream_idle_timeout_ms", "allow_destinations", "roles"});
  if (!root["version"]) fail("version", "is required (v1)");
  const std::string version = scalar(root["version"], "version");
  if (version != "v1") fail("version", "must be v1, got " + quote(version));

  Config config;
  const YAML::Node services = sequence(root, "services");
  for (size_t i = 0; services && i < services.size(); ++i)
    config.services.push_back(parseService(services[i], "services[" + std::to_string(i) + "]"));
  checkUnique(config.services, "services");
  const YAML::Node secrets = sequence(root, "secrets");
  for (size_t i = 0; secrets && i < secrets.size(); ++i)
    config.secrets.push_back(parseSecret(secrets[i], "secrets[" + std::to_string(i) + "]"));
  checkUnique(config.secrets, "secrets");
  const YAML::Node spawn = sequence(root, "spawn");
  for (size_t i = 0; spawn && i < spawn.size(); ++i)
    config.spawn.push_back(parseSpawn(spawn[i], "spawn[" + std::to_string(i) + "]"));
  checkUnique(config.spawn, "spawn");
  if (root["runner"]) {
    config.runner = scalar(root["runner"], "runner");
    if (config.runner.empty()) fail("runner", "must not be empty");
  }
  if (root["probe_interval_ms"]) {
    const std::string text = scalar(root["probe_interval_ms"], "probe_interval_ms");
    long value = 0;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (ec != std::errc() || end != text.data() + text.size() || value < 100 || value > 60000)
      fail("probe_interval_ms", "must be an integer from 100 to 60000, got " + quote(text));
    config.probe_interval = std::chrono::milliseconds(value);
  }
  if (root["upstream_idle_timeout_ms"]) {
    const std::string text = scalar(root["upstream_idle_timeout_ms"], "upstream_idle_timeout_ms");
    long value = 0;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (ec != std::errc() || end != text.data() + text.size() || value < 1000 || value > 3600000) {
      fail("upstream_idle_timeout_ms",
           "must be an integer from 1000 to 3600000, got " + quote(text));
    }
    config.upstream_idle_timeout = std::chrono::milliseconds(value);
  }
  const auto prefixes = stringList(root["allow_destinations"], "allow_destinations");
  for (size_t i = 0; i < prefixes.size(); ++i) {
    try {
      config.destinations.allow(policy::Cidr::parse(prefixes[i]));
    } catch (const policy::CidrError& e) {
      fail("allow_destinations[" + std::to_string(i) + "]", quote(prefixes[i]) + ": " + e.what());
    }
  }
  const YAML::Node roles = sequence(root, "roles");
  for (size_t i = 0; roles && i < roles.size(); ++i)
    config.roles.push_back(parseRole(roles[i], "roles[" + std::to_string(i) + "]", config));
  checkUnique(config.roles, "roles");
  return config;
}

}  // namespace

std::string_view serviceTypeName(ServiceType type) {
  switch (type) {
    case ServiceType::kOpenai:
      return "openai";
    case ServiceType::kMcp:
      return "mcp";
    case ServiceType::kA2a:
      return "a2a";
  }
  return "unknown";
}

const Service* Config::service(std::string_view name) const {
  for (const auto& s : services)
    if (s.name == name) return &s;
  return nullptr;
}

const SecretDecl* Config::secret(std::string_view name) const {
  for (const auto& s : secrets)
    if (s.name == name) return &s;
  return nullptr;
}

const SpawnTemplate* Config::spawnTemplate(std::string_view name) const {
  for (const auto& t : spawn)
    if (t.name == name) return &t;
  return nullptr;
}

Config parseConfig(std::string_view yaml) {
  YAML::Node root;
  try {
    root = YAML::Load(std::string(yaml));
  } catch (const YAML::Exception& e) {
    throw ConfigError("config: not valid YAML (line " + std::to_string(e.mark.line + 1) +
                      "): " + e.msg);
  }
  try {
    return parseRoot(root);
  } catch (const ConfigError& e) {
    if (e.field().empty() || e.field() == "config") throw;
    const YAML::Mark mark = nodeAt(root, e.field()).Mark();
    if (mark.is_null()) throw;
    throw ConfigError(std::string(e.what()) + " (line " + std::to_string(mark.line + 1) +
                      ", column " + std::to_string(mark.column + 1) + ")");
  } catch (const YAML::Exception& e) {
    // Accessors on a node of the wrong kind; our checks should have caught it first.
    throw ConfigError("config: " + std::string(e.what()));
  }
}

Config loadConfig(const std::string& path) {
  std::string why;
  const auto text = common::readRegularFile(path, kMaxConfigBytes, &why);
  if (!text) throw ConfigError("config: cannot read " + path + ": " + why);
  return parseConfig(*text);
}

bool agentMatches(const AgentPattern& pattern, std::string_view agent_id) {
  if (!pattern.wildcard) return agent_id == pattern.name;
  return agent_id.size() > pattern.name.size() + 1 && agent_id.ends_with(pattern.name) &&
         agent_id[agent_id.size() - pattern.name.size() - 1] == '.';
}

}  // namespace samnode
