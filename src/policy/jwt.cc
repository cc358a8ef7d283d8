// JWT verification (RS256 / ES256 only) over OpenSSL 3. Everything here parses untrusted bytes:
// each step is bounded and fails with a CredentialError reason, never an assert or a crash.

#include "policy/jwt.h"

#include <openssl/bn.h>
#include <openssl/core_names.h>
#include <openssl/ec.h>
#include <openssl/evp.h>
#include <openssl/param_build.h>
#include <openssl/rsa.h>

#include <array>
#include <cmath>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <utility>

namespace policy {

namespace {

using Json = nlohmann::json;

// RSA moduli outside this range are skipped: below 2048 is forgeable in practice (and
// forbidden by RFC 7518 §3.3); above 8192 only buys an attacker-chosen JWKS a slow verify.
constexpr int kMinRsaBits = 2048;
constexpr int kMaxRsaBits = 8192;
constexpr size_t kP256CoordinateBytes = 32;
constexpr size_t kEs256SignatureBytes = 2 * kP256CoordinateBytes;
// A NumericDate must fit system_clock (int64 nanoseconds on libstdc++, about ±292 years
// around 1970); anything beyond cannot be represented, so it is treated as unusable.
constexpr double kMaxNumericDate = 9.0e9;

struct PkeyFree {
  void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
};
struct PkeyCtxFree {
  void operator()(EVP_PKEY_CTX* p) const { EVP_PKEY_CTX_free(p); }
};
struct MdCtxFree {
  void operator()(EVP_MD_CTX* p) const { EVP_MD_CTX_free(p); }
};
struct BnFree {
  void operator()(BIGNUM* p) const { BN_free(p); }
};
struct ParamBldFree {
  void operator()(OSSL_PARAM_BLD* p) const { OSSL_PARAM_BLD_free(p); }
};
struct ParamFree {
  void operator()(OSSL_PARAM* p) const { OSSL_PARAM_free(p); }
};
struct EcdsaSigFree {
  void operator()(ECDSA_SIG* p) const { ECDSA_SIG_free(p); }
};
using PkeyPtr = std::unique_ptr<EVP_PKEY, PkeyFree>;
using PkeyCtxPtr = std::unique_ptr<EVP_PKEY_CTX, PkeyCtxFree>;
using MdCtxPtr = std::unique_ptr<EVP_MD_CTX, MdCtxFree>;
using BnPtr = std::unique_ptr<BIGNUM, BnFree>;
using ParamBldPtr = std::unique_ptr<OSSL_PARAM_BLD, ParamBldFree>;
using ParamPtr = std::unique_ptr<OSSL_PARAM, ParamFree>;
using EcdsaSigPtr = std::unique_ptr<ECDSA_SIG, EcdsaSigFree>;

int base64UrlValue(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '-') return 62;
  if (c == '_') return 63;
  return -1;
}

// Strict base64url (RFC 7515 §2): no padding, no whitespace, no '+' or '/', and the unused
// low bits of the last character must be zero, so every byte string has exactly one encoding
// and a signature cannot be altered without changing what is verified.
std::optional<std::string> decodeBase64Url(std::string_view in) {
  if (in.size() % 4 == 1) return std::nullopt;
  std::string out;
  out.reserve(in.size() * 3 / 4);
  uint32_t acc = 0;
  int bits = 0;
  for (char c : in) {
    int v = base64UrlValue(c);
    if (v < 0) return std::nullopt;
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((acc >> bits) & 0xff));
    }
  }
  if ((acc & ((1u << bits) - 1)) != 0) return std::nullopt;
  return out;
}

// Parses a JSON object and refuses duplicate member names at any depth: nlohmann keeps the
// last duplicate while other JWT libraries keep the first, and that disagreement is a classic
// way to make two verifiers read different claims from one token.
std::optional<Json> parseStrictObject(std::string_view text) {
  std::vector<std::set<std::string>> seen;
  bool duplicate = false;
  auto callback = [&](int /*depth*/, Json::parse_event_t event, Json& parsed) {
    switch (event) {
      case Json::parse_event_t::object_start:
        seen.emplace_back();
        break;
      case Json::parse_event_t::object_end:
        if (!seen.empty()) seen.pop_back();
        break;
      case Json::parse_event_t::key:
        if (!seen.empty() && !seen.back().insert(parsed.get<std::string>()).second) {
          duplicate = true;
        }
        break;
      default:
        break;
    }
    return true;
  };
  Json doc = Json::parse(text.begin(), text.end(), callback, /*allow_exceptions=*/false);
  if (doc.is_discarded() || duplicate || !doc.is_object()) return std::nullopt;
  return doc;
}

