#pragma once
// sam-box's configuration: the flags of `sam-box run` (seed 003, "Running it") turned into a
// checked Config. Every refusal names the flag or bundle field and the reason; nothing falls
// back to a silent default.

#include "policy/address.h"
#include "policy/allowlist.h"
#include "policy/bundle.h"
#include "policy/name.h"
#include "sam-box/limits.h"

#include <chrono>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace sambox {

/// The default of --credential-path: the projected token path of the seed's pod spec.
inline constexpr const char* kDefaultCredentialPath = "/var/run/secrets/tokens/sam-token";
/// The default of --ingress-listen (seed 003, "Agents that serve").
inline constexpr const char* kDefaultIngressListen = "127.0.0.1:7080";
/// The name the sandbox uses to reach the node (seed 003, "What the agent sees").
using policy::kMeshName;
/// The only port served for kMeshName (plain HTTP; the node connection is a Unix socket).
inline constexpr uint16_t kMeshPort = 80;

/// A configuration sam-box refuses to start with; what() names the flag/field and reason.
class ConfigError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// The flags as given on the command line (strings unparsed).
struct Flags {
  std::string socket;
  std::string sidecar_socket;
  std::string bundle;
  std::string credential_issuer;
  std::string credential_audience;
  std::string credential_path = kDefaultCredentialPath;
  std::string credential_ca;
  bool insecure_unverified_bundle = false;
  std::string metrics_addr;
  std::vector<std::string> egress_allow;
  std::string ingress_listen = kDefaultIngressListen;
  std::string agent_ingress_socket;
  std::vector<std::string> allow_destination;
  std::string resolve_cache_ttl =  ///< seconds, as given
      std::to_string(std::chrono::duration_cast<std::chrono::seconds>(kResolveCacheTtl).count());
  std::string log_level = "info";
};

/// A TCP listen address "host:port" / "[v6]:port" with a numeric host.
struct ListenAddress {
  std::string host;
  uint16_t port = 0;
};

/// The checked configuration.
struct Config {
  Flags flags;
  std::optional<policy::Bundle> bundle;  ///< absent: egress-only box, no agent identity
  policy::Allowlist allowlist;           ///< bundle's egress.allow + --egress-allow
  policy::DestinationPolicy destinations;
  std::optional<ListenAddress> metrics;            ///< absent: no metrics listener
  std::optional<ListenAddress> ingress;            ///< set only when the bundle has `serves`
  std::chrono::milliseconds resolve_cache_ttl{0};  ///< how long a name's answer is reused
  /// The TCP relays' idle and half-closed timeouts: limits.h's, set by no flag (tests shorten
  /// them).
  TcpTimeouts tcp_timeouts;

  /// The agent id asserted to the node in X-Sam-Agent; empty when there is no bundle.
  [[nodiscard]] std::string agentId() const { return bundle ? bundle->agent_id : std::string(); }
  /// True if identity must be verified against the platform credential at start-up.
  [[nodiscard]] bool verifyCredential() const {
    return bundle.has_value() && !flags.insecure_unverified_bundle;
  }
};

/// Parses --resolve-cache-ttl: whole seconds, 0 to kMaxResolveCacheTtl. Throws ConfigError.
std::chrono::milliseconds parseResolveCacheTtl(const std::string& text);

/// Parses "127.0.0.1:9600" or "[::1]:9600". Throws ConfigError naming `flag`.
ListenAddress parseListenAddress(const std::string& flag, const std::string& text);

/// Checks the flag combination and loads the bundle. Throws ConfigError (or a message
/// carrying policy::BundleError's field) on: missing --socket; a bundle that does not parse;
/// a bundle without --insecure-unverified-bundle and without --credential-issuer/-audience;
/// a bundle to verify without agent.external_id; --insecure-unverified-bundle combined with
/// credential flags or given without --bundle; credential flags without --bundle; a bundle
/// with `serves` and no --agent-ingress-socket, or --agent-ingress-socket without `serves`;
/// a bad --egress-allow entry, --allow-destination CIDR, --metrics-addr, --ingress-listen or
/// --resolve-cache-ttl (whole seconds, 0..kMaxResolveCacheTtl).
Config buildConfig(const Flags& flags);

}  // namespace sambox
