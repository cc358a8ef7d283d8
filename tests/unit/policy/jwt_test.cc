// JWT and JWKS verification against keys and tokens minted here with OpenSSL: the happy paths,
// and the attacks a hostile sandbox (or a hostile network) would try.

#include "policy/jwt.h"

#include <gtest/gtest.h>
#include <openssl/bn.h>
#include <openssl/core_names.h>
#include <openssl/ec.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/pem.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

namespace policy {
namespace {

using Json = nlohmann::json;
using std::chrono::seconds;
using std::chrono::system_clock;

constexpr char kIssuer[] = "https://issuer.test";
constexpr char kAudience[] = "compass";
constexpr char kSubject[] = "system:serviceaccount:agents:researcher";

struct PkeyFree {
  void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
};
using PkeyPtr = std::unique_ptr<EVP_PKEY, PkeyFree>;

std::string b64url(std::string_view in) {
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
  std::string out;
  size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    uint32_t v = (uint8_t(in[i]) << 16) | (uint8_t(in[i + 1]) << 8) | uint8_t(in[i + 2]);
    for (int s = 18; s >= 0; s -= 6) out.push_back(kAlphabet[(v >> s) & 63]);
  }
  if (i + 1 == in.size()) {
    uint32_t v = uint8_t(in[i]) << 16;
    out.push_back(kAlphabet[(v >> 18) & 63]);
    out.push_back(kAlphabet[(v >> 12) & 63]);
  } else if (i + 2 == in.size()) {
    uint32_t v = (uint8_t(in[i]) << 16) | (uint8_t(in[i + 1]) << 8);
    for (int s = 18; s >= 6; s -= 6) out.push_back(kAlphabet[(v >> s) & 63]);
  }
  return out;
}

std::string bnParam(EVP_PKEY* key, const char* name, int pad = 0) {
  BIGNUM* bn = nullptr;
  EXPECT_EQ(EVP_PKEY_get_bn_param(key, name, &bn), 1) << name;
  std::string out(pad ? pad : BN_num_bytes(bn), '\0');
  if (pad) {
    BN_bn2binpad(bn, reinterpret_cast<unsigned char*>(out.data()), pad);
  } else {
    BN_bn2bin(bn, reinterpret_cast<unsigned char*>(out.data()));
  }
  BN_free(bn);
  return out;
}

Json rsaJwk(EVP_PKEY* key, const std::string& kid) {
  return {{"kty", "RSA"},
          {"use", "sig"},
          {"kid", kid},
          {"n", b64url(bnParam(key, OSSL_PKEY_PARAM_RSA_N))},
          {"e", b64url(bnParam(key, OSSL_PKEY_PARAM_RSA_E))}};
}

Json ecJwk(EVP_PKEY* key, const std::string& kid, const char* crv = "P-256", int size = 32) {
  return {{"kty", "EC"},
          {"crv", crv},
          {"kid", kid},
          {"x", b64url(bnParam(key, OSSL_PKEY_PARAM_EC_PUB_X, size))},
          {"y", b64url(bnParam(key, OSSL_PKEY_PARAM_EC_PUB_Y, size))}};
}

std::string digestSign(EVP_PKEY* key, std::string_view input) {
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> md(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  size_t len = 0;
  auto* in = reinterpret_cast<const unsigned char*>(input.data());
  EXPECT_EQ(EVP_DigestSignInit(md.get(), nullptr, EVP_sha256(), nullptr, key), 1);
  EXPECT_EQ(EVP_DigestSign(md.get(), nullptr, &len, in, input.size()), 1);
  std::string sig(len, '\0');
  EXPECT_EQ(EVP_DigestSign(md.get(), reinterpret_cast<unsigned char*>(sig.data()), &len, in,
                           input.size()),
            1);
  sig.resize(len);
  return sig;
}

// ES256 in JWS form: the DER signature OpenSSL produces, re-encoded as raw r||s.
std::string es256Raw(EVP_PKEY* key, std::string_view input) {
  std::string der = digestSign(key, input);
  auto* p = reinterpret_cast<const unsigned char*>(der.data());
  ECDSA_SIG* sig = d2i_ECDSA_SIG(nullptr, &p, static_cast<long>(der.size()));
  std::string raw(64, '\0');
  auto* out = reinterpret_cast<unsigned char*>(raw.data());
  BN_bn2binpad(ECDSA_SIG_get0_r(sig), out, 32);
  BN_bn2binpad(ECDSA_SIG_get0_s(sig), out + 32, 32);
  ECDSA_SIG_free(sig);
  return raw;
}

std::string hs256(std::string_view secret, std::string_view input) {
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
       reinterpret_cast<const unsigned char*>(input.data()), input.size(), mac, &len);
  return std::string(reinterpret_cast<char*>(mac), len);
}

std::string publicPem(EVP_PKEY* key) {
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(BIO_new(BIO_s_mem()), BIO_free);
  PEM_write_bio_PUBKEY(bio.get(), key);
  char* data = nullptr;
  long len = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(len));
}

