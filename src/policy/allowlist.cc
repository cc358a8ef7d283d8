#include "policy/allowlist.h"

#include <algorithm>
#include <cctype>
#include <charconv>

#include "policy/name.h"

namespace policy {
namespace {

constexpr std::string_view kWildcardPrefix = "*.";

uint16_t parseRulePort(std::string_view text) {
  if (text.empty()) throw AllowRuleError("empty port");
  if (!std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    throw AllowRuleError("port is not a decimal number");
  }
  if (text.front() == '0') {
    throw AllowRuleError(text.size() == 1 ? "port out of range (1..65535)"
                                          : "port has leading zeros");
  }
  unsigned value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || value > 65535) {
    throw AllowRuleError("port out of range (1..65535)");
  }
  return static_cast<uint16_t>(value);
}

}  // namespace

std::string AllowRule::text() const {
  std::string out = wildcard ? std::string(kWildcardPrefix) + name : name;
  if (port) out += ":" + std::to_string(*port);
  return out;
}

AllowRule parseAllowRule(std::string_view entry) {
  if (entry.empty()) throw AllowRuleError("empty entry");
  // Checked on the whole entry first so that "::1", "[::1]:443" and "10.0.0.0/8" get the
  // reason that tells the operator what the allowlist is for, not a port-syntax complaint.
  if (entry.find("://") != std::string_view::npos) {
    throw AllowRuleError(
        "a URL is not an allowlist entry: give the host name, e.g. "
        "\"api.github.com\" or \"api.github.com:443\"");
  }
  if (const size_t slash = entry.find('/'); slash != std::string_view::npos) {
    const std::string_view after = entry.substr(slash + 1);
    if (!after.empty() &&
        std::all_of(after.begin(), after.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      throw AllowRuleError("CIDR not allowed: the allowlist holds names only");
    }
    throw AllowRuleError(
        "a path is not an allowlist entry: give the host name only, e.g. \"pypi.org\" or "
        "\"pypi.org:443\"");
  }
  // Several colons are an IPv6 literal unless what comes before the first one cannot begin
  // one ("x.test:80:80" is a name with a bad port, and is told so below).
  const std::string_view before_colon = entry.substr(0, entry.find(':'));
  const bool ipv6_like = std::all_of(before_colon.begin(), before_colon.end(), [](char c) {
    return std::isxdigit(static_cast<unsigned char>(c));
  });
  if (entry.front() == '[' || (std::count(entry.begin(), entry.end(), ':') > 1 && ipv6_like) ||
      isIpLiteral(entry)) {
    throw AllowRuleError("IP literal not allowed: the allowlist holds names only");
  }

  AllowRule rule;
  std::string_view host = entry;
  if (const size_t colon = entry.find(':'); colon != std::string_view::npos) {
    host = entry.substr(0, colon);
    rule.port = parseRulePort(entry.substr(colon + 1));
  }
  if (host == "*") throw AllowRuleError("'*' alone would allow every name");
  if (host.starts_with(kWildcardPrefix)) {
    rule.wildcard = true;
    host.remove_prefix(kWildcardPrefix.size());
  }
  if (host.find('*') != std::string_view::npos) {
    throw AllowRuleError("'*' is allowed only as a leading \"*.\" label");
  }
  if (host.empty()) throw AllowRuleError("empty name");
  if (isIpLiteral(host)) {
    throw AllowRuleError("IP literal not allowed: the allowlist holds names only");
  }
  std::string reason;
  auto name = normalizeName(host, &reason);
  if (!name) throw AllowRuleError(reason);
  if (!rule.wildcard && *name == kMeshName) {
    throw AllowRuleError(std::string(kMeshName) +
                         " is the node's name: sam-box carries it to the node whatever the "
                         "allowlist says (route mesh-entrypoint), so it takes no rule");
  }
  rule.name = std::move(*name);
  return rule;
}

void Allowlist::add(AllowRule rule) {
  const bool duplicate = std::any_of(rules_.begin(), rules_.end(), [&](const AllowRule& r) {
    return r.wildcard == rule.wildcard && r.port == rule.port && r.name == rule.name;
  });
  if (!duplicate) rules_.push_back(std::move(rule));
}

bool Allowlist::allows(std::string_view name, uint16_t port) const {
  if (name.empty() || isIpLiteral(name)) return false;
  // A caller that skipped normalization would compare a spelling, not a name; refusing is
  // the only answer that cannot widen the policy.
  if (auto normalized = normalizeName(name); !normalized || *normalized != name) return false;
  return std::any_of(rules_.begin(), rules_.end(), [&](const AllowRule& rule) {
    if (rule.port && *rule.port != port) return false;
    if (!rule.wildcard) return name == rule.name;
    // Subdomains only: the byte before the suffix must be a label boundary, so "*.pypi.org"
    // matches "a.b.pypi.org" but neither "pypi.org" nor "evilpypi.org".
    return name.size() > rule.name.size() + 1 && name.ends_with(rule.name) &&
           name[name.size() - rule.name.size() - 1] == '.';
  });
}

}  // namespace policy