std::optional<std::string> stringMember(const Json& obj, const char* name) {
  auto it = obj.find(name);
  if (it == obj.end() || !it->is_string()) return std::nullopt;
  return it->get<std::string>();
}

const unsigned char* bytes(const std::string& s) {
  return reinterpret_cast<const unsigned char*>(s.data());
}

PkeyPtr pkeyFromParams(const char* type, OSSL_PARAM_BLD* bld) {
  ParamPtr params(OSSL_PARAM_BLD_to_param(bld));
  PkeyCtxPtr ctx(EVP_PKEY_CTX_new_from_name(nullptr, type, nullptr));
  if (!params || !ctx || EVP_PKEY_fromdata_init(ctx.get()) != 1) return nullptr;
  EVP_PKEY* raw = nullptr;
  if (EVP_PKEY_fromdata(ctx.get(), &raw, EVP_PKEY_PUBLIC_KEY, params.get()) != 1) return nullptr;
  return PkeyPtr(raw);
}

PkeyPtr rsaKeyFromJwk(const Json& jwk) {
  auto n64 = stringMember(jwk, "n");
  auto e64 = stringMember(jwk, "e");
  if (!n64 || !e64) return nullptr;
  auto n = decodeBase64Url(*n64);
  auto e = decodeBase64Url(*e64);
  if (!n || !e || n->empty() || e->empty() || e->size() > 8) return nullptr;
  BnPtr bn_n(BN_bin2bn(bytes(*n), static_cast<int>(n->size()), nullptr));
  BnPtr bn_e(BN_bin2bn(bytes(*e), static_cast<int>(e->size()), nullptr));
  if (!bn_n || !bn_e) return nullptr;
  // Checked before building the key so a huge modulus costs nothing beyond its decoding.
  int bits = BN_num_bits(bn_n.get());
  if (bits < kMinRsaBits || bits > kMaxRsaBits) return nullptr;
  // An even or tiny exponent is not an RSA key anyone generates; refuse it outright.
  if (!BN_is_odd(bn_e.get()) || BN_is_one(bn_e.get())) return nullptr;
  ParamBldPtr bld(OSSL_PARAM_BLD_new());
  if (!bld || OSSL_PARAM_BLD_push_BN(bld.get(), OSSL_PKEY_PARAM_RSA_N, bn_n.get()) != 1 ||
      OSSL_PARAM_BLD_push_BN(bld.get(), OSSL_PKEY_PARAM_RSA_E, bn_e.get()) != 1) {
    return nullptr;
  }
  return pkeyFromParams("RSA", bld.get());
}

PkeyPtr ecKeyFromJwk(const Json& jwk) {
  if (stringMember(jwk, "crv") != "P-256") return nullptr;
  auto x64 = stringMember(jwk, "x");
  auto y64 = stringMember(jwk, "y");
  if (!x64 || !y64) return nullptr;
  auto x = decodeBase64Url(*x64);
  auto y = decodeBase64Url(*y64);
  // RFC 7518 §6.2.1.2: coordinates are the full field size, leading zeros kept.
  if (!x || !y || x->size() != kP256CoordinateBytes || y->size() != kP256CoordinateBytes) {
    return nullptr;
  }
  std::string point = "\x04" + *x + *y;  // SEC 1 uncompressed point
  char group[] = "prime256v1";
  ParamBldPtr bld(OSSL_PARAM_BLD_new());
  if (!bld ||
      OSSL_PARAM_BLD_push_utf8_string(bld.get(), OSSL_PKEY_PARAM_GROUP_NAME, group, 0) != 1 ||
      OSSL_PARAM_BLD_push_octet_string(bld.get(), OSSL_PKEY_PARAM_PUB_KEY, point.data(),
                                       point.size()) != 1) {
    return nullptr;
  }
  PkeyPtr key = pkeyFromParams("EC", bld.get());
  if (!key) return nullptr;
  // Invalid-curve attacks need a point off P-256; make sure the decoded point is on it.
  PkeyCtxPtr check(EVP_PKEY_CTX_new_from_pkey(nullptr, key.get(), nullptr));
  if (!check || EVP_PKEY_public_check(check.get()) != 1) return nullptr;
  return key;
}

}  // namespace

