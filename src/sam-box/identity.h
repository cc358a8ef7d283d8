#pragma once
// Start-up identity check (seed 003, "Identity is asserted about the agent, not by the agent"):
// writing a bundle is not enough to become that agent; the platform credential's subject must
// match the bundle's agent.external_id.

#include "policy/jwt.h"
#include "sam-box/options.h"

namespace sambox {

/// Reads the token at --credential-path (≤ kMaxTokenFileBytes, surrounding whitespace
/// trimmed), fetches the issuer's keys by OIDC discovery (trusting --credential-ca) and
/// verifies the token against issuer, audience and the bundle's external_id.
/// Throws policy::CredentialError (reason "unreadable-token" if the file cannot be read, or
/// one of verifyJwt()'s / fetchIssuerJwks()'s reasons).
policy::VerifiedClaims verifyIdentity(const Config& config);

}  // namespace sambox
