#pragma once
// OpenID Connect discovery (OpenID Connect Discovery 1.0 §4) and JWKS retrieval for the
// credential issuer given by --credential-issuer. The issuer comes from a flag, never from
// the bundle (seed 003: "an issuer named inside it could be one that an attacker controls").

#include "policy/jwt.h"

#include <chrono>
#include <string>

namespace policy {

struct OidcFetchOptions {
  std::string issuer;   ///< https URL; discovery is <issuer>/.well-known/openid-configuration
  std::string ca_file;  ///< PEM bundle to trust for the issuer's TLS; empty = system store
  std::chrono::milliseconds timeout{10000};  ///< per HTTP request, connect + transfer
};

/// Longest discovery document accepted, in bytes.
inline constexpr size_t kMaxDiscoveryBytes = size_t{64} * 1024;

/// Fetches the discovery document, checks that its "issuer" equals opts.issuer exactly
/// (§4.3), fetches "jwks_uri" (which must be https) and parses it. TLS peer and host name
/// verification are always on; redirects are not followed. Throws CredentialError with
/// reason "issuer-unreachable" (network, TLS or HTTP status), "bad-discovery" (malformed or
/// issuer mismatch) or "bad-jwks".
Jwks fetchIssuerJwks(const OidcFetchOptions& opts);

}  // namespace policy