class Jwk {
 public:
  enum class Type { kRsa, kEc };
  Jwk(Type type, std::optional<std::string> kid, PkeyPtr key)
      : type_(type), kid_(std::move(kid)), key_(std::move(key)) {}
  [[nodiscard]] Type type() const { return type_; }
  [[nodiscard]] const std::optional<std::string>& kid() const { return kid_; }
  [[nodiscard]] EVP_PKEY* key() const { return key_.get(); }

 private:
  Type type_;
  std::optional<std::string> kid_;
  PkeyPtr key_;
};

struct Jwks::Impl {
  std::vector<Jwk> keys;
};

Jwks::Jwks() : impl_(new Impl) {}
Jwks::Jwks(Jwks&& other) noexcept : impl_(std::exchange(other.impl_, nullptr)) {}
Jwks& Jwks::operator=(Jwks&& other) noexcept {
  if (this != &other) {
    delete impl_;
    impl_ = std::exchange(other.impl_, nullptr);
  }
  return *this;
}
Jwks::~Jwks() { delete impl_; }
size_t Jwks::size() const { return impl_ ? impl_->keys.size() : 0; }

namespace {

// Builds one key or returns nullopt when the entry is not usable by us. Unusable entries are
// skipped rather than fatal: an issuer may publish keys for other algorithms next to ours.
std::optional<Jwk> parseJwk(const Json& entry) {
  if (!entry.is_object()) return std::nullopt;
  if (entry.contains("use") && stringMember(entry, "use") != "sig") return std::nullopt;
  std::optional<std::string> kid;
  if (entry.contains("kid")) {
    kid = stringMember(entry, "kid");
    if (!kid) return std::nullopt;
  }
  auto kty = stringMember(entry, "kty");
  // A key that declares an "alg" (RFC 7517 §4.4) is only ever used with that algorithm.
  auto declared_alg = stringMember(entry, "alg");
  if (entry.contains("alg") && !declared_alg) return std::nullopt;
  if (kty == "RSA") {
    if (declared_alg && *declared_alg != "RS256") return std::nullopt;
    if (PkeyPtr key = rsaKeyFromJwk(entry)) return Jwk(Jwk::Type::kRsa, kid, std::move(key));
  } else if (kty == "EC") {
    if (declared_alg && *declared_alg != "ES256") return std::nullopt;
    if (PkeyPtr key = ecKeyFromJwk(entry)) return Jwk(Jwk::Type::kEc, kid, std::move(key));
  }
  return std::nullopt;
}

}  // namespace

Jwks Jwks::parse(std::string_view json) {
  if (json.size() > kMaxJwksBytes) {
    throw CredentialError("bad-jwks", "JWKS document is " + std::to_string(json.size()) +
                                          " bytes, over the limit of " +
                                          std::to_string(kMaxJwksBytes));
  }
  Json doc = Json::parse(json.begin(), json.end(), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) {
    throw CredentialError("bad-jwks", "JWKS document is not a JSON object");
  }
  auto it = doc.find("keys");
  if (it == doc.end() || !it->is_array()) {
    throw CredentialError("bad-jwks", "JWKS document has no \"keys\" array");
  }
  Jwks out;
  for (const Json& entry : *it) {
    if (auto jwk = parseJwk(entry)) out.impl_->keys.push_back(std::move(*jwk));
  }
  if (out.impl_->keys.empty()) {
    throw CredentialError("bad-jwks",
                          "JWKS has no usable key (need RSA >= 2048 bits or EC P-256, use sig)");
  }
  return out;
}

// Named in jwt.h as the friend that may read a Jwks's keys.
struct JwtVerifier {
  static const std::vector<Jwk>& keys(const Jwks& set) {
    static const std::vector<Jwk> kNone;
    return set.impl_ ? set.impl_->keys : kNone;
  }
};

