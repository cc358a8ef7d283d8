#pragma once
// The egress allowlist: which names (and optionally which ports) an agent may reach.
// Seed 003 "Identity": "Wildcard egress entries match subdomains only: *.pypi.org matches
// files.pypi.org, but not pypi.org and not evilpypi.org. Matching uses the name that the
// agent asked for, never a resolved address."

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace policy {

/// Thrown by parseAllowRule() for an entry that is not a valid rule; what() is the reason.
class AllowRuleError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

/// One allowlist entry: "name", "*.name", "name:port" or "*.name:port".
struct AllowRule {
  bool wildcard = false;         ///< "*.x": matches subdomains of x at any depth, never x
  std::string name;              ///< normalized (see normalizeName()); without the "*."
  std::optional<uint16_t> port;  ///< set: only this port; unset: any port
  /// The rule as an operator would write it, normalized ("*.pypi.org:443").
  [[nodiscard]] std::string text() const;
};

/// Parses one entry. Refuses (throws AllowRuleError naming the reason): empty entries,
/// IP literals and CIDRs (the allowlist holds names only), "*" alone, a '*' anywhere but a
/// leading "*." label, invalid names (normalizeName()), ports outside 1..65535.
AllowRule parseAllowRule(std::string_view entry);

/// An ordered, de-duplicated set of rules. Empty = pure default-deny.
class Allowlist {
 public:
  /// Adds a rule (a duplicate is ignored).
  void add(AllowRule rule);
  /// True if some rule matches. `name` must already be normalized; an IP literal never
  /// matches. Cost is linear in the number of rules.
  [[nodiscard]] bool allows(std::string_view name, uint16_t port) const;
  [[nodiscard]] const std::vector<AllowRule>& rules() const { return rules_; }
  [[nodiscard]] bool empty() const { return rules_.empty(); }

 private:
  std::vector<AllowRule> rules_;
};

}  // namespace policy