using SignFn = std::function<std::string(std::string_view)>;

std::string token(const Json& header, const Json& claims, const SignFn& sign) {
  std::string input = b64url(header.dump()) + "." + b64url(claims.dump());
  return input + "." + b64url(sign(input));
}

class JwtTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    rsa_ = EVP_RSA_gen(2048);
    other_rsa_ = EVP_RSA_gen(2048);
    ec_ = EVP_EC_gen("P-256");
    other_ec_ = EVP_EC_gen("P-256");
  }
  static void TearDownTestSuite() {
    for (EVP_PKEY* k : {rsa_, other_rsa_, ec_, other_ec_}) EVP_PKEY_free(k);
  }

  void SetUp() override {
    now_ = system_clock::time_point(
        std::chrono::duration_cast<seconds>(system_clock::now().time_since_epoch()));
    opts_ = VerifyOptions{kIssuer, kAudience, kSubject, now_};
    claims_ = {{"iss", kIssuer},
               {"aud", kAudience},
               {"sub", kSubject},
               {"iat", epoch()},
               {"exp", epoch() + 600}};
  }

  [[nodiscard]] int64_t epoch() const {
    return std::chrono::duration_cast<seconds>(now_.time_since_epoch()).count();
  }
  static Jwks keys() {
    return Jwks::parse(Json{{"keys", {rsaJwk(rsa_, "rsa-1"), ecJwk(ec_, "ec-1")}}}.dump());
  }
  static SignFn rs256(EVP_PKEY* key) {
    return [key](std::string_view in) { return digestSign(key, in); };
  }
  static SignFn es256(EVP_PKEY* key) {
    return [key](std::string_view in) { return es256Raw(key, in); };
  }
  [[nodiscard]] std::string rsaToken(const Json& claims) const {
    return token({{"alg", "RS256"}, {"kid", "rsa-1"}}, claims, rs256(rsa_));
  }
  [[nodiscard]] std::string rsaToken() const { return rsaToken(claims_); }

  // "ok" or the CredentialError reason, so each test reads as one expectation.
  [[nodiscard]] std::string verdict(std::string_view tok) const {
    try {
      verifyJwt(tok, keys(), opts_);
      return "ok";
    } catch (const CredentialError& e) {
      EXPECT_NE(std::string(e.what()), "") << "what() must explain " << e.reason();
      return e.reason();
    }
  }
  [[nodiscard]] std::string withClaim(const std::string& name, const Json& value) const {
    Json c = claims_;
    c[name] = value;
    return verdict(rsaToken(c));
  }
  [[nodiscard]] std::string withoutClaim(const std::string& name) const {
    Json c = claims_;
    c.erase(name);
    return verdict(rsaToken(c));
  }

  static inline EVP_PKEY* rsa_ = nullptr;
  static inline EVP_PKEY* other_rsa_ = nullptr;
  static inline EVP_PKEY* ec_ = nullptr;
  static inline EVP_PKEY* other_ec_ = nullptr;
  system_clock::time_point now_;
  VerifyOptions opts_;
  Json claims_;
};