namespace {

enum class Alg { kRs256, kEs256 };

[[noreturn]] void fail(const char* reason, const std::string& detail) {
  throw CredentialError(reason, detail);
}

// A token value quoted for an operator's message: JSON-escaped (so control characters cannot
// forge log lines) and cut short (so a 16 KiB claim cannot flood the log).
std::string shown(const Json& value) {
  constexpr size_t kMaxShownChars = 96;
  std::string text = value.dump(-1, ' ', false, Json::error_handler_t::replace);
  if (text.size() > kMaxShownChars) text = text.substr(0, kMaxShownChars) + "...";
  return text;
}

// Verifies with exactly the algorithm named in the (already allowlisted) header: the key's
// type was matched to it by the caller, and the padding is pinned to PKCS#1 v1.5 so no
// provider default can substitute another scheme.
bool verifySignature(Alg alg, EVP_PKEY* key, std::string_view signing_input,
                     const std::string& signature) {
  std::string der;
  const std::string* sig = &signature;
  if (alg == Alg::kEs256) {
    // JWS carries ECDSA as raw r||s (RFC 7518 §3.4); DER or any other length is refused so
    // that one signature has one encoding.
    if (signature.size() != kEs256SignatureBytes) return false;
    EcdsaSigPtr ecdsa(ECDSA_SIG_new());
    BnPtr r(BN_bin2bn(bytes(signature), kP256CoordinateBytes, nullptr));
    BnPtr s(BN_bin2bn(bytes(signature) + kP256CoordinateBytes, kP256CoordinateBytes, nullptr));
    if (!ecdsa || !r || !s || ECDSA_SIG_set0(ecdsa.get(), r.get(), s.get()) != 1) return false;
    (void)r.release();  // owned by ecdsa now
    (void)s.release();
    unsigned char* out = nullptr;
    int len = i2d_ECDSA_SIG(ecdsa.get(), &out);
    if (len <= 0) return false;
    der.assign(reinterpret_cast<char*>(out), static_cast<size_t>(len));
    OPENSSL_free(out);
    sig = &der;
  } else if (static_cast<int>(signature.size()) != EVP_PKEY_get_size(key)) {
    return false;
  }
  MdCtxPtr md(EVP_MD_CTX_new());
  EVP_PKEY_CTX* pctx = nullptr;  // owned by md
  if (!md || EVP_DigestVerifyInit(md.get(), &pctx, EVP_sha256(), nullptr, key) != 1) {
    return false;
  }
  if (alg == Alg::kRs256 && EVP_PKEY_CTX_set_rsa_padding(pctx, RSA_PKCS1_PADDING) != 1) {
    return false;
  }
  return EVP_DigestVerify(md.get(), bytes(*sig), sig->size(),
                          reinterpret_cast<const unsigned char*>(signing_input.data()),
                          signing_input.size()) == 1;
}

// A JSON number as a NumericDate (RFC 7519 §2), or nullopt if it is not a usable one.
std::optional<std::chrono::system_clock::time_point> numericDate(const Json& value) {
  if (!value.is_number()) return std::nullopt;
  double seconds = value.get<double>();
  if (!std::isfinite(seconds) || std::fabs(seconds) > kMaxNumericDate) return std::nullopt;
  return std::chrono::system_clock::time_point(
      std::chrono::duration_cast<std::chrono::system_clock::duration>(
          std::chrono::duration<double>(seconds)));
}

// Claim checks, in the order of the reasons listed in jwt.h. There is deliberately no clock
// leeway: sam-box and the issuer share the host's (or cluster's) clock, and projected tokens
// are refreshed well before expiry, so skew tolerance would only widen replay windows.
VerifiedClaims checkClaims(const Json& claims, const VerifyOptions& opts) {
  auto iss = stringMember(claims, "iss");
  if (!iss) fail("bad-issuer", "token has no string \"iss\" claim");
  if (*iss != opts.issuer) {
    fail("bad-issuer", "token \"iss\" is " + shown(*iss) + ", expected " + shown(opts.issuer));
  }

  auto aud = claims.find("aud");
  bool audience_ok = false;
  if (aud != claims.end() && aud->is_string()) {
    audience_ok = aud->get<std::string>() == opts.audience;
  } else if (aud != claims.end() && aud->is_array()) {
    for (const Json& a : *aud) {
      // One non-string member makes the whole claim malformed, not merely non-matching.
      if (!a.is_string()) fail("bad-audience", "token \"aud\" array holds a non-string");
      audience_ok = audience_ok || a.get<std::string>() == opts.audience;
    }
  } else {
    fail("bad-audience", "token has no string or array \"aud\" claim");
  }
  if (!audience_ok) {
    fail("bad-audience",
         "token \"aud\" " + shown(*aud) + " does not contain " + shown(opts.audience));
  }

  // exp present but not a number (e.g. the string "1700000000") is reported as missing-exp:
  // a token without a usable NumericDate expiry is a token without an expiry.
  auto exp_it = claims.find("exp");
  if (exp_it == claims.end()) fail("missing-exp", "token has no \"exp\" claim");
  auto exp = numericDate(*exp_it);
  if (!exp) fail("missing-exp", "token \"exp\" is not a usable NumericDate: " + shown(*exp_it));
  if (*exp <= opts.now) fail("expired", "token \"exp\" " + shown(*exp_it) + " has passed");

  if (auto nbf_it = claims.find("nbf"); nbf_it != claims.end()) {
    auto nbf = numericDate(*nbf_it);
    if (!nbf) fail("malformed-token", "token \"nbf\" is not a NumericDate: " + shown(*nbf_it));
    if (*nbf > opts.now) {
      fail("not-yet-valid", "token \"nbf\" " + shown(*nbf_it) + " is in the future");
    }
  }

  auto sub = stringMember(claims, "sub");
  if (!sub) fail("bad-subject", "token has no string \"sub\" claim");
  if (*sub != opts.expected_subject) {
    fail("bad-subject",
         "token \"sub\" is " + shown(*sub) + ", expected " + shown(opts.expected_subject));
  }
  return VerifiedClaims{*iss, *sub, *exp};
}

}  // namespace

