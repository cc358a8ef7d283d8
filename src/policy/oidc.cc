// OIDC discovery and JWKS retrieval over libcurl's easy API. Both documents come from the
// network, so each transfer is bounded in time and size, HTTPS-only and never redirected.

#include "policy/oidc.h"

#include <curl/curl.h>

#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string_view>

namespace policy {

namespace {

using Json = nlohmann::json;

constexpr std::string_view kHttpsScheme = "https://";
constexpr std::string_view kDiscoveryPath = "/.well-known/openid-configuration";

struct CurlFree {
  void operator()(CURL* c) const { curl_easy_cleanup(c); }
};
using CurlPtr = std::unique_ptr<CURL, CurlFree>;

// curl_global_init is not thread-safe and must run before any other curl call; the process
// never calls curl_global_cleanup because other threads may still be fetching.
void initCurlOnce() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

struct Body {
  std::string data;
  size_t cap = 0;
  bool over_cap = false;
};

size_t onBody(char* ptr, size_t size, size_t nmemb, void* user) {
  auto* body = static_cast<Body*>(user);
  size_t n = size * nmemb;
  if (n > body->cap - body->data.size()) {
    body->over_cap = true;
    return 0;  // anything but n makes curl abort the transfer with CURLE_WRITE_ERROR
  }
  body->data.append(ptr, n);
  return n;
}

// A document value quoted for an operator's message: JSON-escaped and cut short.
std::string shown(const Json& value) {
  constexpr size_t kMaxShownChars = 160;
  std::string text = value.dump(-1, ' ', false, Json::error_handler_t::replace);
  if (text.size() > kMaxShownChars) text = text.substr(0, kMaxShownChars) + "...";
  return text;
}

bool isHttps(std::string_view url) {
  if (url.size() <= kHttpsScheme.size()) return false;
  for (size_t i = 0; i < kHttpsScheme.size(); ++i) {
    char c = url[i];
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    if (c != kHttpsScheme[i]) return false;
  }
  return true;
}

// GETs `url` and returns the body of a 200 response. `what` names the document in errors and
// `too_big_reason` is the reason for a body over `cap` (the fault is the document's, not the
// network's).
std::string fetch(const std::string& url, const OidcFetchOptions& opts, size_t cap,
                  const char* what, const char* too_big_reason) {
  initCurlOnce();
  CurlPtr curl(curl_easy_init());
  if (!curl) throw CredentialError("issuer-unreachable", "curl_easy_init failed");
  Body body;
  body.cap = cap;
  char error[CURL_ERROR_SIZE] = {};
  long timeout_ms = static_cast<long>(opts.timeout.count());
  CURL* c = curl.get();
  bool ok =
      curl_easy_setopt(c, CURLOPT_URL, url.c_str()) == CURLE_OK &&
      curl_easy_setopt(c, CURLOPT_ERRORBUFFER, error) == CURLE_OK &&
      // Only https, and no redirects: a 3xx to http (or to another host) would let a
      // network attacker choose the keys.
      curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "https") == CURLE_OK &&
      curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS_STR, "https") == CURLE_OK &&
      curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 0L) == CURLE_OK &&
      curl_easy_setopt(c, CURLOPT_SSL_VERIFYPEER, 1L) == CURLE_OK &&
      curl_easy_setopt(c, CURLOPT_SSL_VERIFYHOST, 2L) == CURLE_OK &&
      curl_easy_setopt(c, CURLOPT_SSLVERSION, CURL_SSLVERSION_TLSv1_2) == CURLE_OK &&
      curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, timeout_ms) == CURLE_OK &&
      curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, timeout_ms) == CURLE_OK &&
      // Signals are process-wide; the timeout must not rely on SIGALRM in a threaded
      // program.
      curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L) == CURLE_OK &&
      // Announced size is refused up front; the write callback enforces it regardless.
      curl_easy_setopt(c, CURLOPT_MAXFILESIZE_LARGE, static_cast<curl_off_t>(cap)) == CURLE_OK &&
      curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, onBody) == CURLE_OK &&
      curl_easy_setopt(c, CURLOPT_WRITEDATA, &body) == CURLE_OK &&
      curl_easy_setopt(c, CURLOPT_USERAGENT, "compass-sandbox/oidc") == CURLE_OK;
  if (ok && !opts.ca_file.empty()) {
    ok = curl_easy_setopt(c, CURLOPT_CAINFO, opts.ca_file.c_str()) == CURLE_OK;
  }
  if (!ok) throw CredentialError("issuer-unreachable", "cannot configure curl for " + url);

  CURLcode rc = curl_easy_perform(c);
  if (body.over_cap || rc == CURLE_FILESIZE_EXCEEDED) {
    throw CredentialError(too_big_reason, std::string(what) + " at " + url + " is over " +
                                              std::to_string(cap) + " bytes");
  }
  if (rc != CURLE_OK) {
    throw CredentialError("issuer-unreachable",
                          "cannot fetch " + std::string(what) + " from " + url + ": " +
                              (error[0] != '\0' ? error : curl_easy_strerror(rc)));
  }
  long status = 0;
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
  if (status != 200) {
    throw CredentialError("issuer-unreachable", std::string(what) + " at " + url +
                                                    " answered HTTP " + std::to_string(status));
  }
  return std::move(body.data);
}

}  // namespace

Jwks fetchIssuerJwks(const OidcFetchOptions& opts) {
  // A plain-http issuer is a configuration error, not a network failure: it is refused before
  // any connection so the keys can never come over an unauthenticated channel.
  if (!isHttps(opts.issuer)) {
    throw CredentialError("bad-discovery",
                          "credential issuer \"" + opts.issuer + "\" is not an https URL");
  }
  // Discovery §4: a terminating "/" of the issuer is removed before the well-known path.
  std::string base = opts.issuer;
  if (base.back() == '/') base.pop_back();
  std::string discovery_url = base + std::string(kDiscoveryPath);
  std::string discovery_text =
      fetch(discovery_url, opts, kMaxDiscoveryBytes, "discovery document", "bad-discovery");

  Json discovery = Json::parse(discovery_text, nullptr, /*allow_exceptions=*/false);
  if (discovery.is_discarded() || !discovery.is_object()) {
    throw CredentialError("bad-discovery",
                          "discovery document at " + discovery_url + " is not a JSON object");
  }
  // §4.3: the advertised issuer must be exactly the one we asked, or a document served from
  // one issuer could vouch for another's tokens.
  auto issuer = discovery.find("issuer");
  if (issuer == discovery.end() || !issuer->is_string() ||
      issuer->get<std::string>() != opts.issuer) {
    throw CredentialError("bad-discovery",
                          "discovery document at " + discovery_url + " names issuer " +
                              (issuer == discovery.end() ? "(none)" : shown(*issuer)) +
                              ", expected \"" + opts.issuer + "\"");
  }
  auto jwks_uri = discovery.find("jwks_uri");
  if (jwks_uri == discovery.end() || !jwks_uri->is_string()) {
    throw CredentialError("bad-discovery",
                          "discovery document at " + discovery_url + " has no \"jwks_uri\"");
  }
  std::string jwks_url = jwks_uri->get<std::string>();
  if (!isHttps(jwks_url)) {
    throw CredentialError("bad-discovery", "discovery document at " + discovery_url +
                                               " names a non-https jwks_uri " + shown(*jwks_uri));
  }
  return Jwks::parse(fetch(jwks_url, opts, kMaxJwksBytes, "JWKS", "bad-jwks"));
}

}  // namespace policy