std::string jwksVerdict(const std::string& doc) {
  try {
    return "ok:" + std::to_string(Jwks::parse(doc).size());
  } catch (const CredentialError& e) {
    return e.reason();
  }
}

// --- JWKS ---

TEST_F(JwtTest, JwksParsesRsaAndEcKeys) {
  EXPECT_EQ(keys().size(), 2u);
  Jwks moved = keys();
  Jwks target = std::move(moved);
  EXPECT_EQ(target.size(), 2u);
}

TEST_F(JwtTest, JwksSkipsUnusableKeys) {
  PkeyPtr small(EVP_RSA_gen(1024));
  PkeyPtr p384(EVP_EC_gen("P-384"));
  Json enc = ecJwk(ec_, "enc");
  enc["use"] = "enc";
  Json rs512 = rsaJwk(rsa_, "rs512");
  rs512["alg"] = "RS512";
  Json off_curve = ecJwk(ec_, "off");
  off_curve["y"] = off_curve["x"];
  Json short_x = ecJwk(ec_, "short");
  short_x["x"] = b64url(std::string(31, '\x01'));
  Json unusable = {{"keys",
                    {rsaJwk(small.get(), "small"), ecJwk(p384.get(), "p384", "P-384", 48),
                     Json{{"kty", "oct"}, {"k", "c2VjcmV0"}}, enc, rs512, off_curve, short_x,
                     Json{{"kty", "RSA"}, {"n", "!!"}, {"e", "AQAB"}}, 42}}};
  EXPECT_EQ(jwksVerdict(unusable.dump()), "bad-jwks");
  unusable["keys"].push_back(ecJwk(ec_, "good"));
  EXPECT_EQ(jwksVerdict(unusable.dump()), "ok:1");
}

TEST_F(JwtTest, JwksRefusesMalformedDocuments) {
  EXPECT_EQ(jwksVerdict(""), "bad-jwks");
  EXPECT_EQ(jwksVerdict("{\"keys\": ["), "bad-jwks");
  EXPECT_EQ(jwksVerdict("[]"), "bad-jwks");
  EXPECT_EQ(jwksVerdict("{\"keys\": {}}"), "bad-jwks");
  EXPECT_EQ(jwksVerdict("{\"keys\": []}"), "bad-jwks");
  std::string big = Json{{"keys", {rsaJwk(rsa_, "rsa-1")}}}.dump();
  big += std::string(kMaxJwksBytes, ' ');
  EXPECT_EQ(jwksVerdict(big), "bad-jwks");
}

// --- valid tokens ---

TEST_F(JwtTest, AcceptsRs256) {
  VerifiedClaims c = verifyJwt(rsaToken(), keys(), opts_);
  EXPECT_EQ(c.issuer, kIssuer);
  EXPECT_EQ(c.subject, kSubject);
  EXPECT_EQ(c.expires_at, now_ + seconds(600));
}

TEST_F(JwtTest, AcceptsEs256) {
  EXPECT_EQ(verdict(token({{"alg", "ES256"}, {"kid", "ec-1"}}, claims_, es256(ec_))), "ok");
}

TEST_F(JwtTest, AcceptsAudienceArrayAndPastNbf) {
  EXPECT_EQ(withClaim("aud", {"other", kAudience}), "ok");
  EXPECT_EQ(withClaim("nbf", epoch() - 10), "ok");
  // No leeway: nbf equal to now is already valid.
  EXPECT_EQ(withClaim("nbf", epoch()), "ok");
}

TEST_F(JwtTest, TokenWithoutKidIsTriedAgainstEveryKeyOfItsType) {
  EXPECT_EQ(verdict(token({{"alg", "RS256"}}, claims_, rs256(rsa_))), "ok");
  EXPECT_EQ(verdict(token({{"alg", "ES256"}}, claims_, es256(ec_))), "ok");
  EXPECT_EQ(verdict(token({{"alg", "ES256"}}, claims_, es256(other_ec_))), "bad-signature");
}

