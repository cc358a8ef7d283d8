#pragma once
// Verification of the platform credential (a JWT, RFC 7519; signatures per RFC 7515/7518):
// seed 003 "Identity is asserted about the agent, not by the agent". On Kubernetes this is a
// projected service account token. Only RS256 and ES256 are accepted; "none", HMAC and every
// other algorithm are refused before any key is looked at.

#include <chrono>
#include <map>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace policy {

/// Longest token accepted, in bytes.
inline constexpr size_t kMaxTokenBytes = size_t{16} * 1024;
/// Longest JWKS document accepted, in bytes.
inline constexpr size_t kMaxJwksBytes = size_t{256} * 1024;

/// A refused credential. reason() is a stable kebab-case code ("bad-audience", "expired",
/// "unknown-kid", ...); what() is a sentence for the operator that names the claim.
class CredentialError : public std::runtime_error {
 public:
  CredentialError(std::string reason, const std::string& detail)
      : std::runtime_error(detail), reason_(std::move(reason)) {}
  [[nodiscard]] const std::string& reason() const { return reason_; }

 private:
  std::string reason_;
};

/// One verification key from a JWKS (RFC 7517): RSA (kty "RSA", n, e) or EC P-256
/// (kty "EC", crv "P-256", x, y). Opaque: holds an OpenSSL EVP_PKEY.
class Jwk;

/// A JSON Web Key Set. Keys of other types or curves, or with "use" other than "sig", are
/// skipped (not an error); a set with no usable key is.
class Jwks {
 public:
  /// Parses a JWKS JSON document. Throws CredentialError("bad-jwks", ...) on malformed JSON,
  /// a document over kMaxJwksBytes, or no usable key.
  static Jwks parse(std::string_view json);
  Jwks(Jwks&&) noexcept;
  Jwks& operator=(Jwks&&) noexcept;
  ~Jwks();
  /// Number of usable keys.
  [[nodiscard]] size_t size() const;

 private:
  Jwks();
  friend struct JwtVerifier;
  struct Impl;
  Impl* impl_;
};

/// What a valid token must say.
struct VerifyOptions {
  std::string issuer;            ///< exact match of "iss"
  std::string audience;          ///< must equal "aud" (string) or be one of it (array)
  std::string expected_subject;  ///< exact match of "sub" (the bundle's agent.external_id)
  std::chrono::system_clock::time_point now = std::chrono::system_clock::now();
};

/// The claims of a verified token that callers use.
struct VerifiedClaims {
  std::string issuer;
  std::string subject;
  std::chrono::system_clock::time_point expires_at;
};

/// Verifies a compact-serialized JWS token: three base64url parts; header "alg" RS256 or
/// ES256 and a "kid" naming a key of that type in `keys` (a token without kid is tried
/// against every key of that type); signature valid; "iss" == issuer; "aud" contains
/// audience; numeric "exp" > now; numeric "nbf" <= now if present; "sub" == expected
/// subject. Throws CredentialError with one of the reasons: malformed-token,
/// unsupported-alg, unknown-kid, bad-signature, bad-issuer, bad-audience, missing-exp,
/// expired, not-yet-valid, bad-subject.
VerifiedClaims verifyJwt(std::string_view token, const Jwks& keys, const VerifyOptions& opts);

}  // namespace policy
