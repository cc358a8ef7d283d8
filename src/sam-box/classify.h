#pragma once
// The classifier: from a tunnel request's target to a route and a verdict, by name only
// (seed 003: "Matching uses the name that the agent asked for, never a resolved address").
// Pure: no I/O, so every rule is unit-tested without sockets.

#include "proto/tunnel_request.h"
#include "sam-box/options.h"

#include <cstdint>
#include <string>
#include <string_view>

namespace sambox {

/// The route label of sam_box_flows_total (seed 003 metrics), plus "malformed" for requests
/// that never named a target.
enum class Route { kExternal, kMeshEntrypoint, kUnresolved, kMalformed };

/// "external", "mesh-entrypoint", "unresolved" or "malformed".
const char* routeLabel(Route route);

struct Decision {
  Route route = Route::kMalformed;
  bool allowed = false;
  int status = 403;    ///< HTTP status of a refusal (403, or 400 for a malformed target)
  std::string reason;  ///< stable kebab-case refusal reason; empty when allowed
  std::string name;    ///< normalized name, or the literal as sent (for logs only)
  uint16_t port = 0;
};

// Refusal reasons decided here (Boundary-Reason values).
inline constexpr const char* kReasonNotAllowlisted = "not-allowlisted";
inline constexpr const char* kReasonUnresolved = "unresolved-address";
inline constexpr const char* kReasonInvalidName = "invalid-name";
inline constexpr const char* kReasonNoIdentity = "no-agent-identity";
/// The last verified platform credential has expired and no renewed one verified
/// (credential_watch.h): mesh requests would carry an identity nothing proves any more.
inline constexpr const char* kReasonCredentialExpired = "credential-expired";
inline constexpr const char* kReasonMeshUdp = "mesh-udp-unsupported";
inline constexpr const char* kReasonMeshPort = "mesh-port-not-served";
inline constexpr const char* kReasonMalformed = "malformed-request";

/// Decides a tunnel. `authority` is "host:port" from the request head. Order: a malformed
/// authority → 400 malformed-request; an IP literal in any spelling → route unresolved,
/// unresolved-address; an invalid name → invalid-name; mesh.sam.alt → mesh-entrypoint
/// (TCP port 80 only, and only when the box has an agent identity that has not lapsed:
/// `identity_lapsed` is Server::identityLapsed(), true → credential-expired); otherwise
/// external, allowed iff the allowlist matches name and port.
Decision classify(const Config& config, proto::TunnelKind kind, std::string_view authority,
                  bool identity_lapsed);

}  // namespace sambox