// --- algorithm attacks ---

TEST_F(JwtTest, RefusesAlgNone) {
  std::string unsigned_token = b64url(Json{{"alg", "none"}}.dump()) + "." + b64url(claims_.dump());
  EXPECT_EQ(verdict(unsigned_token + "."), "unsupported-alg");
  EXPECT_EQ(verdict(token({{"alg", "none"}, {"kid", "rsa-1"}}, claims_, rs256(rsa_))),
            "unsupported-alg");
  EXPECT_EQ(verdict(token({{"alg", "None"}}, claims_, rs256(rsa_))), "unsupported-alg");
}

TEST_F(JwtTest, RefusesHs256KeyedWithThePublicKey) {
  // The classic confusion: a verifier that lets the header pick HMAC would key it with the
  // RSA public key, which the attacker knows. Try every form that key is published in.
  std::string pem = publicPem(rsa_);
  std::string n = bnParam(rsa_, OSSL_PKEY_PARAM_RSA_N);
  std::string jwk = rsaJwk(rsa_, "rsa-1").dump();
  for (const std::string& secret : {pem, n, jwk}) {
    auto hmac = [&secret](std::string_view in) { return hs256(secret, in); };
    EXPECT_EQ(verdict(token({{"alg", "HS256"}, {"kid", "rsa-1"}}, claims_, hmac)),
              "unsupported-alg");
    EXPECT_EQ(verdict(token({{"alg", "HS256"}}, claims_, hmac)), "unsupported-alg");
  }
}

TEST_F(JwtTest, RefusesOtherAlgorithms) {
  EXPECT_EQ(verdict(token({{"alg", "RS384"}, {"kid", "rsa-1"}}, claims_, rs256(rsa_))),
            "unsupported-alg");
  EXPECT_EQ(verdict(token({{"alg", "PS256"}, {"kid", "rsa-1"}}, claims_, rs256(rsa_))),
            "unsupported-alg");
  EXPECT_EQ(verdict(token({{"alg", "rs256"}, {"kid", "rsa-1"}}, claims_, rs256(rsa_))),
            "unsupported-alg");
  EXPECT_EQ(verdict(token({{"kid", "rsa-1"}}, claims_, rs256(rsa_))), "unsupported-alg");
  EXPECT_EQ(verdict(token({{"alg", 256}, {"kid", "rsa-1"}}, claims_, rs256(rsa_))),
            "unsupported-alg");
}

TEST_F(JwtTest, RefusesCriticalHeaderExtensions) {
  Json header = {{"alg", "RS256"}, {"kid", "rsa-1"}, {"crit", {"exp"}}, {"exp", 1}};
  EXPECT_EQ(verdict(token(header, claims_, rs256(rsa_))), "malformed-token");
}

// --- keys and signatures ---

TEST_F(JwtTest, RefusesUnknownKid) {
  EXPECT_EQ(verdict(token({{"alg", "RS256"}, {"kid", "rsa-2"}}, claims_, rs256(rsa_))),
            "unknown-kid");
  // A kid that names a key of the other type is as unknown as one that names nothing.
  EXPECT_EQ(verdict(token({{"alg", "RS256"}, {"kid", "ec-1"}}, claims_, rs256(rsa_))),
            "unknown-kid");
  EXPECT_EQ(verdict(token({{"alg", "RS256"}, {"kid", 1}}, claims_, rs256(rsa_))),
            "malformed-token");
}

TEST_F(JwtTest, RefusesSameKidDifferentKey) {
  EXPECT_EQ(verdict(token({{"alg", "RS256"}, {"kid", "rsa-1"}}, claims_, rs256(other_rsa_))),
            "bad-signature");
  EXPECT_EQ(verdict(token({{"alg", "ES256"}, {"kid", "ec-1"}}, claims_, es256(other_ec_))),
            "bad-signature");
}

