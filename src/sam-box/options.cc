#include "sam-box/options.h"

#include "policy/name.h"

#include <asio/ip/address.hpp>

#include <charconv>

namespace sambox {

ListenAddress parseListenAddress(const std::string& flag, const std::string& text) {
  if (text.find(':') == std::string::npos) {
    throw ConfigError(flag + " \"" + text + "\": expected HOST:PORT, e.g. 127.0.0.1:9600");
  }
  std::string reason;
  const auto authority = policy::parseAuthority(text, &reason);
  if (!authority) throw ConfigError(flag + " \"" + text + "\": " + reason);
  asio::error_code ec;
  asio::ip::make_address(authority->host, ec);
  if (ec) throw ConfigError(flag + " \"" + text + "\": host must be a numeric IP address");
  return {authority->host, authority->port};
}

std::chrono::milliseconds parseResolveCacheTtl(const std::string& text) {
  unsigned value = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  const auto max = std::chrono::duration_cast<std::chrono::seconds>(kMaxResolveCacheTtl).count();
  if (text.empty() || ec != std::errc() || ptr != end || value > static_cast<unsigned>(max)) {
    throw ConfigError("--resolve-cache-ttl \"" + text + "\": want whole seconds from 0 (off) to " +
                      std::to_string(max));
  }
  return std::chrono::seconds(value);
}

Config buildConfig(const Flags& flags) {
  Config cfg;
  cfg.flags = flags;
  if (flags.socket.empty()) throw ConfigError("--socket is required: the tunnel socket path");
  const bool credential_flags =
      !flags.credential_issuer.empty() || !flags.credential_audience.empty();
  if (flags.bundle.empty()) {
    if (flags.insecure_unverified_bundle) {
      throw ConfigError("--insecure-unverified-bundle needs --bundle: there is no bundle to trust");
    }
    if (credential_flags) {
      throw ConfigError(
          "--credential-issuer/--credential-audience need --bundle: without a "
          "bundle there is no agent identity to verify");
    }
  } else {
    try {
      cfg.bundle = policy::loadBundle(flags.bundle);
    } catch (const policy::BundleError& e) {
      throw ConfigError("--bundle " + flags.bundle + ": " + e.what());
    }
    if (flags.insecure_unverified_bundle && credential_flags) {
      throw ConfigError(
          "--insecure-unverified-bundle cannot be combined with "
          "--credential-issuer/--credential-audience: choose one");
    }
    if (!flags.insecure_unverified_bundle) {
      if (flags.credential_issuer.empty()) {
        throw ConfigError(
            "--credential-issuer is required to verify the bundle (or pass "
            "--insecure-unverified-bundle on a machine without a platform issuer)");
      }
      if (flags.credential_audience.empty()) {
        throw ConfigError("--credential-audience is required to verify the bundle");
      }
      if (flags.credential_issuer.rfind("https://", 0) != 0) {
        throw ConfigError("--credential-issuer must be an https:// URL");
      }
      if (cfg.bundle->external_id.empty()) {
        throw ConfigError("--bundle " + flags.bundle +
                          ": agent.external_id: required to match the credential's subject");
      }
    }
  }

  if (cfg.bundle) {
    for (const auto& rule : cfg.bundle->egress_allow) cfg.allowlist.add(rule);
  }
  for (const auto& entry : flags.egress_allow) {
    try {
      cfg.allowlist.add(policy::parseAllowRule(entry));
    } catch (const policy::AllowRuleError& e) {
      throw ConfigError("--egress-allow \"" + entry + "\": " + e.what());
    }
  }
  for (const auto& text : flags.allow_destination) {
    try {
      cfg.destinations.allow(policy::Cidr::parse(text));
    } catch (const policy::CidrError& e) {
      throw ConfigError("--allow-destination \"" + text + "\": " + e.what());
    }
  }

  const bool serves = cfg.bundle && cfg.bundle->serves.has_value();
  if (serves && flags.agent_ingress_socket.empty()) {
    throw ConfigError("--agent-ingress-socket is required: the bundle has `serves` (" +
                      cfg.bundle->serves->name +
                      ") and requests can reach the agent only through that socket");
  }
  if (!serves && !flags.agent_ingress_socket.empty()) {
    throw ConfigError("--agent-ingress-socket given but the bundle has no `serves`");
  }
  if (serves) cfg.ingress = parseListenAddress("--ingress-listen", flags.ingress_listen);
  if (!flags.metrics_addr.empty()) {
    cfg.metrics = parseListenAddress("--metrics-addr", flags.metrics_addr);
  }
  cfg.resolve_cache_ttl = parseResolveCacheTtl(flags.resolve_cache_ttl);
  return cfg;
}

}  // namespace sambox