VerifiedClaims verifyJwt(std::string_view token, const Jwks& keys, const VerifyOptions& opts) {
  if (token.empty()) fail("malformed-token", "token is empty");
  if (token.size() > kMaxTokenBytes) {
    fail("malformed-token", "token is " + std::to_string(token.size()) +
                                " bytes, over the limit of " + std::to_string(kMaxTokenBytes));
  }
  size_t dot1 = token.find('.');
  size_t dot2 = dot1 == std::string_view::npos ? dot1 : token.find('.', dot1 + 1);
  if (dot2 == std::string_view::npos || token.find('.', dot2 + 1) != std::string_view::npos) {
    fail("malformed-token", "token is not three base64url parts separated by two dots");
  }
  std::string_view header_part = token.substr(0, dot1);
  std::string_view payload_part = token.substr(dot1 + 1, dot2 - dot1 - 1);
  std::string_view signature_part = token.substr(dot2 + 1);

  auto header_text = decodeBase64Url(header_part);
  if (!header_text) fail("malformed-token", "token header is not base64url");
  auto header = parseStrictObject(*header_text);
  if (!header) fail("malformed-token", "token header is not a JSON object");

  // The allowlist is applied before any key is touched, so "none", HMAC keyed with a public
  // key, and algorithm substitution never reach the signature code.
  auto alg_name = stringMember(*header, "alg");
  Alg alg;
  if (alg_name == "RS256") {
    alg = Alg::kRs256;
  } else if (alg_name == "ES256") {
    alg = Alg::kEs256;
  } else {
    fail("unsupported-alg", "token header \"alg\" is " +
                                (header->contains("alg") ? shown(header->at("alg")) : "absent") +
                                "; only RS256 and ES256 are accepted");
  }
  // RFC 7515 §4.1.11: a recipient must refuse extensions it does not understand; we know none.
  if (header->contains("crit")) fail("malformed-token", "token header has \"crit\"");
  // Keys are only ever taken from the JWKS fetched from the configured issuer: "jku", "jwk",
  // "x5u" and "x5c" in the header are attacker-supplied and deliberately ignored.
  std::optional<std::string> kid;
  if (header->contains("kid")) {
    kid = stringMember(*header, "kid");
    if (!kid) fail("malformed-token", "token header \"kid\" is not a string");
  }

  Jwk::Type wanted = alg == Alg::kRs256 ? Jwk::Type::kRsa : Jwk::Type::kEc;
  std::vector<const Jwk*> candidates;
  for (const Jwk& k : JwtVerifier::keys(keys)) {
    if (k.type() == wanted && (!kid || k.kid() == kid)) candidates.push_back(&k);
  }
  if (candidates.empty()) {
    fail("unknown-kid", kid ? "no " + *alg_name + " key with kid " + shown(*kid) + " in the JWKS"
                            : "no " + *alg_name + " key in the JWKS");
  }

  auto signature = decodeBase64Url(signature_part);
  if (!signature) fail("malformed-token", "token signature is not base64url");
  std::string_view signing_input = token.substr(0, dot2);
  bool verified = false;
  for (const Jwk* k : candidates) {
    if (verifySignature(alg, k->key(), signing_input, *signature)) {
      verified = true;
      break;
    }
  }
  if (!verified) fail("bad-signature", "token " + *alg_name + " signature does not verify");

  // The payload is parsed only once its bytes are known to come from the issuer.
  auto payload_text = decodeBase64Url(payload_part);
  if (!payload_text) fail("malformed-token", "token payload is not base64url");
  auto claims = parseStrictObject(*payload_text);
  if (!claims) fail("malformed-token", "token payload is not a JSON object");
  return checkClaims(*claims, opts);
}

}  // namespace policy
