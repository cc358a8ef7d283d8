#include "sam-box/identity.h"

#include "policy/oidc.h"
#include "sam-box/limits.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>

namespace sambox {

policy::VerifiedClaims verifyIdentity(const Config& config) {
  const std::string& path = config.flags.credential_path;
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw policy::CredentialError("unreadable-token",
                                  "--credential-path " + path + ": " + std::strerror(errno));
  }
  std::string token;
  token.resize(kMaxTokenFileBytes + 1);
  in.read(token.data(), static_cast<std::streamsize>(token.size()));
  token.resize(static_cast<size_t>(in.gcount()));
  if (token.size() > kMaxTokenFileBytes) {
    throw policy::CredentialError("unreadable-token",
                                  "--credential-path " + path + ": larger than " +
                                      std::to_string(kMaxTokenFileBytes) + " bytes");
  }
  const auto first = token.find_first_not_of(" \t\r\n");
  const auto last = token.find_last_not_of(" \t\r\n");
  token = first == std::string::npos ? std::string() : token.substr(first, last - first + 1);

  policy::OidcFetchOptions fetch;
  fetch.issuer = config.flags.credential_issuer;
  fetch.ca_file = config.flags.credential_ca;
  const policy::Jwks keys = policy::fetchIssuerJwks(fetch);

  policy::VerifyOptions opts;
  opts.issuer = config.flags.credential_issuer;
  opts.audience = config.flags.credential_audience;
  opts.expected_subject = config.bundle->external_id;
  return policy::verifyJwt(token, keys, opts);
}

}  // namespace sambox
