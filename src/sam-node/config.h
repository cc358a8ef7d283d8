#pragma once
// sam-node's configuration file (docs/sam-node.md, "Configuration"): services declared
// statically (seed 003: "Tools and models are operator workloads declared in a node's
// configuration"), secrets, spawn templates and the roles that grant them. Strict: any
// unknown key, bad value or dangling reference refuses the whole file.

#include "policy/address.h"
#include "policy/allowlist.h"

#include <chrono>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace samnode {

/// A configuration the node refuses; what() is "<field path>: <reason>", then where in the
/// file when parseConfig() can tell, e.g. "services[1].target_url: must be an http:// or
/// https:// URL (line 7, column 17)".
class ConfigError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
  /// `field` is the path of the field at fault ("services[1].target_url"), kept for
  /// parseConfig() to find its place in the file.
  ConfigError(std::string field, const std::string& reason)
      : std::runtime_error(field + ": " + reason), field_(std::move(field)) {}
  [[nodiscard]] const std::string& field() const { return field_; }

 private:
  std::string field_;
};

enum class ServiceType { kOpenai, kMcp, kA2a };
std::string_view serviceTypeName(ServiceType type);  ///< "openai", "mcp", "a2a"

struct Service {
  std::string name;  ///< RFC 1123 label, unique
  ServiceType type = ServiceType::kOpenai;
  std::string target_url;  ///< http(s)://host[:port][/path], no trailing '/'
  std::string api_key;     ///< openai only: a secret reference, empty = none
};

struct SecretDecl {
  std::string name;
  std::string ref;                       ///< file://, env://, keyring:// or a bare name
  std::string header = "Authorization";  ///< a token (RFC 9110 field name)
  std::string format = "Bearer {}";      ///< exactly one "{}"
  /// secret-use may send it over http:// (clear text) to its granted destinations; false:
  /// https:// only. YAML `allow_http: true|false`.
  bool allow_http = false;
};

struct SpawnTemplate {
  std::string name;
  std::string bundle;                ///< absolute path
  std::string backend;               ///< compass-runner --backend
  std::vector<std::string> command;  ///< non-empty
};

/// One grant of a role: pattern "<service>/<tool>" or "<service>/*".
struct ToolGrant {
  std::string service;
  std::string tool;  ///< "*" = every tool of the service
};

struct SecretGrant {
  std::string name;
  policy::Allowlist destinations;
};

/// An allowed_agents entry: an exact agent id, or "*.<namespace>" (subdomains only).
struct AgentPattern {
  bool wildcard = false;
  std::string name;  ///< normalized, without "*."
};

struct Role {
  std::string name;
  std::vector<AgentPattern> allowed_agents;
  std::vector<std::string> services;
  std::vector<ToolGrant> tools;
  std::vector<std::string> spawn;
  std::vector<SecretGrant> secrets;
};

struct Config {
  std::vector<Service> services;
  std::vector<SecretDecl> secrets;
  std::vector<SpawnTemplate> spawn;
  std::vector<Role> roles;
  std::string runner = "compass-runner";
  std::chrono::milliseconds probe_interval{1000};
  /// `upstream_idle_timeout_ms`: how long a proxied /v1 or /a2a exchange may go without a byte
  /// from the upstream (no limit on the whole: a model may stream for an hour). Default 600 s,
  /// the OpenAI SDKs' own request timeout.
  std::chrono::milliseconds upstream_idle_timeout{600000};
  /// `allow_destinations: [CIDR, ...]`: the address prefixes secret-use may reach although
  /// policy::isForbiddenAddress() (loopback, link-local, ...) or the host's own interfaces
  /// would refuse them; same syntax and checks as sam-box's --allow-destination. Empty by
  /// default: a granted name that resolves there is refused (forbidden-address).
  policy::DestinationPolicy destinations;

  [[nodiscard]] const Service* service(std::string_view name) const;
  [[nodiscard]] const SecretDecl* secret(std::string_view name) const;
  [[nodiscard]] const SpawnTemplate* spawnTemplate(std::string_view name) const;
};

/// Parses YAML text. Throws ConfigError.
Config parseConfig(std::string_view yaml);
/// The largest configuration file loadConfig() reads, in bytes.
inline constexpr size_t kMaxConfigBytes = 16 << 20;
/// Reads (a regular file of at most kMaxConfigBytes: a FIFO or device is refused, never
/// waited on) and parses a file. Throws ConfigError ("config: cannot read PATH: reason").
Config loadConfig(const std::string& path);

/// True if `agent_id` (normalized) matches `pattern`: exact equality, or for "*.ns" any name
/// ending in ".ns" with at least one more label (never "ns" itself).
bool agentMatches(const AgentPattern& pattern, std::string_view agent_id);

}  // namespace samnode
