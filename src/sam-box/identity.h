#pragma once
// Start-up identity check (seed 003, "Identity is asserted about the agent, not by the agent"):
// writing a bundle is not enough to become that agent; the platform credential's subject must
// match the bundle's agent.external_id. Linked only into the sam-box-verify helper
// (verifier.h): this is the code that needs libcurl and libcrypto.

#include "policy/jwt.h"
#include "sam-box/verifier.h"

namespace sambox {

/// Verifies `token`, the bytes of the token file (≤ kMaxTokenFileBytes, surrounding
/// whitespace trimmed here): fetches the issuer's keys by OIDC discovery (trusting
/// check.ca_file) and checks the token against issuer, audience and the expected subject.
/// Throws policy::CredentialError ("unreadable-token" if it is too large, or one of
/// verifyJwt()'s / fetchIssuerJwks()'s reasons).
policy::VerifiedClaims verifyIdentity(const IdentityCheck& check, std::string token);

}  // namespace sambox