TEST_F(JwtTest, RefusesTamperedPayload) {
  std::string good = rsaToken();
  Json c = claims_;
  c["sub"] = "system:serviceaccount:agents:admin";
  size_t dot1 = good.find('.');
  size_t dot2 = good.rfind('.');
  std::string forged = good.substr(0, dot1 + 1) + b64url(c.dump()) + good.substr(dot2);
  opts_.expected_subject = "system:serviceaccount:agents:admin";
  EXPECT_EQ(verdict(forged), "bad-signature");
}

TEST_F(JwtTest, RefusesTruncatedSignature) {
  // Truncated by whole bytes, so the base64url stays canonical and only the length is wrong.
  auto rs_short = [](std::string_view in) { return digestSign(rsa_, in).substr(0, 255); };
  EXPECT_EQ(verdict(token({{"alg", "RS256"}, {"kid", "rsa-1"}}, claims_, rs_short)),
            "bad-signature");
  auto es_short = [](std::string_view in) { return es256Raw(ec_, in).substr(0, 63); };
  EXPECT_EQ(verdict(token({{"alg", "ES256"}, {"kid", "ec-1"}}, claims_, es_short)),
            "bad-signature");
  std::string good = rsaToken();
  EXPECT_EQ(verdict(good.substr(0, good.rfind('.') + 1)), "bad-signature");
}

TEST_F(JwtTest, RefusesDerEncodedEs256) {
  auto der = [](std::string_view in) { return digestSign(ec_, in); };
  EXPECT_EQ(verdict(token({{"alg", "ES256"}, {"kid", "ec-1"}}, claims_, der)), "bad-signature");
}

TEST_F(JwtTest, RefusesEs256WithAllZeroSignature) {
  auto zero = [](std::string_view) { return std::string(64, '\0'); };
  EXPECT_EQ(verdict(token({{"alg", "ES256"}, {"kid", "ec-1"}}, claims_, zero)), "bad-signature");
}

// --- claims ---

TEST_F(JwtTest, RefusesWrongIssuer) {
  EXPECT_EQ(withClaim("iss", "https://attacker.test"), "bad-issuer");
  EXPECT_EQ(withClaim("iss", std::string(kIssuer) + "/"), "bad-issuer");
  EXPECT_EQ(withoutClaim("iss"), "bad-issuer");
}

TEST_F(JwtTest, RefusesWrongAudience) {
  EXPECT_EQ(withClaim("aud", "other"), "bad-audience");
  EXPECT_EQ(withClaim("aud", {"other", "compass2"}), "bad-audience");
  EXPECT_EQ(withClaim("aud", Json::array()), "bad-audience");
  EXPECT_EQ(withClaim("aud", {kAudience, 7}), "bad-audience");
  EXPECT_EQ(withClaim("aud", {{"aud", kAudience}}), "bad-audience");
  EXPECT_EQ(withoutClaim("aud"), "bad-audience");
}

TEST_F(JwtTest, RefusesExpiredToken) {
  EXPECT_EQ(withClaim("exp", epoch() - 1), "expired");
  // No leeway: a token is invalid at the second of its exp.
  EXPECT_EQ(withClaim("exp", epoch()), "expired");
  EXPECT_EQ(withClaim("exp", 0), "expired");
}

TEST_F(JwtTest, RefusesMissingOrNonNumericExp) {
  EXPECT_EQ(withoutClaim("exp"), "missing-exp");
  // A string exp is not a NumericDate; we do not coerce, so the token has no usable expiry.
  EXPECT_EQ(withClaim("exp", std::to_string(epoch() + 600)), "missing-exp");
  EXPECT_EQ(withClaim("exp", nullptr), "missing-exp");
  EXPECT_EQ(withClaim("exp", true), "missing-exp");
  EXPECT_EQ(withClaim("exp", 1e300), "missing-exp");
}

TEST_F(JwtTest, RefusesNotYetValidToken) {
  EXPECT_EQ(withClaim("nbf", epoch() + 60), "not-yet-valid");
  EXPECT_EQ(withClaim("nbf", epoch() + 1), "not-yet-valid");
  EXPECT_EQ(withClaim("nbf", "0"), "malformed-token");
}

