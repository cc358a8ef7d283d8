#pragma once
// Start-up identity check (seed 003, "Identity is asserted about the agent, not by the agent"):
// writing a bundle is not enough to become that agent; the platform credential's subject must
// match the bundle's agent.external_id. Linked only into the sam-box-verify helper
// (verifier.h): this is the code that needs libcurl and libcrypto.

#include "policy/jwt.h"
#include "sam-box/verifier.h"

namespace sambox {

/// Reads the token at check.token_path (≤ kMaxTokenFileBytes, surrounding whitespace
/// trimmed), fetches the issuer's keys by OIDC discovery (trusting check.ca_file) and
/// verifies the token against issuer, audience and the expected subject.
/// Throws policy::CredentialError (reason "unreadable-token" if the file cannot be read, or
/// one of verifyJwt()'s / fetchIssuerJwks()'s reasons).
policy::VerifiedClaims verifyIdentity(const IdentityCheck& check);

}  // namespace sambox
