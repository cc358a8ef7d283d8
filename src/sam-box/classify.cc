#include "sam-box/classify.h"

#include "policy/name.h"

namespace sambox {

const char* routeLabel(Route route) {
  switch (route) {
    case Route::kExternal:
      return "external";
    case Route::kMeshEntrypoint:
      return "mesh-entrypoint";
    case Route::kUnresolved:
      return "unresolved";
    case Route::kMalformed:
      return "malformed";
  }
  return "malformed";
}

Decision classify(const Config& config, proto::TunnelKind kind, std::string_view authority,
                  bool identity_lapsed) {
  Decision d;
  std::string why;
  const auto target = policy::parseAuthority(authority, &why);
  if (!target) {
    d.status = 400;
    d.reason = kReasonMalformed;
    d.name = std::string(authority.substr(0, 256));
    return d;
  }
  d.port = target->port;
  d.name = target->host;
  if (policy::isIpLiteral(target->host)) {
    // An address the agent never resolved through the sandbox's DNS has no name.
    d.route = Route::kUnresolved;
    d.reason = kReasonUnresolved;
    return d;
  }
  d.route = Route::kExternal;
  const auto name = policy::normalizeName(target->host, &why);
  if (!name) {
    d.reason = kReasonInvalidName;
    return d;
  }
  d.name = *name;
  if (*name == kMeshName) {
    d.route = Route::kMeshEntrypoint;
    if (kind == proto::TunnelKind::kConnectUdp) {
      d.reason = kReasonMeshUdp;
    } else if (!config.bundle) {
      d.reason = kReasonNoIdentity;
    } else if (target->port != kMeshPort) {
      d.reason = kReasonMeshPort;
    } else if (identity_lapsed) {
      d.reason = kReasonCredentialExpired;
    } else {
      d.allowed = true;
    }
    return d;
  }
  if (config.allowlist.allows(*name, target->port)) {
    d.allowed = true;
  } else {
    d.reason = kReasonNotAllowlisted;
  }
  return d;
}

}  // namespace sambox