TEST_F(JwtTest, RefusesWrongSubject) {
  EXPECT_EQ(withClaim("sub", "system:serviceaccount:agents:other"), "bad-subject");
  EXPECT_EQ(withClaim("sub", std::string(kSubject) + " "), "bad-subject");
  EXPECT_EQ(withClaim("sub", Json::array({kSubject})), "bad-subject");
  EXPECT_EQ(withoutClaim("sub"), "bad-subject");
}

TEST_F(JwtTest, RefusesDuplicateClaims) {
  // Signed, so only the duplicate can be the reason: one parser would read the first "sub",
  // another the last.
  std::string dup = R"({"iss":")" + std::string(kIssuer) +
                    R"(","aud":"compass","sub":"x","sub":")" + kSubject + R"(","exp":)" +
                    std::to_string(epoch() + 600) + "}";
  std::string input = b64url(R"({"alg":"RS256","kid":"rsa-1"})") + "." + b64url(dup);
  EXPECT_EQ(verdict(input + "." + b64url(digestSign(rsa_, input))), "malformed-token");
}

// --- framing ---

TEST_F(JwtTest, RefusesMalformedFraming) {
  std::string good = rsaToken();
  EXPECT_EQ(verdict(""), "malformed-token");
  EXPECT_EQ(verdict("."), "malformed-token");
  EXPECT_EQ(verdict(".."), "malformed-token");
  EXPECT_EQ(verdict(good + "."), "malformed-token");
  EXPECT_EQ(verdict(good + ".AAAA"), "malformed-token");
  EXPECT_EQ(verdict(good.substr(0, good.rfind('.'))), "malformed-token");
  EXPECT_EQ(verdict(" " + good), "malformed-token");
  EXPECT_EQ(verdict(good + "\n"), "malformed-token");
}

TEST_F(JwtTest, RefusesOversizedToken) {
  Json c = claims_;
  c["pad"] = std::string(kMaxTokenBytes, 'a');
  EXPECT_EQ(verdict(rsaToken(c)), "malformed-token");
}

TEST_F(JwtTest, RefusesNonJsonHeader) {
  std::string rest = rsaToken().substr(rsaToken().find('.'));
  EXPECT_EQ(verdict(b64url("not json") + rest), "malformed-token");
  EXPECT_EQ(verdict(b64url(R"(["RS256"])") + rest), "malformed-token");
  EXPECT_EQ(verdict(b64url(R"({"alg":"RS256","alg":"none"})") + rest), "malformed-token");
  EXPECT_EQ(verdict(rest), "malformed-token");  // empty header
}

TEST_F(JwtTest, RefusesNonCanonicalBase64) {
  std::string good = rsaToken();
  size_t dot1 = good.find('.');
  std::string header = good.substr(0, dot1);
  std::string rest = good.substr(dot1);
  EXPECT_EQ(verdict(header + "=" + rest), "malformed-token");
  std::string plus = header;
  std::replace(plus.begin(), plus.end(), '-', '+');
  std::replace(plus.begin(), plus.end(), '_', '/');
  if (plus != header) {
    EXPECT_EQ(verdict(plus + rest), "malformed-token");
  }
  // A 2048-bit signature is 256 bytes: 342 characters, the last of which carries 4 unused
  // bits that must be zero. Setting one gives a second spelling of the same signature.
  const std::string alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
  std::string sig_bits = good;
  sig_bits.back() = alphabet[alphabet.find(sig_bits.back()) + 1];
  EXPECT_EQ(verdict(sig_bits), "malformed-token");
  std::string payload_not_json = header + "." + b64url("{") + ".";
  std::string input = payload_not_json.substr(0, payload_not_json.size() - 1);
  EXPECT_EQ(verdict(input + "." + b64url(digestSign(rsa_, input))), "malformed-token");
}

}  // namespace
}  // namespace policy
