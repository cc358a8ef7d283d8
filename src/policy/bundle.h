#pragma once
// The agent bundle that the platform writes outside the sandbox (seed 003, "Identity is
// asserted about the agent, not by the agent"):
//
//   version: v1
//   agent:
//     id: researcher-1.prod.acme.example
//     external_id: system:serviceaccount:agents:researcher
//   egress:
//     allow: [api.github.com, "*.githubusercontent.com"]
//   serves:
//     name: code-reviewer
//     port: 8080
//
// Parsing is strict: an unknown version, an unknown key at any level, a wrong type, a bad
// name or a bad port is refused with the field's path and the reason.

#include "policy/allowlist.h"

#include <cstdint>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace policy {

/// Longest bundle file accepted, in bytes.
inline constexpr size_t kMaxBundleBytes = size_t{64} * 1024;
/// Most egress.allow entries accepted.
inline constexpr size_t kMaxAllowEntries = 4096;
/// Longest agent.external_id accepted, in bytes.
inline constexpr size_t kMaxExternalIdBytes = 1024;

/// A refused bundle. field() is the dotted path ("egress.allow[2]", "serves.port", or ""
/// for the document itself); what() is "<field>: <reason>".
class BundleError : public std::runtime_error {
 public:
  BundleError(std::string field, const std::string& reason)
      : std::runtime_error(field.empty() ? reason : field + ": " + reason),
        field_(std::move(field)) {}
  [[nodiscard]] const std::string& field() const { return field_; }

 private:
  std::string field_;
};

/// `serves`: the one service an agent may offer (itself, as an A2A agent).
struct Serves {
  std::string name;   ///< a normalized DNS label or name (normalizeName())
  uint16_t port = 0;  ///< the port the agent binds inside the sandbox, 1..65535
};

struct Bundle {
  std::string agent_id;  ///< agent.id: required, a normalized DNS name
  /// agent.external_id: the platform subject (JWT "sub") this bundle belongs to; optional in
  /// the file, required by sam-box unless --insecure-unverified-bundle. Printable ASCII.
  std::string external_id;
  std::vector<AllowRule> egress_allow;  ///< egress.allow; empty = pure default-deny
  std::optional<Serves> serves;         ///< serves, if present (both name and port required)
};

/// Parses bundle YAML text. Throws BundleError. Required: version (must be "v1"), agent.id.
/// Optional: agent.external_id, egress (map with optional allow: sequence of strings),
/// serves (map with required name and port). A YAML anchor/alias or a duplicate key is
/// refused, as are documents over kMaxBundleBytes and more than one document.
Bundle parseBundle(std::string_view yaml_text);

/// Reads and parses a bundle file. Throws BundleError (field "") if the file cannot be read
/// or exceeds kMaxBundleBytes, with the path and errno text in the reason.
Bundle loadBundle(const std::filesystem::path& path);

}  // namespace policy
