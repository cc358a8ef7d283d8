#include "sam-box/identity.h"

#include "policy/oidc.h"
#include "sam-box/limits.h"

#include <utility>

namespace sambox {

policy::VerifiedClaims verifyIdentity(const IdentityCheck& check, std::string token) {
  if (token.size() > kMaxTokenFileBytes) {
    throw policy::CredentialError(kReasonUnreadableToken, tokenTooLargeDetail(check.token_path));
  }
  const auto first = token.find_first_not_of(" \t\r\n");
  const auto last = token.find_last_not_of(" \t\r\n");
  token = first == std::string::npos ? std::string() : token.substr(first, last - first + 1);

  policy::OidcFetchOptions fetch;
  fetch.issuer = check.issuer;
  fetch.ca_file = check.ca_file;
  const policy::Jwks keys = policy::fetchIssuerJwks(fetch);

  policy::VerifyOptions opts;
  opts.issuer = check.issuer;
  opts.audience = check.audience;
  opts.expected_subject = check.expected_subject;
  return policy::verifyJwt(token, keys, opts);
}

}  // namespace sambox
